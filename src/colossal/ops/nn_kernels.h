// Kernel signatures and dispatch stubs of the fused neural-network kernels: softmax and
// log_softmax, layer_norm and scaled dot-product attention, forward and backward. The CPU kernels
// live in ops/cpu/{softmax,layer_norm,attention}_kernels.cpp; a CUDA backend registers its own.
#pragma once

#include "colossal/core/dispatch.h"
#include "colossal/core/tensor.h"

namespace colossal::ops {

// ---- softmax / log_softmax
// Tensors are contiguous and viewed as [outer, size, inner], the softmax running over `size`
// (the dimension `dim` of the op), so a row is `size` elements `inner` apart.

/// out <- softmax(x) (or log_softmax(x) when `log`), same shape and dtype.
using SoftmaxForwardKernel = void(const Tensor& out, const Tensor& x, int64_t outer, int64_t size, int64_t inner,
                                  bool log);
/// grad_x <- y * (dy - sum(dy * y)) for softmax, dy - exp(y) * sum(dy) for log_softmax, where y is
/// the forward output.
using SoftmaxBackwardKernel = void(const Tensor& grad_x, const Tensor& grad_y, const Tensor& y, int64_t outer,
                                   int64_t size, int64_t inner, bool log);

extern core::DispatchStub<SoftmaxForwardKernel> softmax_forward_stub;
extern core::DispatchStub<SoftmaxBackwardKernel> softmax_backward_stub;

// ---- layer_norm
// x is contiguous and viewed as [rows, cols] (cols = the product of normalized_shape). mean and
// rstd are [rows] in the accumulation dtype (f64 for f64 input, f32 otherwise). weight and bias are
// contiguous [cols] of x's dtype, or undefined.

/// y <- (x - mean) * rstd * weight + bias; also stores each row's mean and 1 / sqrt(var + eps).
using LayerNormForwardKernel = void(const Tensor& y, const Tensor& mean, const Tensor& rstd, const Tensor& x,
                                    const Tensor& weight, const Tensor& bias, double eps);
/// Writes the gradients that are defined among grad_x [rows, cols], grad_weight [cols] and
/// grad_bias [cols] (all contiguous, x's dtype) from grad_y (contiguous [rows, cols]). With
/// accumulate_x, x's gradient is added into what grad_x holds instead of written over it, rounded as
/// the separate addition would (the gradient to x's dtype, then the sum in the accumulation dtype), so
/// the numbers are those of the unfused path bit for bit (Note [Gradient accumulation in the op] in
/// autograd/engine.cpp).
using LayerNormBackwardKernel = void(const Tensor& grad_x, const Tensor& grad_weight, const Tensor& grad_bias,
                                     const Tensor& grad_y, const Tensor& x, const Tensor& mean, const Tensor& rstd,
                                     const Tensor& weight, bool accumulate_x);

extern core::DispatchStub<LayerNormForwardKernel> layer_norm_forward_stub;
extern core::DispatchStub<LayerNormBackwardKernel> layer_norm_backward_stub;

// ---- scaled dot-product attention
// q [..., Tq, D], k [..., Tk, D] and v [..., Tk, Dv] share one batch shape (the batch and head
// dimensions; broadcast inputs arrive expanded, with stride 0) and may have any strides. out
// [..., Tq, Dv] is contiguous; lse [..., Tq] (contiguous, in the accumulation dtype: f64 for f64,
// f32 otherwise) receives each query row's logsumexp of its scaled, masked scores, -inf for a row
// that sees no key (its output is 0). Causal: query i sees keys j <= i + (Tk - Tq).

struct AttentionParams {
  double scale = 1.0;
  bool causal = false;
  /// Dropout on the probabilities (0: none): each is kept with probability 1 - dropout_p and scaled
  /// by 1 / (1 - dropout_p), the mask drawn from the Philox stream (dropout_seed, dropout_offset)
  /// inside the fused kernel, and drawn again from the same two numbers by the backward. Only the
  /// attention_dropout_* stubs read these three; the other kernels are called with dropout_p = 0.
  double dropout_p = 0.0;
  uint64_t dropout_seed = 0;
  uint64_t dropout_offset = 0;
};

using AttentionForwardKernel = void(const Tensor& out, const Tensor& lse, const Tensor& q, const Tensor& k,
                                    const Tensor& v, const AttentionParams& params);
/// grad_q, grad_k, grad_v are contiguous with q's, k's and v's (expanded) shapes; grad_out is
/// contiguous like out. `out` is the forward output: flash-style kernels need it for rowsum(dO * O), a
/// kernel that recomputes the probabilities may ignore it.
using AttentionBackwardKernel = void(const Tensor& grad_q, const Tensor& grad_k, const Tensor& grad_v,
                                     const Tensor& grad_out, const Tensor& q, const Tensor& k, const Tensor& v,
                                     const Tensor& out, const Tensor& lse, const AttentionParams& params);

extern core::DispatchStub<AttentionForwardKernel> attention_forward_stub;
extern core::DispatchStub<AttentionBackwardKernel> attention_backward_stub;

/// Attention with dropout inside a fused kernel (params.dropout_p in (0, 1)), as the forward stub's
/// contract otherwise. Returns false, touching nothing, when the backend's fused kernel does not
/// take the problem; the op then runs the unfused composition (ops/attention.cpp). Registered only
/// where such a kernel exists (CUDA: cuDNN's engine, ops/cuda/attention_cudnn.cpp).
using AttentionDropoutForwardKernel = bool(const Tensor& out, const Tensor& lse, const Tensor& q, const Tensor& k,
                                           const Tensor& v, const AttentionParams& params);
/// Its backward, with the forward's params: the kernel draws the forward's mask again. Returns false
/// when it declines the problem.
using AttentionDropoutBackwardKernel = bool(const Tensor& grad_q, const Tensor& grad_k, const Tensor& grad_v,
                                            const Tensor& grad_out, const Tensor& q, const Tensor& k, const Tensor& v,
                                            const Tensor& out, const Tensor& lse, const AttentionParams& params);

extern core::DispatchStub<AttentionDropoutForwardKernel> attention_dropout_forward_stub;
extern core::DispatchStub<AttentionDropoutBackwardKernel> attention_dropout_backward_stub;

}  // namespace colossal::ops
