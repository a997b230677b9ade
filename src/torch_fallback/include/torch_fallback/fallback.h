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
#include <ATen/core/stack.h>
#include <c10/core/Storage.h>
#include <torch/library.h>

#include <optional>
#include <string>
#include <vector>

#include "api.h"

namespace torch_fallback {

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

// native_batch_norm and its backward on cuDNN, as eager CUDA runs them, when
// the fallback targets a GPU and the call's tensors live on it; false (the
// stack untouched) when they do not.
TORCH_FALLBACK_API bool run_batch_norm_as_eager_cuda(const BackendAdapter& backend,
                                                     const c10::OperatorHandle& op,
                                                     torch::jit::Stack* stack);

template <const BackendAdapter& (*Adapter)()>
void batch_norm_kernel(const c10::OperatorHandle& op, torch::jit::Stack* stack) {
  if (!run_batch_norm_as_eager_cuda(Adapter(), op, stack)) boxed_fallback(Adapter(), op, stack);
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
// _copy_from_and_resize, the ops run whole, batch norm on cuDNN where eager
// CUDA would take it, and (for PrivateUse1) the choice of the fused attention
// kernel. The backend still owns its memory: empty.memory_format, empty_strided
// and resize_. Call it after registering the backend's own kernels: it leaves
// those in place.
template <const BackendAdapter& (*Adapter)()>
void register_kernels(torch::Library& aten) {
  detail::register_math_bit_fallthroughs();
  if (Adapter().device_type == c10::DeviceType::PrivateUse1) detail::register_sdp_choice();
  register_view_kernels(aten);
  aten.impl("_copy_from", TORCH_FN(detail::CopyKernels<Adapter>::copy_from));
  aten.impl("_copy_from_and_resize", TORCH_FN(detail::CopyKernels<Adapter>::copy_from_and_resize));
  for (const char* name : {"native_batch_norm", "native_batch_norm_backward"}) {
    if (detail::has_kernel(name, Adapter().device_type)) continue;
    aten.impl(name,
              torch::CppFunction::makeFromBoxedFunction<&detail::batch_norm_kernel<Adapter>>());
  }
  for (const std::string& name : ops_run_whole()) {
    // The backend's own kernels, registered before this call, win.
    if (detail::has_kernel(name, Adapter().device_type)) continue;
    aten.impl(name.c_str(), boxed_fallback_for<Adapter>());
  }
}

}  // namespace torch_fallback
