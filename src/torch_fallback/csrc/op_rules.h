#pragma once
// What the fallback must know about an op beyond its schema, worked out once
// per op: arguments its kernels write without the schema saying so, results a
// backend tensor cannot hold, arguments that may stay on the CPU.
#include <ATen/core/dispatch/Dispatcher.h>

#include "decompositions.h"
#include "metrics.h"
#include "settings.h"

#include <atomic>
#include <string>
#include <vector>

namespace torch_fallback {

struct OpRules {
  std::string name;       // "aten::add"
  std::string overload;   // "Tensor"
  std::string full_name;  // "aten::add.Tensor"
  // Arguments that kernels mutate although the schema does not mark them (a!):
  // native_batch_norm's running statistics, for instance.
  std::vector<size_t> hidden_mutations;
  // Every argument the op writes: the schema's (a!) ones and the hidden mutations.
  std::vector<size_t> written_arguments;
  // Written arguments a kernel may resize: out= ones, and those of the resize_
  // and set_ ops. They get a resizable storage of their own on the target.
  std::vector<size_t> resizable_arguments;
  // ScalarType arguments: a quantized dtype there makes a quantized result.
  std::vector<size_t> dtype_arguments;
  // Layout arguments: a sparse or mkldnn layout there makes such a result.
  std::vector<size_t> layout_arguments;
  // Generator arguments: a backend generator is swapped for the target's.
  std::vector<size_t> generator_arguments;
  // A return aliases an input without writing it: a view, which a fallback cannot give.
  bool returns_a_view = false;
  // The op makes sparse or quantized tensors whatever its arguments; empty if not.
  std::string unservable_result;
  // An indexing op, whose indices (Tensor?[]) may be CPU tensors, as on CUDA.
  bool takes_cpu_indices = false;
  // CUDA's kernel takes every tensor on one device (set_cuda_device_checked_ops):
  // no 0-dim CPU tensor as a scalar either.
  bool takes_no_cpu_scalars = false;
  // Tensor arguments that CUDA's kernel takes on the host (_nested_from_padded's
  // sizes), so they may be CPU tensors of any shape.
  std::vector<size_t> host_read_arguments;
  // A _foreach_ op: its Tensor[] arguments hold one tensor per result, and its
  // scalars may come as a CPU tensor, as on CUDA.
  bool is_foreach = false;
  // _foreach_copy_, which copies between devices as CUDA's does (one copy_ per tensor).
  bool copies_between_devices = false;
  // An op a DirectCall may run: it writes no argument but in place (no out=,
  // no resize, no hidden mutation), takes no device or layout, returns no view,
  // and a backend tensor can hold its results.
  bool runs_direct = false;
  // The op reads its tensor where the backend keeps it, whatever the target:
  // item() (_local_scalar_dense), whose result is a host number. On a GPU home
  // that is eager's read (a copy to page-locked memory, then a wait on the
  // stream); the CPU op list still sends it to the CPU.
  bool reads_on_home = false;
  // Kernels for the targets, dense and nested (computed: composites count).
  bool has_cpu_kernel = false;
  bool has_cuda_kernel = false;
  bool has_nested_cpu_kernel = false;
  bool has_nested_cuda_kernel = false;
  // The CPU decomposition for an op the CPU has no kernel for, or nullptr.
  Decomposition cpu_decomposition = nullptr;
  // How the op runs on the CPU target where CUDA's kernel takes inputs the
  // CPU's refuses (histc of integers), or nullptr.
  Decomposition cpu_runner = nullptr;
  // How the op runs on a CUDA target when eager would pick another kernel than
  // the op's own there (batch norm's cuDNN kernels), or nullptr.
  Decomposition cuda_runner = nullptr;
  metrics::Counters* counters = nullptr;

  // Whether the op is on the CPU op list (torch_fallback.set_cpu_ops); cached
  // until the list changes.
  bool forced_to_cpu() const {
    const uint64_t generation = cpu_ops_generation();
    uint64_t cached = forced_to_cpu_cache_.load(std::memory_order_relaxed);
    if (C10_UNLIKELY((cached >> 1) != generation)) cached = look_up_cpu_ops(generation);
    return (cached & 1U) != 0;
  }

 private:
  uint64_t look_up_cpu_ops(uint64_t generation) const;
  // The answer and the list's generation it holds for, in one word that every
  // thread reads and writes whole: generation << 1 | forced. 0: none yet (the
  // first generation is 1).
  mutable std::atomic<uint64_t> forced_to_cpu_cache_{0};
};

// The rules of `op`, one object per op for the process; cheap after the first
// call of each op on a thread.
const OpRules& op_rules(const c10::OperatorHandle& op);

// The ops ("aten::equal") whose CUDA kernels check that all their tensors are on
// one device (torch_fallback/_cuda_device_checks.py, recorded by the build); set
// as the library loads, before any op's rules are made.
void set_cuda_device_checked_ops(const std::vector<std::string>& names);

}  // namespace torch_fallback
