// tinydev: PyTorch's PrivateUse1 device, renamed "tinydev", whose tensors keep
// their bytes in host memory. It implements natively only what a backend must:
// its memory (allocation, resize_), its device guard and hooks. Views and
// copies come from torch-fallback's kernels; every other op reaches
// torch-fallback's boxed fallback, registered at the bottom of this file.
#include <ATen/CPUGeneratorImpl.h>
#include <ATen/EmptyTensor.h>
#include <ATen/detail/PrivateUse1HooksInterface.h>
#include <ATen/native/Resize.h>
#include <c10/core/Allocator.h>
#include <c10/core/CPUAllocator.h>
#include <c10/core/DeviceGuard.h>
#include <c10/core/impl/COW.h>
#include <c10/core/impl/DeviceGuardImplInterface.h>
#include <c10/core/impl/alloc_cpu.h>
#include <torch/library.h>

#include <torch_fallback/fallback.h>
#include <torch_fallback/kernels.h>

#include <atomic>
#include <cstring>

#include "tinydev.h"

namespace tinydev {
namespace {

constexpr c10::DeviceType kTinydev = c10::DeviceType::PrivateUse1;
std::atomic<int64_t> g_live_allocations{0};

c10::Device tinydev_device(c10::DeviceIndex index = 0) { return {kTinydev, index}; }

// ---- memory ---------------------------------------------------------------
// The deleters double as tags: a storage is tinydev's when its DataPtr carries
// one of the first two.

void free_owned(void* ptr) {
  c10::free_cpu(ptr);
  g_live_allocations.fetch_sub(1, std::memory_order_relaxed);
}
void release_adopted(void* ctx) { delete static_cast<c10::Storage*>(ctx); }
void release_home_view(void* ctx) { delete static_cast<c10::Storage*>(ctx); }

c10::DataPtr allocate_bytes(size_t nbytes) {
  void* ptr = nbytes == 0 ? nullptr : c10::alloc_cpu(nbytes);
  g_live_allocations.fetch_add(1, std::memory_order_relaxed);
  return {ptr, ptr, &free_owned, tinydev_device()};
}

class TinydevAllocator final : public c10::Allocator {
 public:
  c10::DataPtr allocate(size_t nbytes) override { return allocate_bytes(nbytes); }
  void copy_data(void* dest, const void* src, size_t count) const override {
    default_copy_data(dest, src, count);
  }
};

TinydevAllocator g_allocator;
REGISTER_ALLOCATOR(kTinydev, &g_allocator);

void check_tinydev_storage(const c10::Storage& storage) {
  if (c10::impl::cow::is_cow_data_ptr(storage.data_ptr())) {
    // A lazy clone shares its source's bytes until written: give it its own.
    storage.unsafeGetStorageImpl()->mutable_data_ptr();
  }
  const auto deleter = storage.data_ptr().get_deleter();
  TORCH_CHECK(deleter == &free_owned || deleter == &release_adopted,
              "tinydev: this storage was not allocated by tinydev's allocator.");
}

void resize_storage_bytes(const c10::Storage& storage, size_t nbytes) {
  TORCH_CHECK(storage.resizable(), "tinydev: this storage is not resizable.");
  c10::DataPtr fresh = allocate_bytes(nbytes);
  const size_t keep = std::min(nbytes, storage.nbytes());
  if (keep > 0) std::memcpy(fresh.get(), storage.data(), keep);
  auto* impl = storage.unsafeGetStorageImpl();
  impl->set_data_ptr_noswap(std::move(fresh));
  impl->set_nbytes(nbytes);
}

// ---- the adapter: how torch-fallback sees tinydev's memory ------------------

// [readme:adapter]
// Every tinydev storage lives in host memory.
c10::Device home_device(const c10::Storage& storage) {
  check_tinydev_storage(storage);
  return c10::Device(c10::kCPU);
}

// A CPU storage over the same bytes, keeping the tinydev storage alive. (An
// out= argument that must grow gets a resizable storage from the fallback.)
c10::Storage home_storage(const c10::Storage& storage) {
  check_tinydev_storage(storage);
  c10::DataPtr data(const_cast<void*>(storage.data()), new c10::Storage(storage),
                    &release_home_view, c10::Device(c10::kCPU));
  return c10::Storage(c10::Storage::use_byte_size_t(), storage.nbytes(), std::move(data),
                      c10::GetCPUAllocator(), /*resizable=*/false);
}

// Results of the fallback are made on the CPU, then adopted.
c10::Device output_home(c10::DeviceIndex /*index*/) { return c10::Device(c10::kCPU); }

// A tinydev tensor taking over a CPU tensor's memory, without a copy.
at::Tensor adopt(const at::Tensor& home_tensor, c10::DeviceIndex index) {
  const c10::Storage& source = home_tensor.storage();
  c10::DataPtr data(const_cast<void*>(source.data()), new c10::Storage(source),
                    &release_adopted, tinydev_device(index));
  c10::Storage storage(c10::Storage::use_byte_size_t(), source.nbytes(), std::move(data),
                       &g_allocator, /*resizable=*/true);
  return torch_fallback::backend_tensor_over(std::move(storage), home_tensor);
}

const torch_fallback::BackendAdapter& adapter() {
  static const torch_fallback::BackendAdapter instance{
      kTinydev, &home_device, &home_storage, &output_home, &adopt};
  return instance;
}
// [/readme:adapter]

// ---- native kernels: tinydev's memory -------------------------------------

at::Tensor empty_memory_format(c10::SymIntArrayRef size, std::optional<at::ScalarType> dtype,
                               std::optional<at::Layout> /*layout*/,
                               std::optional<at::Device> device, std::optional<bool> /*pin*/,
                               std::optional<at::MemoryFormat> memory_format) {
  const c10::DeviceGuard guard(device.value_or(tinydev_device()));
  return at::detail::empty_generic(C10_AS_INTARRAYREF_SLOW(size), &g_allocator,
                                   c10::DispatchKeySet(c10::DispatchKey::PrivateUse1),
                                   c10::dtype_or_default(dtype), memory_format);
}

at::Tensor empty_strided(c10::SymIntArrayRef size, c10::SymIntArrayRef stride,
                         std::optional<at::ScalarType> dtype, std::optional<at::Layout> /*layout*/,
                         std::optional<at::Device> device, std::optional<bool> /*pin*/) {
  const c10::DeviceGuard guard(device.value_or(tinydev_device()));
  return at::detail::empty_strided_generic(
      C10_AS_INTARRAYREF_SLOW(size), C10_AS_INTARRAYREF_SLOW(stride), &g_allocator,
      c10::DispatchKeySet(c10::DispatchKey::PrivateUse1), c10::dtype_or_default(dtype));
}

const at::Tensor& resize_(const at::Tensor& self, c10::SymIntArrayRef size,
                          std::optional<at::MemoryFormat> memory_format) {
  auto* impl = self.unsafeGetTensorImpl();
  at::native::resize_impl_cpu_(impl, C10_AS_INTARRAYREF_SLOW(size), std::nullopt,
                               /*resize_storage=*/false);
  if (memory_format) impl->empty_tensor_restride(*memory_format);
  const size_t needed = at::detail::computeStorageNbytes(
      self.sizes(), self.strides(), self.dtype().itemsize(), self.storage_offset());
  if (self.numel() > 0 && needed > self.storage().nbytes()) {
    resize_storage_bytes(self.storage(), needed);
  }
  return self;
}

// ---- the device: one tinydev device, its guard and hooks ------------------

struct TinydevGuardImpl final : public c10::impl::DeviceGuardImplInterface {
  static constexpr c10::DeviceType static_type = kTinydev;

  c10::DeviceType type() const override { return static_type; }
  c10::Device exchangeDevice(c10::Device device) const override {
    setDevice(device);
    return tinydev_device();
  }
  c10::Device getDevice() const override { return tinydev_device(); }
  void setDevice(c10::Device device) const override {
    TORCH_CHECK_INDEX(!device.has_index() || device.index() == 0, "tinydev: ", device,
                      " does not exist; there is one tinydev device, tinydev:0.");
  }
  void uncheckedSetDevice(c10::Device /*device*/) const noexcept override {}
  c10::Stream getStream(c10::Device device) const override {
    return c10::Stream(c10::Stream::DEFAULT, device);
  }
  c10::Stream getDefaultStream(c10::Device device) const override {
    return c10::Stream(c10::Stream::DEFAULT, device);
  }
  c10::Stream exchangeStream(c10::Stream stream) const override {
    return c10::Stream(c10::Stream::DEFAULT, stream.device());
  }
  c10::DeviceIndex deviceCount() const noexcept override { return 1; }
  // Host memory, synchronous work: events are complete when recorded.
  void record(void** /*event*/, const c10::Stream& /*stream*/, c10::DeviceIndex /*index*/,
              c10::EventFlag /*flag*/) const override {}
  void block(void* /*event*/, const c10::Stream& /*stream*/) const override {}
  bool queryEvent(void* /*event*/) const override { return true; }
  void destroyEvent(void* /*event*/, c10::DeviceIndex /*index*/) const noexcept override {}
  bool queryStream(const c10::Stream& /*stream*/) const override { return true; }
  void synchronizeStream(const c10::Stream& /*stream*/) const override {}
  void synchronizeDevice(c10::DeviceIndex /*index*/) const override {}
};

C10_REGISTER_GUARD_IMPL(PrivateUse1, TinydevGuardImpl);

struct TinydevHooks final : public at::PrivateUse1HooksInterface {
  bool isBuilt() const override { return true; }
  bool isAvailable() const override { return true; }
  bool hasPrimaryContext(c10::DeviceIndex /*index*/) const override { return true; }
  c10::DeviceIndex deviceCount() const override { return 1; }
  c10::DeviceIndex getCurrentDevice() const override { return 0; }
  // Random ops run on the fallback's target and draw from its generator.
  const at::Generator& getDefaultGenerator(c10::DeviceIndex /*index*/) const override {
    return at::detail::getDefaultCPUGenerator();
  }
  at::Device getDeviceFromPtr(void* /*data*/) const override { return tinydev_device(); }
  bool isPinnedPtr(const void* /*data*/) const override { return false; }
  c10::Allocator* getPinnedMemoryAllocator() const override { return c10::GetCPUAllocator(); }
  void resizePrivateUse1Bytes(const c10::Storage& storage, size_t nbytes) const override {
    resize_storage_bytes(storage, nbytes);
  }
};

const bool g_hooks_registered = [] {
  at::RegisterPrivateUse1HooksInterface(new TinydevHooks());
  return true;
}();

}  // namespace

int64_t live_allocations() { return g_live_allocations.load(std::memory_order_relaxed); }

// ---- registration ----------------------------------------------------------

// [readme:registration]
TORCH_LIBRARY_IMPL(aten, PrivateUse1, m) {
  m.impl("empty.memory_format", TORCH_FN(empty_memory_format));
  m.impl("empty_strided", TORCH_FN(empty_strided));
  m.impl("resize_", TORCH_FN(resize_));
  torch_fallback::register_kernels<&adapter>(m);  // views, copies, ops run whole; last
}

// Every other aten op, for tinydev tensors: torch-fallback's boxed fallback.
TORCH_LIBRARY_IMPL(_, PrivateUse1, m) {
  m.fallback(torch_fallback::boxed_fallback_for<&adapter>());
}
// [/readme:registration]

}  // namespace tinydev
