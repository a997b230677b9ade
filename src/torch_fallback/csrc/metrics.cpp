#include "metrics.h"

#include <mutex>
#include <unordered_map>

namespace torch_fallback::metrics {
namespace {

std::mutex g_mutex;
std::unordered_map<std::string, OpStats> g_stats;

}  // namespace

void record(const std::string& op, const Call& call) {
  std::lock_guard<std::mutex> lock(g_mutex);
  OpStats& stats = g_stats[op];
  (call.on_cuda ? stats.calls_cuda : stats.calls_cpu) += 1;
  stats.errors += call.failed ? 1 : 0;
  stats.time_ns += call.time_ns;
  stats.bytes_to_target += call.bytes_to_target;
  stats.bytes_from_target += call.bytes_from_target;
}

std::map<std::string, OpStats> snapshot() {
  std::lock_guard<std::mutex> lock(g_mutex);
  return {g_stats.begin(), g_stats.end()};
}

void reset() {
  std::lock_guard<std::mutex> lock(g_mutex);
  g_stats.clear();
}

}  // namespace torch_fallback::metrics
