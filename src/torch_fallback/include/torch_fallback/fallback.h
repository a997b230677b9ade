#pragma once
// The public C++ API of torch-fallback: a generalized boxed fallback that runs
// the ops a backend has no kernel for on the CPU or on a CUDA GPU.
//
// A backend describes its memory with a BackendAdapter and registers the
// fallback for its dispatch key:
//
//   const torch_fallback::BackendAdapter& my_adapter() {
//     static const torch_fallback::BackendAdapter adapter{
//         c10::DeviceType::PrivateUse1, &home_device, &home_storage, &output_home, &adopt};
//     return adapter;
//   }
//   TORCH_LIBRARY_IMPL(_, PrivateUse1, m) {
//     m.fallback(torch_fallback::boxed_fallback_for<&my_adapter>());
//   }
//   TORCH_LIBRARY_IMPL(_, NestedTensorPrivateUse1, m) {  // nested tensors too
//     m.fallback(torch_fallback::boxed_fallback_for<&my_adapter>());
//   }
//   TORCH_LIBRARY_IMPL(aten, PrivateUse1, m) {
//     ... the backend's memory: empty.memory_format, empty_strided, resize_
//     torch_fallback::register_kernels<&my_adapter>(m);  // views, copies, last
//   }
//
// Tensors whose memory already lives on the fallback's target device are used
// in place (zero-copy); others are copied there and back. The target, the ops
// forced to the CPU and the CUDA sync mode are torch_fallback's settings
// (TORCH_FALLBACK_TARGET, torch_fallback.set_target, ...); every call is
// counted in torch_fallback.metrics().
#include <ATen/core/Generator.h>
#include <ATen/core/Tensor.h>
#include <ATen/core/boxing/impl/boxing.h>
#include <ATen/core/dispatch/Dispatcher.h>
#include <ATen/core/stack.h>
#include <ATen/ops/_foreach_add_ops.h>
#include <ATen/ops/_foreach_addcdiv_ops.h>
#include <ATen/ops/_foreach_addcmul_ops.h>
#include <ATen/ops/_foreach_div_ops.h>
#include <ATen/ops/_foreach_lerp_ops.h>
#include <ATen/ops/_foreach_mul_ops.h>
#include <ATen/ops/_foreach_sqrt_ops.h>
#include <ATen/ops/_foreach_zero_ops.h>
#include <ATen/ops/_fused_sdp_choice_ops.h>
#include <ATen/ops/_log_softmax_backward_data_ops.h>
#include <ATen/ops/_log_softmax_ops.h>
#include <ATen/ops/_scaled_dot_product_cudnn_attention_backward_ops.h>
#include <ATen/ops/_scaled_dot_product_cudnn_attention_ops.h>
#include <ATen/ops/_scaled_dot_product_efficient_attention_backward_ops.h>
#include <ATen/ops/_scaled_dot_product_efficient_attention_ops.h>
#include <ATen/ops/_scaled_dot_product_flash_attention_for_cpu_backward_ops.h>
#include <ATen/ops/_scaled_dot_product_flash_attention_for_cpu_ops.h>
#include <ATen/ops/_softmax_backward_data_ops.h>
#include <ATen/ops/_softmax_ops.h>
#include <ATen/ops/add_ops.h>
#include <ATen/ops/addmm_ops.h>
#include <ATen/ops/bmm_ops.h>
#include <ATen/ops/cat_ops.h>
#include <ATen/ops/convolution_backward_ops.h>
#include <ATen/ops/convolution_ops.h>
#include <ATen/ops/div_ops.h>
#include <ATen/ops/fill_ops.h>
#include <ATen/ops/gelu_backward_ops.h>
#include <ATen/ops/gelu_ops.h>
#include <ATen/ops/mean_ops.h>
#include <ATen/ops/mm_ops.h>
#include <ATen/ops/mul_ops.h>
#include <ATen/ops/native_batch_norm_backward_ops.h>
#include <ATen/ops/native_batch_norm_ops.h>
#include <ATen/ops/native_dropout_backward_ops.h>
#include <ATen/ops/native_dropout_ops.h>
#include <ATen/ops/native_layer_norm_backward_ops.h>
#include <ATen/ops/native_layer_norm_ops.h>
#include <ATen/ops/nll_loss_backward_ops.h>
#include <ATen/ops/nll_loss_forward_ops.h>
#include <ATen/ops/relu_ops.h>
#include <ATen/ops/sub_ops.h>
#include <ATen/ops/sum_ops.h>
#include <ATen/ops/threshold_backward_ops.h>
#include <ATen/ops/zero_ops.h>
#include <c10/core/Storage.h>
#include <c10/util/SmallVector.h>
#include <torch/library.h>

#include <array>
#include <chrono>
#include <optional>
#include <string>
#include <tuple>
#include <type_traits>
#include <utility>
#include <vector>

#include "api.h"
#include "cuda.h"

namespace torch_fallback {

struct OpRules;

// How a backend's tensors map to memory the CPU or CUDA can use.
struct BackendAdapter {
  // The backend's device type (PrivateUse1 for out-of-tree backends).
  c10::DeviceType device_type;
  // The device whose memory holds a backend storage: the CPU or a CUDA GPU.
  c10::Device (*home_device)(const c10::Storage& storage);
  // A storage on the home device sharing the backend storage's bytes. It may be
  // the same storage at every call (one kept with the backend storage): the
  // fallback never resizes it, and gives arguments a kernel may resize (out=
  // ones) a resizable storage of their own over the same bytes.
  c10::Storage (*home_storage)(const c10::Storage& storage);
  // The home device for new backend tensors on backend device `index`.
  c10::Device (*output_home)(c10::DeviceIndex index);
  // A backend tensor on device `index` taking over a home-device tensor's memory.
  at::Tensor (*adopt)(const at::Tensor& home_tensor, c10::DeviceIndex index);
  // Optional: the generator a random op running on `target` draws from, for
  // the backend generator it was given (none: the backend's default generator
  // for device `index`). Without it, random ops use the target's generators.
  at::Generator (*target_generator)(const std::optional<at::Generator>& generator,
                                    c10::DeviceIndex index, c10::Device target) = nullptr;
};

// Runs `op` from `stack` on the fallback target for `backend`'s tensors.
TORCH_FALLBACK_API void boxed_fallback(const BackendAdapter& backend,
                                       const c10::OperatorHandle& op, torch::jit::Stack* stack);

// The fallback as a kernel for torch::Library::fallback or ::impl, for the
// backend whose adapter `Adapter()` returns.
namespace detail {
template <const BackendAdapter& (*Adapter)()>
void fallback_kernel(const c10::OperatorHandle& op, torch::jit::Stack* stack) {
  boxed_fallback(Adapter(), op, stack);
}
}  // namespace detail

template <const BackendAdapter& (*Adapter)()>
torch::CppFunction boxed_fallback_for() {
  return torch::CppFunction::makeFromBoxedFunction<&detail::fallback_kernel<Adapter>>();
}

// Whether the fallback now sends ops that have a CUDA kernel to a GPU (the
// target setting; for 'auto', whether a GPU is visible). A backend whose memory
// lives on the host may then allocate it page-locked, so that the fallback's
// copies to and from the GPU run asynchronously and at full speed.
TORCH_FALLBACK_API bool targets_cuda();

// A CPU or CUDA tensor viewing the same bytes as a backend tensor.
TORCH_FALLBACK_API at::Tensor home_view(const BackendAdapter& backend, const at::Tensor& tensor);

// A backend tensor over `storage` (a backend storage sharing `home_tensor`'s
// memory) with `home_tensor`'s dtype and geometry: what an adopt returns. A
// kernel's fresh result, which nothing else holds, becomes that tensor itself
// rather than leaving a second TensorImpl to make and one to free.
TORCH_FALLBACK_API at::Tensor backend_tensor_over(c10::Storage storage,
                                                  const at::Tensor& home_tensor);

// A copy between a backend tensor and a CPU, CUDA or backend tensor, run on
// the home devices. Refuses overlapping source and destination as eager
// copy_ does.
TORCH_FALLBACK_API void copy_between(const BackendAdapter& backend, const at::Tensor& src,
                                     const at::Tensor& dst, bool non_blocking);

// Registers the metadata-only view ops (as_strided, view, _reshape_alias,
// unfold, view_as_real, view_as_complex): a boxed fallback cannot return
// views, so every backend needs them natively.
TORCH_FALLBACK_API void register_view_kernels(torch::Library& aten);

// Ops whose composite (device-agnostic) kernels do not serve a third-party
// device as eager serves CPU and CUDA, so they go to the fallback whole:
// convolution's calls convolution_overrideable, conj_physical_ calls a
// DispatchStub directly, and every op with its own CPU kernel besides a
// composite one (addr, the norms) checks and computes as the CPU kernel does.
TORCH_FALLBACK_API const std::vector<std::string>& ops_run_whole();

// The adapter registered for `device_type` (register_kernels registers the
// backend's), or null: what the library's pieces reached from Python without a
// template argument (the c10d backend of torch_fallback.distributed) use.
TORCH_FALLBACK_API void register_adapter(const BackendAdapter& backend);
TORCH_FALLBACK_API const BackendAdapter* adapter_for(c10::DeviceType device_type);

// Lets nn.Module.to (and .data = ...) move a tensor between `device_type` and
// the CPU or CUDA in place, as it moves one between the CPU and CUDA: the
// Parameter object stays, so tied weights stay tied and an optimizer built
// before the move keeps its tensors. Only calls with a `device_type` tensor
// among their arguments see it; register_kernels calls it.
TORCH_FALLBACK_API void register_device_moves(c10::DeviceType device_type);

namespace detail {
// _copy_from and _copy_from_and_resize see the conjugate and negative bits
// themselves; registered once, by the first backend.
TORCH_FALLBACK_API void register_math_bit_fallthroughs();
// Whether `aten::<name>` ("op" or "op.overload") has a kernel of its own for the
// dispatch key of `device_type`.
TORCH_FALLBACK_API bool has_kernel(const std::string& name, c10::DeviceType device_type);
// scaled_dot_product_attention on PrivateUse1 tensors runs the fused attention
// kernel the fallback's target would choose, not the math path.
TORCH_FALLBACK_API void register_sdp_choice();

// How a DirectKernel runs its op on the target: the target's kernel for the op.
template <typename Op>
struct TargetKernel {
  template <typename... Args>
  static decltype(auto) run(c10::DispatchKeySet keys, Args&&... args) {
    return Op::redispatch(keys, std::forward<Args>(args)...);
  }
};

// native_batch_norm and its backward on the target as eager runs them there.
// _batch_norm_impl_index picks cuDNN only for CUDA tensors (input.is_cuda()),
// so a backend's batch norm would always take the native kernels: slower on
// the GPU and more host work per call. On a CUDA target these ask PyTorch's own
// choice (_select_batch_norm_backend) and run cuDNN where it says so.
struct TORCH_FALLBACK_API BatchNormOnTarget {
  static std::tuple<at::Tensor, at::Tensor, at::Tensor> run(
      c10::DispatchKeySet keys, const at::Tensor& input, const std::optional<at::Tensor>& weight,
      const std::optional<at::Tensor>& bias, const std::optional<at::Tensor>& running_mean,
      const std::optional<at::Tensor>& running_var, bool training, double momentum, double eps);
};

struct TORCH_FALLBACK_API BatchNormBackwardOnTarget {
  static std::tuple<at::Tensor, at::Tensor, at::Tensor> run(
      c10::DispatchKeySet keys, const at::Tensor& grad_out, const at::Tensor& input,
      const std::optional<at::Tensor>& weight, const std::optional<at::Tensor>& running_mean,
      const std::optional<at::Tensor>& running_var, const std::optional<at::Tensor>& save_mean,
      const std::optional<at::Tensor>& save_invstd, bool train, double eps,
      std::array<bool, 3> output_mask);
};

class TargetImplPool;

// The versions of the backend tensors an op writes through target tensors. Most
// in-place ops count their writes above the backend (ADInplaceOrView), but a
// _foreach_ op's kernel counts them itself on each tensor it writes (the CPU
// kernel through each tensor's in-place op, the CUDA one explicitly): on the
// target tensors. pass_on() adds those counts to the backend tensors, so that
// autograd sees the writes as it sees eager's. Each target tensor is watched once.
class TORCH_FALLBACK_API WrittenVersions {
 public:
  void watch(const at::Tensor& backend, const at::Tensor& target);
  void pass_on() const;

 private:
  struct Watched {
    c10::TensorImpl* backend;
    c10::TensorImpl* target;
    uint32_t target_before;
  };
  c10::SmallVector<Watched, 4> watched_;
};

// One call of an op whose tensors all live on the fallback target already: the
// target's kernel runs unboxed on views of them, without the boxing, the
// argument walk and the unboxing of the boxed fallback. In-place ops write the
// backend's memory through the views. Any other call (a tensor elsewhere, a
// setting that sends the op elsewhere) goes to the boxed fallback, which serves it in full.
class TORCH_FALLBACK_API DirectCall {
 public:
  // `rules`: rules_for(op), which a kernel may keep per thread.
  DirectCall(const BackendAdapter& backend, const OpRules& rules);
  static const OpRules& rules_for(const c10::OperatorHandle& op);
  ~DirectCall();
  DirectCall(const DirectCall&) = delete;
  DirectCall& operator=(const DirectCall&) = delete;

  // Each argument, before start(). A 0-dim CPU tensor (a Python number) may
  // come with backend tensors, as on CUDA.
  void offer(const at::Tensor& tensor);
  void offer(at::Tensor& written);
  void offer(const std::optional<at::Tensor>& tensor) {
    if (tensor.has_value()) offer(*tensor);
  }
  void offer(at::TensorList tensors);
  void offer(const at::ITensorListRef& tensors);  // cat's, which it only reads
  void offer(std::optional<c10::ScalarType> dtype);
  void offer(c10::ScalarType dtype) { offer(std::optional<c10::ScalarType>(dtype)); }
  template <typename T>
  void offer(const T& /*not a tensor*/) {}

  // Whether this call runs directly; if so, picks the target and enters its device.
  bool start();

  // The dispatch keys of the target's kernel. The call goes straight there: the
  // keys above it (autograd, autocast, the math bits) have run for the
  // backend's tensors already, so the views need no second key extraction.
  c10::DispatchKeySet target_keys() const { return target_keys_; }

  // Each argument as the target kernel takes it: views of the backend tensors.
  const at::Tensor& on_target(const at::Tensor& tensor);
  at::Tensor& on_target(at::Tensor& written);
  std::optional<at::Tensor> on_target(const std::optional<at::Tensor>& tensor) {
    return tensor.has_value() ? std::optional<at::Tensor>(on_target(*tensor)) : tensor;
  }
  at::TensorList on_target(at::TensorList tensors);
  at::ITensorListRef on_target(const at::ITensorListRef& tensors);
  template <typename T>
  T& on_target(T& value) {
    return value;
  }

  // The kernel's results as backend tensors; an in-place op's are its backend arguments.
  at::Tensor finish(const at::Tensor& result);
  // The kernel gave no tensor to adopt: it wrote its arguments, or returned a number.
  void finish();
  template <typename... Tensors>
  std::tuple<Tensors...> finish(const std::tuple<Tensors...>& results) {
    kernel_done();
    auto on_backend = std::apply(
        [this](const auto&... result) { return std::tuple<Tensors...>(to_backend(result)...); },
        results);
    finished_ = true;
    return on_backend;
  }
  std::vector<at::Tensor> finish(const std::vector<at::Tensor>& results);

  // Says which op and target raised `error`.
  void add_context(c10::Error& error) const;

 private:
  at::Tensor to_backend(const at::Tensor& result);
  template <typename T>
  const T& to_backend(const T& not_a_tensor) {  // the sizes attention kernels return
    return not_a_tensor;
  }
  // After the kernel: waits for it if the settings ask so, and counts its writes.
  void kernel_done() const;
  const c10::Storage* home_in_call(c10::StorageImpl* backend_storage) const;
  at::Tensor view_of(const at::Tensor& tensor);
  // The view kept with `tensor` for later calls, if it still matches; else a new
  // one, kept where the tensor has a kept view already or `add` says to give it one.
  at::Tensor kept_view_of(const at::Tensor& tensor, bool add);

  const BackendAdapter& backend_;
  const OpRules& rules_;
  const std::chrono::steady_clock::time_point start_;
  bool usable_ = true;
  bool started_ = false;
  bool finished_ = false;
  size_t tensors_ = 0;  // backend tensors offered outside lists
  size_t lists_offered_ = 0;
  size_t list_tensors_ = 0;
  const at::Tensor* written_list_ = nullptr;  // the list argument the op writes, if any
  std::optional<c10::DeviceIndex> index_;
  std::optional<c10::Device> home_;  // of the tensors offered
  c10::Device target_{c10::kCPU};
  c10::DispatchKeySet target_keys_{c10::DispatchKey::CPU};
  std::optional<cuda::DeviceScope> device_scope_;
  TargetImplPool* pool_ = nullptr;  // this thread's, where target tensors may be reused
  // The target storage of each backend storage, once per call: tensors that
  // share memory on the backend share it on the target, as kernels' overlap checks expect.
  c10::SmallVector<std::pair<c10::StorageImpl*, c10::Storage>, 4> homes_;
  c10::SmallVector<at::Tensor, 4> views_;  // sized in start(): references to them stay valid
  c10::SmallVector<std::vector<at::Tensor>, 1> view_lists_;
  WrittenVersions written_versions_;
};

// An unboxed kernel for the op `Op` (an at::_ops struct): DirectCall where it
// serves the call (running `Run` on the target), else the boxed fallback.
template <const BackendAdapter& (*Adapter)(), typename Op, typename Run = TargetKernel<Op>,
          typename Schema = typename Op::schema>
struct DirectKernel;

template <const BackendAdapter& (*Adapter)(), typename Op, typename Run, typename Result,
          typename... Args>
struct DirectKernel<Adapter, Op, Run, Result(Args...)> {
  static Result call(Args... args) {
    static const c10::OperatorHandle op =
        c10::Dispatcher::singleton().findSchemaOrThrow(Op::name, Op::overload_name);
    thread_local const OpRules* rules = nullptr;  // the fallback's rules are per thread
    if (rules == nullptr) rules = &DirectCall::rules_for(op);
    {
      DirectCall direct(Adapter(), *rules);
      (direct.offer(args), ...);
      if (direct.start()) {
        const auto run = [&]() -> Result {
          try {
            return Run::run(direct.target_keys(), direct.on_target(args)...);
          } catch (c10::Error& error) {
            direct.add_context(error);
            throw;
          }
        };
        if constexpr (std::is_void_v<Result>) {  // an in-place _foreach_ op
          run();
          direct.finish();
          return;
        } else if constexpr (std::is_same_v<Result, at::Tensor&>) {
          run();  // an in-place op: it wrote self through its view
          direct.finish();
          return self(args...);
        } else if constexpr (std::is_arithmetic_v<Result>) {  // _fused_sdp_choice's choice
          const Result value = run();
          direct.finish();
          return value;
        } else {
          return direct.finish(run());
        }
      }
    }
    torch::jit::Stack stack = c10::impl::boxArgs<Args...>(args...);
    boxed_fallback(Adapter(), op, &stack);
    if constexpr (std::is_void_v<Result>) {
      return;
    } else if constexpr (std::is_same_v<Result, at::Tensor&>) {
      return self(args...);
    } else {
      return c10::impl::PopResult<Result>::call(stack);
    }
  }

 private:
  // An in-place op's first argument, which it writes and returns.
  template <typename... Rest>
  static at::Tensor& self(at::Tensor& written, Rest&&... /*others*/) {
    return written;
  }
};

template <const BackendAdapter& (*Adapter)(), typename Op, typename Run = TargetKernel<Op>>
void register_direct_kernel(torch::Library& aten) {
  std::string name = std::string(Op::name).substr(std::string("aten::").size());
  if (*Op::overload_name != '\0') name += std::string(".") + Op::overload_name;
  if (has_kernel(name, Adapter().device_type)) return;  // the backend's own
  using Kernel = DirectKernel<Adapter, Op, Run>;
  aten.impl(name.c_str(), TORCH_FN(Kernel::call));
}

template <const BackendAdapter& (*Adapter)(), typename... Ops>
void register_direct_kernels(torch::Library& aten) {
  (register_direct_kernel<Adapter, Ops>(aten), ...);
}

template <const BackendAdapter& (*Adapter)()>
struct CopyKernels {
  static at::Tensor copy_from(const at::Tensor& self, const at::Tensor& dst, bool non_blocking) {
    copy_between(Adapter(), self, dst, non_blocking);
    return dst;
  }
  static at::Tensor copy_from_and_resize(const at::Tensor& self, const at::Tensor& dst) {
    dst.resize_(self.sizes());
    copy_between(Adapter(), self, dst, /*non_blocking=*/false);
    return dst;
  }
};
}  // namespace detail

// Everything torch-fallback can give a backend besides the fallback itself,
// for TORCH_LIBRARY_IMPL(aten, <key>, m): the views, _copy_from and
// _copy_from_and_resize, the ops run whole, unboxed kernels for the functional
// and in-place ops a training step calls most (DirectKernel), batch norm on cuDNN where
// eager CUDA would take it, and (for PrivateUse1) the choice of the fused
// attention kernel, and device moves that keep parameters (register_device_moves).
// The backend still owns its memory: empty.memory_format,
// empty_strided and resize_. Call it after registering the backend's own
// kernels: it leaves those in place.
template <const BackendAdapter& (*Adapter)()>
void register_kernels(torch::Library& aten) {
  detail::register_math_bit_fallthroughs();
  register_adapter(Adapter());
  register_device_moves(Adapter().device_type);
  if (Adapter().device_type == c10::DeviceType::PrivateUse1) detail::register_sdp_choice();
  register_view_kernels(aten);
  aten.impl("_copy_from", TORCH_FN(detail::CopyKernels<Adapter>::copy_from));
  aten.impl("_copy_from_and_resize", TORCH_FN(detail::CopyKernels<Adapter>::copy_from_and_resize));
  // The functional ops a training step calls most, run unboxed where they can be.
  namespace ops = at::_ops;
  detail::register_direct_kernels<
      Adapter, ops::add_Tensor, ops::sub_Tensor, ops::mul_Tensor, ops::div_Tensor, ops::mm,
      ops::bmm, ops::addmm, ops::convolution, ops::convolution_backward, ops::relu,
      ops::threshold_backward, ops::gelu, ops::gelu_backward, ops::_softmax,
      ops::_softmax_backward_data, ops::_log_softmax, ops::_log_softmax_backward_data,
      ops::native_layer_norm, ops::native_layer_norm_backward, ops::sum_dim_IntList,
      ops::mean_dim, ops::nll_loss_forward, ops::nll_loss_backward, ops::native_dropout,
      ops::native_dropout_backward, ops::cat,
      // in place: gradient accumulation, zero_grad(set_to_none=False), the optimizers
      ops::add__Tensor, ops::sub__Tensor, ops::mul__Tensor, ops::div__Tensor, ops::mul__Scalar,
      ops::zero_, ops::fill__Scalar, ops::_foreach_add__Scalar, ops::_foreach_add__List,
      ops::_foreach_mul__Scalar, ops::_foreach_mul__List, ops::_foreach_div__ScalarList,
      ops::_foreach_addcmul__Scalar, ops::_foreach_addcdiv__ScalarList,
      ops::_foreach_lerp__Scalar, ops::_foreach_zero_, ops::_foreach_sqrt,
      // the fused attention kernels scaled_dot_product_attention chooses on each target
      ops::_fused_sdp_choice, ops::_scaled_dot_product_cudnn_attention,
      ops::_scaled_dot_product_cudnn_attention_backward,
      ops::_scaled_dot_product_efficient_attention,
      ops::_scaled_dot_product_efficient_attention_backward,
      ops::_scaled_dot_product_flash_attention_for_cpu,
      ops::_scaled_dot_product_flash_attention_for_cpu_backward>(aten);
  detail::register_direct_kernel<Adapter, ops::native_batch_norm, detail::BatchNormOnTarget>(aten);
  detail::register_direct_kernel<Adapter, ops::native_batch_norm_backward,
                                 detail::BatchNormBackwardOnTarget>(aten);
  for (const std::string& name : ops_run_whole()) {
    // The backend's own kernels, registered before this call, win.
    if (detail::has_kernel(name, Adapter().device_type)) continue;
    aten.impl(name.c_str(), boxed_fallback_for<Adapter>());
  }
}

}  // namespace torch_fallback
