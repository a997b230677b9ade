#pragma once
// Per-op counters of the fallback: calls per target, time, bytes moved.
#include <cstdint>
#include <map>
#include <string>

namespace torch_fallback::metrics {

struct OpStats {
  uint64_t calls_cpu = 0;
  uint64_t calls_cuda = 0;
  uint64_t errors = 0;
  uint64_t time_ns = 0;
  uint64_t bytes_to_target = 0;    // copied from the backend's memory to the target device
  uint64_t bytes_from_target = 0;  // copied back from the target device
};

struct Call {
  bool on_cuda = false;
  bool failed = false;
  uint64_t time_ns = 0;
  uint64_t bytes_to_target = 0;
  uint64_t bytes_from_target = 0;
};

void record(const std::string& op, const Call& call);
std::map<std::string, OpStats> snapshot();
void reset();

}  // namespace torch_fallback::metrics
