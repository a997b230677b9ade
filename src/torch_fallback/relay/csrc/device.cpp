// relay devices: the current device, the device guard and the hooks that
// PyTorch asks of a PrivateUse1 backend.
#include <ATen/Context.h>
#include <ATen/detail/CUDAHooksInterface.h>
#include <ATen/detail/PrivateUse1HooksInterface.h>
#include <ATen/core/grad_mode.h>
#include <ATen/ops/zeros.h>
#include <c10/core/DeviceGuard.h>

#include <atomic>
#include <c10/core/impl/DeviceGuardImplInterface.h>
#include <c10/util/ApproximateClock.h>
#include <torch/csrc/autograd/engine.h>
#include <torch/csrc/distributed/c10d/reducer_timer.hpp>
#include <torch/csrc/profiler/stubs/base.h>
#include <torch/version.h>

#include <pthread.h>

#include <memory>
#include <thread>
#include <type_traits>
#include <utility>
#include <vector>

#include <torch_fallback/cuda.h>
#include "relay.h"

namespace torch_fallback::relay {
namespace {

thread_local c10::DeviceIndex t_current_device = 0;

// Set once autograd's engine has started its device threads: each of them
// sets its device through the guard when it starts.
std::atomic<bool> g_autograd_device_threads{false};

// The CUDA device guard of the GPU that serves relay:`index`, or nullptr.
const c10::impl::DeviceGuardImplInterface* cuda_impl(c10::DeviceIndex index) {
  if (index < 0 || index >= cuda::device_count() || !c10::impl::hasDeviceGuardImpl(c10::kCUDA)) {
    return nullptr;
  }
  return c10::impl::getDeviceGuardImpl(c10::kCUDA);
}

// A relay stream and the CUDA stream of the same id on the GPU serving its device.
c10::Stream as_cuda(const c10::Stream& relay_stream) {
  return c10::Stream(c10::Stream::UNSAFE, c10::Device(c10::kCUDA, relay_stream.device_index()),
                     relay_stream.id());
}

c10::Stream as_relay(const c10::Stream& cuda_stream, c10::Device device) {
  return c10::Stream(c10::Stream::UNSAFE, device, cuda_stream.id());
}

// torch.Stream("relay") names no index: the current device's, as CUDA's streams take it.
c10::Device with_index(c10::Device device) {
  return device.has_index() ? device : c10::Device(device.type(), t_current_device);
}

// torch.accelerator.get_device_capability: relay tensors hold every dtype their
// target does, which is what the default capability says. The query exists
// from PyTorch 2.10; older interfaces lack the method, and get no override.
template <typename Interface>
using DeviceCapabilityOf = decltype(std::declval<const Interface&>().getDeviceCapability(
    std::declval<c10::Device>()));

template <typename Interface, typename = void>
struct WithDeviceCapability : Interface {};

template <typename Interface>
struct WithDeviceCapability<Interface, std::void_t<DeviceCapabilityOf<Interface>>> : Interface {
  DeviceCapabilityOf<Interface> getDeviceCapability(c10::Device /*device*/) const override {
    return {};
  }
};

struct RelayGuardImpl final : public WithDeviceCapability<c10::impl::DeviceGuardImplInterface> {
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
    g_autograd_device_threads.store(true, std::memory_order_relaxed);
    if (device.has_index()) relay::set_device(device.index());
  }

  void uncheckedSetDevice(c10::Device device) const noexcept override {
    if (device.has_index()) t_current_device = device.index();
  }

  // Where a GPU serves the device, a relay stream is the CUDA stream of the same
  // id on that GPU: the stream relay's CUDA kernels run on. Autograd records
  // each node's stream at the forward and makes it current for the node's
  // backward (on the engine's device thread), so relay's backward kernels run
  // where the forward's did: on a CUDA graph's capture stream, or on a side
  // stream. Without a GPU, work is ordered on the host: one stream.
  c10::Stream getStream(c10::Device named) const override {
    const c10::Device device = with_index(named);
    if (const auto* cuda = cuda_impl(device.index())) {
      return as_relay(cuda->getStream({c10::kCUDA, device.index()}), device);
    }
    return c10::Stream(c10::Stream::DEFAULT, device);
  }

  c10::Stream getDefaultStream(c10::Device named) const override {
    const c10::Device device = with_index(named);
    return c10::Stream(c10::Stream::DEFAULT, device);
  }

  c10::Stream exchangeStream(c10::Stream stream) const override {
    const c10::Device device = stream.device();
    if (const auto* cuda = cuda_impl(device.index())) {
      return as_relay(cuda->exchangeStream(as_cuda(stream)), device);
    }
    return c10::Stream(c10::Stream::DEFAULT, device);
  }

  c10::DeviceIndex deviceCount() const noexcept override { return relay::device_count(); }

  // torch.Stream("relay"): a new CUDA stream of the device's GPU where one serves
  // it, else the device's one stream.
  c10::Stream getNewStream(c10::Device named, int priority) const override {
    const c10::Device device = with_index(named);
    if (const auto* cuda = cuda_impl(device.index())) {
      return as_relay(cuda->getNewStream({c10::kCUDA, device.index()}, priority), device);
    }
    return c10::Stream(c10::Stream::DEFAULT, device);
  }

  c10::Stream getStreamFromGlobalPool(c10::Device named, bool high_priority) const override {
    const c10::Device device = with_index(named);
    if (const auto* cuda = cuda_impl(device.index())) {
      return as_relay(cuda->getStreamFromGlobalPool({c10::kCUDA, device.index()}, high_priority),
                      device);
    }
    return c10::Stream(c10::Stream::DEFAULT, device);
  }

  // relay work runs in order on the host, or on the current CUDA stream of the
  // device's GPU (a CUDA home or target). Where a GPU serves the device, an event
  // is a CUDA event on that stream, so that c10 futures (c10d's, DDP's) order
  // their consumers after the GPU work they wait for; elsewhere events are
  // complete on record.
  void record(void** event, const c10::Stream& stream, c10::DeviceIndex index,
              c10::EventFlag flag) const override {
    const c10::DeviceIndex device = index >= 0 ? index : stream.device_index();
    if (const auto* cuda = cuda_impl(device)) cuda->record(event, as_cuda(stream), device, flag);
  }
  void block(void* event, const c10::Stream& stream) const override {
    const auto* cuda = cuda_impl(stream.device_index());
    if (event != nullptr && cuda != nullptr) cuda->block(event, as_cuda(stream));
  }
  bool queryEvent(void* event) const override {
    return event == nullptr || c10::impl::getDeviceGuardImpl(c10::kCUDA)->queryEvent(event);  // only a GPU makes events
  }
  void synchronizeEvent(void* event) const override {
    if (event != nullptr) c10::impl::getDeviceGuardImpl(c10::kCUDA)->synchronizeEvent(event);
  }
  void destroyEvent(void* event, c10::DeviceIndex index) const noexcept override {
    if (event != nullptr) c10::impl::getDeviceGuardImpl(c10::kCUDA)->destroyEvent(event, index);
  }

  double elapsedTime(void* start, void* end, const c10::DeviceIndex index) const override {
    TORCH_CHECK(start != nullptr && end != nullptr,
                "torch_fallback: torch.Event on relay times work only where a GPU serves the "
                "device (a CUDA home or target); elsewhere use "
                "torch.relay.Event(enable_timing=True), which times on the host.");
    return c10::impl::getDeviceGuardImpl(c10::kCUDA)->elapsedTime(start, end, index);
  }

  bool queryStream(const c10::Stream& stream) const override {
    const auto* cuda = cuda_impl(stream.device_index());
    return cuda == nullptr || cuda->queryStream(as_cuda(stream));
  }
  void synchronizeStream(const c10::Stream& stream) const override {
    relay::synchronize(stream.device_index());
  }
  void synchronizeDevice(c10::DeviceIndex index) const override { relay::synchronize(index); }
};

C10_REGISTER_GUARD_IMPL(PrivateUse1, RelayGuardImpl);

// DDP's runtime statistics (its logger's forward, backward and communication
// times) need a timer for the parameters' device type; without one DDP warns
// and records none. relay's is the CPU's, PyTorch's own, which reads the host
// clock: on a GPU home it times the host's side of the work, which CUDA's
// times with events. Registered at the lowest priority and only where none is:
// a timer torch registers for PrivateUse1 itself is left in place.
const bool g_timer_registered = [] {
  auto* timers = c10d::TimerRegistry();
  if (!timers->Has(c10::kPrivateUse1)) {
    timers->Register(
        c10::kPrivateUse1,
        [](c10::Device device) { return c10d::TimerRegistry()->Create(c10::kCPU, device); },
        c10::REGISTRY_FALLBACK);
  }
  return true;
}();

struct RelayHooks final : public at::PrivateUse1HooksInterface {
  bool isBuilt() const override { return true; }
  bool isAvailable() const override { return true; }
  bool hasPrimaryContext(c10::DeviceIndex /*index*/) const override { return true; }

  const at::Generator& getDefaultGenerator(c10::DeviceIndex index) const override {
    return default_generator(index);
  }
  at::Generator getNewGenerator(c10::DeviceIndex index) const override {
    return new_generator(index);
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

  // Tensor.pin_memory() and non_blocking copies to the host ask for pinned memory.
  bool isPinnedPtr(const void* data) const override { return is_pinned(data); }
  c10::Allocator* getPinnedMemoryAllocator() const override { return pinned_allocator(); }

  void resizePrivateUse1Bytes(const c10::Storage& storage, size_t nbytes) const override {
    resize_storage_bytes(storage, nbytes);
  }
};

// torch.autograd.profiler.profile(use_device="relay") times relay's work with
// these, as it times CUDA's with CUDA events. relay's work is done once its
// device is synchronized (host-homed work when its call returns), so the host's
// clock after a synchronize marks where the device is.
struct RelayProfilerStubs final : torch::profiler::impl::ProfilerStubs {
  void record(c10::DeviceIndex* device, torch::profiler::impl::ProfilerVoidEventStub* event,
              int64_t* cpu_ns) const override {
    const c10::DeviceIndex index = t_current_device;
    if (device != nullptr) *device = index;
    relay::synchronize(index);
    const int64_t now = c10::getTime();
    if (cpu_ns != nullptr) *cpu_ns = now;
    *event = std::make_shared<int64_t>(now);
  }
  float elapsed(const torch::profiler::impl::ProfilerVoidEventStub* start,
                const torch::profiler::impl::ProfilerVoidEventStub* end) const override {
    const int64_t ns =
        *static_cast<const int64_t*>(end->get()) - *static_cast<const int64_t*>(start->get());
    return static_cast<float>(ns) / 1000.0f;  // microseconds, as CUDA's stubs give
  }
  void mark(const char* /*name*/) const override {}
  void rangePush(const char* /*name*/) const override {}
  void rangePop() const override {}
  bool enabled() const override { return true; }
  void onEachDevice(std::function<void(int)> op) const override {
    const c10::DeviceIndex previous = t_current_device;
    for (c10::DeviceIndex index = 0; index < relay::device_count(); ++index) {
      relay::set_device(index);
      op(index);
    }
    relay::set_device(previous);
  }
  void synchronize() const override { relay::synchronize(t_current_device); }
};

const bool g_hooks_registered = [] {
  static RelayProfilerStubs profiler_stubs;
  torch::profiler::impl::registerPrivateUse1Methods(&profiler_stubs);
  at::RegisterPrivateUse1HooksInterface(new RelayHooks());
  // Initialized at once (its init does nothing): PyTorch reports no pointer as
  // pinned for an accelerator not yet initialized, and DDP's reducer asserts that
  // the pinned buffer it allocates for relay parameters is pinned.
#if TORCH_VERSION_MAJOR > 2 || (TORCH_VERSION_MAJOR == 2 && TORCH_VERSION_MINOR >= 6)
  at::globalContext().lazyInitDevice(c10::DeviceType::PrivateUse1);
#else
  at::globalContext().lazyInitPrivateUse1();
#endif
  return true;
}();

}  // namespace

c10::DeviceIndex device_count() { return std::max<c10::DeviceIndex>(1, cuda::device_count()); }

c10::DeviceIndex current_device() { return t_current_device; }

void check_device_index(int64_t index) {
  TORCH_CHECK_INDEX(index >= 0 && index < device_count(), "torch_fallback: relay:", index,
                    " does not exist; there are ", static_cast<int>(device_count()),
                    " relay device(s).");
}

void set_device(c10::DeviceIndex index) {
  check_device_index(index);
  t_current_device = index;
  // relay:N keeps its GPU memory on cuda:N: make that GPU current too, as NCCL and
  // the CUDA target expect (torch.cuda.set_device's effect).
  if (index < cuda::device_count()) cuda::set_device(index);
}

void synchronize(c10::DeviceIndex index) {
  // Host work is synchronous; only the CUDA side (CUDA homes, the CUDA target) can be pending.
  if (cuda::device_count() == 0) return;
  cuda::DeviceScope scope(index < 0 ? t_current_device : index);
  cuda::device_synchronize();
}

namespace {

using torch::autograd::Engine;
using torch::autograd::ReadyQueue;

// Autograd's engine starts its device threads once, at the first backward: one
// per device index that the device types registered then have. Its queues are
// protected members; a derived type names them.
struct EngineAccess : Engine {
  static std::vector<std::shared_ptr<ReadyQueue>>& queues(Engine& engine) {
    return engine.*(&EngineAccess::device_ready_queues_);
  }
  static bool started(Engine& engine) {
    return engine.*(&EngineAccess::thread_pool_shared_) != nullptr;
  }
};

size_t g_queues_before_relay = 0;

// A fork child has none of the parent's threads: it gets the engine's own
// queues back, so that a relay backward there fails as before instead of
// waiting on a queue no thread serves.
void drop_relay_queues_in_fork_child() {
  EngineAccess::queues(Engine::get_default_engine()).resize(g_queues_before_relay);
}

}  // namespace

void add_autograd_device_threads() {
  Engine& engine = Engine::get_default_engine();
  // Not started: its first backward counts relay's devices itself.
  if (!EngineAccess::started(engine)) return;
  auto& queues = EngineAccess::queues(engine);
  const auto wanted = static_cast<size_t>(device_count());
  if (queues.size() >= wanted) return;
  g_queues_before_relay = queues.size();
  pthread_atfork(nullptr, nullptr, &drop_relay_queues_in_fork_child);
  for (size_t index = queues.size(); index < wanted; ++index) {
    auto queue = std::make_shared<ReadyQueue>();
    queues.push_back(queue);
    std::thread(&Engine::thread_init, &engine, static_cast<int>(index), queue, true).detach();
  }
}

void finish_autograd_work() {
  if (!g_autograd_device_threads.load(std::memory_order_relaxed)) return;
  // A device thread runs its tasks in order and drops each graph before taking
  // the next task, so once a backward of our own has run on every relay
  // device, no device thread holds a user's graph (or the Python objects in
  // it) any more. This backward's graph holds no Python object.
  const at::AutoGradMode grad_mode(true);
  // Multithreading is per thread: off on the exiting thread, the drain would run
  // there and leave the device threads' last graphs alive.
  c10::AutogradState& state = c10::AutogradState::get_tls_state();
  const bool multithreading = state.get_multithreading_enabled();
  state.set_multithreading_enabled(true);
  for (c10::DeviceIndex index = 0; index < device_count(); ++index) {
    const c10::Device device(c10::DeviceType::PrivateUse1, index);
    const c10::DeviceGuard guard(device);
    at::Tensor leaf = at::zeros({}, at::TensorOptions().device(device)).requires_grad_(true);
    leaf.sum().backward();
  }
  state.set_multithreading_enabled(multithreading);
}

}  // namespace torch_fallback::relay
