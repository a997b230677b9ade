// Batch norm on a CUDA target as eager CUDA runs it. _batch_norm_impl_index
// picks cuDNN only for tensors that are CUDA tensors (input.is_cuda()), so a
// backend's batch norm would always take the native kernels: slower on the GPU
// and more host work per call. Where every tensor of the call already lives on
// the target GPU, these kernels ask PyTorch's own choice
// (_select_batch_norm_backend) and run cuDNN when it says so, as eager would.
#include <torch_fallback/fallback.h>

#include <atomic>
#include <chrono>

#include <ATen/native/Normalization.h>
#include <ATen/ops/cudnn_batch_norm.h>
#include <ATen/ops/cudnn_batch_norm_backward.h>
#include <ATen/ops/empty.h>
#include <c10/util/SmallVector.h>

#include "metrics.h"
#include "op_rules.h"

namespace torch_fallback::detail {
namespace {

// cuDNN's backward may want the reserve space of its forward, which
// native_batch_norm's results cannot carry. Then its backward fails with an
// empty one; from then on the native backward runs (the forward's saved mean
// and inverse standard deviation mean the same to both).
std::atomic<bool> g_backward_needs_reserve{false};

// A call's tensors as CUDA tensors, if all of them live on one GPU already.
class OnTarget {
 public:
  OnTarget(const BackendAdapter& backend, const torch::jit::Stack& stack, size_t first,
           size_t count)
      : backend_(backend) {
    for (size_t i = first; i < first + count && usable_; ++i) add(stack[i]);
    usable_ = usable_ && device_ && backend_.output_home(index_) == *device_;
  }

  bool usable() const { return usable_; }
  const at::Tensor& operator[](size_t i) const { return views_[i]; }
  at::Tensor adopt(const at::Tensor& result) const {
    return result.defined() ? backend_.adopt(result, index_) : result;
  }

 private:
  void add(const c10::IValue& arg) {
    if (arg.isNone()) {
      views_.emplace_back();
      return;
    }
    const at::Tensor& tensor = arg.toTensor();
    if (!tensor.defined()) {
      views_.emplace_back();
      return;
    }
    if (tensor.device().type() != backend_.device_type || tensor.is_nested() ||
        tensor.layout() != c10::kStrided) {
      usable_ = false;
      return;
    }
    const c10::Device home = backend_.home_device(tensor.storage());
    if (!home.is_cuda() || (device_ && *device_ != home)) {
      usable_ = false;
      return;
    }
    device_ = home;
    index_ = tensor.device().index();
    views_.push_back(home_view(backend_, tensor));
  }

  const BackendAdapter& backend_;
  c10::SmallVector<at::Tensor, 7> views_;  // at most 7 tensor arguments: no allocation
  std::optional<c10::Device> device_;
  c10::DeviceIndex index_ = 0;
  bool usable_ = true;
};

bool cudnn_chosen(const at::Tensor& input, const at::Tensor& weight, const at::Tensor& bias,
                  const at::Tensor& running_mean, const at::Tensor& running_var, bool training,
                  double eps) {
  return weight.defined() && bias.defined() &&
         at::native::_select_batch_norm_backend(input, weight, bias, running_mean, running_var,
                                                training, eps) ==
             at::native::BatchNormBackend::Cudnn;
}

void record(const c10::OperatorHandle& op, std::chrono::steady_clock::time_point start) {
  metrics::Call call;
  call.on_cuda = true;
  call.time_ns = static_cast<uint64_t>(std::chrono::duration_cast<std::chrono::nanoseconds>(
                                           std::chrono::steady_clock::now() - start)
                                           .count());
  metrics::record(*op_rules(op).counters, call);
}

// native_batch_norm(input, weight?, bias?, running_mean?, running_var?, training, momentum, eps)
bool forward(const BackendAdapter& backend, const c10::OperatorHandle& op,
             torch::jit::Stack* stack) {
  const auto start = std::chrono::steady_clock::now();
  const size_t first = stack->size() - 8;
  const bool training = (*stack)[first + 5].toBool();
  // In eval mode cuDNN leaves the saved mean and inverse standard deviation
  // empty, where eager's native_batch_norm returns them with one value per channel.
  if (!training) return false;
  const OnTarget t(backend, *stack, first, 5);
  const double momentum = (*stack)[first + 6].toDouble();
  const double eps = (*stack)[first + 7].toDouble();
  if (!t.usable() || !cudnn_chosen(t[0], t[1], t[2], t[3], t[4], training, eps)) return false;
  // Running statistics are updated in place, on the backend's own memory.
  auto [out, save_mean, save_invstd, reserve] =
      at::cudnn_batch_norm(t[0], t[1], t[2], t[3], t[4], training, momentum, eps);
  torch::jit::drop(*stack, 8);
  torch::jit::push(*stack, t.adopt(out), t.adopt(save_mean), t.adopt(save_invstd));
  record(op, start);
  return true;
}

// native_batch_norm_backward(grad_out, input, weight?, running_mean?, running_var?,
//                            save_mean?, save_invstd?, train, eps, output_mask)
bool backward(const BackendAdapter& backend, const c10::OperatorHandle& op,
              torch::jit::Stack* stack) {
  const auto start = std::chrono::steady_clock::now();
  const size_t first = stack->size() - 10;
  const bool train = (*stack)[first + 7].toBool();
  // Eager's cuDNN batch norm also takes the native backward in eval mode.
  if (!train || g_backward_needs_reserve.load(std::memory_order_relaxed)) return false;
  const OnTarget t(backend, *stack, first, 7);
  const double eps = (*stack)[first + 8].toDouble();
  // The backward has no bias; the weight (its shape and dtype) stands in for it.
  if (!t.usable() || !t[5].defined() || !t[6].defined() ||
      !cudnn_chosen(t[1], t[2], t[2], t[3], t[4], /*training=*/true, eps)) {
    return false;
  }
  const auto mask = (*stack)[first + 9].toBoolList();
  const at::Tensor& input = t[1];
  std::tuple<at::Tensor, at::Tensor, at::Tensor> grads;
  try {
    grads = at::cudnn_batch_norm_backward(
        input, t[0].contiguous(input.suggest_memory_format()), t[2], t[3], t[4], t[5], t[6], eps,
        at::empty({0}, input.options().dtype(at::kByte)));
  } catch (const c10::Error&) {
    g_backward_needs_reserve.store(true, std::memory_order_relaxed);
    return false;
  }
  const auto kept = [&](size_t i, const at::Tensor& grad) {
    return mask.get(i) ? t.adopt(grad) : at::Tensor();
  };
  torch::jit::drop(*stack, 10);
  torch::jit::push(*stack, kept(0, std::get<0>(grads)), kept(1, std::get<1>(grads)),
                   kept(2, std::get<2>(grads)));
  record(op, start);
  return true;
}

}  // namespace

bool run_batch_norm_as_eager_cuda(const BackendAdapter& backend, const c10::OperatorHandle& op,
                                  torch::jit::Stack* stack) {
  const OpRules& rules = op_rules(op);
  if (rules.forced_to_cpu() || !targets_cuda()) return false;
  return rules.name == "aten::native_batch_norm" ? forward(backend, op, stack)
                                                 : backward(backend, op, stack);
}

}  // namespace torch_fallback::detail
