#pragma once
// Machinery of torch_fallback/kernels.h: the unboxed kernels (DirectKernel) that
// register_kernels registers, and what they need. Not part of the stable API.
#include "../fallback.h"

#include <ATen/ops/_adaptive_avg_pool2d_backward_ops.h>
#include <ATen/ops/_adaptive_avg_pool2d_ops.h>
#include <ATen/ops/addcdiv_ops.h>
#include <ATen/ops/addcmul_ops.h>
#include <ATen/ops/argmin_ops.h>
#include <ATen/ops/atan2_ops.h>
#include <ATen/ops/atan_ops.h>
#include <ATen/ops/avg_pool2d_backward_ops.h>
#include <ATen/ops/avg_pool2d_ops.h>
#include <ATen/ops/_batch_norm_impl_index_ops.h>
#include <ATen/ops/binary_cross_entropy_backward_ops.h>
#include <ATen/ops/binary_cross_entropy_ops.h>
#include <ATen/ops/bitwise_xor_ops.h>
#include <ATen/ops/bucketize_ops.h>
#include <ATen/ops/bernoulli_ops.h>
#include <ATen/ops/_cdist_backward_ops.h>
#include <ATen/ops/_cdist_forward_ops.h>
#include <ATen/ops/cumprod_ops.h>
#include <ATen/ops/elu_backward_ops.h>
#include <ATen/ops/elu_ops.h>
#include <ATen/ops/erf_ops.h>
#include <ATen/ops/erfinv_ops.h>
#include <ATen/ops/expm1_ops.h>
#include <ATen/ops/flip_ops.h>
#include <ATen/ops/fmod_ops.h>
#include <ATen/ops/_foreach_add_ops.h>
#include <ATen/ops/_foreach_addcdiv_ops.h>
#include <ATen/ops/_foreach_addcmul_ops.h>
#include <ATen/ops/_foreach_div_ops.h>
#include <ATen/ops/_foreach_lerp_ops.h>
#include <ATen/ops/_foreach_maximum_ops.h>
#include <ATen/ops/_foreach_mul_ops.h>
#include <ATen/ops/_foreach_norm_ops.h>
#include <ATen/ops/_foreach_sqrt_ops.h>
#include <ATen/ops/_foreach_zero_ops.h>
#include <ATen/ops/frac_ops.h>
#include <ATen/ops/_fused_sdp_choice_ops.h>
#include <ATen/ops/glu_backward_ops.h>
#include <ATen/ops/glu_ops.h>
#include <ATen/ops/hardsigmoid_backward_ops.h>
#include <ATen/ops/hardsigmoid_ops.h>
#include <ATen/ops/hardswish_backward_ops.h>
#include <ATen/ops/hardswish_ops.h>
#include <ATen/ops/huber_loss_backward_ops.h>
#include <ATen/ops/huber_loss_ops.h>
#include <ATen/ops/im2col_ops.h>
#include <ATen/ops/index_copy_ops.h>
#include <ATen/ops/index_fill_ops.h>
#include <ATen/ops/_index_put_impl_ops.h>
#include <ATen/ops/isnan_ops.h>
#include <ATen/ops/leaky_relu_backward_ops.h>
#include <ATen/ops/leaky_relu_ops.h>
#include <ATen/ops/lerp_ops.h>
#include <ATen/ops/_local_scalar_dense_ops.h>
#include <ATen/ops/log10_ops.h>
#include <ATen/ops/log1p_ops.h>
#include <ATen/ops/log2_ops.h>
#include <ATen/ops/_log_softmax_ops.h>
#include <ATen/ops/_log_softmax_backward_data_ops.h>
#include <ATen/ops/masked_scatter_ops.h>
#include <ATen/ops/median_ops.h>
#include <ATen/ops/mish_backward_ops.h>
#include <ATen/ops/mish_ops.h>
#include <ATen/ops/nll_loss2d_backward_ops.h>
#include <ATen/ops/nll_loss2d_forward_ops.h>
#include <ATen/ops/prod_ops.h>
#include <ATen/ops/reflection_pad1d_ops.h>
#include <ATen/ops/reflection_pad1d_backward_ops.h>
#include <ATen/ops/reflection_pad2d_backward_ops.h>
#include <ATen/ops/reflection_pad2d_ops.h>
#include <ATen/ops/replication_pad1d_ops.h>
#include <ATen/ops/replication_pad1d_backward_ops.h>
#include <ATen/ops/replication_pad2d_ops.h>
#include <ATen/ops/replication_pad2d_backward_ops.h>
#include <ATen/ops/roll_ops.h>
#include <ATen/ops/round_ops.h>
#include <ATen/ops/_scaled_dot_product_cudnn_attention_ops.h>
#include <ATen/ops/_scaled_dot_product_cudnn_attention_backward_ops.h>
#include <ATen/ops/_scaled_dot_product_efficient_attention_ops.h>
#include <ATen/ops/_scaled_dot_product_efficient_attention_backward_ops.h>
#include <ATen/ops/_scaled_dot_product_flash_attention_backward_ops.h>
#include <ATen/ops/_scaled_dot_product_flash_attention_ops.h>
#include <ATen/ops/_scaled_dot_product_flash_attention_for_cpu_ops.h>
#include <ATen/ops/_scaled_dot_product_flash_attention_for_cpu_backward_ops.h>
#include <ATen/ops/_softmax_ops.h>
#include <ATen/ops/_softmax_backward_data_ops.h>
#include <ATen/ops/softplus_backward_ops.h>
#include <ATen/ops/softplus_ops.h>
#include <ATen/ops/std_mean_ops.h>
#include <ATen/ops/std_ops.h>
#include <ATen/ops/tan_ops.h>
#include <ATen/ops/trunc_ops.h>
#include <ATen/ops/upsample_bicubic2d_ops.h>
#include <ATen/ops/upsample_bicubic2d_backward_ops.h>
#include <ATen/ops/upsample_bilinear2d_backward_ops.h>
#include <ATen/ops/upsample_bilinear2d_ops.h>
#include <ATen/ops/upsample_linear1d_ops.h>
#include <ATen/ops/upsample_linear1d_backward_ops.h>
#include <ATen/ops/upsample_nearest1d_ops.h>
#include <ATen/ops/upsample_nearest1d_backward_ops.h>
#include <ATen/ops/upsample_nearest2d_backward_ops.h>
#include <ATen/ops/upsample_nearest2d_ops.h>
#include <ATen/ops/upsample_nearest3d_ops.h>
#include <ATen/ops/upsample_nearest3d_backward_ops.h>
#include <ATen/ops/upsample_trilinear3d_ops.h>
#include <ATen/ops/upsample_trilinear3d_backward_ops.h>
#include <ATen/ops/var_mean_ops.h>
#include <ATen/ops/var_ops.h>
#include <ATen/ops/_weight_norm_interface_ops.h>
#include <ATen/ops/abs_ops.h>
#include <ATen/ops/add_ops.h>
#include <ATen/ops/addmm_ops.h>
#include <ATen/ops/all_ops.h>
#include <ATen/ops/amax_ops.h>
#include <ATen/ops/amin_ops.h>
#include <ATen/ops/any_ops.h>
#include <ATen/ops/arange_ops.h>
#include <ATen/ops/argmax_ops.h>
#include <ATen/ops/baddbmm_ops.h>
#include <ATen/ops/bitwise_and_ops.h>
#include <ATen/ops/bitwise_not_ops.h>
#include <ATen/ops/bitwise_or_ops.h>
#include <ATen/ops/bmm_ops.h>
#include <ATen/ops/cat_ops.h>
#include <ATen/ops/ceil_ops.h>
#include <ATen/ops/clamp_ops.h>
#include <ATen/ops/clamp_min_ops.h>
#include <ATen/ops/col2im_ops.h>
#include <ATen/ops/_convolution_ops.h>
#include <ATen/ops/convolution_backward_ops.h>
#include <ATen/ops/cos_ops.h>
#include <ATen/ops/cumsum_ops.h>
#include <ATen/ops/div_ops.h>
#include <ATen/ops/embedding_dense_backward_ops.h>
#include <ATen/ops/eq_ops.h>
#include <ATen/ops/exp_ops.h>
#include <ATen/ops/exponential_ops.h>
#include <ATen/ops/fill_ops.h>
#include <ATen/ops/floor_ops.h>
#include <ATen/ops/floor_divide_ops.h>
#include <ATen/ops/gather_ops.h>
#include <ATen/ops/ge_ops.h>
#include <ATen/ops/gelu_ops.h>
#include <ATen/ops/gelu_backward_ops.h>
#include <ATen/ops/gt_ops.h>
#include <ATen/ops/hardtanh_ops.h>
#include <ATen/ops/hardtanh_backward_ops.h>
#include <ATen/ops/index_ops.h>
#include <ATen/ops/index_add_ops.h>
#include <ATen/ops/index_select_ops.h>
#include <ATen/ops/isin_ops.h>
#include <ATen/ops/isneginf_ops.h>
#include <ATen/ops/isposinf_ops.h>
#include <ATen/ops/le_ops.h>
#include <ATen/ops/linalg_vector_norm_ops.h>
#include <ATen/ops/log_ops.h>
#include <ATen/ops/log_sigmoid_backward_ops.h>
#include <ATen/ops/log_sigmoid_forward_ops.h>
#include <ATen/ops/lt_ops.h>
#include <ATen/ops/masked_fill_ops.h>
#include <ATen/ops/masked_select_ops.h>
#include <ATen/ops/max_ops.h>
#include <ATen/ops/max_pool2d_with_indices_ops.h>
#include <ATen/ops/max_pool2d_with_indices_backward_ops.h>
#include <ATen/ops/maximum_ops.h>
#include <ATen/ops/mean_ops.h>
#include <ATen/ops/min_ops.h>
#include <ATen/ops/minimum_ops.h>
#include <ATen/ops/mse_loss_ops.h>
#include <ATen/ops/mse_loss_backward_ops.h>
#include <ATen/ops/mm_ops.h>
#include <ATen/ops/mul_ops.h>
#include <ATen/ops/multinomial_ops.h>
#include <ATen/ops/native_batch_norm_ops.h>
#include <ATen/ops/nansum_ops.h>
#include <ATen/ops/native_batch_norm_backward_ops.h>
#include <ATen/ops/native_dropout_ops.h>
#include <ATen/ops/native_dropout_backward_ops.h>
#include <ATen/ops/native_group_norm_ops.h>
#include <ATen/ops/native_group_norm_backward_ops.h>
#include <ATen/ops/native_layer_norm_ops.h>
#include <ATen/ops/native_layer_norm_backward_ops.h>
#include <ATen/ops/ne_ops.h>
#include <ATen/ops/neg_ops.h>
#include <ATen/ops/nll_loss_backward_ops.h>
#include <ATen/ops/nll_loss_forward_ops.h>
#include <ATen/ops/nonzero_ops.h>
#include <ATen/ops/normal_ops.h>
#include <ATen/ops/pow_ops.h>
#include <ATen/ops/reciprocal_ops.h>
#include <ATen/ops/remainder_ops.h>
#include <ATen/ops/relu_ops.h>
#include <ATen/ops/rsqrt_ops.h>
#include <ATen/ops/scatter_ops.h>
#include <ATen/ops/scatter_add_ops.h>
#include <ATen/ops/sgn_ops.h>
#include <ATen/ops/sigmoid_ops.h>
#include <ATen/ops/sigmoid_backward_ops.h>
#include <ATen/ops/sign_ops.h>
#include <ATen/ops/silu_ops.h>
#include <ATen/ops/silu_backward_ops.h>
#include <ATen/ops/sin_ops.h>
#include <ATen/ops/smooth_l1_loss_ops.h>
#include <ATen/ops/sort_ops.h>
#include <ATen/ops/sqrt_ops.h>
#include <ATen/ops/sub_ops.h>
#include <ATen/ops/sum_ops.h>
#include <ATen/ops/tanh_ops.h>
#include <ATen/ops/tanh_backward_ops.h>
#include <ATen/ops/threshold_backward_ops.h>
#include <ATen/ops/topk_ops.h>
#include <ATen/ops/tril_ops.h>
#include <ATen/ops/triu_ops.h>
#include <ATen/ops/uniform_ops.h>
#include <ATen/ops/where_ops.h>
#include <ATen/ops/xlogy_ops.h>
#include <ATen/ops/zero_ops.h>
#include <ATen/ops/_embedding_bag_ops.h>
#include <ATen/ops/_embedding_bag_backward_ops.h>
#include <ATen/ops/_embedding_bag_forward_only_ops.h>
#include <ATen/ops/_embedding_bag_dense_backward_ops.h>
#include <ATen/ops/_embedding_bag_per_sample_weights_backward_ops.h>
#include <ATen/ops/_thnn_fused_lstm_cell_ops.h>
#include <ATen/ops/_thnn_fused_lstm_cell_backward_impl_ops.h>
#include <ATen/ops/_thnn_fused_gru_cell_ops.h>
#include <ATen/ops/_thnn_fused_gru_cell_backward_ops.h>
#include <ATen/ops/_prelu_kernel_ops.h>
#include <ATen/ops/_prelu_kernel_backward_ops.h>
#include <ATen/ops/hardshrink_ops.h>
#include <ATen/ops/hardshrink_backward_ops.h>
#include <ATen/ops/softshrink_ops.h>
#include <ATen/ops/softshrink_backward_ops.h>
#include <ATen/ops/logit_ops.h>
#include <ATen/ops/logit_backward_ops.h>
#include <ATen/ops/adaptive_max_pool2d_ops.h>
#include <ATen/ops/adaptive_max_pool2d_backward_ops.h>
#include <ATen/ops/grid_sampler_2d_ops.h>
#include <ATen/ops/grid_sampler_2d_backward_ops.h>
#include <ATen/ops/_fft_r2c_ops.h>
#include <ATen/ops/_fft_c2c_ops.h>
#include <ATen/ops/_fft_c2r_ops.h>
#include <ATen/ops/_ctc_loss_ops.h>
#include <ATen/ops/_ctc_loss_backward_ops.h>
#include <ATen/ops/_unique2_ops.h>
#include <ATen/ops/searchsorted_ops.h>
#include <ATen/ops/histc_ops.h>
#include <ATen/ops/bincount_ops.h>
#include <ATen/ops/mode_ops.h>
#include <ATen/ops/count_nonzero_ops.h>
#include <ATen/ops/trace_ops.h>
#include <ATen/ops/linalg_inv_ex_ops.h>
#include <ATen/ops/_linalg_solve_ex_ops.h>
#include <ATen/ops/linalg_lu_solve_ops.h>
#include <ATen/ops/addmv_ops.h>
#include <ATen/ops/fmax_ops.h>
#include <ATen/ops/fmin_ops.h>
#include <ATen/ops/copysign_ops.h>
#include <ATen/ops/hypot_ops.h>
#include <ATen/ops/heaviside_ops.h>
#include <ATen/ops/norm_ops.h>
#include <ATen/ops/pixel_shuffle_ops.h>
#include <ATen/ops/pixel_unshuffle_ops.h>
#include <ATen/ops/_cummax_helper_ops.h>
#include <ATen/ops/_cummin_helper_ops.h>
#include <ATen/ops/_logcumsumexp_ops.h>
#include <ATen/ops/linalg_cross_ops.h>
#include <ATen/ops/random_ops.h>
#include <ATen/ops/max_unpool2d_ops.h>
#include <ATen/ops/embedding_renorm_ops.h>
#include <ATen/ops/nanmedian_ops.h>
#include <ATen/ops/aminmax_ops.h>
#include <ATen/ops/logaddexp_ops.h>
#include <ATen/ops/logaddexp2_ops.h>
#include <ATen/ops/asinh_ops.h>
#include <ATen/ops/sinh_ops.h>
#include <ATen/ops/cosh_ops.h>
#include <ATen/ops/sinc_ops.h>
#include <ATen/ops/acos_ops.h>
#include <ATen/ops/asin_ops.h>
#include <ATen/ops/atanh_ops.h>
#include <ATen/ops/acosh_ops.h>
#include <ATen/ops/digamma_ops.h>
#include <ATen/ops/lgamma_ops.h>
#include <ATen/ops/polygamma_ops.h>
#include <ATen/ops/threshold_ops.h>
#include <ATen/ops/avg_pool3d_ops.h>
#include <ATen/ops/avg_pool3d_backward_ops.h>
#include <ATen/ops/multi_margin_loss_ops.h>
#include <ATen/ops/multi_margin_loss_backward_ops.h>
#include <ATen/ops/max_pool3d_with_indices_ops.h>
#include <ATen/ops/max_pool3d_with_indices_backward_ops.h>
#include <ATen/ops/_adaptive_avg_pool3d_ops.h>
#include <ATen/ops/_adaptive_avg_pool3d_backward_ops.h>
#include <ATen/ops/_upsample_nearest_exact1d_ops.h>
#include <ATen/ops/_upsample_nearest_exact2d_ops.h>
#include <ATen/ops/_upsample_nearest_exact3d_ops.h>
#include <ATen/ops/_upsample_nearest_exact1d_backward_ops.h>
#include <ATen/ops/_upsample_nearest_exact2d_backward_ops.h>
#include <ATen/ops/_upsample_nearest_exact3d_backward_ops.h>
#include <ATen/ops/channel_shuffle_ops.h>
#include <ATen/ops/dot_ops.h>
#include <ATen/ops/vdot_ops.h>
#include <ATen/ops/renorm_ops.h>
#include <ATen/ops/i0_ops.h>
#include <ATen/ops/special_i1_ops.h>
#include <ATen/ops/special_i1e_ops.h>
#include <ATen/ops/lshift_ops.h>
#include <ATen/ops/rshift_ops.h>
#include <ATen/ops/special_i0e_ops.h>
#include <ATen/ops/erfc_ops.h>
#include <ATen/ops/exp2_ops.h>
#include <ATen/ops/signbit_ops.h>
#include <ATen/ops/bitwise_left_shift_ops.h>
#include <ATen/ops/bitwise_right_shift_ops.h>
#include <ATen/ops/narrow_copy_ops.h>
#include <ATen/ops/take_ops.h>
#include <ATen/ops/put_ops.h>
#include <ATen/ops/index_reduce_ops.h>
#include <ATen/ops/scatter_reduce_ops.h>
#include <ATen/ops/rrelu_with_noise_ops.h>
#include <ATen/ops/clamp_max_ops.h>
#include <ATen/core/boxing/impl/boxing.h>
#include <c10/util/DimVector.h>
#include <c10/util/SmallVector.h>

#include <array>
#include <initializer_list>
#include <optional>
#include <tuple>
#include <type_traits>
#include <utility>
#include <vector>

namespace torch_fallback {

struct OpRules;

namespace detail {
// _copy_from and _copy_from_and_resize see the conjugate and negative bits
// themselves; registered once, by the first backend.
TORCH_FALLBACK_API void register_math_bit_fallthroughs();
// Whether `aten::<name>` ("op" or "op.overload") has a kernel of its own for the
// dispatch key of `device_type`.
TORCH_FALLBACK_API bool has_kernel(const std::string& name, c10::DeviceType device_type);
// Whether this torch decomposes `aten::<name>` above the backends (a
// CompositeImplicitAutograd kernel) and the library leaves it so (it is not one of
// the ops run whole): a backend kernel for it would take its autograd away
// (Autograd<backend> then no longer runs the decomposition), so it gets none.
TORCH_FALLBACK_API bool decomposes_above_backends(const std::string& name);
// The autograd key of `device_type`'s backend, and `kernel` registered there for
// `aten::<name>` (the library that holds it lives as long as the process).
TORCH_FALLBACK_API c10::DispatchKey autograd_key(c10::DeviceType device_type);
TORCH_FALLBACK_API void register_autograd_kernel(c10::DeviceType device_type, const char* name,
                                                 torch::CppFunction kernel);
// scaled_dot_product_attention on PrivateUse1 tensors runs the fused attention
// kernel the fallback's target would choose, not the math path: CUDA's flash
// attention through _scaled_dot_product_fused_attention_overrideable, registered
// in `aten` unless the backend has its own. A backend with its own choice sets
// _fused_sdp_choice_stub after register_kernels.
TORCH_FALLBACK_API void register_sdp_choice(torch::Library& aten);
// PyTorch's nested kernels that work on any device's buffer, and the ops whose
// composite kernels cannot take nested tensors (register_nested_kernels).
TORCH_FALLBACK_API void register_nested_native_kernels(torch::Library& nested);
TORCH_FALLBACK_API const std::vector<std::string>& nested_ops_run_whole();

// How a DirectKernel runs its op on the target: the target's kernel for the op.
template <typename Op>
struct TargetKernel {
  template <typename... Args>
  static decltype(auto) run(c10::DispatchKeySet keys, Args&&... args) {
    return Op::redispatch(keys, std::forward<Args>(args)...);
  }
};

// native_batch_norm and its backward on the target as eager runs them there.
// _batch_norm_impl_index picks cuDNN only for CUDA tensors (input.is_cuda()),
// so a backend's batch norm would always take the native kernels: slower on
// the GPU and more host work per call. On a CUDA target these ask PyTorch's own
// choice (_select_batch_norm_backend) and run cuDNN where it says so.
struct TORCH_FALLBACK_API BatchNormOnTarget {
  static std::tuple<at::Tensor, at::Tensor, at::Tensor> run(
      c10::DispatchKeySet keys, const at::Tensor& input, const std::optional<at::Tensor>& weight,
      const std::optional<at::Tensor>& bias, const std::optional<at::Tensor>& running_mean,
      const std::optional<at::Tensor>& running_var, bool training, double momentum, double eps);
};

struct TORCH_FALLBACK_API BatchNormBackwardOnTarget {
  static std::tuple<at::Tensor, at::Tensor, at::Tensor> run(
      c10::DispatchKeySet keys, const at::Tensor& grad_out, const at::Tensor& input,
      const std::optional<at::Tensor>& weight, const std::optional<at::Tensor>& running_mean,
      const std::optional<at::Tensor>& running_var, const std::optional<at::Tensor>& save_mean,
      const std::optional<at::Tensor>& save_invstd, bool train, double eps,
      std::array<bool, 3> output_mask);
};

// F.batch_norm reaches native_batch_norm through the composite
// _batch_norm_impl_index, which takes cuDNN only for CUDA tensors: for a
// backend's tensors in eval mode, native_batch_norm costs three GPU kernels
// (it also returns the saved statistics) where eager runs cuDNN's one. Where
// autograd records nothing, the composite runs whole on the target, as eager
// runs it there (a DirectKernel); where autograd records, or the call is not
// served directly, it runs on the backend's tensors (run), as without this kernel.
struct TORCH_FALLBACK_API BatchNormImplIndex {
  using Result = std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor, int64_t>;
  static Result run(const at::Tensor& input, const std::optional<at::Tensor>& weight,
                    const std::optional<at::Tensor>& bias,
                    const std::optional<at::Tensor>& running_mean,
                    const std::optional<at::Tensor>& running_var, bool training, double momentum,
                    double eps, bool cudnn_enabled);
  // The kernel for the backend's autograd key: run where autograd records,
  // else the backend's kernel.
  static Result autograd(c10::DispatchKeySet keys, const at::Tensor& input,
                         const std::optional<at::Tensor>& weight,
                         const std::optional<at::Tensor>& bias,
                         const std::optional<at::Tensor>& running_mean,
                         const std::optional<at::Tensor>& running_var, bool training,
                         double momentum, double eps, bool cudnn_enabled);
  static void register_autograd(c10::DeviceType device_type);
};

// histc on the CPU target counts integer tensors as CUDA's kernel does, as the
// boxed fallback counts them (histc_counts_in_double).
struct TORCH_FALLBACK_API HistcOnTarget {
  static at::Tensor run(c10::DispatchKeySet keys, const at::Tensor& self, int64_t bins,
                        const c10::Scalar& min, const c10::Scalar& max);
};

class TargetImplPool;

// What both engines record of one call: its metrics (time, where it ran, bytes
// moved, whether it failed) and, on a CUDA target with several GPUs visible,
// the GPU made current while the record lives.
class TORCH_FALLBACK_API CallRecord {
 public:
  CallRecord(const OpRules& rules, bool unboxed);
  CallRecord(const CallRecord&) = delete;
  CallRecord& operator=(const CallRecord&) = delete;

  // The call runs on `target`; with one GPU visible it is the current device already.
  void enter(c10::Device target) {
    on_cuda_ = target.is_cuda();
    if (on_cuda_ && cuda::device_count() > 1) device_scope_.emplace(target.index());
  }
  // The call is meant for a CUDA target: counted there, also where it is refused
  // before it enters the target.
  void count_on_cuda() { on_cuda_ = true; }
  void add_bytes_to_target(uint64_t bytes) { bytes_to_target_ += bytes; }
  void add_bytes_from_target(uint64_t bytes) { bytes_from_target_ += bytes; }
  // Counts the call in its op's metrics.
  void record(bool failed) const;

 private:
  const OpRules& rules_;
  const bool unboxed_;
  const uint64_t start_ticks_;  // metrics::ticks()
  bool on_cuda_ = false;
  uint64_t bytes_to_target_ = 0;
  uint64_t bytes_from_target_ = 0;
  std::optional<cuda::DeviceScope> device_scope_;
};

// The versions of the backend tensors an op writes through target tensors. Most
// in-place ops count their writes above the backend (ADInplaceOrView), but a
// _foreach_ op's kernel counts them itself on each tensor it writes (the CPU
// kernel through each tensor's in-place op, the CUDA one explicitly): on the
// target tensors. pass_on() adds those counts to the backend tensors, so that
// autograd sees the writes as it sees eager's. Each target tensor is watched once.
class TORCH_FALLBACK_API WrittenVersions {
 public:
  // `counted_above`: writes the target's count will show that the backend's
  // tensor has counted already (a layer above the backend's key run again for
  // the target tensor); they are not passed on.
  void watch(const at::Tensor& backend, const at::Tensor& target, uint32_t counted_above = 0);
  // Calls that write no argument watch none: no call out of line for them.
  void pass_on() const {
    if (!watched_.empty()) pass_on_watched();
  }

 private:
  void pass_on_watched() const;
  struct Watched {
    c10::TensorImpl* backend;
    c10::TensorImpl* target;
    uint32_t target_before;
  };
  c10::SmallVector<Watched, 4> watched_;
};

// One call of an op whose tensors all live on the fallback target already: the
// target's kernel runs unboxed on views of them, without the boxing, the
// argument walk and the unboxing of the boxed fallback. In-place ops write the
// backend's memory through the views. Any other call (a tensor elsewhere, a
// setting that sends the op elsewhere) goes to the boxed fallback, which serves it in full.
class TORCH_FALLBACK_API DirectCall {
 public:
  // `rules`: rules_for(op), which a kernel may keep: one object per op for the process.
  DirectCall(const BackendAdapter& backend, const OpRules& rules);
  static const OpRules& rules_for(const c10::OperatorHandle& op);
  ~DirectCall();
  DirectCall(const DirectCall&) = delete;
  DirectCall& operator=(const DirectCall&) = delete;

  // Each argument, before start(). A 0-dim CPU tensor (a Python number) may
  // come with backend tensors, as on CUDA.
  void offer(const at::Tensor& tensor);
  void offer(at::Tensor& written);
  void offer(const std::optional<at::Tensor>& tensor) {
    if (tensor.has_value()) offer(*tensor);
  }
  void offer(at::TensorList tensors);
  void offer(const at::ITensorListRef& tensors);  // cat's, which it only reads
  void offer(const c10::List<std::optional<at::Tensor>>& tensors);  // index's indices
  void offer(std::optional<c10::ScalarType> dtype);
  // A random op's generator: none, or the backend's (another device's is the
  // boxed fallback's to refuse, as eager refuses it).
  void offer(const std::optional<at::Generator>& generator);
  void offer(c10::ScalarType dtype) { offer(std::optional<c10::ScalarType>(dtype)); }
  template <typename T>
  void offer(const T& /*not a tensor*/) {}

  // Whether this call runs directly; if so, picks the target and enters its device.
  bool start();

  // The dispatch keys of the target's kernel. The call goes straight there: the
  // keys above it (autograd, autocast, the math bits) have run for the
  // backend's tensors already, so the views need no second key extraction.
  c10::DispatchKeySet target_keys() const { return target_keys_; }

  // Each argument as the target kernel takes it: views of the backend tensors.
  const at::Tensor& on_target(const at::Tensor& tensor);
  at::Tensor& on_target(at::Tensor& written);
  std::optional<at::Tensor> on_target(const std::optional<at::Tensor>& tensor) {
    return tensor.has_value() ? std::optional<at::Tensor>(on_target(*tensor)) : tensor;
  }
  at::TensorList on_target(at::TensorList tensors);
  // The target's generator that the backend's (or its default) draws from, as the
  // boxed fallback swaps it (BackendAdapter::target_generator).
  std::optional<at::Generator> on_target(std::optional<at::Generator>& generator);
  at::ITensorListRef on_target(const at::ITensorListRef& tensors);
  c10::List<std::optional<at::Tensor>> on_target(
      const c10::List<std::optional<at::Tensor>>& tensors);
  template <typename T>
  T& on_target(T& value) {
    return value;
  }

  // The kernel's results as backend tensors; an in-place op's are its backend arguments.
  at::Tensor finish(const at::Tensor& result);
  // The kernel gave no tensor to adopt: it wrote its arguments, or returned a number.
  void finish();
  template <typename... Tensors>
  std::tuple<Tensors...> finish(const std::tuple<Tensors...>& results) {
    kernel_done();
    auto on_backend = std::apply(
        [this](const auto&... result) { return std::tuple<Tensors...>(to_backend(result)...); },
        results);
    finished_ = true;
    return on_backend;
  }
  std::vector<at::Tensor> finish(const std::vector<at::Tensor>& results);

  // Says which op and target raised `error`.
  void add_context(c10::Error& error) const;

 private:
  at::Tensor to_backend(const at::Tensor& result);
  template <typename T>
  const T& to_backend(const T& not_a_tensor) {  // the sizes attention kernels return
    return not_a_tensor;
  }
  // After the kernel: waits for it if the settings ask so, and counts its writes.
  void kernel_done() const {
    if (target_.is_cuda()) wait_if_asked();
    written_versions_.pass_on();
  }
  // On a CUDA target: a device synchronize where the CUDA sync setting says so.
  void wait_if_asked() const;
  C10_NOINLINE void park_list_views();
  c10::StorageImpl* home_in_call(c10::StorageImpl* backend_storage) const;
  at::Tensor view_of(const at::Tensor& tensor);
  // The view kept with `tensor` for later calls, if it still matches; else a new
  // one, kept where the tensor has a kept view already or `add` says to give it one.
  at::Tensor kept_view_of(const at::Tensor& tensor, bool add);

  const BackendAdapter& backend_;
  const OpRules& rules_;
  CallRecord record_;
  bool usable_ = true;
  bool started_ = false;
  bool finished_ = false;
  size_t tensors_ = 0;  // backend tensors offered outside lists
  size_t lists_offered_ = 0;
  size_t list_tensors_ = 0;
  const at::Tensor* written_list_ = nullptr;  // the list argument the op writes, if any
  std::optional<c10::DeviceIndex> index_;
  std::optional<c10::Device> home_;  // of the tensors offered
  c10::Device target_{c10::kCPU};
  c10::DispatchKeySet target_keys_{c10::DispatchKey::CPU};
  TargetImplPool* pool_ = nullptr;  // this thread's, where target tensors may be reused
  // The target storage of each backend storage, once per call: tensors that
  // share memory on the backend share it on the target, as kernels' overlap checks
  // expect. The first view of each (in views_ or view_lists_) holds it until the call ends.
  c10::SmallVector<std::pair<c10::StorageImpl*, c10::StorageImpl*>, 8> homes_;
  // Sized in start(): references to them stay valid. Batch norm has five tensors.
  c10::SmallVector<at::Tensor, 8> views_;
  c10::SmallVector<std::vector<at::Tensor>, 1> view_lists_;
  WrittenVersions written_versions_;
};

// An unboxed kernel for the op `Op` (an at::_ops struct): DirectCall where it
// serves the call (running `Run` on the target), else `Otherwise::run` on the
// backend's tensors, or the boxed fallback where Otherwise is void.
template <const BackendAdapter& (*Adapter)(), typename Op, typename Run = TargetKernel<Op>,
          typename Otherwise = void, typename Schema = typename Op::schema>
struct DirectKernel;

template <const BackendAdapter& (*Adapter)(), typename Op, typename Run, typename Otherwise,
          typename Result, typename... Args>
struct DirectKernel<Adapter, Op, Run, Otherwise, Result(Args...)> {
  static Result call(Args... args) {
    // One guard for both, and no thread-local lookup: the rules are the process's.
    static const std::pair<c10::OperatorHandle, const OpRules*> op_and_rules = [] {
      c10::OperatorHandle handle =
          c10::Dispatcher::singleton().findSchemaOrThrow(Op::name, Op::overload_name);
      const OpRules* rules = &DirectCall::rules_for(handle);
      return std::make_pair(std::move(handle), rules);
    }();
    const c10::OperatorHandle& op = op_and_rules.first;
    {
      DirectCall direct(Adapter(), *op_and_rules.second);
      (direct.offer(args), ...);
      if (direct.start()) {
        const auto run = [&]() -> Result {
          try {
            return Run::run(direct.target_keys(), direct.on_target(args)...);
          } catch (c10::Error& error) {
            direct.add_context(error);
            throw;
          }
        };
        if constexpr (std::is_void_v<Result>) {  // an in-place _foreach_ op
          run();
          direct.finish();
          return;
        } else if constexpr (std::is_same_v<Result, at::Tensor&>) {
          run();  // an in-place op: it wrote self through its view
          direct.finish();
          return written(args...);
        } else if constexpr (std::is_arithmetic_v<Result> ||  // _fused_sdp_choice's choice
                             std::is_same_v<Result, c10::Scalar>) {  // item()'s number
          const Result value = run();
          direct.finish();
          return value;
        } else {
          return direct.finish(run());
        }
      }
    }
    if constexpr (!std::is_void_v<Otherwise>) {
      return Otherwise::run(args...);
    } else {
      torch::jit::Stack stack = c10::impl::boxArgs<Args...>(args...);
      boxed_fallback(Adapter(), op, &stack);
      if constexpr (std::is_void_v<Result>) {
        return;
      } else if constexpr (std::is_same_v<Result, at::Tensor&>) {
        return written(args...);
      } else {
        return c10::impl::PopResult<Result>::call(stack);
      }
    }
  }

 private:
  // The tensor an in-place or out= op writes and returns: its first non-const one.
  template <typename First, typename... Rest>
  static at::Tensor& written(First&& first, Rest&&... rest) {
    if constexpr (std::is_same_v<First, at::Tensor&>) {
      return first;
    } else {
      return written(std::forward<Rest>(rest)...);
    }
  }
};

// Whether the kernel was registered: not where the backend has its own, nor
// (unless `over_decomposition`) where this torch decomposes the op above the backends.
template <const BackendAdapter& (*Adapter)(), typename Op, typename Run = TargetKernel<Op>,
          typename Otherwise = void, bool over_decomposition = false>
bool register_direct_kernel(torch::Library& aten) {
  std::string name = std::string(Op::name).substr(std::string("aten::").size());
  if (*Op::overload_name != '\0') name += std::string(".") + Op::overload_name;
  if (has_kernel(name, Adapter().device_type)) return false;
  if (!over_decomposition && decomposes_above_backends(name)) return false;
  using Kernel = DirectKernel<Adapter, Op, Run, Otherwise>;
  aten.impl(name.c_str(), TORCH_FN(Kernel::call));
  return true;
}

template <const BackendAdapter& (*Adapter)(), typename... Ops>
void register_direct_kernels(torch::Library& aten) {
  (register_direct_kernel<Adapter, Ops>(aten), ...);
}

// `Op` served by the boxed fallback: a call its unboxed kernel leaves to it.
template <const BackendAdapter& (*Adapter)(), typename Op, typename... Args>
void run_boxed(const Args&... args) {
  static const c10::OperatorHandle op =
      c10::Dispatcher::singleton().findSchemaOrThrow(Op::name, Op::overload_name);
  torch::jit::Stack stack{c10::IValue(args)...};
  boxed_fallback(Adapter(), op, &stack);
}

// arange.start_out, which torch.arange(..., device=<backend>) calls on an empty
// tensor. Where the size the target kernel will compute is known (arange_size),
// the output is sized on the backend first, so that the target kernel writes it
// in place through a view, unboxed. Anything else (an output of another size,
// which the kernel resizes with a warning; a range it refuses) is served boxed,
// as eager serves it on the target.
TORCH_FALLBACK_API int64_t arange_size(const c10::Scalar& start, const c10::Scalar& end,
                                       const c10::Scalar& step, c10::ScalarType dtype);

template <const BackendAdapter& (*Adapter)()>
struct ArangeKernel {
  static at::Tensor& call(const c10::Scalar& start, const c10::Scalar& end,
                          const c10::Scalar& step, at::Tensor& out) {
    const int64_t size = arange_size(start, end, step, out.scalar_type());
    if (size >= 0 && (out.numel() == size || out.numel() == 0)) {
      const std::vector<int64_t> given = out.sizes().vec();
      if (out.numel() != size) out.resize_({size});
      try {
        return DirectKernel<Adapter, at::_ops::arange_start_out>::call(start, end, step, out);
      } catch (const c10::Error&) {
        // The target sized it otherwise: served boxed below, from the output as it
        // came, so that the kernel resizes an empty one without a warning, as eager's.
        out.resize_(given);
      }
    }
    run_boxed<Adapter, at::_ops::arange_start_out>(start, end, step, out);
    return out;
  }
};

// The shape `sizes` broadcast to, or nullopt where they do not broadcast.
TORCH_FALLBACK_API std::optional<c10::DimVector> broadcast_shape(
    std::initializer_list<c10::IntArrayRef> sizes);

// where.self_out, which the math attention's _safe_softmax calls to write its
// output in place. An output of the broadcast shape, or an empty one (sized on
// the backend first, as the target kernel would size it), is written unboxed
// through a view; any other (which the kernel resizes with a warning) and
// arguments that do not broadcast are served boxed, as eager serves them.
template <const BackendAdapter& (*Adapter)()>
struct WhereOutKernel {
  static at::Tensor& call(const at::Tensor& condition, const at::Tensor& self,
                          const at::Tensor& other, at::Tensor& out) {
    const auto shape = broadcast_shape({condition.sizes(), self.sizes(), other.sizes()});
    if (shape && out.device().type() == Adapter().device_type &&
        (out.numel() == 0 || out.sizes() == c10::IntArrayRef(*shape))) {
      if (out.sizes() != c10::IntArrayRef(*shape)) out.resize_(*shape);
      return DirectKernel<Adapter, at::_ops::where_self_out>::call(condition, self, other, out);
    }
    run_boxed<Adapter, at::_ops::where_self_out>(condition, self, other, out);
    return out;
  }
};

template <const BackendAdapter& (*Adapter)()>
struct CopyKernels {
  static at::Tensor copy_from(const at::Tensor& self, const at::Tensor& dst, bool non_blocking) {
    copy_between(Adapter(), self, dst, non_blocking);
    return dst;
  }
  static at::Tensor copy_from_and_resize(const at::Tensor& self, const at::Tensor& dst) {
    dst.resize_(self.sizes());
    copy_between(Adapter(), self, dst, /*non_blocking=*/false);
    return dst;
  }
};
}  // namespace detail
}  // namespace torch_fallback
