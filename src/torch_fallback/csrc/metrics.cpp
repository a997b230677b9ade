#include "metrics.h"

#include <memory>
#include <mutex>
#include <unordered_map>

namespace torch_fallback::metrics {
namespace {

std::mutex g_mutex;
std::unordered_map<std::string, std::unique_ptr<Counters>> g_counters;

constexpr auto kRelaxed = std::memory_order_relaxed;

}  // namespace

Counters* counters_for(const std::string& op) {
  std::lock_guard<std::mutex> lock(g_mutex);
  auto& counters = g_counters[op];
  if (!counters) counters = std::make_unique<Counters>();
  return counters.get();
}

void record(Counters& counters, const Call& call) {
  (call.on_cuda ? counters.calls_cuda : counters.calls_cpu).fetch_add(1, kRelaxed);
  if (call.failed) counters.errors.fetch_add(1, kRelaxed);
  if (call.unboxed) counters.calls_unboxed.fetch_add(1, kRelaxed);
  counters.time_ns.fetch_add(call.time_ns, kRelaxed);
  if (call.bytes_to_target != 0) counters.bytes_to_target.fetch_add(call.bytes_to_target, kRelaxed);
  if (call.bytes_from_target != 0) {
    counters.bytes_from_target.fetch_add(call.bytes_from_target, kRelaxed);
  }
}

std::map<std::string, OpStats> snapshot() {
  std::lock_guard<std::mutex> lock(g_mutex);
  std::map<std::string, OpStats> result;
  for (const auto& [op, c] : g_counters) {
    OpStats stats{c->calls_cpu.load(kRelaxed),       c->calls_cuda.load(kRelaxed),
                  c->errors.load(kRelaxed),          c->time_ns.load(kRelaxed),
                  c->bytes_to_target.load(kRelaxed), c->bytes_from_target.load(kRelaxed),
                  c->calls_unboxed.load(kRelaxed)};
    if (stats.calls_cpu + stats.calls_cuda > 0) result.emplace(op, stats);
  }
  return result;
}

void reset() {
  std::lock_guard<std::mutex> lock(g_mutex);
  for (auto& [op, c] : g_counters) {
    for (auto* counter : {&c->calls_cpu, &c->calls_cuda, &c->errors, &c->time_ns,
                          &c->bytes_to_target, &c->bytes_from_target, &c->calls_unboxed}) {
      counter->store(0, kRelaxed);
    }
  }
}

}  // namespace torch_fallback::metrics
