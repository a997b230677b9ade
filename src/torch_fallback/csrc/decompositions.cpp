#include "decompositions.h"

#include <ATen/ATen.h>
#include <ATen/core/dispatch/Dispatcher.h>

#include <unordered_map>
#include <utility>
#include <vector>

namespace torch_fallback {
namespace {

using torch::jit::Stack;

at::Tensor optional_tensor(const c10::IValue& value) {
  return value.isNone() ? at::Tensor() : value.toTensor();
}

at::Tensor or_zeros(const at::Tensor& tensor, const at::Tensor& like) {
  return tensor.defined() ? tensor : at::zeros_like(like);
}

// CUDA's fused cells compute in float for half and bfloat16 tensors (their
// accscalar_t) and round only what they store: the results and the workspace.
// The decompositions do the same, one rounding per stored value instead of one per op.
c10::ScalarType compute_type(c10::ScalarType stored) {
  return at::isReducedFloatingType(stored) ? at::kFloat : stored;
}

at::Tensor computed_as(const at::Tensor& tensor, c10::ScalarType type) {
  return tensor.defined() && tensor.scalar_type() != type ? tensor.to(type) : tensor;
}

// gates = input_gates + hidden_gates (+ both biases), as the CUDA kernels sum them.
at::Tensor summed_gates(const at::Tensor& input_gates, const at::Tensor& hidden_gates,
                        const at::Tensor& input_bias, const at::Tensor& hidden_bias) {
  at::Tensor gates = input_gates + hidden_gates;
  if (input_bias.defined()) gates = gates + input_bias + hidden_bias;
  return gates;
}

// _thnn_fused_lstm_cell(input_gates, hidden_gates, cx, input_bias?, hidden_bias?)
//   -> (hy, cy, workspace = activated gates [i, f, g, o])
void lstm_cell(const c10::OperatorHandle&, Stack* stack) {
  auto args = torch::jit::pop(*stack, 5);
  const c10::ScalarType stored = args[0].toTensor().scalar_type();
  const c10::ScalarType type = compute_type(stored);
  const auto arg = [&](size_t i) { return computed_as(optional_tensor(args[i]), type); };
  const at::Tensor gates = summed_gates(arg(0), arg(1), arg(3), arg(4));
  const at::Tensor cx = arg(2);
  auto chunks = gates.chunk(4, 1);
  const at::Tensor ig = chunks[0].sigmoid();
  const at::Tensor fg = chunks[1].sigmoid();
  const at::Tensor cg = chunks[2].tanh();
  const at::Tensor og = chunks[3].sigmoid();
  const at::Tensor cy = fg * cx + ig * cg;
  const at::Tensor hy = og * cy.tanh();
  torch::jit::push(*stack, computed_as(hy, stored), computed_as(cy, stored),
                   computed_as(at::cat({ig, fg, cg, og}, 1), stored));
}

// _thnn_fused_lstm_cell_backward_impl(grad_hy?, grad_cy?, cx, cy, workspace, has_bias)
//   -> (grad_gates, grad_cx, grad_bias)
void lstm_cell_backward(const c10::OperatorHandle&, Stack* stack) {
  auto args = torch::jit::pop(*stack, 6);
  const c10::ScalarType stored = args[3].toTensor().scalar_type();
  const c10::ScalarType type = compute_type(stored);
  const auto arg = [&](size_t i) { return computed_as(optional_tensor(args[i]), type); };
  const at::Tensor cx = arg(2);
  const at::Tensor cy = arg(3);
  const at::Tensor workspace = arg(4);
  const bool has_bias = args[5].toBool();
  const at::Tensor grad_hy = or_zeros(arg(0), cy);
  const at::Tensor grad_cy = or_zeros(arg(1), cy);
  auto chunks = workspace.chunk(4, 1);
  const at::Tensor &ig = chunks[0], &fg = chunks[1], &cg = chunks[2], &og = chunks[3];
  const at::Tensor tanh_cy = cy.tanh();
  const at::Tensor gcx = grad_hy * og * (1 - tanh_cy * tanh_cy) + grad_cy;
  const at::Tensor grad_gates = computed_as(
      at::cat({gcx * cg * (1 - ig) * ig, gcx * cx * (1 - fg) * fg, gcx * ig * (1 - cg * cg),
               grad_hy * tanh_cy * (1 - og) * og},
              1),
      stored);
  const at::Tensor grad_bias = has_bias ? grad_gates.sum(0) : at::Tensor();  // as CUDA sums it
  torch::jit::push(*stack, grad_gates, computed_as(gcx * fg, stored), grad_bias);
}

// _thnn_fused_gru_cell(input_gates, hidden_gates, hx, input_bias?, hidden_bias?)
//   -> (hy, workspace = [r, z, n, hx, hidden n gate with its bias])
void gru_cell(const c10::OperatorHandle&, Stack* stack) {
  auto args = torch::jit::pop(*stack, 5);
  const c10::ScalarType stored = args[0].toTensor().scalar_type();
  const c10::ScalarType type = compute_type(stored);
  const auto arg = [&](size_t i) { return computed_as(optional_tensor(args[i]), type); };
  at::Tensor input_gates = arg(0);
  at::Tensor hidden_gates = arg(1);
  const at::Tensor hx = arg(2);
  const at::Tensor input_bias = arg(3);
  const at::Tensor hidden_bias = arg(4);
  if (input_bias.defined()) {
    input_gates = input_gates + input_bias;
    hidden_gates = hidden_gates + hidden_bias;
  }
  auto in = input_gates.chunk(3, 1);
  auto hid = hidden_gates.chunk(3, 1);
  const at::Tensor rg = (in[0] + hid[0]).sigmoid();
  const at::Tensor ig = (in[1] + hid[1]).sigmoid();
  const at::Tensor ng = (in[2] + rg * hid[2]).tanh();
  const at::Tensor hy = ng + ig * (hx - ng);
  torch::jit::push(*stack, computed_as(hy, stored),
                   computed_as(at::cat({rg, ig, ng, hx, hid[2]}, 1), stored));
}

// _thnn_fused_gru_cell_backward(grad_hy, workspace, has_bias)
//   -> (grad_input_gates, grad_hidden_gates, grad_hx, grad_input_bias, grad_hidden_bias)
void gru_cell_backward(const c10::OperatorHandle&, Stack* stack) {
  auto args = torch::jit::pop(*stack, 3);
  const c10::ScalarType stored = args[0].toTensor().scalar_type();
  const c10::ScalarType type = compute_type(stored);
  const at::Tensor grad_hy = computed_as(args[0].toTensor(), type);
  const bool has_bias = args[2].toBool();
  auto chunks = computed_as(args[1].toTensor(), type).chunk(5, 1);
  const at::Tensor &rg = chunks[0], &ig = chunks[1], &ng = chunks[2], &hx = chunks[3],
                   &hn = chunks[4];
  const at::Tensor gig = grad_hy * (hx - ng) * (1 - ig) * ig;
  const at::Tensor gin = grad_hy * (1 - ig) * (1 - ng * ng);
  const at::Tensor grg = gin * hn * (1 - rg) * rg;
  const at::Tensor grad_input_gates = computed_as(at::cat({grg, gig, gin}, 1), stored);
  const at::Tensor grad_hidden_gates = computed_as(at::cat({grg, gig, gin * rg}, 1), stored);
  const at::Tensor grad_input_bias = has_bias ? grad_input_gates.sum(0) : at::Tensor();
  const at::Tensor grad_hidden_bias = has_bias ? grad_hidden_gates.sum(0) : at::Tensor();
  torch::jit::push(*stack, grad_input_gates, grad_hidden_gates,
                   computed_as(grad_hy * ig, stored), grad_input_bias, grad_hidden_bias);
}

// SyncBatchNorm's ops (torch.nn.modules._functions.SyncBatchNorm), which it runs
// for CUDA and PrivateUse1 tensors. As CUDA's kernels: statistics per channel
// (dimension 1) in the accumulation type (float for half and bfloat16), mean and
// invstd in that type, results of the input's dtype.

// The channel dimension's values of a per-channel tensor, broadcast against `like`.
at::Tensor per_channel(const at::Tensor& values, const at::Tensor& like) {
  std::vector<int64_t> shape(static_cast<size_t>(like.dim()), 1);
  shape[1] = values.numel();
  return values.view(shape);
}

std::vector<int64_t> all_but_channels(const at::Tensor& tensor) {
  std::vector<int64_t> dims{0};
  for (int64_t dim = 2; dim < tensor.dim(); ++dim) dims.push_back(dim);
  return dims;
}

// 1 / sqrt(var + eps), and 0 where both are 0 (CUDA's InvStd).
at::Tensor inverse_std(const at::Tensor& var, double eps) {
  const at::Tensor invstd = (var + eps).rsqrt();
  return eps == 0 ? at::where(var == 0, at::zeros_like(invstd), invstd) : invstd;
}

// batch_norm_stats(input, eps) -> (mean, invstd), the variance biased.
void batch_norm_stats(const c10::OperatorHandle&, Stack* stack) {
  auto args = torch::jit::pop(*stack, 2);
  const at::Tensor stored = args[0].toTensor();
  const at::Tensor input = computed_as(stored, compute_type(stored.scalar_type()));
  const auto dims = all_but_channels(input);
  const at::Tensor mean = input.mean(dims);
  const at::Tensor var = (input - per_channel(mean, input)).square().mean(dims);
  torch::jit::push(*stack, mean, inverse_std(var, args[1].toDouble()));
}

// Running statistics updated in place, as CUDA's kernels update them (the schema
// does not say so: op_rules' hidden mutations).
void update_running_stats(const at::Tensor& running_mean, const at::Tensor& running_var,
                          const at::Tensor& mean, const at::Tensor& unbiased_var,
                          double momentum) {
  if (running_mean.defined()) {
    running_mean.copy_(mean * momentum + running_mean.to(mean.scalar_type()) * (1 - momentum));
  }
  if (running_var.defined()) {
    running_var.copy_(unbiased_var * momentum +
                      running_var.to(unbiased_var.scalar_type()) * (1 - momentum));
  }
}

// CUDA's gather kernels read every tensor as its template types, and refuse another
// (get_packed_accessor's words): counts and running statistics as the running
// statistics' type (the input's where there are none), means and invstds as its
// accumulation type.
void expect_type(const at::Tensor& tensor, const char* name, c10::ScalarType type) {
  TORCH_CHECK(!tensor.defined() || tensor.scalar_type() == type, "Expected ", name,
              " to have type ", type, " but got ", tensor.scalar_type());
}

// The ranks' statistics combined one rank after another, as CUDA's
// batch_norm_reduce_statistics_kernel combines them: (mean, invstd) of all.
std::pair<at::Tensor, at::Tensor> gather_stats(const at::Tensor& input, const at::Tensor& means,
                                               const at::Tensor& invstds,
                                               const at::Tensor& counts,
                                               const at::Tensor& running_mean,
                                               const at::Tensor& running_var, double momentum,
                                               double eps) {
  const c10::ScalarType stored =
      running_mean.defined() ? running_mean.scalar_type() : input.scalar_type();
  const c10::ScalarType type = compute_type(stored);
  expect_type(counts, "counts", stored);
  expect_type(means, "mean", type);
  expect_type(invstds, "invstd", type);
  expect_type(running_mean, "running_mean", stored);
  expect_type(running_var, "running_var", stored);
  const at::Tensor count_of = computed_as(counts, type);
  at::Tensor avg = at::zeros({means.size(1)}, means.options());
  at::Tensor var_n = at::zeros_like(avg);
  at::Tensor n = at::zeros({}, count_of.options());
  for (int64_t rank = 0; rank < means.size(0); ++rank) {
    const at::Tensor count = count_of[rank];
    const at::Tensor m = means[rank];
    const at::Tensor stddev = invstds[rank].reciprocal();
    const at::Tensor v = (stddev * stddev - eps) * count;
    const at::Tensor factor = (n + count).reciprocal();
    var_n = var_n + (v + (avg - m) * (avg - m) * n * count * factor);
    avg = n * factor * avg + count * factor * m;
    n = n + count;
  }
  update_running_stats(running_mean, running_var, avg, var_n / (n - 1), momentum);
  return {avg, (var_n / n + eps).rsqrt()};
}

// batch_norm_gather_stats_with_counts(input, mean, invstd, running_mean?, running_var?,
//   momentum, eps, counts) -> (mean, invstd)
void batch_norm_gather_stats_with_counts(const c10::OperatorHandle&, Stack* stack) {
  auto args = torch::jit::pop(*stack, 8);
  auto [mean, invstd] = gather_stats(args[0].toTensor(), args[1].toTensor(), args[2].toTensor(),
                                     args[7].toTensor(), optional_tensor(args[3]),
                                     optional_tensor(args[4]), args[5].toDouble(),
                                     args[6].toDouble());
  torch::jit::push(*stack, mean, invstd);
}

// batch_norm_gather_stats(input, mean, invstd, running_mean?, running_var?, momentum, eps,
//   count): every rank with the same count, in the type CUDA makes its counts.
void batch_norm_gather_stats(const c10::OperatorHandle&, Stack* stack) {
  auto args = torch::jit::pop(*stack, 8);
  const at::Tensor input = args[0].toTensor();
  const at::Tensor means = args[1].toTensor();
  const at::Tensor running_mean = optional_tensor(args[3]);
  const at::Tensor counts =
      at::full({means.size(0)}, args[7].toInt(),
               means.options().dtype(running_mean.defined() ? running_mean.dtype()
                                                            : input.dtype()));
  auto [mean, invstd] = gather_stats(input, means, args[2].toTensor(), counts, running_mean,
                                     optional_tensor(args[4]), args[5].toDouble(),
                                     args[6].toDouble());
  torch::jit::push(*stack, mean, invstd);
}

// batch_norm_elemt(input, weight?, bias?, mean, invstd, eps)
//   -> (input - mean) * invstd * weight + bias
void batch_norm_elemt(const c10::OperatorHandle&, Stack* stack) {
  auto args = torch::jit::pop(*stack, 6);
  const at::Tensor stored = args[0].toTensor();
  const c10::ScalarType type = compute_type(stored.scalar_type());
  const at::Tensor input = computed_as(stored, type);
  const auto channel = [&](size_t i) {
    return per_channel(computed_as(optional_tensor(args[i]), type), input);
  };
  at::Tensor out = (input - channel(3)) * channel(4);
  if (!args[1].isNone()) out = out * channel(1);
  if (!args[2].isNone()) out = out + channel(2);
  torch::jit::push(*stack, computed_as(out, stored.scalar_type()));
}

// batch_norm_backward_reduce(grad_out, input, mean, invstd, weight?, input_g, weight_g,
//   bias_g) -> (sum_dy, sum_dy_xmu, grad_weight, grad_bias), each only where asked for.
void batch_norm_backward_reduce(const c10::OperatorHandle&, Stack* stack) {
  auto args = torch::jit::pop(*stack, 8);
  const at::Tensor mean = args[2].toTensor();
  const c10::ScalarType type = mean.scalar_type();
  const at::Tensor grad_out = computed_as(args[0].toTensor(), type);
  const at::Tensor input = computed_as(args[1].toTensor(), type);
  const auto dims = all_but_channels(input);
  const at::Tensor sum_dy = grad_out.sum(dims);
  const at::Tensor sum_dy_xmu = (grad_out * (input - per_channel(mean, input))).sum(dims);
  const at::Tensor weight = optional_tensor(args[4]);
  const c10::ScalarType weight_type = weight.defined() ? weight.scalar_type() : type;
  const bool input_g = args[5].toBool();
  const bool weight_g = args[6].toBool();
  const bool bias_g = args[7].toBool();
  torch::jit::push(*stack, input_g ? sum_dy : at::Tensor(), input_g ? sum_dy_xmu : at::Tensor(),
                   weight_g ? (sum_dy_xmu * args[3].toTensor()).to(weight_type) : at::Tensor(),
                   bias_g ? sum_dy.to(weight_type) : at::Tensor());
}

// batch_norm_backward_elemt(grad_out, input, mean, invstd, weight?, sum_dy, sum_dy_xmu,
//   count) -> grad_input, the sums being all ranks' and count their element counts.
void batch_norm_backward_elemt(const c10::OperatorHandle&, Stack* stack) {
  auto args = torch::jit::pop(*stack, 8);
  const at::Tensor stored = args[1].toTensor();
  const at::Tensor mean = args[2].toTensor();
  const c10::ScalarType type = mean.scalar_type();
  const at::Tensor input = computed_as(stored, type);
  const at::Tensor grad_out = computed_as(args[0].toTensor(), type);
  const at::Tensor invstd = args[3].toTensor();
  const at::Tensor norm = args[7].toTensor().sum().to(type).reciprocal();
  const at::Tensor mean_dy = args[5].toTensor() * norm;
  const at::Tensor mean_dy_xmu = args[6].toTensor() * norm;
  const at::Tensor factor_1 = invstd * invstd * mean_dy_xmu;
  const at::Tensor weight = optional_tensor(args[4]);
  const at::Tensor factor_2 = weight.defined() ? computed_as(weight, type) * invstd : invstd;
  const at::Tensor grad_input =
      (grad_out - per_channel(mean_dy, input) -
       (input - per_channel(mean, input)) * per_channel(factor_1, input)) *
      per_channel(factor_2, input);
  torch::jit::push(*stack, computed_as(grad_input, stored.scalar_type()));
}

// histc(self, bins, min, max) and histc.out(..., out) of integer tensors
// (histc_counts_in_double).
void histc_of_integers(const c10::OperatorHandle& op, Stack* stack) {
  const bool out_form = op.schema().arguments().size() == 5;
  c10::IValue& self_slot = (*stack)[stack->size() - (out_form ? 5 : 4)];
  const at::Tensor self = self_slot.toTensor();
  if (!histc_counts_in_double(self)) {
    op.callBoxed(stack);
    return;
  }
  self_slot = self.to(at::kDouble);
  if (!out_form) {
    op.callBoxed(stack);
    stack->back() = stack->back().toTensor().to(self.scalar_type());
    return;
  }
  // CUDA's out= form copies its counts into `out`, whatever out's dtype.
  const at::Tensor out = stack->back().toTensor();
  stack->back() = at::empty({0}, self.options().dtype(at::kDouble));
  op.callBoxed(stack);
  const at::Tensor counts = torch::jit::pop(*stack).toTensor();
  out.resize_(counts.sizes());
  out.copy_(counts);
  torch::jit::push(*stack, out);
}

}  // namespace

bool histc_counts_in_double(const at::Tensor& self) {
  return at::isIntegralType(self.scalar_type(), /*includeBool=*/false);
}

Decomposition cpu_runner(const std::string& full_name) {
  if (full_name == "aten::histc" || full_name == "aten::histc.out") return &histc_of_integers;
  return nullptr;
}

Decomposition cpu_decomposition(const std::string& full_name) {
  static const std::unordered_map<std::string, Decomposition> table{
      {"aten::_thnn_fused_lstm_cell", &lstm_cell},
      {"aten::_thnn_fused_lstm_cell_backward_impl", &lstm_cell_backward},
      {"aten::_thnn_fused_gru_cell", &gru_cell},
      {"aten::_thnn_fused_gru_cell_backward", &gru_cell_backward},
      {"aten::batch_norm_stats", &batch_norm_stats},
      {"aten::batch_norm_gather_stats", &batch_norm_gather_stats},
      {"aten::batch_norm_gather_stats_with_counts", &batch_norm_gather_stats_with_counts},
      {"aten::batch_norm_elemt", &batch_norm_elemt},
      {"aten::batch_norm_backward_reduce", &batch_norm_backward_reduce},
      {"aten::batch_norm_backward_elemt", &batch_norm_backward_elemt},
  };
  const auto it = table.find(full_name);
  return it == table.end() ? nullptr : it->second;
}

}  // namespace torch_fallback
