// relay memory: the allocator, the home of each storage, and zero-copy views
// between relay storages and CPU or CUDA storages.
#include <unistd.h>

#include <array>
#include <atomic>
#include <map>
#include <mutex>
#include <utility>

#include <ATen/Context.h>
#include <ATen/ops/from_blob.h>
#include <c10/core/CPUAllocator.h>
#include <c10/core/impl/alloc_cpu.h>
#include <ATen/detail/CUDAHooksInterface.h>
#include <c10/core/DeviceGuard.h>
#include <c10/core/impl/COW.h>

#include <torch/version.h>
#include <torch_fallback/cuda.h>
#include "relay.h"

// torch.accelerator's memory calls ask the device's allocator for them as a
// c10::DeviceAllocator (PyTorch 2.9 on); before, they did not exist.
#if TORCH_VERSION_MAJOR > 2 || (TORCH_VERSION_MAJOR == 2 && TORCH_VERSION_MINOR >= 9)
#include <c10/core/CachingDeviceAllocator.h>
#define RELAY_DEVICE_ALLOCATOR 1
#else
#define RELAY_DEVICE_ALLOCATOR 0
#endif

namespace torch_fallback::relay {
namespace {

std::atomic<Home> g_home{Home::Host};

// Bytes held by relay tensors per relay device, both homes, adopted results included.
constexpr int kMaxDevices = 64;
struct Counter {
  std::atomic<int64_t> allocated{0};
  std::atomic<int64_t> peak{0};
};
Counter g_counters[kMaxDevices];

void count_allocation(c10::DeviceIndex index, int64_t nbytes) {
  Counter& counter = g_counters[index];
  const int64_t now = counter.allocated.fetch_add(nbytes, std::memory_order_relaxed) + nbytes;
  int64_t peak = counter.peak.load(std::memory_order_relaxed);
  while (now > peak && !counter.peak.compare_exchange_weak(peak, now)) {
  }
}

// A relay DataPtr's context is the CPU or CUDA StorageImpl that owns its memory
// (allocated for relay, or a result relay took over), one reference held: that
// is also the storage the fallback runs kernels on, so that a call allocates
// none. The deleter drops the reference and counts the bytes off its relay
// device; there is one per device index, and it doubles as the tag of a relay
// DataPtr.
template <c10::DeviceIndex Index>
void release_home(void* ctx) {
  auto home = c10::intrusive_ptr<c10::StorageImpl>::reclaim(static_cast<c10::StorageImpl*>(ctx));
  g_counters[Index].allocated.fetch_sub(static_cast<int64_t>(home->nbytes()),
                                        std::memory_order_relaxed);
}

template <size_t... Index>
constexpr std::array<c10::DeleterFnPtr, sizeof...(Index)> release_homes(
    std::index_sequence<Index...> /*indices*/) {
  return {&release_home<static_cast<c10::DeviceIndex>(Index)>...};
}

constexpr std::array<c10::DeleterFnPtr, kMaxDevices> kReleaseHome =
    release_homes(std::make_index_sequence<kMaxDevices>());

void release_backend_storage(void* ctx) { delete static_cast<c10::Storage*>(ctx); }

// The StorageImpl a relay storage's memory lives in, or nullptr for memory
// relay did not allocate.
C10_ALWAYS_INLINE c10::StorageImpl* home_impl_of(const c10::Storage& storage) {
  const c10::DataPtr& data = storage.data_ptr();
  const c10::DeviceIndex index = data.device().index();
  if (index < 0 || index >= kMaxDevices || data.get_deleter() != kReleaseHome[index]) {
    return nullptr;
  }
  return static_cast<c10::StorageImpl*>(data.get_context());
}

c10::Device relay_device(c10::DeviceIndex index) {
  return c10::Device(c10::DeviceType::PrivateUse1, index);
}

c10::DataPtr relay_data_ptr(c10::Storage home, c10::DeviceIndex index) {
  TORCH_CHECK(index >= 0 && index < kMaxDevices, "torch_fallback: relay supports devices 0 to ",
              kMaxDevices - 1, ", not relay:", static_cast<int>(index), ".");
  count_allocation(index, static_cast<int64_t>(home.nbytes()));
  void* data = home.mutable_data();
  return {data, home.unsafeReleaseStorageImpl(), kReleaseHome[index], relay_device(index)};
}

// The relay storage of an op's result: one per result of every call. Each
// thread keeps the memory of those it freed for its next ones: in a model's
// forward, which allocates hundreds of objects between two frees, a malloc and
// a free cost more than the rest of the adoption.
class AdoptedStorage final : public c10::StorageImpl {
 public:
  using c10::StorageImpl::StorageImpl;
  static void* operator new(size_t size);
  static void operator delete(void* block);
};

// Trivially constructed and destroyed, so that it is usable whenever a storage
// dies, even after this thread's destructors ran (then it stops keeping memory).
struct FreedBlocks {
  static constexpr int kCapacity = 256;
  void* blocks[kCapacity];
  int count;
  bool released_at_exit;  // FreedBlocksRelease will give the blocks back
  bool closing;           // it has: the thread is ending
};
thread_local FreedBlocks t_freed{};

// Returns a thread's kept blocks to the heap when the thread ends.
struct FreedBlocksRelease {
  FreedBlocks* freed = nullptr;
  ~FreedBlocksRelease() {
    freed->closing = true;
    while (freed->count > 0) ::operator delete(freed->blocks[--freed->count]);
  }
};

void* AdoptedStorage::operator new(size_t size) {
  FreedBlocks& freed = t_freed;
  if (size == sizeof(AdoptedStorage) && freed.count > 0) return freed.blocks[--freed.count];
  return ::operator new(size);
}

// A thread's first block, and any once it ends or keeps enough.
C10_NOINLINE void keep_or_free(FreedBlocks& freed, void* block) {
  if (!freed.released_at_exit && !freed.closing) {
    thread_local FreedBlocksRelease release;
    release.freed = &freed;
    freed.released_at_exit = true;
  }
  if (freed.closing || freed.count == FreedBlocks::kCapacity) {
    ::operator delete(block);
    return;
  }
  freed.blocks[freed.count++] = block;
}

void AdoptedStorage::operator delete(void* block) {
  FreedBlocks& freed = t_freed;
  if (C10_LIKELY(freed.released_at_exit && !freed.closing &&
                 freed.count < FreedBlocks::kCapacity)) {
    freed.blocks[freed.count++] = block;
    return;
  }
  keep_or_free(freed, block);
}

c10::Storage storage_from(c10::Allocator* allocator, size_t nbytes) {
  return c10::Storage(c10::Storage::use_byte_size_t(), nbytes, allocator->allocate(nbytes),
                      allocator, /*resizable=*/false);
}

// Host memory is page-locked while the fallback runs ops on a GPU, so that its
// copies to and from the GPU are asynchronous and run at full speed.
c10::Allocator* host_allocator() {
  if (cuda::device_count() > 0 && targets_cuda()) {
    return at::detail::getCUDAHooks().getPinnedMemoryAllocator();
  }
  return c10::GetCPUAllocator();
}

// A GPU home needs a GPU; without one, the way out is the host home, whatever the target.
C10_NOINLINE void refuse_gpu_home() {
  TORCH_CHECK(false, "torch_fallback: relay's home is 'cuda' (torch_fallback.relay.set_home('cuda') ",
              "or TORCH_FALLBACK_RELAY_HOME=cuda), which keeps relay tensors in GPU memory, but ",
              cuda::built() ? "no GPU is visible (torch.cuda.device_count() == 0)"
                            : "this PyTorch was built without CUDA",
              ". Keep them in host memory: torch_fallback.relay.set_home('cpu'), or unset "
              "TORCH_FALLBACK_RELAY_HOME.");
}

void check_gpu_home_usable() {
  if (C10_UNLIKELY(cuda::device_count() == 0)) refuse_gpu_home();
}

c10::DataPtr allocate_on(Home home, c10::DeviceIndex index, size_t nbytes) {
  if (home == Home::Host) return relay_data_ptr(storage_from(host_allocator(), nbytes), index);
  check_gpu_home_usable();
  TORCH_CHECK(index < cuda::device_count(), "torch_fallback: relay:", static_cast<int>(index),
              " homes its memory on cuda:", static_cast<int>(index), ", but only ",
              static_cast<int>(cuda::device_count()), " GPU(s) are visible.");
  // The CUDA caching allocator exists once CUDA is initialised; no CUDA op may have run yet.
  at::globalContext().lazyInitDevice(c10::kCUDA);
  c10::DeviceGuard guard(c10::Device(c10::kCUDA, index));
  return relay_data_ptr(storage_from(c10::GetAllocator(c10::kCUDA), nbytes), index);
}

// The device whose memory `ptr` points into: a GPU's, or the host's.
c10::Device device_of_pointer(const void* ptr) {
  if (cuda::device_count() == 0) return c10::Device(c10::kCPU);
  // Page-locked host memory is host memory, although CUDA knows it.
  if (at::detail::getCUDAHooks().isPinnedPtr(ptr)) return c10::Device(c10::kCPU);
  try {
    return at::detail::getCUDAHooks().getDeviceFromPtr(const_cast<void*>(ptr));
  } catch (const c10::Error&) {
    return c10::Device(c10::kCPU);  // host memory, unknown to CUDA
  }
}

at::Tensor bytes_at(const void* ptr, size_t count, c10::Device device) {
  return at::from_blob(const_cast<void*>(ptr), {static_cast<int64_t>(count)},
                       at::TensorOptions().dtype(at::kByte).device(device));
}

#if RELAY_DEVICE_ALLOCATOR
using AllocatorBase = c10::DeviceAllocator;

// CUDA's caching allocator, which relay's GPU memory comes from, or null.
c10::DeviceAllocator* cuda_allocator() {
  if (cuda::device_count() == 0) return nullptr;
  return dynamic_cast<c10::DeviceAllocator*>(c10::GetAllocator(c10::DeviceType::CUDA));
}
#else
using AllocatorBase = c10::Allocator;
#endif

class RelayAllocator final : public AllocatorBase {
 public:
  c10::DataPtr allocate(size_t nbytes) override {
    return allocate_on(current_home(), current_device(), nbytes);
  }

#if RELAY_DEVICE_ALLOCATOR
  // torch.accelerator.memory_allocated, memory_stats, empty_cache, ... (and the
  // libraries that call them, accelerate's clear_device_cache among them).
  bool initialized() override { return true; }
  // relay keeps no cache of its own: its GPU memory comes from CUDA's caching
  // allocator, whose cache this empties, as torch.relay.empty_cache() does.
  void emptyCache(c10::MempoolId_t /*mempool_id*/) override {
    if (auto* cuda = cuda_allocator()) cuda->emptyCache();
  }
  // One ordered stream per device: memory is never reused ahead of its stream.
  void recordStream(const c10::DataPtr& /*ptr*/, c10::Stream /*stream*/) override {}
  c10::CachingDeviceAllocator::DeviceStats getDeviceStats(c10::DeviceIndex device) override {
    const MemoryFigures figures = memory_figures(device);
    c10::CachingDeviceAllocator::DeviceStats stats;
    // relay holds exactly what its tensors hold: allocated, reserved and active agree.
    for (auto* stat : {&stats.allocated_bytes, &stats.reserved_bytes, &stats.active_bytes,
                       &stats.requested_bytes}) {
      auto& all = (*stat)[static_cast<size_t>(c10::CachingAllocator::StatType::AGGREGATE)];
      all.current = figures.allocated;
      all.peak = figures.peak;
    }
    return stats;
  }
  void resetAccumulatedStats(c10::DeviceIndex /*device*/) override {}
  void resetPeakStats(c10::DeviceIndex device) override { reset_peak(device); }
#if TORCH_VERSION_MAJOR > 2 || (TORCH_VERSION_MAJOR == 2 && TORCH_VERSION_MINOR >= 10)
  // Free and total bytes where new relay tensors go (accelerate sizes
  // device_map="auto" by it): the GPU's with a CUDA home, else the host's.
  std::pair<size_t, size_t> getMemoryInfo(c10::DeviceIndex device) override {
    if (current_home() == Home::Cuda) {
      auto* cuda = cuda_allocator();
      TORCH_CHECK(cuda != nullptr, "torch_fallback: relay's CUDA home has no CUDA allocator.");
      return cuda->getMemoryInfo(device < 0 ? current_device() : device);
    }
    const auto page = static_cast<size_t>(sysconf(_SC_PAGESIZE));
    return {static_cast<size_t>(sysconf(_SC_AVPHYS_PAGES)) * page,
            static_cast<size_t>(sysconf(_SC_PHYS_PAGES)) * page};
  }
#endif
#endif

  // Raw copies (storage clones, copy-on-write materialization) between any two
  // homes: the pointers say where each side lives.
  void copy_data(void* dest, const void* src, size_t count) const override {
    if (count == 0) return;
    const c10::Device to = device_of_pointer(dest);
    const c10::Device from = device_of_pointer(src);
    if (to.is_cpu() && from.is_cpu()) {
      default_copy_data(dest, src, count);
      return;
    }
    bytes_at(dest, count, to).copy_(bytes_at(src, count, from));
  }
};

RelayAllocator g_allocator;

}  // namespace

REGISTER_ALLOCATOR(c10::DeviceType::PrivateUse1, &g_allocator);

Home current_home() { return g_home.load(std::memory_order_relaxed); }
void set_current_home(Home home) { g_home.store(home, std::memory_order_relaxed); }

Home parse_home(const std::string& name) {
  if (name == "cpu") return Home::Host;
  if (name == "cuda") return Home::Cuda;
  TORCH_CHECK_VALUE(false, "torch_fallback: unknown relay home '", name,
                    "'; valid homes are 'cpu' (host memory) and 'cuda' (GPU memory) "
                    "(TORCH_FALLBACK_RELAY_HOME or torch_fallback.relay.set_home).");
}

std::string home_name(Home home) { return home == Home::Host ? "cpu" : "cuda"; }

c10::Allocator* allocator() { return &g_allocator; }

Home home_of(const c10::Storage& storage) {
  // Every op asks this of each relay tensor: relay's own memory, the common case,
  // is told by its deleter first (a lazy clone's deleter is another).
  const c10::StorageImpl* home = home_impl_of(storage);
  if (home == nullptr && c10::impl::cow::is_cow_data_ptr(storage.data_ptr())) {
    // A lazy clone (torch._lazy_clone) shares its source's memory until it is
    // written; give it its own memory, so that it has a home of its own.
    storage.unsafeGetStorageImpl()->mutable_data_ptr();
    home = home_impl_of(storage);
  }
  if (home != nullptr) return home->device().is_cuda() ? Home::Cuda : Home::Host;
  // Memory relay did not allocate: a relay tensor made with from_blob (as
  // torch.save does to copy a storage to the host). The pointer tells.
  return device_of_pointer(storage.data()).is_cuda() ? Home::Cuda : Home::Host;
}

c10::Device home_device(const c10::Storage& storage) {
  const c10::StorageImpl* home = home_impl_of(storage);  // relay's own memory, told at once
  const bool on_cuda = home != nullptr ? home->device().is_cuda() : home_of(storage) == Home::Cuda;
  return on_cuda ? c10::Device(c10::kCUDA, storage.device().index()) : c10::Device(c10::kCPU);
}

namespace {

// The StorageImpl a relay DataPtr keeps, while it still holds the relay storage's bytes.
C10_ALWAYS_INLINE c10::StorageImpl* kept_home(const c10::Storage& storage) {
  c10::StorageImpl* home = home_impl_of(storage);
  if (home == nullptr || home->data() != storage.data() || home->nbytes() != storage.nbytes()) {
    return nullptr;
  }
  return home;
}

}  // namespace

c10::Storage home_storage(const c10::Storage& storage) {
  c10::StorageImpl* kept = kept_home(storage);
  if (C10_UNLIKELY(kept == nullptr)) {
    const c10::Device device = home_device(storage);  // gives a lazy clone memory of its own
    kept = kept_home(storage);
    if (kept == nullptr) {
      // Memory relay does not own: a view that keeps the relay storage alive.
      c10::DataPtr data(const_cast<void*>(storage.data()), new c10::Storage(storage),
                        &release_backend_storage, device);
      return c10::Storage(c10::Storage::use_byte_size_t(), storage.nbytes(), std::move(data),
                          c10::GetAllocator(device.type()), /*resizable=*/false);
    }
  }
  return c10::Storage(c10::intrusive_ptr<c10::StorageImpl>::reclaim_copy(kept));
}

c10::Device output_home(c10::DeviceIndex index) {
  if (current_home() == Home::Host) return c10::Device(c10::kCPU);
  check_gpu_home_usable();
  return c10::Device(c10::kCUDA, index);
}

at::Tensor adopt(const at::Tensor& home_tensor, c10::DeviceIndex index) {
  // A kernel's result is a plain tensor, whose storage needs no virtual call;
  // storage() says what is wrong with any other.
  const c10::Storage& plain = home_tensor.unsafeGetTensorImpl()->unsafe_storage();
  const c10::Storage& source = C10_LIKELY(plain) ? plain : home_tensor.storage();
  // The fallback runs later ops on this storage in place (the relay DataPtr keeps it);
  // a kernel must never give it new memory, which the relay storage would not see.
  source.unsafeGetStorageImpl()->set_resizable(false);
  c10::Storage storage(c10::make_intrusive<AdoptedStorage>(
      c10::StorageImpl::use_byte_size_t(), source.nbytes(), relay_data_ptr(source, index),
      allocator(), /*resizable=*/true));
  return backend_tensor_over(std::move(storage), home_tensor);
}

void resize_storage_bytes(const c10::Storage& storage, size_t nbytes) {
  TORCH_CHECK(storage.resizable(), "torch_fallback: this relay storage is not resizable.");
  const c10::DeviceIndex index = storage.device().index();
  const Home home = storage.nbytes() == 0 && storage.data() == nullptr
                        ? current_home()
                        : home_of(storage);
  c10::DataPtr fresh = allocate_on(home, index, nbytes);
  const size_t keep = std::min(nbytes, storage.nbytes());
  if (keep > 0) {
    const c10::Device device = home == Home::Host ? c10::Device(c10::kCPU)
                                                  : c10::Device(c10::kCUDA, index);
    bytes_at(fresh.get(), keep, device).copy_(bytes_at(storage.data(), keep, device));
  }
  auto* impl = storage.unsafeGetStorageImpl();
  impl->set_data_ptr_noswap(std::move(fresh));
  impl->set_nbytes(nbytes);
}

void rehome(const c10::Storage& storage, const c10::Storage& home) {
  TORCH_CHECK(storage.device().type() == c10::DeviceType::PrivateUse1,
              "torch_fallback: rehome takes a relay storage, not one on ", storage.device(), ".");
  TORCH_CHECK(home.device().is_cpu() || home.device().is_cuda(),
              "torch_fallback: a relay storage's home is CPU or CUDA memory, not ", home.device(),
              ".");
  TORCH_CHECK(home.nbytes() == storage.nbytes(), "torch_fallback: a new home of ", home.nbytes(),
              " bytes for a relay storage of ", storage.nbytes(), ".");
  storage.unsafeGetStorageImpl()->set_data_ptr_noswap(
      relay_data_ptr(home, storage.device().index()));
}

const BackendAdapter& backend() {
  static const BackendAdapter adapter = [] {
    BackendAdapter relay{c10::DeviceType::PrivateUse1, &home_device, &home_storage, &output_home,
                         &adopt, &target_generator};
    relay.lend_backend_meta = true;  // relay keeps no state of its own there
    return relay;
  }();
  return adapter;
}

MemoryFigures memory_figures(c10::DeviceIndex index) {
  check_device_index(index);
  return {g_counters[index].allocated.load(), g_counters[index].peak.load()};
}

void reset_peak(c10::DeviceIndex index) {
  check_device_index(index);
  g_counters[index].peak.store(g_counters[index].allocated.load());
}

namespace {

// Without a GPU, pinned memory is host memory that relay's pinned allocator
// handed out (a host-homed relay tensor needs no DMA); with one, CUDA's.
std::mutex g_pinned_mutex;
std::map<const char*, size_t> g_pinned_blocks;  // start -> size

void free_pinned(void* ptr) {
  {
    std::lock_guard<std::mutex> lock(g_pinned_mutex);
    g_pinned_blocks.erase(static_cast<const char*>(ptr));
  }
  c10::free_cpu(ptr);
}

class HostPinnedAllocator final : public c10::Allocator {
 public:
  c10::DataPtr allocate(size_t nbytes) override {
    void* ptr = c10::alloc_cpu(std::max<size_t>(nbytes, 1));
    std::lock_guard<std::mutex> lock(g_pinned_mutex);
    g_pinned_blocks[static_cast<const char*>(ptr)] = nbytes;
    return {ptr, ptr, &free_pinned, c10::Device(c10::kCPU)};
  }
  c10::DeleterFnPtr raw_deleter() const override { return &free_pinned; }
  void copy_data(void* dest, const void* src, std::size_t count) const override {
    default_copy_data(dest, src, count);
  }
};

HostPinnedAllocator g_host_pinned;

}  // namespace

c10::Allocator* pinned_allocator() {
  if (cuda::device_count() > 0) return at::detail::getCUDAHooks().getPinnedMemoryAllocator();
  return &g_host_pinned;
}

bool is_pinned(const void* ptr) {
  if (cuda::device_count() > 0) return at::detail::getCUDAHooks().isPinnedPtr(ptr);
  const char* p = static_cast<const char*>(ptr);
  std::lock_guard<std::mutex> lock(g_pinned_mutex);
  auto it = g_pinned_blocks.upper_bound(p);
  if (it == g_pinned_blocks.begin()) return false;
  --it;
  return p < it->first + std::max<size_t>(it->second, 1);
}

}  // namespace torch_fallback::relay
