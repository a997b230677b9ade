#pragma once
// Process-wide fallback settings. They are global rather than thread-local
// because autograd runs backward ops on its own threads.
#include <cstdint>
#include <string>
#include <vector>

namespace torch_fallback {

enum class Target { Cpu, Cuda, Auto };
// How a CUDA fallback hands its results on: in the order of the current CUDA
// stream (the default), or after a full device synchronize.
enum class CudaSync { Stream, Device };

Target target();
void set_target(Target target);
Target parse_target(const std::string& name);  // "cpu" | "cuda" | "auto", else ValueError
std::string target_name(Target target);

CudaSync cuda_sync();
void set_cuda_sync(CudaSync mode);
CudaSync parse_cuda_sync(const std::string& name);  // "stream" | "device", else ValueError
std::string cuda_sync_name(CudaSync mode);

// Ops that always run on the CPU target, named "ns::op" (every overload) or "ns::op.overload".
std::vector<std::string> cpu_ops();
void set_cpu_ops(const std::vector<std::string>& names);  // ValueError on a malformed name
bool forced_to_cpu(const std::string& name, const std::string& full_name);  // full: "ns::op.overload"
// Changes whenever the CPU op list does, so that callers may cache forced_to_cpu.
uint64_t cpu_ops_generation();

}  // namespace torch_fallback
