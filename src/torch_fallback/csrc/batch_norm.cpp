// Batch norm on the target as eager runs it there (BatchNormOnTarget): cuDNN's
// kernels where PyTorch would choose them for CUDA tensors, else the target's
// native_batch_norm; and eager's composite above it (BatchNormImplIndex).
// DirectKernel gives these the views of the call's tensors; the boxed fallback
// runs them through cuda_runner (home memory off the GPU).
#include <torch_fallback/detail/direct_kernel.h>

#include "decompositions.h"

#include <atomic>

#include <ATen/core/grad_mode.h>
#include <ATen/native/Normalization.h>
#include <ATen/ops/_batch_norm_impl_index_native.h>
#include <ATen/ops/cudnn_batch_norm_backward_ops.h>
#include <ATen/ops/cudnn_batch_norm_ops.h>
#include <ATen/ops/empty.h>

namespace torch_fallback::detail {
namespace {

// cuDNN's backward may want the reserve space of its forward, which
// native_batch_norm's results cannot carry. Then its backward fails with an
// empty one; from then on the native backward runs (the forward's saved mean
// and inverse standard deviation mean the same to both).
std::atomic<bool> g_backward_needs_reserve{false};

bool cudnn_chosen(c10::DispatchKeySet keys, const at::Tensor& input,
                  const std::optional<at::Tensor>& weight, const std::optional<at::Tensor>& bias,
                  const std::optional<at::Tensor>& running_mean,
                  const std::optional<at::Tensor>& running_var, bool training, double eps) {
  const auto defined = [](const std::optional<at::Tensor>& t) { return t && t->defined(); };
  const auto or_none = [](const std::optional<at::Tensor>& t) { return t ? *t : at::Tensor(); };
  return keys.has(c10::DispatchKey::CUDA) && defined(weight) && defined(bias) &&
         at::native::_select_batch_norm_backend(input, *weight, *bias, or_none(running_mean),
                                                or_none(running_var), training, eps) ==
             at::native::BatchNormBackend::Cudnn;
}

}  // namespace

std::tuple<at::Tensor, at::Tensor, at::Tensor> BatchNormOnTarget::run(
    c10::DispatchKeySet keys, const at::Tensor& input, const std::optional<at::Tensor>& weight,
    const std::optional<at::Tensor>& bias, const std::optional<at::Tensor>& running_mean,
    const std::optional<at::Tensor>& running_var, bool training, double momentum, double eps) {
  // In eval mode cuDNN leaves the saved mean and inverse standard deviation
  // empty, where eager's native_batch_norm returns them with one value per channel.
  // Running statistics are updated in place, on the backend's own memory.
  if (training && cudnn_chosen(keys, input, weight, bias, running_mean, running_var, training, eps)) {
    auto [out, save_mean, save_invstd, reserve] = at::_ops::cudnn_batch_norm::redispatch(
        keys, input, *weight, bias, running_mean, running_var, training, momentum, eps);
    return {out, save_mean, save_invstd};
  }
  return at::_ops::native_batch_norm::redispatch(keys, input, weight, bias, running_mean,
                                                 running_var, training, momentum, eps);
}

std::tuple<at::Tensor, at::Tensor, at::Tensor> BatchNormBackwardOnTarget::run(
    c10::DispatchKeySet keys, const at::Tensor& grad_out, const at::Tensor& input,
    const std::optional<at::Tensor>& weight, const std::optional<at::Tensor>& running_mean,
    const std::optional<at::Tensor>& running_var, const std::optional<at::Tensor>& save_mean,
    const std::optional<at::Tensor>& save_invstd, bool train, double eps,
    std::array<bool, 3> output_mask) {
  const auto defined = [](const std::optional<at::Tensor>& t) { return t && t->defined(); };
  // Eager's cuDNN batch norm also takes the native backward in eval mode. The
  // backward has no bias; the weight (its shape and dtype) stands in for it.
  if (train && !g_backward_needs_reserve.load(std::memory_order_relaxed) &&
      defined(save_mean) && defined(save_invstd) &&
      cudnn_chosen(keys, input, weight, weight, running_mean, running_var, /*training=*/true, eps)) {
    try {
      auto [grad_input, grad_weight, grad_bias] = at::_ops::cudnn_batch_norm_backward::redispatch(
          keys, input, grad_out.contiguous(input.suggest_memory_format()), *weight, running_mean,
          running_var, save_mean, save_invstd, eps,
          at::empty({0}, input.options().dtype(at::kByte)));
      const auto kept = [&](size_t i, at::Tensor& grad) {
        return output_mask[i] ? std::move(grad) : at::Tensor();
      };
      return {kept(0, grad_input), kept(1, grad_weight), kept(2, grad_bias)};
    } catch (const c10::Error&) {
      g_backward_needs_reserve.store(true, std::memory_order_relaxed);
    }
  }
  return at::_ops::native_batch_norm_backward::redispatch(keys, grad_out, input, weight,
                                                          running_mean, running_var, save_mean,
                                                          save_invstd, train, eps, output_mask);
}

BatchNormImplIndex::Result BatchNormImplIndex::run(
    const at::Tensor& input, const std::optional<at::Tensor>& weight,
    const std::optional<at::Tensor>& bias, const std::optional<at::Tensor>& running_mean,
    const std::optional<at::Tensor>& running_var, bool training, double momentum, double eps,
    bool cudnn_enabled) {
  return at::native::_batch_norm_impl_index(input, weight, bias, running_mean, running_var,
                                            training, momentum, eps, cudnn_enabled);
}

BatchNormImplIndex::Result BatchNormImplIndex::autograd(
    c10::DispatchKeySet keys, const at::Tensor& input, const std::optional<at::Tensor>& weight,
    const std::optional<at::Tensor>& bias, const std::optional<at::Tensor>& running_mean,
    const std::optional<at::Tensor>& running_var, bool training, double momentum, double eps,
    bool cudnn_enabled) {
  const auto records = [](const std::optional<at::Tensor>& tensor) {
    return tensor && tensor->defined() &&
           ((c10::GradMode::is_enabled() && tensor->requires_grad()) ||
            tensor->_fw_grad(/*level=*/0).defined());
  };
  if (records(input) || records(weight) || records(bias)) {
    return run(input, weight, bias, running_mean, running_var, training, momentum, eps,
               cudnn_enabled);
  }
  return at::_ops::_batch_norm_impl_index::redispatch(keys & c10::after_autograd_keyset, input,
                                                      weight, bias, running_mean, running_var,
                                                      training, momentum, eps, cudnn_enabled);
}

void BatchNormImplIndex::register_autograd(c10::DeviceType device_type) {
  const auto op = c10::Dispatcher::singleton().findOp({"aten::_batch_norm_impl_index", ""});
  if (op && op->hasKernelForDispatchKey(autograd_key(device_type))) return;  // the backend's own
  register_autograd_kernel(device_type, "_batch_norm_impl_index",
                           torch::CppFunction(TORCH_FN(autograd)));
}

}  // namespace torch_fallback::detail

namespace torch_fallback {
namespace {

using torch::jit::Stack;
using detail::BatchNormBackwardOnTarget;
using detail::BatchNormOnTarget;

const c10::DispatchKeySet kCudaKeys{c10::DispatchKey::CUDA};

// The boxed fallback's batch norm on a CUDA target (home memory elsewhere): the
// kernels eager CUDA runs, as the unboxed path does.
void batch_norm_on_cuda(const c10::OperatorHandle&, Stack* stack) {
  auto args = torch::jit::pop(*stack, 8);
  auto [out, save_mean, save_invstd] = BatchNormOnTarget::run(
      kCudaKeys, args[0].toTensor(), args[1].toOptional<at::Tensor>(),
      args[2].toOptional<at::Tensor>(), args[3].toOptional<at::Tensor>(),
      args[4].toOptional<at::Tensor>(), args[5].toBool(), args[6].toDouble(), args[7].toDouble());
  torch::jit::push(*stack, std::move(out), std::move(save_mean), std::move(save_invstd));
}

void batch_norm_backward_on_cuda(const c10::OperatorHandle&, Stack* stack) {
  auto args = torch::jit::pop(*stack, 10);
  const c10::List<bool> mask = args[9].toBoolList();
  auto [grad_input, grad_weight, grad_bias] = BatchNormBackwardOnTarget::run(
      kCudaKeys, args[0].toTensor(), args[1].toTensor(), args[2].toOptional<at::Tensor>(),
      args[3].toOptional<at::Tensor>(), args[4].toOptional<at::Tensor>(),
      args[5].toOptional<at::Tensor>(), args[6].toOptional<at::Tensor>(), args[7].toBool(),
      args[8].toDouble(), {mask.get(0), mask.get(1), mask.get(2)});
  torch::jit::push(*stack, std::move(grad_input), std::move(grad_weight), std::move(grad_bias));
}

}  // namespace

Decomposition cuda_runner(const std::string& full_name) {
  if (full_name == "aten::native_batch_norm") return &batch_norm_on_cuda;
  if (full_name == "aten::native_batch_norm_backward") return &batch_norm_backward_on_cuda;
  return nullptr;
}

}  // namespace torch_fallback
