// Kernel signatures and dispatch stubs of the image ops in ops/conv.h: conv2d, batch_norm2d and the
// pooling family, forward and backward. The CPU kernels live in ops/cpu/{conv,batch_norm,pooling}
// _kernels.cpp; a CUDA backend (cuDNN) registers its own. Every tensor reaching a kernel is contiguous.
// The *_nhwc stubs take images as [N, H, W, C] (Note [image layouts] in ops/conv.h); only backends
// with channels-last kernels register them, and the ops transpose around the nchw stubs elsewhere.
#pragma once

#include <cstdint>

#include "colossal/core/dispatch.h"
#include "colossal/core/tensor.h"

namespace colossal::ops {

// ---- conv2d
/// The geometry of one convolution, validated by ops::conv2d before any kernel sees it.
struct Conv2dGeometry {
  int64_t batch = 0, in_channels = 0, in_height = 0, in_width = 0;
  int64_t out_channels = 0, kernel_height = 0, kernel_width = 0;
  int64_t out_height = 0, out_width = 0;
  int64_t stride_h = 1, stride_w = 1, pad_h = 0, pad_w = 0, dilation_h = 1, dilation_w = 1;
  int64_t groups = 1;
};

/// out [N, O, oH, oW] <- x [N, C, H, W] (*) weight [O, C / groups, kH, kW] + bias [O] (bias may be
/// undefined). All of x's dtype.
using Conv2dForwardKernel = void(const Tensor& out, const Tensor& x, const Tensor& weight, const Tensor& bias,
                                 const Conv2dGeometry& geometry);
/// Writes whichever of grad_x (x's shape), grad_weight (weight's shape) and grad_bias [O] are
/// defined, overwriting their contents, from grad_out [N, O, oH, oW].
using Conv2dBackwardKernel = void(const Tensor& grad_x, const Tensor& grad_weight, const Tensor& grad_bias,
                                  const Tensor& grad_out, const Tensor& x, const Tensor& weight,
                                  const Conv2dGeometry& geometry);

extern core::DispatchStub<Conv2dForwardKernel> conv2d_forward_stub;
extern core::DispatchStub<Conv2dBackwardKernel> conv2d_backward_stub;
/// The same in nhwc: x [N, H, W, C], weight [O, kH, kW, C / groups], out and grad_out [N, oH, oW, O].
/// bias and grad_bias are always undefined (the op adds the bias itself).
extern core::DispatchStub<Conv2dForwardKernel> conv2d_nhwc_forward_stub;
extern core::DispatchStub<Conv2dBackwardKernel> conv2d_nhwc_backward_stub;

// ---- batch_norm2d
// x and y are [N, C, H, W]; weight and bias are [C] of x's dtype or undefined. save_mean and
// save_invstd are [C] in the accumulation dtype (f64 for f64 input, f32 otherwise).

/// Training: normalises with the batch mean and biased variance, writes them to save_mean and
/// save_invstd (1 / sqrt(var + eps)) and, when running_mean/running_var (any floating dtype) are
/// defined, updates them in place: running = (1 - momentum) * running + momentum * batch, with the
/// unbiased variance. Evaluation: normalises with the running statistics and writes those to
/// save_mean / save_invstd.
using BatchNormForwardKernel = void(const Tensor& y, const Tensor& save_mean, const Tensor& save_invstd,
                                    const Tensor& x, const Tensor& running_mean, const Tensor& running_var,
                                    const Tensor& weight, const Tensor& bias, bool training, double momentum,
                                    double eps);
/// Writes the defined ones among grad_x, grad_weight and grad_bias. With `training` the statistics
/// depend on x and grad_x carries the two mean-subtraction terms; otherwise y is affine in x.
using BatchNormBackwardKernel = void(const Tensor& grad_x, const Tensor& grad_weight, const Tensor& grad_bias,
                                     const Tensor& grad_y, const Tensor& x, const Tensor& weight,
                                     const Tensor& save_mean, const Tensor& save_invstd, bool training);

extern core::DispatchStub<BatchNormForwardKernel> batch_norm_forward_stub;
extern core::DispatchStub<BatchNormBackwardKernel> batch_norm_backward_stub;
/// The same with the channel innermost: x, y and their gradients are [..., C] (an nhwc image or
/// any rows-by-channels matrix), normalised per channel over all the other dimensions.
extern core::DispatchStub<BatchNormForwardKernel> batch_norm_nhwc_forward_stub;
extern core::DispatchStub<BatchNormBackwardKernel> batch_norm_nhwc_backward_stub;
/// relu(batch_norm2d(x)) in one pass each way, channel innermost: the forward writes the relu's
/// output; the backward takes the gradient of that output and recomputes the relu's mask from x,
/// the statistics and the parameters (hence the bias), so the output need not be kept.
using BatchNormReluBackwardKernel = void(const Tensor& grad_x, const Tensor& grad_weight, const Tensor& grad_bias,
                                         const Tensor& grad_y, const Tensor& x, const Tensor& weight,
                                         const Tensor& bias, const Tensor& save_mean, const Tensor& save_invstd,
                                         bool training);
extern core::DispatchStub<BatchNormForwardKernel> batch_norm_relu_nhwc_forward_stub;
extern core::DispatchStub<BatchNormReluBackwardKernel> batch_norm_relu_nhwc_backward_stub;
/// relu(batch_norm2d(x) + residual) in one pass, channel innermost (residual: x's shape and dtype,
/// contiguous). Its backward needs no kernel of its own: the relu's gradient from the output, then
/// batch_norm_nhwc_backward_stub.
using BatchNormAddReluForwardKernel = void(const Tensor& y, const Tensor& save_mean, const Tensor& save_invstd,
                                           const Tensor& x, const Tensor& residual, const Tensor& running_mean,
                                           const Tensor& running_var, const Tensor& weight, const Tensor& bias,
                                           bool training, double momentum, double eps);
extern core::DispatchStub<BatchNormAddReluForwardKernel> batch_norm_add_relu_nhwc_forward_stub;

// ---- pooling
// Inputs are [N, C, H, W] and pool each of the N * C planes independently.

/// The window of a (non-adaptive) pooling op, validated by the op.
struct Pool2dGeometry {
  int64_t kernel_h = 1, kernel_w = 1, stride_h = 1, stride_w = 1, pad_h = 0, pad_w = 0;
  bool count_include_pad = true;  ///< avg_pool2d only
};

/// out [N, C, oH, oW] <- each window's maximum, indices (i64, same shape) <- its position h * W + w
/// within the input plane (the first maximum; NaN counts as the maximum).
using MaxPool2dForwardKernel = void(const Tensor& out, const Tensor& indices, const Tensor& x,
                                    const Pool2dGeometry& geometry);
/// grad_x (overwritten) <- grad_out scattered to `indices`, summing where windows share a maximum.
/// The geometry is the forward's: it tells a kernel that gathers per input element (CUDA) which
/// windows can hold it.
using MaxPool2dBackwardKernel = void(const Tensor& grad_x, const Tensor& grad_out, const Tensor& indices,
                                     const Pool2dGeometry& geometry);
using AvgPool2dForwardKernel = void(const Tensor& out, const Tensor& x, const Pool2dGeometry& geometry);
/// grad_x (overwritten) <- the adjoint of the averaging.
using AvgPool2dBackwardKernel = void(const Tensor& grad_x, const Tensor& grad_out, const Pool2dGeometry& geometry);
/// Window i of an output of size `out` over an input of size `in` spans [floor(i * in / out),
/// ceil((i + 1) * in / out)), as in PyTorch. out's spatial size is the requested output size.
using AdaptiveAvgPool2dForwardKernel = void(const Tensor& out, const Tensor& x);
using AdaptiveAvgPool2dBackwardKernel = void(const Tensor& grad_x, const Tensor& grad_out);

extern core::DispatchStub<MaxPool2dForwardKernel> max_pool2d_forward_stub;
extern core::DispatchStub<MaxPool2dBackwardKernel> max_pool2d_backward_stub;
/// The same in nhwc: x, out, indices and the gradients are [N, H, W, C]; indices are u8, the
/// maximum's offset dh * kW + dw inside its window (which starts at oh * stride - pad, ow * stride
/// - pad), so windows hold at most 256 positions (the op transposes around the nchw kernels beyond).
extern core::DispatchStub<MaxPool2dForwardKernel> max_pool2d_nhwc_forward_stub;
extern core::DispatchStub<MaxPool2dBackwardKernel> max_pool2d_nhwc_backward_stub;
extern core::DispatchStub<AvgPool2dForwardKernel> avg_pool2d_forward_stub;
extern core::DispatchStub<AvgPool2dBackwardKernel> avg_pool2d_backward_stub;
extern core::DispatchStub<AdaptiveAvgPool2dForwardKernel> adaptive_avg_pool2d_forward_stub;
extern core::DispatchStub<AdaptiveAvgPool2dBackwardKernel> adaptive_avg_pool2d_backward_stub;

}  // namespace colossal::ops
