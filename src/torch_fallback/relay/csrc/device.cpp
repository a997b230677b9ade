// relay devices: the current device, the device guard and the hooks that
// PyTorch asks of a PrivateUse1 backend.
#include <ATen/detail/CUDAHooksInterface.h>
#include <ATen/detail/PrivateUse1HooksInterface.h>
#include <c10/core/CPUAllocator.h>
#include <ATen/CPUGeneratorImpl.h>
#include <c10/core/impl/DeviceGuardImplInterface.h>

#include <torch_fallback/cuda.h>
#include "relay.h"

namespace torch_fallback::relay {
namespace {

thread_local c10::DeviceIndex t_current_device = 0;

void check_index(c10::DeviceIndex index) {
  TORCH_CHECK_INDEX(index >= 0 && index < device_count(), "torch_fallback: relay:",
                    static_cast<int>(index), " does not exist; there are ",
                    static_cast<int>(device_count()), " relay device(s).");
}

struct RelayGuardImpl final : public c10::impl::DeviceGuardImplInterface {
  static constexpr c10::DeviceType static_type = c10::DeviceType::PrivateUse1;

  c10::DeviceType type() const override { return static_type; }

  c10::Device exchangeDevice(c10::Device device) const override {
    const c10::Device previous = getDevice();
    if (device.index() != previous.index()) setDevice(device);
    return previous;
  }

  c10::Device getDevice() const override { return {static_type, t_current_device}; }

  void setDevice(c10::Device device) const override {
    TORCH_CHECK(device.type() == static_type, "torch_fallback: expected a relay device, got ",
                device);
    if (device.has_index()) relay::set_device(device.index());
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

  c10::DeviceIndex deviceCount() const noexcept override { return relay::device_count(); }

  // relay work is ordered on one stream per device, so events are complete on record.
  void record(void** /*event*/, const c10::Stream& /*stream*/, c10::DeviceIndex /*index*/,
              c10::EventFlag /*flag*/) const override {}
  void block(void* /*event*/, const c10::Stream& /*stream*/) const override {}
  bool queryEvent(void* /*event*/) const override { return true; }
  void destroyEvent(void* /*event*/, c10::DeviceIndex /*index*/) const noexcept override {}

  bool queryStream(const c10::Stream& /*stream*/) const override { return true; }
  void synchronizeStream(const c10::Stream& stream) const override {
    relay::synchronize(stream.device_index());
  }
  void synchronizeDevice(c10::DeviceIndex index) const override { relay::synchronize(index); }
};

C10_REGISTER_GUARD_IMPL(PrivateUse1, RelayGuardImpl);

struct RelayHooks final : public at::PrivateUse1HooksInterface {
  bool isBuilt() const override { return true; }
  bool isAvailable() const override { return true; }
  bool hasPrimaryContext(c10::DeviceIndex /*index*/) const override { return true; }

  // Random ops run on the fallback target, whose own generator they use.
  const at::Generator& getDefaultGenerator(c10::DeviceIndex /*index*/) const override {
    return at::detail::getDefaultCPUGenerator();
  }

  at::Device getDeviceFromPtr(void* /*data*/) const override {
    return {c10::DeviceType::PrivateUse1, t_current_device};
  }

  c10::DeviceIndex deviceCount() const override { return relay::device_count(); }
  void setCurrentDevice(c10::DeviceIndex index) const override { relay::set_device(index); }
  c10::DeviceIndex getCurrentDevice() const override { return t_current_device; }
  c10::DeviceIndex exchangeDevice(c10::DeviceIndex index) const override {
    const c10::DeviceIndex previous = t_current_device;
    relay::set_device(index);
    return previous;
  }
  c10::DeviceIndex maybeExchangeDevice(c10::DeviceIndex index) const override {
    return exchangeDevice(index);
  }

  // non_blocking copies to the host ask for pinned memory: CUDA's where a GPU
  // is visible (relay's CUDA home copies through it), plain host memory else.
  bool isPinnedPtr(const void* data) const override {
    return cuda::device_count() > 0 && at::detail::getCUDAHooks().isPinnedPtr(data);
  }
  c10::Allocator* getPinnedMemoryAllocator() const override {
    return cuda::device_count() > 0 ? at::detail::getCUDAHooks().getPinnedMemoryAllocator()
                                    : c10::GetCPUAllocator();
  }

  void resizePrivateUse1Bytes(const c10::Storage& storage, size_t nbytes) const override {
    resize_storage_bytes(storage, nbytes);
  }
};

const bool g_hooks_registered = [] {
  at::RegisterPrivateUse1HooksInterface(new RelayHooks());
  return true;
}();

}  // namespace

c10::DeviceIndex device_count() { return std::max<c10::DeviceIndex>(1, cuda::device_count()); }

c10::DeviceIndex current_device() { return t_current_device; }

void set_device(c10::DeviceIndex index) {
  check_index(index);
  t_current_device = index;
}

void synchronize(c10::DeviceIndex index) {
  // Host work is synchronous; only the CUDA side (CUDA homes, the CUDA target) can be pending.
  if (cuda::device_count() == 0) return;
  cuda::DeviceScope scope(index < 0 ? t_current_device : index);
  cuda::device_synchronize();
}

}  // namespace torch_fallback::relay
