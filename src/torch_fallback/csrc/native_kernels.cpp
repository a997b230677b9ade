// Kernels every backend needs natively and that depend on no backend's memory:
// metadata-only views, and the list of ops sent to the fallback whole.
#include <torch_fallback/kernels.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <mutex>
#include <tuple>
#include <typeinfo>

#include <ATen/EmptyTensor.h>
#include <c10/core/impl/TorchDispatchModeTLS.h>
#include <ATen/core/dispatch/Dispatcher.h>
#include <ATen/detail/PrivateUse1HooksInterface.h>
#include <ATen/native/Resize.h>
#include <ATen/core/grad_mode.h>
#include <ATen/native/transformers/attention.h>
#include <ATen/SDPBackend.h>
#include <ATen/ops/_fused_sdp_choice.h>
#include <ATen/ops/_fused_sdp_choice_native.h>
#include <ATen/ops/_scaled_dot_product_flash_attention_backward_ops.h>
#include <ATen/ops/_scaled_dot_product_flash_attention_ops.h>
#include <ATen/ops/_nested_tensor_size_native.h>
#include <ATen/ops/_nested_tensor_storage_offsets_native.h>
#include <ATen/ops/_nested_tensor_strides_native.h>
#include <ATen/ops/_nested_view_from_buffer_native.h>

#include <ATen/ops/_to_copy_native.h>
#include <ATen/ops/alias_native.h>
#include <ATen/ops/as_strided_native.h>
#include <ATen/ops/chunk_native.h>
#include <ATen/ops/copy_native.h>
#include <ATen/ops/detach_native.h>
#include <ATen/ops/empty_like_native.h>
#include <ATen/ops/narrow_native.h>
#include <ATen/ops/select_native.h>
#include <ATen/ops/split_with_sizes_native.h>
#include <ATen/ops/squeeze_native.h>
#include <ATen/ops/transpose_native.h>
#include <ATen/ops/unbind_native.h>
#include <ATen/ops/unsqueeze_native.h>
#include <ATen/ops/values_native.h>
#include <ATen/ops/_reshape_alias_native.h>
#include <ATen/ops/unfold_native.h>
#include <ATen/ops/view_as_complex_native.h>
#include <ATen/ops/view_as_real_native.h>
#include <ATen/ops/view_native.h>

namespace torch_fallback {
namespace {

at::Tensor as_strided(const at::Tensor& self, c10::SymIntArrayRef size, c10::SymIntArrayRef stride,
                      std::optional<c10::SymInt> storage_offset) {
  return at::native::as_strided_tensorimpl(
      self, C10_AS_INTARRAYREF_SLOW(size), C10_AS_INTARRAYREF_SLOW(stride),
      storage_offset ? std::optional<int64_t>(storage_offset->expect_int()) : std::nullopt);
}

at::Tensor view(const at::Tensor& self, c10::SymIntArrayRef size) {
  return at::native::view(self, C10_AS_INTARRAYREF_SLOW(size));
}

at::Tensor reshape_alias(const at::Tensor& self, c10::SymIntArrayRef size,
                         c10::SymIntArrayRef stride) {
  return at::native::_reshape_alias(self, C10_AS_INTARRAYREF_SLOW(size),
                                    C10_AS_INTARRAYREF_SLOW(stride));
}

at::Tensor unfold(const at::Tensor& self, int64_t dimension, int64_t size, int64_t step) {
  return at::native::unfold(self, dimension, size, step);
}

// set_: a tensor's metadata over a storage, as the CPU's kernels set it; a
// storage too small for it is grown by the backend (its PrivateUse1 hooks).
at::Tensor& set_storage(at::Tensor& self, at::Storage source, c10::SymInt storage_offset,
                        c10::SymIntArrayRef size, c10::SymIntArrayRef stride) {
  const int64_t offset = storage_offset.expect_int();
  const auto sizes = C10_AS_INTARRAYREF_SLOW(size);
  const auto strides = C10_AS_INTARRAYREF_SLOW(stride);
  at::native::checkSetStorage(self, std::move(source), offset, sizes, strides);
  self.unsafeGetTensorImpl()->set_storage_offset(offset);
  const at::OptionalIntArrayRef stride_opt =
      strides.data() != nullptr ? at::OptionalIntArrayRef(strides) : std::nullopt;
  at::native::resize_impl_cpu_(self.unsafeGetTensorImpl(), sizes, stride_opt,
                               /*resize_storage=*/false);
  const size_t needed = at::detail::computeStorageNbytes(
      self.sizes(), self.strides(), self.dtype().itemsize(), self.storage_offset());
  if (self.numel() > 0 && needed > self.storage().nbytes()) {
    at::detail::getPrivateUse1Hooks().resizePrivateUse1Bytes(self.storage(), needed);
  }
  return self;
}

at::Tensor& set_source_storage(at::Tensor& self, at::Storage source) {
  const auto itemsize = static_cast<int64_t>(self.dtype().itemsize());
  const int64_t numel = static_cast<int64_t>(source.nbytes()) / itemsize;
  return set_storage(self, std::move(source), 0, c10::SymIntArrayRef({c10::SymInt(numel)}), {});
}

at::Tensor& set_source_tensor(at::Tensor& self, const at::Tensor& source) {
  if (self.is_same(source)) return self;
  return set_storage(self, source.storage(), source.sym_storage_offset(), source.sym_sizes(),
                     source.sym_strides());
}

at::Tensor& set_empty(at::Tensor& self) {
  c10::Allocator* allocator = c10::GetAllocator(self.device().type());
  c10::Storage empty(c10::Storage::use_byte_size_t(), 0, allocator->allocate(0), allocator,
                     /*resizable=*/true);
  return set_storage(self, std::move(empty), 0, c10::SymIntArrayRef({c10::SymInt(0)}), {});
}

bool returns_a_view(const c10::FunctionSchema& schema) {
  for (const auto& ret : schema.returns()) {
    if (ret.alias_info() != nullptr && !ret.alias_info()->isWrite()) return true;
  }
  return false;
}

// The aten ops ("op" or "op.overload") for which `wanted` says yes.
template <typename Wanted>
std::vector<std::string> aten_ops_where(Wanted&& wanted) {
  std::vector<std::string> names;
  auto& dispatcher = c10::Dispatcher::singleton();
  for (const c10::OperatorName& name : dispatcher.getAllOpNames()) {
    if (name.name.rfind("aten::", 0) != 0) continue;
    const auto op = dispatcher.findOp(name);
    if (!op || !wanted(name, *op)) continue;
    const std::string bare = name.name.substr(6);
    names.push_back(name.overload_name.empty() ? bare : bare + "." + name.overload_name);
  }
  return names;
}

// Whether _scaled_dot_product_fused_attention_overrideable on the backend's
// tensors runs CUDA's flash attention (register_sdp_choice registered it).
std::atomic<bool> g_flash_as_overrideable{false};

using FlashResult = std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor, c10::SymInt,
                               c10::SymInt, at::Tensor, at::Tensor, at::Tensor>;

// scaled_dot_product_attention's flash branch runs CUDA's flash kernel for CUDA
// tensors only, and the CPU's for any other device's. On a CUDA target, the
// target's flash choice comes back as the overrideable backend, which PyTorch
// serves with this op on the backend's tensors: CUDA's flash kernel through the
// fallback, where the math path would take a dozen ops and their backwards.
FlashResult flash_attention(const at::Tensor& query, const at::Tensor& key,
                            const at::Tensor& value, const std::optional<at::Tensor>& attn_bias,
                            double dropout_p, bool is_causal, bool return_debug_mask,
                            std::optional<double> scale) {
  TORCH_CHECK(!attn_bias || !attn_bias->defined(),
              "torch_fallback: _scaled_dot_product_fused_attention_overrideable runs CUDA's "
              "flash attention, which takes no attention mask; call scaled_dot_product_attention, "
              "which takes another kernel where there is a mask.");
  return at::_ops::_scaled_dot_product_flash_attention::call(query, key, value, dropout_p,
                                                             is_causal, return_debug_mask, scale);
}

std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor> flash_attention_backward(
    const at::Tensor& grad_out, const at::Tensor& query, const at::Tensor& key,
    const at::Tensor& value, const at::Tensor& /*attn_bias: none, as in the forward*/,
    std::array<bool, 4> /*grad_input_mask: flash computes all three*/, const at::Tensor& out,
    const at::Tensor& logsumexp, const at::Tensor& cum_seq_q, const at::Tensor& cum_seq_k,
    c10::SymInt max_q, c10::SymInt max_k, double dropout_p, bool is_causal,
    const at::Tensor& philox_seed, const at::Tensor& philox_offset, std::optional<double> scale) {
  auto [grad_query, grad_key, grad_value] =
      at::_ops::_scaled_dot_product_flash_attention_backward::call(
          grad_out, query, key, value, out, logsumexp, cum_seq_q, cum_seq_k, std::move(max_q),
          std::move(max_k), dropout_p, is_causal, philox_seed, philox_offset, scale);
  return {std::move(grad_query), std::move(grad_key), std::move(grad_value), at::Tensor()};
}

// CUDA's flash branch first pads head dimensions to a multiple of 8 (and slices
// the output back); flash_attention runs on the tensors as they are, so it takes
// only those that need no padding, whose results are then eager CUDA's.
bool flash_through_overrideable(const at::Tensor& query, const at::Tensor& key,
                                const at::Tensor& value) {
  return g_flash_as_overrideable.load(std::memory_order_relaxed) && query.size(-1) % 8 == 0 &&
         key.size(-1) % 8 == 0 && value.size(-1) % 8 == 0;
}

// scaled_dot_product_attention asks this stub which attention kernel to run.
// Without it a third-party device gets the math path (a dozen ops and their
// backwards); with it, the target's own choice, made by the target's
// _fused_sdp_choice on the backend's tensors (through the fallback).
template <typename Fn>
struct SdpChoice;
template <typename... Args>
struct SdpChoice<int64_t (*)(const at::Tensor&, const at::Tensor&, const at::Tensor&, Args...)> {
  static int64_t choose(const at::Tensor& query, const at::Tensor& key, const at::Tensor& value,
                        Args... rest) {
    constexpr auto math = static_cast<int64_t>(at::SDPBackend::math);
    if (query.is_nested() || key.is_nested() || value.is_nested()) return math;
    const std::optional<at::Tensor>& attn_mask = std::get<0>(std::forward_as_tuple(rest...));
    // A mask that requires grad (a learned position bias: T5) rules out the fused
    // kernels, which do not differentiate it; the target's chooser would see
    // the fallback's target views, which carry no requires_grad.
    if (attn_mask && attn_mask->defined() && attn_mask->requires_grad() &&
        at::GradMode::is_enabled()) {
      return math;
    }
    // The CPU's chooser reads shapes, strides and dtypes only: called as the CPU's
    // attention calls it, with no dispatch, so that a transform (vmap, a trace:
    // torch.compile, make_fx, fake tensors) sees no call and the kernel eager picks.
    if (!targets_cuda()) return at::native::_fused_sdp_choice_cpp(query, key, value, rest...);
    // CUDA's chooser refuses other devices' tensors: it sees the target's, through
    // the fallback. Under a transform that call would be batched (no batching rule)
    // or recorded (and could not run): there the CUDA target takes the math path.
    const auto transformed = [](const at::Tensor& tensor) {
      return tensor.defined() && tensor.key_set().has_any(transform_keys);
    };
    if (c10::impl::dispatch_mode_enabled() || transformed(query) || transformed(key) ||
        transformed(value) || (attn_mask && transformed(*attn_mask))) {
      return math;
    }
    const int64_t choice = at::_fused_sdp_choice(query, key, value, rest...);
    if (choice != static_cast<int64_t>(at::SDPBackend::flash_attention)) return choice;
    // For any device but CUDA, PyTorch's flash branch runs the CPU's flash kernel;
    // the overrideable branch reaches CUDA's (flash_attention).
    return flash_through_overrideable(query, key, value)
               ? static_cast<int64_t>(at::SDPBackend::overrideable)
               : math;
  }

  static constexpr c10::DispatchKeySet transform_keys{
      c10::DispatchKey::FuncTorchBatched, c10::DispatchKey::Python, c10::DispatchKey::Functionalize};
};
using SdpChoiceFn = decltype(at::native::_fused_sdp_choice_stub)::FnPtr;

// torch.load with map_location moves a nested tensor's sizes, strides and
// offsets to the buffer's device; PyTorch's kernel reads them on the host.
at::Tensor nested_view_from_buffer(const at::Tensor& buffer, const at::Tensor& sizes,
                                   const at::Tensor& strides, const at::Tensor& offsets) {
  return at::native::_nested_view_from_buffer(buffer, sizes.cpu(), strides.cpu(), offsets.cpu());
}

}  // namespace

void register_view_kernels(torch::Library& aten, c10::DeviceType device_type) {
  // The backend's own views, registered before, stay.
  const auto impl = [&](const char* name, auto&& kernel) {
    if (!detail::has_kernel(name, device_type)) aten.impl(name, std::forward<decltype(kernel)>(kernel));
  };
  impl("as_strided", TORCH_FN(as_strided));
  impl("view", TORCH_FN(view));
  impl("_reshape_alias", TORCH_FN(reshape_alias));
  impl("unfold", TORCH_FN(unfold));
  impl("view_as_real", TORCH_FN(at::native::view_as_real));
  impl("view_as_complex", TORCH_FN(at::native::view_as_complex));
  // A nested tensor over a backend buffer: what torch.load rebuilds one with.
  impl("_nested_view_from_buffer", TORCH_FN(nested_view_from_buffer));
  if (device_type != c10::DeviceType::PrivateUse1) return;  // set_ grows storages by its hooks
  impl("set_.source_Storage", TORCH_FN(set_source_storage));
  impl("set_.source_Storage_storage_offset", TORCH_FN(set_storage));
  impl("set_.source_Tensor", TORCH_FN(set_source_tensor));
  impl("set_", TORCH_FN(set_empty));
}

namespace detail {

void register_nested_native_kernels(torch::Library& nested) {
  // PyTorch's views, copies and empty_like of nested tensors work on the buffer,
  // whatever its device, but are registered for the CPU's and CUDA's nested keys
  // only. _to_copy(nested CPU tensor, device=<backend>) comes here, not to the
  // CPU's kernel: BackendSelect adds the device argument's key.
  namespace native = at::native;
  nested.impl("_to_copy", TORCH_FN(native::_to_copy_nested));
  // The metadata, CPU tensors on every device (torch.save saves them).
  nested.impl("_nested_tensor_size", TORCH_FN(native::_nested_tensor_size));
  nested.impl("_nested_tensor_strides", TORCH_FN(native::_nested_tensor_strides));
  nested.impl("_nested_tensor_storage_offsets", TORCH_FN(native::_nested_tensor_storage_offsets));
  nested.impl("copy_", TORCH_FN(native::copy_nested_));
  nested.impl("empty_like", TORCH_FN(native::empty_like_nested));
  nested.impl("alias", TORCH_FN(native::alias_nested));
  nested.impl("detach", TORCH_FN(native::detach));
  nested.impl("chunk", TORCH_FN(native::chunk_nested_tensor));
  nested.impl("narrow", TORCH_FN(native::narrow_nested_symint));
  nested.impl("select.int", [](const at::Tensor& self, int64_t dim, c10::SymInt index) {
    return native::select_nested(self, dim, index.expect_int());
  });
  nested.impl("split_with_sizes",
              [](const at::Tensor& self, c10::SymIntArrayRef sizes, int64_t dim) {
                return native::split_with_sizes_nested(self, C10_AS_INTARRAYREF_SLOW(sizes), dim);
              });
  nested.impl("squeeze", TORCH_FN(native::squeeze_nested));
  nested.impl("squeeze.dim",
              TORCH_FN(static_cast<at::Tensor (*)(const at::Tensor&, int64_t)>(
                  native::squeeze_dim_nested)));
  nested.impl("squeeze.dims",
              TORCH_FN(static_cast<at::Tensor (*)(const at::Tensor&, at::IntArrayRef)>(
                  native::squeeze_dim_nested)));
  nested.impl("transpose.int", TORCH_FN(native::transpose_nested));
  nested.impl("unbind.int", TORCH_FN(native::NestedTensor_unbind));
  nested.impl("unsqueeze", TORCH_FN(native::unsqueeze_nested));
  nested.impl("values", TORCH_FN(native::values_nested));
  nested.impl("view", [](const at::Tensor& self, c10::SymIntArrayRef size) {
    return native::view_nested(self, C10_AS_INTARRAYREF_SLOW(size));
  });
}

const std::vector<std::string>& nested_ops_run_whole() {
  // Ops with a nested kernel for the CPU and a composite one that other devices'
  // nested tensors take (matmul, linear): the composite reads sizes(), which a
  // nested tensor has not. Views are registered natively; out= forms are left to
  // the composite, as the fallback writes no nested result back.
  static const std::vector<std::string> names =
      aten_ops_where([](const c10::OperatorName& /*name*/, const c10::OperatorHandle& op) {
        const auto& args = op.schema().arguments();
        return op.hasKernelForDispatchKey(c10::DispatchKey::NestedTensorCPU) &&
               op.hasKernelForDispatchKey(c10::DispatchKey::CompositeImplicitAutograd) &&
               !returns_a_view(op.schema()) &&
               std::none_of(args.begin(), args.end(), [](const auto& arg) { return arg.is_out(); });
      });
  return names;
}

}  // namespace detail

// Ops with their own CPU or CUDA kernel and a composite one that other devices
// take: the composite may check less (addr_ on a 0-dim self) or compute
// differently (mish_backward's, an implicit one, rounds otherwise than the CPU's
// kernel). And the _foreach_ ops, whose composite kernels run one op per tensor
// of the list: one fallback call each on the backend, where CUDA's kernels
// launch a few. An op whose implicit composite is all CUDA has, besides its own
// kernel, keeps it: the CPU target would have no kernel to run it whole.
std::vector<std::string> ops_with_target_and_composite_kernels() {
  return aten_ops_where([](const c10::OperatorName& name, const c10::OperatorHandle& op) {
    const bool foreach_op = name.name.rfind("aten::_foreach_", 0) == 0;
    const bool on_cpu = op.hasKernelForDispatchKey(c10::DispatchKey::CPU);
    const bool explicit_composite =
        (foreach_op || on_cpu || op.hasKernelForDispatchKey(c10::DispatchKey::CUDA)) &&
        (op.hasKernelForDispatchKey(c10::DispatchKey::CompositeExplicitAutograd) ||
         op.hasKernelForDispatchKey(c10::DispatchKey::CompositeExplicitAutogradNonFunctional));
    const bool implicit_composite =
        on_cpu && op.hasKernelForDispatchKey(c10::DispatchKey::CompositeImplicitAutograd);
    return (explicit_composite || implicit_composite) &&
           !returns_a_view(op.schema());  // a backend registers views natively
  });
}

const std::vector<std::string>& ops_run_whole() {
  static const std::vector<std::string> names = [] {
    std::vector<std::string> names{
        // _convolution's composite kernel calls convolution_overrideable. Not
        // convolution, which the JIT tracer leaves unrecorded for the
        // _convolution it calls: run whole, that would trace the target's.
        "_convolution", "convolution_backward",
        // The composite norms compute differently from the CPU and CUDA kernels.
        "native_layer_norm_backward", "native_group_norm_backward",
        // cdist's: one fallback call instead of one per op it is made of.
        "_euclidean_dist",
        // Composite kernels that call a DispatchStub directly, which has no
        // entry for a third-party device.
        "conj_physical_", "kaiser_window", "kaiser_window.periodic", "kaiser_window.beta",
        // Composite constructors of sparse tensors, which would wrap backend
        // tensors into a sparse tensor no kernel can serve: the fallback
        // refuses them, so .to(backend) of a sparse tensor fails there.
        "_sparse_compressed_tensor_unsafe", "_sparse_coo_tensor_unsafe",
    };
    for (auto& name : ops_with_target_and_composite_kernels()) names.push_back(std::move(name));
    return names;
  }();
  return names;
}

namespace {

// The device types whose tensors swap memory in place (Tensor.data = ...):
// PyTorch's dense backends, and those registered by register_device_moves.
std::array<std::atomic<bool>, static_cast<size_t>(c10::DeviceType::COMPILE_TIME_MAX_DEVICE_TYPES)>
    movable_device_types{};

bool movable_in_place(const at::Tensor& tensor) {
  const c10::TensorImpl& impl = *tensor.unsafeGetTensorImpl();
  // shallow_copy_from copies TensorImpl's own fields only: a subclass (a
  // backend's own TensorImpl, a wrapper) would lose what it adds.
  return typeid(impl) == typeid(c10::TensorImpl) && tensor.layout() == c10::kStrided &&
         impl.key_set().has(c10::DispatchKey::Dense) &&
         movable_device_types[static_cast<size_t>(tensor.device().type())].load();
}

// aten::_has_compatible_shallow_copy_type for calls with a backend tensor:
// nn.Module._apply asks it whether to keep a parameter by `param.data = moved`
// (identity kept) or to make a new Parameter (ties broken); set_data checks it.
bool has_compatible_shallow_copy_type(const at::Tensor& self, const at::Tensor& from) {
  return self.unsafeGetTensorImpl()->has_compatible_shallow_copy_type(from.key_set()) ||
         (movable_in_place(self) && movable_in_place(from));
}

}  // namespace

namespace {
std::array<std::atomic<const BackendAdapter*>,
           static_cast<size_t>(c10::DeviceType::COMPILE_TIME_MAX_DEVICE_TYPES)>
    adapters{};
}  // namespace

void register_adapter(const BackendAdapter& backend) {
  TORCH_CHECK((backend.begin_access == nullptr) == (backend.end_access == nullptr),
              "torch_fallback: the adapter of ", c10::DeviceTypeName(backend.device_type, true),
              " sets ", backend.begin_access != nullptr ? "begin_access" : "end_access",
              " without ", backend.begin_access != nullptr ? "end_access" : "begin_access",
              ": set both (an access that begins must end) or neither.");
  adapters[static_cast<size_t>(backend.device_type)] = &backend;
}

const BackendAdapter* adapter_for(c10::DeviceType device_type) {
  return adapters[static_cast<size_t>(device_type)].load();
}

void register_device_moves(c10::DeviceType device_type) {
  static std::once_flag dense_once;
  std::call_once(dense_once, [] {
    for (const auto dense : {c10::DeviceType::CPU, c10::DeviceType::CUDA, c10::DeviceType::HIP,
                             c10::DeviceType::XPU, c10::DeviceType::MPS, c10::DeviceType::HPU}) {
      movable_device_types[static_cast<size_t>(dense)] = true;
    }
  });
  if (movable_device_types[static_cast<size_t>(device_type)].exchange(true)) return;
  // The autograd key is where the composite kernel would run: a kernel there
  // is reached only by calls that have a tensor of this device among their
  // arguments, so CPU and CUDA tensors keep PyTorch's answer.
  detail::register_autograd_kernel(device_type, "_has_compatible_shallow_copy_type",
                                   torch::CppFunction(TORCH_FN(has_compatible_shallow_copy_type)));
}

namespace detail {

c10::DispatchKey autograd_key(c10::DeviceType device_type) {
  return c10::getAutogradKeyFromBackend(c10::toBackendComponent(
      c10::computeDispatchKey(std::nullopt, c10::kStrided, c10::Device(device_type))));
}

void register_autograd_kernel(c10::DeviceType device_type, const char* name,
                              torch::CppFunction kernel) {
  static std::mutex libraries_mutex;
  static std::vector<std::unique_ptr<torch::Library>> libraries;
  const std::lock_guard<std::mutex> lock(libraries_mutex);
  auto& library = libraries.emplace_back(std::make_unique<torch::Library>(
      torch::Library::IMPL, "aten", autograd_key(device_type), __FILE__, __LINE__));
  library->impl(name, std::move(kernel));
}

bool has_kernel(const std::string& name, c10::DeviceType device_type) {
  const auto dot = name.find('.');
  const c10::OperatorName op_name(
      "aten::" + name.substr(0, dot), dot == std::string::npos ? "" : name.substr(dot + 1));
  const auto op = c10::Dispatcher::singleton().findOp(op_name);
  return op && op->hasKernelForDispatchKey(
                   c10::computeDispatchKey(std::nullopt, c10::kStrided, c10::Device(device_type)));
}

bool decomposes_above_backends(const std::string& name) {
  const auto dot = name.find('.');
  const c10::OperatorName op_name(
      "aten::" + name.substr(0, dot), dot == std::string::npos ? "" : name.substr(dot + 1));
  const auto op = c10::Dispatcher::singleton().findOp(op_name);
  if (!op || !op->hasKernelForDispatchKey(c10::DispatchKey::CompositeImplicitAutograd)) {
    return false;
  }
  const auto& whole = ops_run_whole();
  return std::find(whole.begin(), whole.end(), name) == whole.end();
}

void register_sdp_choice(torch::Library& aten) {
  // A backend's own choice wins whichever static initializer runs first: set
  // before this, it is left in place (read through the stub's only member, a
  // DispatchStubImpl, which is public and first in a standard-layout struct);
  // set after, REGISTER_PRIVATEUSE1_DISPATCH overwrites this one.
  auto& stub = at::native::_fused_sdp_choice_stub;
  static_assert(std::is_standard_layout_v<std::remove_reference_t<decltype(stub)>>);
  if (reinterpret_cast<const at::native::DispatchStubImpl&>(stub).privateuse1_dispatch_ptr !=
      nullptr) {
    return;
  }
  stub.set_privateuse1_dispatch_ptr(&SdpChoice<SdpChoiceFn>::choose);
  // A backend's own overrideable attention is its own: the flash choice then
  // takes the math path, as before.
  constexpr auto kPrivateUse1 = c10::DeviceType::PrivateUse1;
  if (!has_kernel("_scaled_dot_product_fused_attention_overrideable", kPrivateUse1) &&
      !has_kernel("_scaled_dot_product_fused_attention_overrideable_backward", kPrivateUse1)) {
    aten.impl("_scaled_dot_product_fused_attention_overrideable", TORCH_FN(flash_attention));
    aten.impl("_scaled_dot_product_fused_attention_overrideable_backward",
              TORCH_FN(flash_attention_backward));
    g_flash_as_overrideable.store(true, std::memory_order_relaxed);
  }
}

void register_math_bit_fallthroughs() {
  static std::once_flag once;
  std::call_once(once, [] {
    // Without these, the math-bit fallbacks would resolve the bits with
    // clone(), which copies through _copy_from again, forever (or writes into
    // a clone that nobody reads, for _copy_from_and_resize's destination).
    for (const auto key : {c10::DispatchKey::Conjugate, c10::DispatchKey::Negative}) {
      static std::vector<std::unique_ptr<torch::Library>> libraries;
      auto& library = libraries.emplace_back(std::make_unique<torch::Library>(
          torch::Library::IMPL, "aten", key, __FILE__, __LINE__));
      library->impl("_copy_from", torch::CppFunction::makeFallthrough());
      library->impl("_copy_from_and_resize", torch::CppFunction::makeFallthrough());
    }
  });
}

}  // namespace detail
}  // namespace torch_fallback
