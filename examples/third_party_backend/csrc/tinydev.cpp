// tinydev: PyTorch's PrivateUse1 device, renamed "tinydev", with the traits of
// PyTorch's reference backend (torch_openreg), which was not written with
// torch-fallback in mind: two devices; host memory locked outside access
// (memory.cpp) with its own allocation table; its own view, _copy_from and
// attention-choice kernels; its own BackendMeta and serialization hook. It
// implements natively what such a backend does; every other op reaches
// torch-fallback's boxed fallback, registered at the bottom of this file.
#include <ATen/EmptyTensor.h>
#include <ATen/CPUGeneratorImpl.h>
#include <ATen/SDPBackend.h>
#include <ATen/detail/PrivateUse1HooksInterface.h>
#include <ATen/native/DispatchStub.h>
#include <ATen/native/Resize.h>
#include <ATen/native/transformers/attention.h>
#include <ATen/ops/_reshape_alias_native.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/as_strided_native.h>
#include <ATen/ops/view_native.h>
#include <c10/core/Allocator.h>
#include <c10/core/CPUAllocator.h>
#include <c10/core/DeviceGuard.h>
#include <c10/core/impl/COW.h>
#include <c10/core/impl/DeviceGuardImplInterface.h>
#include <torch/csrc/jit/serialization/pickler.h>
#include <torch/library.h>

#include <torch_fallback/fallback.h>
#include <torch_fallback/kernels.h>

#include <array>
#include <atomic>
#include <cstring>
#include <string>
#include <unordered_map>
#include <vector>

#include "tinydev.h"

namespace tinydev {
namespace {

constexpr c10::DeviceType kTinydev = c10::DeviceType::PrivateUse1;
thread_local c10::DeviceIndex t_current_device = 0;
// Calls of each kernel of tinydev's that torch-fallback also offers.
enum OwnKernel { kView, kAsStrided, kReshapeAlias, kCopyFrom, kSdpChoice, kOwnKernels };
constexpr const char* kOwnKernelNames[kOwnKernels] = {"view", "as_strided", "_reshape_alias",
                                                      "_copy_from", "_fused_sdp_choice"};
std::array<std::atomic<int64_t>, kOwnKernels> g_own_kernel_calls{};

c10::Device tinydev_device(c10::DeviceIndex index) { return {kTinydev, index}; }

void check_index(c10::DeviceIndex index) {
  TORCH_CHECK_INDEX(index >= 0 && index < kDeviceCount, "tinydev: tinydev:", int(index),
                    " does not exist; there are ", int(kDeviceCount), " tinydev devices.");
}

// ---- memory ---------------------------------------------------------------

void free_owned(void* ptr) { free_locked(ptr); }

c10::DataPtr allocate_bytes(size_t nbytes, c10::DeviceIndex device) {
  void* ptr = allocate_locked(nbytes, device);
  return {ptr, ptr, &free_owned, tinydev_device(device)};
}

// Opens access to every non-null pointer given, for one scope (tinydev's own
// kernels; torch_openreg's MemoryGuard).
class AccessGuard {
 public:
  explicit AccessGuard(std::vector<const void*> data) : data_(std::move(data)) {
    for (size_t i = 0; i < data_.size(); ++i) {
      try {
        open_access(data_[i]);
      } catch (...) {
        data_.resize(i);
        close_all();
        throw;
      }
    }
  }
  ~AccessGuard() { close_all(); }
  AccessGuard(const AccessGuard&) = delete;
  AccessGuard& operator=(const AccessGuard&) = delete;

 private:
  void close_all() noexcept {
    for (const void* data : data_) close_access(data);
  }
  std::vector<const void*> data_;
};

class TinydevAllocator final : public c10::Allocator {
 public:
  c10::DataPtr allocate(size_t nbytes) override {
    return allocate_bytes(nbytes, t_current_device);
  }
  // Lazy clones (COW) materialize through here: both sides are locked pages.
  void copy_data(void* dest, const void* src, size_t count) const override {
    const AccessGuard access({dest, src});
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
  TORCH_CHECK(storage.data_ptr().get_deleter() == &free_owned,
              "tinydev: this storage was not allocated by tinydev's allocator.");
}

void resize_storage_bytes(const c10::Storage& storage, size_t nbytes) {
  TORCH_CHECK(storage.resizable(), "tinydev: this storage is not resizable.");
  c10::DataPtr fresh = allocate_bytes(nbytes, storage.device().index());
  const size_t keep = std::min(nbytes, storage.nbytes());
  if (keep > 0) {
    const AccessGuard access({fresh.get(), storage.data()});
    std::memcpy(fresh.get(), storage.data(), keep);
  }
  auto* impl = storage.unsafeGetStorageImpl();
  impl->set_data_ptr_noswap(std::move(fresh));
  impl->set_nbytes(nbytes);
}

// ---- the adapter: how torch-fallback sees tinydev's memory ------------------

void release_home_view(void* ctx) { delete static_cast<c10::Storage*>(ctx); }

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

// Results of the fallback are made on the CPU; with no `adopt`, torch-fallback
// copies each into memory tinydev's allocator makes (so its table knows it).
c10::Device output_home(c10::DeviceIndex /*index*/) { return c10::Device(c10::kCPU); }

// The pages are locked outside access: torch-fallback opens one around every
// home view it makes, for as long as that view lives.
void begin_access(const c10::Storage& storage) { open_access(storage.data()); }
void end_access(const c10::Storage& storage) { close_access(storage.data()); }

const torch_fallback::BackendAdapter& adapter() {
  static const torch_fallback::BackendAdapter instance = [] {
    torch_fallback::BackendAdapter tinydev{kTinydev, &home_device, &home_storage, &output_home,
                                           /*adopt=*/nullptr};
    tinydev.begin_access = &begin_access;
    tinydev.end_access = &end_access;
    return tinydev;  // lend_backend_meta stays false: tinydev's BackendMeta is its own
  }();
  return instance;
}
// [/readme:adapter]

// ---- native kernels: tinydev's memory, views, copies ------------------------

at::Tensor empty_memory_format(c10::SymIntArrayRef size, std::optional<at::ScalarType> dtype,
                               std::optional<at::Layout> /*layout*/,
                               std::optional<at::Device> device, std::optional<bool> /*pin*/,
                               std::optional<at::MemoryFormat> memory_format) {
  const c10::DeviceGuard guard(device.value_or(tinydev_device(t_current_device)));
  return at::detail::empty_generic(C10_AS_INTARRAYREF_SLOW(size), &g_allocator,
                                   c10::DispatchKeySet(c10::DispatchKey::PrivateUse1),
                                   c10::dtype_or_default(dtype), memory_format);
}

at::Tensor empty_strided(c10::SymIntArrayRef size, c10::SymIntArrayRef stride,
                         std::optional<at::ScalarType> dtype, std::optional<at::Layout> /*layout*/,
                         std::optional<at::Device> device, std::optional<bool> /*pin*/) {
  const c10::DeviceGuard guard(device.value_or(tinydev_device(t_current_device)));
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

// Views: at::native's own, as torch_openreg registers them.
at::Tensor view(const at::Tensor& self, c10::SymIntArrayRef size) {
  ++g_own_kernel_calls[kView];
  return at::native::view(self, C10_AS_INTARRAYREF_SLOW(size));
}

at::Tensor as_strided(const at::Tensor& self, c10::SymIntArrayRef size,
                      c10::SymIntArrayRef stride, std::optional<c10::SymInt> storage_offset) {
  ++g_own_kernel_calls[kAsStrided];
  return at::native::as_strided_tensorimpl(
      self, C10_AS_INTARRAYREF_SLOW(size), C10_AS_INTARRAYREF_SLOW(stride),
      storage_offset ? std::optional<int64_t>(storage_offset->expect_int()) : std::nullopt);
}

at::Tensor reshape_alias(const at::Tensor& self, c10::SymIntArrayRef size,
                         c10::SymIntArrayRef stride) {
  ++g_own_kernel_calls[kReshapeAlias];
  return at::native::_reshape_alias(self, C10_AS_INTARRAYREF_SLOW(size),
                                    C10_AS_INTARRAYREF_SLOW(stride));
}

// A CPU tensor over a tinydev or CPU tensor's bytes (no access opened).
at::Tensor on_cpu(const at::Tensor& tensor) {
  if (tensor.device().type() != kTinydev) return tensor;
  at::Tensor alias = at::empty({0}, tensor.options().device(c10::kCPU));
  alias.set_(home_storage(tensor.storage()), tensor.storage_offset(), tensor.sizes(),
             tensor.strides());
  alias._set_conj(tensor.is_conj());
  alias._set_neg(tensor.is_neg());
  return alias;
}

// Copies between tinydev and the CPU, or two tinydev tensors, under tinydev's
// own access guard; with CUDA on either side, torch-fallback's copy.
at::Tensor copy_from(const at::Tensor& self, const at::Tensor& dst, bool non_blocking) {
  ++g_own_kernel_calls[kCopyFrom];
  if (self.is_cuda() || dst.is_cuda()) {
    torch_fallback::copy_between(adapter(), self, dst, non_blocking);
    return dst;
  }
  std::vector<const void*> guarded;
  for (const at::Tensor* tensor : {&self, &dst}) {
    if (tensor->device().type() == kTinydev) guarded.push_back(tensor->storage().data());
  }
  const AccessGuard access(std::move(guarded));
  on_cpu(dst).copy_(on_cpu(self));
  return dst;
}

// The attention choice: always the math kernel (which runs through the fallback).
template <typename Fn>
struct OwnSdpChoice;
template <typename... Args>
struct OwnSdpChoice<int64_t (*)(Args...)> {
  static int64_t choose(Args... /*args*/) {
    ++g_own_kernel_calls[kSdpChoice];
    return static_cast<int64_t>(at::SDPBackend::math);
  }
};
using SdpChoiceFn = decltype(at::native::_fused_sdp_choice_stub)::FnPtr;

// ---- BackendMeta: tinydev's own, with its serialization hook ----------------

struct TinydevBackendMeta final : public c10::BackendMeta {
  explicit TinydevBackendMeta(int64_t version) : version(version) {}
  c10::intrusive_ptr<c10::BackendMeta> clone(
      const c10::intrusive_ptr<c10::BackendMeta>& /*ptr*/) const override {
    return c10::make_intrusive<TinydevBackendMeta>(version);
  }
  int64_t version;
};

// As torch_openreg's: it takes any BackendMeta on a tinydev tensor for its own,
// with no check. That holds because torch-fallback keeps nothing there unless
// the adapter lends it the slot (lend_backend_meta), which tinydev does not.
void serialize_meta(const at::Tensor& tensor, std::unordered_map<std::string, bool>& metadata) {
  c10::BackendMeta* meta = tensor.unsafeGetTensorImpl()->get_backend_meta();
  if (meta == nullptr) return;
  const auto* own = dynamic_cast<TinydevBackendMeta*>(meta);
  metadata["tinydev_meta_v" + std::to_string(own->version)] = true;
}

void deserialize_meta(const at::Tensor& tensor,
                      std::unordered_map<std::string, bool>& metadata) {
  for (const auto& [key, value] : metadata) {
    if (key.rfind("tinydev_meta_v", 0) == 0 && value) {
      const int64_t version = std::stoll(key.substr(std::string("tinydev_meta_v").size()));
      tensor.unsafeGetTensorImpl()->set_backend_meta(
          c10::make_intrusive<TinydevBackendMeta>(version));
    }
  }
}

const bool g_meta_serialization_registered = [] {
  torch::jit::TensorBackendMetaRegistry(kTinydev, &serialize_meta, &deserialize_meta);
  return true;
}();

void set_meta(const at::Tensor& tensor, int64_t version) {
  TORCH_CHECK(tensor.device().type() == kTinydev, "tinydev: set_meta takes a tinydev tensor");
  tensor.unsafeGetTensorImpl()->set_backend_meta(
      c10::make_intrusive<TinydevBackendMeta>(version));
}

int64_t meta_version(const at::Tensor& tensor) {
  c10::BackendMeta* meta = tensor.unsafeGetTensorImpl()->get_backend_meta();
  if (meta == nullptr) return 0;
  const auto* own = dynamic_cast<TinydevBackendMeta*>(meta);
  TORCH_CHECK(own != nullptr, "tinydev: a BackendMeta that is not tinydev's is on this tensor");
  return own->version;
}

// ---- the devices: two tinydev devices, their guard and hooks ----------------

struct TinydevGuardImpl final : public c10::impl::DeviceGuardImplInterface {
  static constexpr c10::DeviceType static_type = kTinydev;

  c10::DeviceType type() const override { return static_type; }
  c10::Device exchangeDevice(c10::Device device) const override {
    const c10::Device previous = getDevice();
    setDevice(device);
    return previous;
  }
  c10::Device getDevice() const override { return tinydev_device(t_current_device); }
  void setDevice(c10::Device device) const override {
    if (!device.has_index()) return;
    check_index(device.index());
    t_current_device = device.index();
  }
  void uncheckedSetDevice(c10::Device device) const noexcept override {
    if (device.has_index()) t_current_device = device.index();
  }
  c10::Stream getStream(c10::Device device) const override {
    return c10::Stream(c10::Stream::DEFAULT, device);
  }
  c10::Stream getDefaultStream(c10::Device device) const override {
    return c10::Stream(c10::Stream::DEFAULT, device);
  }
  c10::Stream exchangeStream(c10::Stream stream) const override {
    return c10::Stream(c10::Stream::DEFAULT, stream.device());
  }
  c10::DeviceIndex deviceCount() const noexcept override { return kDeviceCount; }
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
  c10::DeviceIndex deviceCount() const override { return kDeviceCount; }
  c10::DeviceIndex getCurrentDevice() const override { return t_current_device; }
  // Random ops run on the fallback's target and draw from its generator.
  const at::Generator& getDefaultGenerator(c10::DeviceIndex /*index*/) const override {
    return at::detail::getDefaultCPUGenerator();
  }
  // From the allocation table, as torch_openreg answers it.
  at::Device getDeviceFromPtr(void* data) const override {
    const std::optional<c10::DeviceIndex> device = device_of(data);
    TORCH_CHECK(device.has_value(), "tinydev: ", data, " is not memory tinydev allocated.");
    return tinydev_device(*device);
  }
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

int64_t own_kernel_calls(const std::string& name) {
  for (int kernel = 0; kernel < kOwnKernels; ++kernel) {
    if (name == kOwnKernelNames[kernel]) return g_own_kernel_calls[kernel].load();
  }
  TORCH_CHECK(false, "tinydev has no kernel of its own named ", name);
}

// ---- registration ----------------------------------------------------------

TORCH_LIBRARY_FRAGMENT(tinydev, m) {
  // tinydev's own BackendMeta (a version number), which torch.save keeps.
  m.def("set_meta(Tensor tensor, int version) -> ()", &set_meta);
  m.def("meta_version(Tensor tensor) -> int", &meta_version);
  // The current tinydev device of this thread (the device guard's).
  m.def("current_device", []() { return static_cast<int64_t>(t_current_device); });
  m.def("set_device", [](int64_t index) {
    check_index(static_cast<c10::DeviceIndex>(index));
    t_current_device = static_cast<c10::DeviceIndex>(index);
  });
}

// [readme:registration]
TORCH_LIBRARY_IMPL(aten, PrivateUse1, m) {
  m.impl("empty.memory_format", TORCH_FN(empty_memory_format));
  m.impl("empty_strided", TORCH_FN(empty_strided));
  m.impl("resize_", TORCH_FN(resize_));
  m.impl("view", TORCH_FN(view));
  m.impl("as_strided", TORCH_FN(as_strided));
  m.impl("_reshape_alias", TORCH_FN(reshape_alias));
  m.impl("_copy_from", TORCH_FN(copy_from));
  // Last: registers what tinydev has no kernel for (other views, _copy_from_and_resize,
  // ops run whole), leaving tinydev's own kernels and attention choice in place.
  torch_fallback::register_kernels<&adapter>(m);
}

// Every other aten op, for tinydev tensors: torch-fallback's boxed fallback.
TORCH_LIBRARY_IMPL(_, PrivateUse1, m) {
  m.fallback(torch_fallback::boxed_fallback_for<&adapter>());
}
// [/readme:registration]

}  // namespace tinydev

// tinydev's own attention choice (the macro works in this namespace only).
namespace at::native {
REGISTER_PRIVATEUSE1_DISPATCH(_fused_sdp_choice_stub,
                              &tinydev::OwnSdpChoice<tinydev::SdpChoiceFn>::choose);
}  // namespace at::native
