#pragma once
// CPU implementations of ops that PyTorch implements only for CUDA but picks
// for every non-CPU device: the fused LSTM and GRU cells, which nn.LSTM,
// nn.GRU and their cells use for PrivateUse1 tensors. They follow the CUDA
// kernels exactly, workspace layout included, so that a forward on one
// target and a backward on the other agree. SyncBatchNorm's statistics and
// elementwise ops, which it runs for PrivateUse1 tensors in training across
// ranks. And CPU runs of ops whose CUDA kernels take dtypes the CPU's do not.
#include <ATen/core/Tensor.h>
#include <ATen/core/stack.h>

#include <string>

namespace c10 {
class OperatorHandle;
}

namespace torch_fallback {

using Decomposition = void (*)(const c10::OperatorHandle& op, torch::jit::Stack* stack);

// The CPU decomposition of `full_name` ("aten::op.overload"), or nullptr.
Decomposition cpu_decomposition(const std::string& full_name);

// Whether histc on the CPU target counts `self` in double: CUDA's kernel counts
// integer tensors too (Hugging Face's MoE layers count expert indices with it on
// any device but the CPU), the CPU's floating ones only. Double holds the integers
// and CUDA's bin arithmetic exactly below 2**53; the result takes the input's
// dtype, as CUDA's. The boxed fallback (cpu_runner) and the unboxed kernel
// (HistcOnTarget) both count so.
bool histc_counts_in_double(const at::Tensor& self);

// How the boxed fallback runs `full_name` on the CPU target where CUDA's kernel
// takes inputs that the CPU's refuses (histc of integers), or nullptr.
Decomposition cpu_runner(const std::string& full_name);

// How the boxed fallback runs `full_name` on a CUDA target where eager CUDA
// would choose another kernel than the op's own (batch_norm.cpp), or nullptr.
Decomposition cuda_runner(const std::string& full_name);

}  // namespace torch_fallback
