#pragma once
// Tensors over other tensors' memory: the fallback's building blocks.
#include <ATen/core/Tensor.h>

#include <functional>

namespace torch_fallback {

// A tensor on `device` (CPU, CUDA or a backend's) over `storage` with the
// geometry (and the lazy conjugate and negative bits) of `like`.
at::Tensor tensor_over(c10::Storage storage, c10::Device device, const at::Tensor& like);

// A nested tensor with the structure of `nested` over `map(its buffer)`.
at::Tensor map_nested_buffer(const at::Tensor& nested,
                             const std::function<at::Tensor(const at::Tensor&)>& map);

}  // namespace torch_fallback
