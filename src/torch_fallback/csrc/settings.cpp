#include "settings.h"

#include <atomic>
#include <cctype>
#include <mutex>
#include <set>

#include <c10/util/Exception.h>

namespace torch_fallback {

namespace settings_state {
std::atomic<Target> g_target{Target::Cpu};
std::atomic<CudaSync> g_cuda_sync{CudaSync::Stream};
std::atomic<uint64_t> g_cpu_ops_generation{1};
}  // namespace settings_state

namespace {

using settings_state::g_cpu_ops_generation;
using settings_state::g_cuda_sync;
using settings_state::g_target;

std::mutex g_cpu_ops_mutex;
std::set<std::string> g_cpu_ops;

bool valid_op_name(const std::string& name) {
  const auto sep = name.find("::");
  if (sep == std::string::npos || sep == 0 || sep + 2 >= name.size()) return false;
  for (char c : name) {
    if (!(std::isalnum(static_cast<unsigned char>(c)) || c == '_' || c == ':' || c == '.')) {
      return false;
    }
  }
  return true;
}

}  // namespace

void set_target(Target target) { g_target.store(target, std::memory_order_relaxed); }

Target parse_target(const std::string& name) {
  if (name == "cpu") return Target::Cpu;
  if (name == "cuda") return Target::Cuda;
  if (name == "auto") return Target::Auto;
  TORCH_CHECK_VALUE(false, "torch_fallback: unknown fallback target '", name,
                    "'; valid targets are 'cpu', 'cuda' and 'auto' (TORCH_FALLBACK_TARGET or "
                    "torch_fallback.set_target).");
}

std::string target_name(Target target) {
  switch (target) {
    case Target::Cpu: return "cpu";
    case Target::Cuda: return "cuda";
    case Target::Auto: return "auto";
  }
  return "?";
}

void set_cuda_sync(CudaSync mode) { g_cuda_sync.store(mode, std::memory_order_relaxed); }

CudaSync parse_cuda_sync(const std::string& name) {
  if (name == "stream") return CudaSync::Stream;
  if (name == "device") return CudaSync::Device;
  TORCH_CHECK_VALUE(false, "torch_fallback: unknown CUDA sync mode '", name,
                    "'; valid modes are 'stream' and 'device' (TORCH_FALLBACK_CUDA_SYNC or "
                    "torch_fallback.set_cuda_sync).");
}

std::string cuda_sync_name(CudaSync mode) { return mode == CudaSync::Stream ? "stream" : "device"; }

std::vector<std::string> cpu_ops() {
  std::lock_guard<std::mutex> lock(g_cpu_ops_mutex);
  return {g_cpu_ops.begin(), g_cpu_ops.end()};
}

void set_cpu_ops(const std::vector<std::string>& names) {
  for (const auto& name : names) {
    TORCH_CHECK_VALUE(valid_op_name(name), "torch_fallback: '", name,
                      "' is not an operator name; write 'namespace::op' or "
                      "'namespace::op.overload', e.g. 'aten::nonzero' (TORCH_FALLBACK_CPU_OPS is "
                      "a comma-separated list of such names).");
  }
  std::lock_guard<std::mutex> lock(g_cpu_ops_mutex);
  g_cpu_ops = {names.begin(), names.end()};
  g_cpu_ops_generation.fetch_add(1, std::memory_order_release);
}

bool forced_to_cpu(const std::string& name, const std::string& full_name) {
  std::lock_guard<std::mutex> lock(g_cpu_ops_mutex);
  return g_cpu_ops.count(name) != 0 || g_cpu_ops.count(full_name) != 0;
}

}  // namespace torch_fallback
