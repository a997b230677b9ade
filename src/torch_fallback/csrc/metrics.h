#pragma once
// Per-op counters of the fallback: calls per target, time, bytes moved. Each
// op's counters are atomics found once (OpRules keeps the pointer), so that
// recording a call takes no lock.
#include <atomic>
#include <cstdint>
#include <map>
#include <string>
#include <vector>

#if defined(__x86_64__)
#include <x86intrin.h>
#endif

namespace torch_fallback::metrics {

namespace detail {
extern const bool use_tsc;
uint64_t steady_ns();
}  // namespace detail

// A call's start and end, read cheaply: the CPU's time-stamp counter where it
// runs at a constant rate on every core (an invariant TSC), else steady_clock's
// nanoseconds. Two clock_gettime calls per call were a tenth of the fallback's
// own time on a loop of small ops. snapshot() converts ticks to nanoseconds.
inline uint64_t ticks() {
#if defined(__x86_64__)
  if (detail::use_tsc) return __rdtsc();
#endif
  return detail::steady_ns();
}

struct OpStats {
  uint64_t calls_cpu = 0;
  uint64_t calls_cuda = 0;
  uint64_t errors = 0;
  uint64_t time_ns = 0;
  uint64_t bytes_to_target = 0;    // copied from the backend's memory to the target device
  uint64_t bytes_from_target = 0;  // copied back from the target device
  uint64_t calls_unboxed = 0;      // of the calls, those an unboxed kernel served
};

struct Call {
  bool on_cuda = false;
  bool failed = false;
  bool unboxed = false;
  uint64_t ticks = 0;  // its duration
  uint64_t bytes_to_target = 0;
  uint64_t bytes_from_target = 0;
};

// The live counters of one op. Boxed and unboxed calls are counted apart, so
// that an unboxed call, the common one, updates two counters: its calls and ticks.
struct Counters {
  std::atomic<uint64_t> boxed_cpu{0};
  std::atomic<uint64_t> boxed_cuda{0};
  std::atomic<uint64_t> unboxed_cpu{0};
  std::atomic<uint64_t> unboxed_cuda{0};
  std::atomic<uint64_t> errors{0};
  std::atomic<uint64_t> ticks{0};
  std::atomic<uint64_t> bytes_to_target{0};
  std::atomic<uint64_t> bytes_from_target{0};
};

// The counters of `op` ("aten::add.Tensor"); the pointer stays valid for the process.
Counters* counters_for(const std::string& op);

// Inline: every fallback call ends here.
inline void record(Counters& counters, const Call& call) {
  constexpr auto relaxed = std::memory_order_relaxed;
  if (call.unboxed) {
    (call.on_cuda ? counters.unboxed_cuda : counters.unboxed_cpu).fetch_add(1, relaxed);
  } else {
    (call.on_cuda ? counters.boxed_cuda : counters.boxed_cpu).fetch_add(1, relaxed);
  }
  if (call.failed) counters.errors.fetch_add(1, relaxed);
  counters.ticks.fetch_add(call.ticks, relaxed);
  if (call.bytes_to_target != 0) counters.bytes_to_target.fetch_add(call.bytes_to_target, relaxed);
  if (call.bytes_from_target != 0) {
    counters.bytes_from_target.fetch_add(call.bytes_from_target, relaxed);
  }
}

// Ops with at least one call since the last reset.
std::map<std::string, OpStats> snapshot();
void reset();

// The calling thread's parked target TensorImpls (TargetImplPool), per pool: CPU,
// CPU inference, CUDA, CUDA inference.
std::vector<int64_t> parked_target_impls();

}  // namespace torch_fallback::metrics
