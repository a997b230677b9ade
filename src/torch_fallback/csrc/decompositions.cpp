#include "decompositions.h"

#include <ATen/ATen.h>
#include <ATen/core/dispatch/Dispatcher.h>

#include <unordered_map>

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

// histc(self, bins, min, max) and histc.out(..., out): CUDA's kernel counts
// integer tensors too (Hugging Face's MoE layers count expert indices with it on
// any device but the CPU), the CPU's floating ones only. Counted in double,
// which holds the integers and CUDA's bin arithmetic exactly below 2**53; the
// result has the input's dtype, as CUDA's.
void histc_of_integers(const c10::OperatorHandle& op, Stack* stack) {
  const bool out_form = op.schema().arguments().size() == 5;
  c10::IValue& self_slot = (*stack)[stack->size() - (out_form ? 5 : 4)];
  const at::Tensor self = self_slot.toTensor();
  if (!at::isIntegralType(self.scalar_type(), /*includeBool=*/false)) {
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
  };
  const auto it = table.find(full_name);
  return it == table.end() ? nullptr : it->second;
}

}  // namespace torch_fallback
