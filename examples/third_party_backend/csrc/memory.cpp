// tinydev's memory, guarded as PyTorch's reference backend (torch_openreg)
// guards its own: every allocation is mapped pages that stay PROT_NONE, so any
// touch segfaults, except while an access is open (tinydev's own kernels, and
// torch-fallback through the adapter's begin_access/end_access). An allocation
// table answers which device owns a pointer; copies refuse memory not in it.
#include <sys/mman.h>
#include <unistd.h>

#include <c10/util/Exception.h>

#include <cstdint>
#include <map>
#include <mutex>

#include "tinydev.h"

namespace tinydev {
namespace {

struct Allocation {
  size_t mapped;  // bytes mapped: the request rounded up to whole pages
  c10::DeviceIndex device;
  int64_t open_accesses;
};

std::mutex g_mutex;
std::map<uintptr_t, Allocation> g_table;  // by base address

size_t page_rounded(size_t nbytes) {
  static const size_t page = static_cast<size_t>(sysconf(_SC_PAGESIZE));
  return (nbytes + page - 1) / page * page;
}

void protect(uintptr_t base, const Allocation& allocation, int protection) {
  TORCH_CHECK(mprotect(reinterpret_cast<void*>(base), allocation.mapped, protection) == 0,
              "tinydev: mprotect failed on an allocation of ", allocation.mapped, " bytes");
}

// The allocation holding `address` (its base and entry), or the table's end.
std::map<uintptr_t, Allocation>::iterator holding(const void* address) {
  const auto key = reinterpret_cast<uintptr_t>(address);
  auto after = g_table.upper_bound(key);
  if (after == g_table.begin()) return g_table.end();
  auto found = std::prev(after);
  return key < found->first + found->second.mapped ? found : g_table.end();
}

std::map<uintptr_t, Allocation>::iterator checked(const void* address, const char* what) {
  auto found = holding(address);
  TORCH_CHECK(found != g_table.end(), "tinydev: ", what, " got memory tinydev did not allocate (",
              address, "); tinydev tensors hold only memory from tinydev's allocator.");
  return found;
}

}  // namespace

void* allocate_locked(size_t nbytes, c10::DeviceIndex device) {
  if (nbytes == 0) return nullptr;
  const size_t mapped = page_rounded(nbytes);
  void* base = mmap(nullptr, mapped, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  TORCH_CHECK(base != MAP_FAILED, "tinydev: out of memory mapping ", nbytes, " bytes");
  const std::lock_guard<std::mutex> lock(g_mutex);
  g_table.emplace(reinterpret_cast<uintptr_t>(base), Allocation{mapped, device, 0});
  return base;
}

void free_locked(void* base) {
  if (base == nullptr) return;
  size_t mapped = 0;
  {
    const std::lock_guard<std::mutex> lock(g_mutex);
    auto found = g_table.find(reinterpret_cast<uintptr_t>(base));
    if (found == g_table.end()) return;  // not ours: nothing to unmap
    mapped = found->second.mapped;
    g_table.erase(found);
  }
  munmap(base, mapped);
}

// [readme:access]
void open_access(const void* data) {
  if (data == nullptr) return;
  const std::lock_guard<std::mutex> lock(g_mutex);
  auto found = checked(data, "an access");
  if (found->second.open_accesses++ == 0) protect(found->first, found->second, PROT_READ | PROT_WRITE);
}

void close_access(const void* data) noexcept {
  if (data == nullptr) return;
  const std::lock_guard<std::mutex> lock(g_mutex);
  auto found = holding(data);
  if (found == g_table.end() || found->second.open_accesses == 0) return;
  if (--found->second.open_accesses == 0) {
    mprotect(reinterpret_cast<void*>(found->first), found->second.mapped, PROT_NONE);
  }
}
// [/readme:access]

std::optional<c10::DeviceIndex> device_of(const void* address) {
  const std::lock_guard<std::mutex> lock(g_mutex);
  auto found = holding(address);
  if (found == g_table.end()) return std::nullopt;
  return found->second.device;
}

int64_t open_accesses() {
  const std::lock_guard<std::mutex> lock(g_mutex);
  int64_t open = 0;
  for (const auto& [base, allocation] : g_table) open += allocation.open_accesses;
  return open;
}

int64_t live_allocations() {
  const std::lock_guard<std::mutex> lock(g_mutex);
  return static_cast<int64_t>(g_table.size());
}

}  // namespace tinydev
