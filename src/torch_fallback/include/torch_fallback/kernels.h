#pragma once
// register_kernels: everything torch-fallback gives a backend besides the
// boxed fallback, registered for the backend's dispatch key. Include it in the
// translation unit that registers the backend's kernels; it pulls in the
// operator headers of the unboxed kernels, which other files need not pay for.
#include "detail/direct_kernel.h"

namespace torch_fallback {

// Everything torch-fallback can give a backend besides the fallback itself,
// for TORCH_LIBRARY_IMPL(aten, <key>, m): the views, _copy_from and
// _copy_from_and_resize, arange, where's out= form, the ops run whole, unboxed kernels for the functional
// and in-place ops a training step calls most (DirectKernel), batch norm on cuDNN where
// eager CUDA would take it, and (for PrivateUse1) the choice of the fused
// attention kernel, and device moves that keep parameters (register_device_moves).
// The backend still owns its memory: empty.memory_format,
// empty_strided and resize_. Call it after registering the backend's own
// kernels (in a TORCH_LIBRARY_IMPL block that runs later, e.g. the same one):
// every kernel the backend has for its dispatch key by then is left in place,
// the views, _copy_from and the attention choice included.
template <const BackendAdapter& (*Adapter)()>
void register_kernels(torch::Library& aten) {
  const c10::DeviceType device_type = Adapter().device_type;
  detail::register_math_bit_fallthroughs();
  register_adapter(Adapter());
  register_device_moves(device_type);
  if (device_type == c10::DeviceType::PrivateUse1) detail::register_sdp_choice(aten);
  register_view_kernels(aten, device_type);
  if (!detail::has_kernel("_copy_from", device_type)) {
    aten.impl("_copy_from", TORCH_FN(detail::CopyKernels<Adapter>::copy_from));
  }
  if (!detail::has_kernel("_copy_from_and_resize", device_type)) {
    aten.impl("_copy_from_and_resize",
              TORCH_FN(detail::CopyKernels<Adapter>::copy_from_and_resize));
  }
  if (!detail::has_kernel("arange.start_out", device_type)) {
    aten.impl("arange.start_out", TORCH_FN(detail::ArangeKernel<Adapter>::call));
  }
  if (!detail::has_kernel("where.self_out", device_type)) {
    aten.impl("where.self_out", TORCH_FN(detail::WhereOutKernel<Adapter>::call));
  }
  // The functional ops a training step calls most, run unboxed where they can be.
  // _convolution, not convolution: the JIT tracer records the op convolution
  // calls, so convolution must reach it on the backend's tensors.
  namespace ops = at::_ops;
  detail::register_direct_kernels<
      Adapter, ops::add_Tensor, ops::sub_Tensor, ops::mul_Tensor, ops::div_Tensor, ops::mm,
      ops::bmm, ops::addmm, ops::_convolution, ops::convolution_backward, ops::relu,
      ops::threshold_backward, ops::gelu, ops::gelu_backward, ops::_softmax,
      ops::_softmax_backward_data, ops::_log_softmax, ops::_log_softmax_backward_data,
      ops::native_layer_norm, ops::native_layer_norm_backward, ops::sum_dim_IntList,
      ops::mean_dim, ops::nll_loss_forward, ops::nll_loss_backward, ops::native_dropout,
      ops::native_dropout_backward, ops::cat,
      // in place: gradient accumulation, zero_grad(set_to_none=False), the optimizers
      ops::add__Tensor, ops::sub__Tensor, ops::mul__Tensor, ops::div__Tensor, ops::mul__Scalar,
      ops::zero_, ops::fill__Scalar, ops::_foreach_add__Scalar, ops::_foreach_add__List,
      ops::_foreach_mul__Scalar, ops::_foreach_mul__List, ops::_foreach_div__ScalarList,
      ops::_foreach_addcmul__Scalar, ops::_foreach_addcdiv__ScalarList,
      ops::_foreach_lerp__Scalar, ops::_foreach_zero_, ops::_foreach_sqrt,
      ops::_foreach_maximum__List,  // AMSGrad
      // clip_grad_norm_, the regression and logistic losses and their backwards
      ops::_foreach_norm_Scalar, ops::_foreach_mul__Tensor, ops::linalg_vector_norm,
      ops::mse_loss, ops::mse_loss_backward, ops::smooth_l1_loss, ops::log_sigmoid_forward,
      ops::log_sigmoid_backward, ops::sgn, ops::reciprocal,
      // the fused attention kernels scaled_dot_product_attention chooses on each target
      ops::_fused_sdp_choice, ops::_scaled_dot_product_cudnn_attention,
      ops::_scaled_dot_product_cudnn_attention_backward,
      ops::_scaled_dot_product_efficient_attention,
      ops::_scaled_dot_product_efficient_attention_backward,
      ops::_scaled_dot_product_flash_attention, ops::_scaled_dot_product_flash_attention_backward,
      ops::_scaled_dot_product_flash_attention_for_cpu,
      ops::_scaled_dot_product_flash_attention_for_cpu_backward>(aten);
  // The pointwise, comparison, indexing and reduction ops of inference and
  // decoding (normalization, rotary embeddings, activations, masks, sampling),
  // and the backward kernels of those that train: launch-bound work pays a boxed call
  // for each of them.
  detail::register_direct_kernels<
      Adapter, ops::pow_Tensor_Scalar, ops::pow_Tensor_Tensor, ops::rsqrt, ops::sqrt, ops::neg,
      ops::exp, ops::log, ops::abs, ops::sin, ops::cos, ops::tanh, ops::sigmoid, ops::silu,
      ops::hardtanh, ops::clamp, ops::minimum, ops::maximum, ops::where_self, ops::eq_Scalar,
      ops::eq_Tensor, ops::ne_Scalar, ops::ne_Tensor, ops::lt_Scalar, ops::lt_Tensor,
      ops::le_Scalar, ops::le_Tensor, ops::gt_Scalar, ops::gt_Tensor, ops::ge_Scalar,
      ops::ge_Tensor, ops::bitwise_and_Tensor, ops::bitwise_or_Tensor, ops::bitwise_not,
      ops::ceil, ops::floor, ops::sign, ops::isneginf, ops::isposinf, ops::tril, ops::triu,
      ops::masked_fill__Scalar, ops::index_select, ops::index_Tensor, ops::_index_put_impl_,
      ops::index_add_, ops::gather, ops::scatter__value, ops::scatter_src, ops::nonzero,
      ops::baddbmm, ops::cumsum, ops::argmax, ops::max, ops::max_dim, ops::topk, ops::any,
      ops::all, ops::all_dim, ops::any_dim,
      // generate()'s stopping checks, floor division, F.normalize, mixture-of-experts
      // routing, masks, weight norm
      ops::isin_Tensor_Tensor, ops::div_Tensor_mode, ops::floor_divide, ops::clamp_min,
      ops::scatter__src, ops::scatter_add_, ops::scatter_add, ops::masked_select,
      ops::_weight_norm_interface,
      // beam search, and the sampling filters (top-p, min-p, typical)
      ops::remainder_Tensor, ops::remainder_Scalar, ops::min_dim, ops::sort_stable, ops::amax,
      ops::amin, ops::nansum, ops::clamp_,
      // vision and audio models: resizing, padding, pooling, the activations of
      // mobile and detection networks (in place too), shifted windows
      ops::upsample_nearest1d, ops::upsample_nearest2d, ops::upsample_nearest3d,
      ops::upsample_linear1d, ops::upsample_bilinear2d, ops::upsample_bicubic2d,
      ops::upsample_trilinear3d, ops::reflection_pad1d, ops::reflection_pad2d,
      ops::replication_pad1d, ops::replication_pad2d, ops::avg_pool2d, ops::_adaptive_avg_pool2d,
      ops::im2col, ops::roll, ops::flip, ops::softplus, ops::elu, ops::leaky_relu, ops::mish,
      ops::hardswish, ops::hardsigmoid, ops::glu, ops::relu_, ops::sigmoid_, ops::tanh_,
      ops::silu_, ops::exp_, ops::log_,
      // pointwise math, reductions, statistics and indexing of everyday code
      ops::erf, ops::erfinv, ops::atan2, ops::atan, ops::tan, ops::log1p, ops::expm1, ops::log2,
      ops::log10, ops::round, ops::trunc, ops::frac, ops::isnan, ops::fmod_Tensor,
      ops::fmod_Scalar, ops::bitwise_xor_Tensor, ops::pow_Scalar, ops::lerp_Scalar,
      ops::lerp_Tensor, ops::addcmul, ops::addcdiv, ops::xlogy_Tensor, ops::min, ops::argmin,
      ops::prod, ops::prod_dim_int, ops::cumprod, ops::median, ops::var_correction,
      ops::std_correction, ops::var_mean_correction, ops::std_mean_correction,
      ops::masked_fill__Tensor, ops::masked_scatter_, ops::index_copy, ops::index_fill__int_Scalar,
      ops::bucketize_Tensor, ops::clamp_min__Tensor, ops::_cdist_forward,
      // random draws: sampling, noise, stochastic depth, dropout of whole channels
      ops::multinomial, ops::normal_, ops::uniform_, ops::bernoulli__float, ops::bernoulli,
      ops::exponential_,
      // their backwards, and the losses of segmentation and binary classification
      ops::upsample_nearest2d_backward, ops::upsample_bilinear2d_backward,
      ops::upsample_bicubic2d_backward, ops::upsample_nearest1d_backward,
      ops::upsample_linear1d_backward, ops::upsample_nearest3d_backward,
      ops::upsample_trilinear3d_backward, ops::reflection_pad1d_backward,
      ops::replication_pad1d_backward, ops::replication_pad2d_backward, ops::col2im,
      ops::avg_pool2d_backward, ops::_adaptive_avg_pool2d_backward, ops::leaky_relu_backward,
      ops::elu_backward, ops::softplus_backward, ops::hardswish_backward,
      ops::hardsigmoid_backward, ops::mish_backward, ops::glu_backward,
      ops::reflection_pad2d_backward, ops::_cdist_backward, ops::nll_loss2d_forward,
      ops::nll_loss2d_backward, ops::binary_cross_entropy, ops::binary_cross_entropy_backward,
      ops::huber_loss, ops::huber_loss_backward,
      ops::_local_scalar_dense, ops::max_pool2d_with_indices, ops::native_group_norm,
      ops::silu_backward, ops::sigmoid_backward, ops::tanh_backward, ops::hardtanh_backward,
      ops::max_pool2d_with_indices_backward, ops::native_group_norm_backward,
      ops::embedding_dense_backward>(aten);
  // The long tail of everyday code: super-resolution, bags of embeddings,
  // recurrent cells (CUDA's fused ones), shrinkage and PReLU activations, spatial
  // transformers, spectra and CTC, histograms and counts, small linear algebra.
  detail::register_direct_kernels<
      Adapter, ops::pixel_shuffle, ops::pixel_unshuffle, ops::_embedding_bag,
      ops::_embedding_bag_forward_only, ops::_embedding_bag_backward,
      ops::_embedding_bag_dense_backward,
      ops::_embedding_bag_per_sample_weights_backward, ops::_thnn_fused_lstm_cell,
      ops::_thnn_fused_lstm_cell_backward_impl, ops::_thnn_fused_gru_cell,
      ops::_thnn_fused_gru_cell_backward, ops::_prelu_kernel, ops::_prelu_kernel_backward,
      ops::hardshrink, ops::hardshrink_backward, ops::softshrink, ops::softshrink_backward,
      ops::logit, ops::logit_backward, ops::adaptive_max_pool2d, ops::adaptive_max_pool2d_backward,
      ops::grid_sampler_2d, ops::grid_sampler_2d_backward, ops::_fft_r2c, ops::_fft_c2c,
      ops::_fft_c2r, ops::_ctc_loss, ops::_ctc_loss_backward, ops::_unique2,
      ops::searchsorted_Tensor, ops::bincount, ops::mode,
      ops::count_nonzero_dim_IntList, ops::trace, ops::linalg_inv_ex, ops::_linalg_solve_ex,
      ops::linalg_lu_solve, ops::addmv_, ops::fmax, ops::fmin, ops::copysign_Tensor, ops::hypot,
      ops::heaviside, ops::norm_ScalarOpt_dim, ops::clamp_min_, ops::index_fill__int_Tensor>(aten);
  // More of everyday code: the in-place forms of pointwise ops and activations,
  // the remaining pointwise math (hyperbolic and inverse trigonometric functions,
  // gamma functions, Bessel functions, shifts), cumulative and robust statistics,
  // 3-d pooling, exact nearest resizing, channel shuffles, margin losses, unpooling,
  // random integers and RReLU's noise, and indexing by flat position or reduction.
  detail::register_direct_kernels<
      Adapter, ops::_cummax_helper, ops::_cummin_helper, ops::_logcumsumexp, ops::linalg_cross,
      ops::random__from, ops::random_, ops::random__to, ops::max_unpool2d,
      ops::embedding_renorm_, ops::nanmedian, ops::ceil_, ops::floor_, ops::round_,
      ops::trunc_, ops::lerp__Tensor, ops::lerp__Scalar, ops::aminmax, ops::logaddexp,
      ops::logaddexp2, ops::asinh, ops::sinh, ops::cosh, ops::sinc, ops::acos, ops::asin,
      ops::atanh, ops::acosh, ops::digamma, ops::lgamma, ops::polygamma, ops::threshold,
      ops::avg_pool3d, ops::avg_pool3d_backward, ops::multi_margin_loss,
      ops::multi_margin_loss_backward, ops::log1p_, ops::sqrt_, ops::rsqrt_, ops::neg_,
      ops::reciprocal_, ops::sign_, ops::max_pool3d_with_indices,
      ops::max_pool3d_with_indices_backward, ops::_adaptive_avg_pool3d,
      ops::_adaptive_avg_pool3d_backward, ops::_upsample_nearest_exact1d,
      ops::_upsample_nearest_exact2d, ops::_upsample_nearest_exact3d,
      ops::_upsample_nearest_exact1d_backward, ops::_upsample_nearest_exact2d_backward,
      ops::_upsample_nearest_exact3d_backward, ops::channel_shuffle, ops::dot, ops::vdot,
      ops::renorm, ops::i0, ops::special_i1, ops::special_i1e, ops::special_i0e, ops::erfc, ops::exp2,
      ops::signbit, ops::bitwise_left_shift_Tensor, ops::bitwise_right_shift_Tensor,
      ops::__lshift___Scalar, ops::__lshift___Tensor, ops::__rshift___Scalar,
      ops::__rshift___Tensor,
      ops::bitwise_and__Tensor, ops::bitwise_or__Tensor, ops::bitwise_xor__Tensor,
      ops::narrow_copy, ops::take, ops::put_, ops::index_reduce_, ops::scatter_reduce_two,
      ops::scatter_reduce__two, ops::rrelu_with_noise, ops::clamp_max, ops::clamp_max_,
      ops::clamp_max_Tensor, ops::clamp__Tensor, ops::clamp_Tensor, ops::pow__Scalar,
      ops::pow__Tensor, ops::fill__Tensor, ops::cumsum_, ops::exp2_, ops::elu_, ops::hardtanh_,
      ops::leaky_relu_, ops::gelu_, ops::hardswish_, ops::hardsigmoid_, ops::mish_, ops::sin_,
      ops::cos_, ops::index_add, ops::lt__Scalar, ops::ne__Scalar, ops::eq__Scalar,
      ops::ge__Scalar, ops::gt__Scalar, ops::le__Scalar, ops::atan2_, ops::remainder__Tensor,
      ops::div__Tensor_mode, ops::floor_divide__Tensor>(aten);
  detail::register_direct_kernel<Adapter, ops::histc, detail::HistcOnTarget>(aten);
  detail::register_direct_kernel<Adapter, ops::native_batch_norm, detail::BatchNormOnTarget>(aten);
  detail::register_direct_kernel<Adapter, ops::native_batch_norm_backward,
                                 detail::BatchNormBackwardOnTarget>(aten);
  // A composite: its kernel for the backend's autograd key comes with it.
  if (detail::register_direct_kernel<Adapter, ops::_batch_norm_impl_index,
                                     detail::TargetKernel<ops::_batch_norm_impl_index>,
                                     detail::BatchNormImplIndex, /*over_decomposition=*/true>(
          aten)) {
    detail::BatchNormImplIndex::register_autograd(device_type);
  }
  for (const std::string& name : ops_run_whole()) {
    // The backend's own kernels, registered before this call, win.
    if (detail::has_kernel(name, Adapter().device_type)) continue;
    aten.impl(name.c_str(), boxed_fallback_for<Adapter>());
  }
}

// For TORCH_LIBRARY_IMPL(aten, NestedTensor<backend>, m), with the boxed
// fallback as that key's fallback: PyTorch's own kernels for the views, copies,
// device moves, empty_like and metadata (sizes, strides, offsets, kept on the
// CPU) of nested tensors (they work on the buffer, on any device), and the
// fallback for the ops whose composite kernels would read a nested tensor's
// sizes (matmul, linear), so that the target's nested kernels run.
template <const BackendAdapter& (*Adapter)()>
void register_nested_kernels(torch::Library& nested) {
  detail::register_nested_native_kernels(nested);
  for (const std::string& name : detail::nested_ops_run_whole()) {
    nested.impl(name.c_str(), boxed_fallback_for<Adapter>());
  }
}

}  // namespace torch_fallback
