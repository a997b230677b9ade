#pragma once
// Process-wide fallback settings. They are global rather than thread-local
// because autograd runs backward ops on its own threads.
#include <atomic>
#include <cstdint>
#include <string>
#include <vector>

namespace torch_fallback {

enum class Target { Cpu, Cuda, Auto };
// How a CUDA fallback hands its results on: in the order of the current CUDA
// stream (the default), or after a full device synchronize.
enum class CudaSync { Stream, Device };

// Read by every call: inline loads, defined in settings.cpp.
namespace settings_state {
extern std::atomic<Target> g_target;
extern std::atomic<CudaSync> g_cuda_sync;
extern std::atomic<uint64_t> g_cpu_ops_generation;
}  // namespace settings_state

inline Target target() { return settings_state::g_target.load(std::memory_order_relaxed); }
void set_target(Target target);
Target parse_target(const std::string& name);  // "cpu" | "cuda" | "auto", else ValueError
std::string target_name(Target target);

inline CudaSync cuda_sync() { return settings_state::g_cuda_sync.load(std::memory_order_relaxed); }
void set_cuda_sync(CudaSync mode);
CudaSync parse_cuda_sync(const std::string& name);  // "stream" | "device", else ValueError
std::string cuda_sync_name(CudaSync mode);

// Ops that always run on the CPU target, named "ns::op" (every overload) or "ns::op.overload".
std::vector<std::string> cpu_ops();
void set_cpu_ops(const std::vector<std::string>& names);  // ValueError on a malformed name
bool forced_to_cpu(const std::string& name, const std::string& full_name);  // full: "ns::op.overload"
// Changes whenever the CPU op list does, so that callers may cache forced_to_cpu.
inline uint64_t cpu_ops_generation() {
  return settings_state::g_cpu_ops_generation.load(std::memory_order_acquire);
}

}  // namespace torch_fallback
