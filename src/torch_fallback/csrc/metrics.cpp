#include "metrics.h"

#include <chrono>
#include <memory>
#include <mutex>
#include <unordered_map>

#if defined(__x86_64__)
#include <cpuid.h>
#include <x86intrin.h>
#endif

namespace torch_fallback::metrics {
namespace {

std::mutex g_mutex;
std::unordered_map<std::string, std::unique_ptr<Counters>> g_counters;

constexpr auto kRelaxed = std::memory_order_relaxed;

bool invariant_tsc() {
#if defined(__x86_64__)
  unsigned int eax = 0, ebx = 0, ecx = 0, edx = 0;
  if (__get_cpuid_max(0x80000000U, nullptr) < 0x80000007U) return false;
  __cpuid(0x80000007U, eax, ebx, ecx, edx);
  return (edx & (1U << 8)) != 0;  // CPUID.80000007H:EDX[8], "TscInvariant"
#else
  return false;
#endif
}

}  // namespace

namespace detail {

uint64_t steady_ns() {
  return static_cast<uint64_t>(std::chrono::duration_cast<std::chrono::nanoseconds>(
                                   std::chrono::steady_clock::now().time_since_epoch())
                                   .count());
}

const bool use_tsc = invariant_tsc();

}  // namespace detail

namespace {

using detail::steady_ns;

// Where ticks and nanoseconds were when the library loaded: the ratio of both
// since then converts ticks, measured over the process's life so far.
struct Origin {
  uint64_t ticks;
  uint64_t ns;
};
const Origin g_origin{ticks(), steady_ns()};

double ns_per_tick() {
  if (!detail::use_tsc) return 1.0;
  const uint64_t ns = steady_ns() - g_origin.ns;
  const uint64_t elapsed = ticks() - g_origin.ticks;
  return elapsed == 0 ? 1.0 : static_cast<double>(ns) / static_cast<double>(elapsed);
}

}  // namespace

Counters* counters_for(const std::string& op) {
  std::lock_guard<std::mutex> lock(g_mutex);
  auto& counters = g_counters[op];
  if (!counters) counters = std::make_unique<Counters>();
  return counters.get();
}

std::map<std::string, OpStats> snapshot() {
  const double tick_ns = ns_per_tick();
  std::lock_guard<std::mutex> lock(g_mutex);
  std::map<std::string, OpStats> result;
  for (const auto& [op, c] : g_counters) {
    const auto counted_ticks = static_cast<double>(c->ticks.load(kRelaxed));
    const auto time_ns = static_cast<uint64_t>(counted_ticks * tick_ns);
    const uint64_t unboxed_cpu = c->unboxed_cpu.load(kRelaxed);
    const uint64_t unboxed_cuda = c->unboxed_cuda.load(kRelaxed);
    OpStats stats{c->boxed_cpu.load(kRelaxed) + unboxed_cpu,
                  c->boxed_cuda.load(kRelaxed) + unboxed_cuda,
                  c->errors.load(kRelaxed),
                  time_ns,
                  c->bytes_to_target.load(kRelaxed),
                  c->bytes_from_target.load(kRelaxed),
                  unboxed_cpu + unboxed_cuda};
    if (stats.calls_cpu + stats.calls_cuda > 0) result.emplace(op, stats);
  }
  return result;
}

void reset() {
  std::lock_guard<std::mutex> lock(g_mutex);
  for (auto& [op, c] : g_counters) {
    for (auto* counter : {&c->boxed_cpu, &c->boxed_cuda, &c->unboxed_cpu, &c->unboxed_cuda,
                          &c->errors, &c->ticks, &c->bytes_to_target, &c->bytes_from_target}) {
      counter->store(0, kRelaxed);
    }
  }
}

}  // namespace torch_fallback::metrics
