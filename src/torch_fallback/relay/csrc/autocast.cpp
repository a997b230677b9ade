// relay's autocast policy: CUDA's. Matmuls and convolutions run in the low
// precision dtype, reductions and numerically sensitive ops in float32, and
// mixed-dtype ops at the widest input dtype, as torch.autocast("cuda") does.
#include <ATen/autocast_mode.h>
#include <torch/library.h>

namespace at::autocast {
namespace {

Tensor binary_cross_entropy_banned(const Tensor&, const Tensor&, const std::optional<Tensor>&,
                                   int64_t) {
  TORCH_CHECK(false,
              "torch.nn.functional.binary_cross_entropy and torch.nn.BCELoss are unsafe to "
              "autocast on relay, as on CUDA. Use torch.nn.functional."
              "binary_cross_entropy_with_logits or torch.nn.BCEWithLogitsLoss instead.");
}

TORCH_LIBRARY_IMPL(_, AutocastPrivateUse1, m) {
  m.fallback(torch::CppFunction::makeFallthrough());
}

TORCH_LIBRARY_IMPL(aten, AutocastPrivateUse1, m) {
#define RELAY_LOWER_PRECISION_FP(...) KERNEL_PRIVATEUSEONE(__VA_ARGS__, lower_precision_fp)
  AT_FORALL_LOWER_PRECISION_FP(RELAY_LOWER_PRECISION_FP)
#undef RELAY_LOWER_PRECISION_FP
#define RELAY_FP32(...) KERNEL_PRIVATEUSEONE(__VA_ARGS__, fp32)
  AT_FORALL_FP32(RELAY_FP32)
#undef RELAY_FP32
#define RELAY_FP32_SET_OPT_DTYPE(...) KERNEL_PRIVATEUSEONE(__VA_ARGS__, fp32_set_opt_dtype)
  AT_FORALL_FP32_SET_OPT_DTYPE(RELAY_FP32_SET_OPT_DTYPE)
#undef RELAY_FP32_SET_OPT_DTYPE
  AT_FORALL_DIFFERENT_REDISPATCH_SIGNATURE(KERNEL_DIFFERENT_REDISPATCH_SIGNATURE_PRIVATEUSEONE)
#define RELAY_PROMOTE(...) KERNEL_PRIVATEUSEONE(__VA_ARGS__, promote)
  AT_FORALL_PROMOTE(RELAY_PROMOTE)
#undef RELAY_PROMOTE
  m.impl(TORCH_SELECTIVE_NAME("aten::binary_cross_entropy"),
         TORCH_FN((&binary_cross_entropy_banned)));
}

}  // namespace
}  // namespace at::autocast
