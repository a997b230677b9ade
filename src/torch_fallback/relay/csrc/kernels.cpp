// The only ops relay implements itself: allocation, resize, lazy clones and record_stream.
// Views, set_ and copies come from torch-fallback's public API, and every
// other op reaches the boxed fallback, registered at the end.
#include <ATen/EmptyTensor.h>
#include <ATen/native/Resize.h>
#include <ATen/native/ResizeCommon.h>
#include <ATen/native/TensorFactories.h>
#include <ATen/ops/_lazy_clone_native.h>
#include <ATen/ops/clone.h>
#include <c10/core/DeviceGuard.h>
#include <c10/core/impl/COW.h>
#include <torch/library.h>

#include <torch_fallback/kernels.h>

#include "relay.h"

namespace torch_fallback::relay {
namespace {

// As CPU's and CUDA's allocators: new memory is NaN (or the largest integer)
// under torch.use_deterministic_algorithms, so that reading it before writing shows.
bool fills_new_memory() {
  const auto& context = at::globalContext();
  return context.deterministicAlgorithms() && context.deterministicFillUninitializedMemory();
}

void check_not_pinned(std::optional<bool> pin_memory) {
  TORCH_CHECK(!pin_memory.value_or(false), "Only dense CPU tensors can be pinned");
}

at::Tensor empty_memory_format(c10::SymIntArrayRef size, std::optional<at::ScalarType> dtype,
                               std::optional<at::Layout> /*layout*/,
                               std::optional<at::Device> device, std::optional<bool> pin_memory,
                               std::optional<at::MemoryFormat> memory_format) {
  check_not_pinned(pin_memory);
  const c10::DeviceGuard guard(device.value_or(c10::Device(c10::DeviceType::PrivateUse1)));
  at::Tensor tensor = at::detail::empty_generic(
      C10_AS_INTARRAYREF_SLOW(size), allocator(),
      c10::DispatchKeySet(c10::DispatchKey::PrivateUse1), c10::dtype_or_default(dtype),
      memory_format);
  if (C10_UNLIKELY(fills_new_memory())) at::native::fill_empty_deterministic_(tensor);
  return tensor;
}

at::Tensor empty_strided(c10::SymIntArrayRef size, c10::SymIntArrayRef stride,
                         std::optional<at::ScalarType> dtype, std::optional<at::Layout> /*layout*/,
                         std::optional<at::Device> device, std::optional<bool> pin_memory) {
  check_not_pinned(pin_memory);
  const c10::DeviceGuard guard(device.value_or(c10::Device(c10::DeviceType::PrivateUse1)));
  at::Tensor tensor = at::detail::empty_strided_generic(
      C10_AS_INTARRAYREF_SLOW(size), C10_AS_INTARRAYREF_SLOW(stride), allocator(),
      c10::DispatchKeySet(c10::DispatchKey::PrivateUse1), c10::dtype_or_default(dtype));
  if (C10_UNLIKELY(fills_new_memory())) at::native::fill_empty_deterministic_(tensor);
  return tensor;
}

const at::Tensor& resize_(const at::Tensor& self, c10::SymIntArrayRef size,
                          std::optional<at::MemoryFormat> memory_format) {
  auto* impl = self.unsafeGetTensorImpl();
  const int64_t old_nbytes = static_cast<int64_t>(self.storage().nbytes());
  at::native::resize_impl_cpu_(impl, C10_AS_INTARRAYREF_SLOW(size), std::nullopt,
                               /*resize_storage=*/false);
  if (memory_format) impl->empty_tensor_restride(*memory_format);
  const size_t needed = at::detail::computeStorageNbytes(
      self.sizes(), self.strides(), self.dtype().itemsize(), self.storage_offset());
  if (self.numel() > 0 && needed > self.storage().nbytes()) {
    resize_storage_bytes(self.storage(), needed);
    if (C10_UNLIKELY(fills_new_memory())) at::native::fill_resize_deterministic_(self, old_nbytes);
  }
  return self;
}

// Copy-on-write needs a storage whose DataPtr owns its data directly; relay's
// CUDA-homed and adopted storages hold a context instead, so they are cloned
// eagerly, which is what a lazy clone must behave like.
at::Tensor lazy_clone(const at::Tensor& self) {
  const c10::StorageImpl& storage = *self.storage().unsafeGetStorageImpl();
  if (c10::impl::cow::has_simple_data_ptr(storage) ||
      c10::impl::cow::is_cow_data_ptr(storage.data_ptr())) {
    return at::native::_lazy_clone(self);
  }
  return at::clone(self);
}

// Tensor.record_stream: relay orders a device's work on one stream, so memory
// is never reused ahead of the stream that reads it.
void record_stream(at::Tensor& /*self*/, c10::Stream /*stream*/) {}

}  // namespace

TORCH_LIBRARY_IMPL(aten, PrivateUse1, m) {
  m.impl("empty.memory_format", TORCH_FN(empty_memory_format));
  m.impl("record_stream", TORCH_FN(record_stream));
  m.impl("empty_strided", TORCH_FN(empty_strided));
  m.impl("resize_", TORCH_FN(resize_));
  m.impl("_lazy_clone", TORCH_FN(lazy_clone));
  torch_fallback::register_kernels<&backend>(m);  // last: relay's own kernels stay
}

TORCH_LIBRARY_IMPL(_, PrivateUse1, m) {
  m.fallback(torch_fallback::boxed_fallback_for<&backend>());
}

TORCH_LIBRARY_IMPL(_, NestedTensorPrivateUse1, m) {
  m.fallback(torch_fallback::boxed_fallback_for<&backend>());
}

TORCH_LIBRARY_IMPL(aten, NestedTensorPrivateUse1, m) {
  torch_fallback::register_nested_kernels<&backend>(m);
}

// Sparse and quantized relay tensors cannot be made; these give every attempt
// a clear error (Tensor.to("relay") of a quantized tensor reaches
// empty_quantized at the quantized key).
TORCH_LIBRARY_IMPL(_, QuantizedPrivateUse1, m) {
  m.fallback(torch_fallback::boxed_fallback_for<&backend>());
}

TORCH_LIBRARY_IMPL(_, SparsePrivateUse1, m) {
  m.fallback(torch_fallback::boxed_fallback_for<&backend>());
}

TORCH_LIBRARY_IMPL(_, SparseCsrPrivateUse1, m) {
  m.fallback(torch_fallback::boxed_fallback_for<&backend>());
}

// Its composite kernel would otherwise wrap relay tensors into a sparse one
// (what Tensor.to("relay") of a CSR tensor calls); the fallback refuses it.
TORCH_LIBRARY_IMPL(aten, SparseCsrPrivateUse1, m) {
  m.impl("_sparse_compressed_tensor_unsafe", torch_fallback::boxed_fallback_for<&backend>());
}

}  // namespace torch_fallback::relay
