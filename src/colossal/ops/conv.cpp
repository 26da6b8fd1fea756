// conv2d: validates the convolution's geometry, runs the device kernel (im2col + GEMM on the CPU)
// and records the backward kernel that produces the input, weight and bias gradients together.
#include "colossal/ops/conv.h"
#include "colossal/ops/autocast.h"

#include "colossal/autograd/function.h"  // record
#include "colossal/core/view.h"          // contiguous_raw
#include "colossal/ops/conv_kernels.h"   // conv2d stubs, Conv2dGeometry
#include "colossal/ops/elementwise.h"    // add
#include "colossal/ops/linalg.h"         // linear
#include "colossal/ops/reduction.h"      // sum
#include "colossal/ops/shape.h"          // contiguous, permute, reshape

namespace colossal::ops {

constinit core::DispatchStub<Conv2dForwardKernel> conv2d_forward_stub("conv2d");
constinit core::DispatchStub<Conv2dBackwardKernel> conv2d_backward_stub("conv2d_backward");
constinit core::DispatchStub<Conv2dForwardKernel> conv2d_nhwc_forward_stub("conv2d_nhwc");
constinit core::DispatchStub<Conv2dBackwardKernel> conv2d_nhwc_backward_stub("conv2d_nhwc_backward");

namespace {

Conv2dGeometry conv2d_geometry(const Tensor& x, const Tensor& weight, const Tensor& bias, Pair stride, Pair padding,
                               Pair dilation, int64_t groups, ImageLayout layout) {
  const bool nhwc = layout == ImageLayout::nhwc;
  COLOSSAL_CHECK(x.defined() && weight.defined(), "conv2d: x and weight must be defined");
  COLOSSAL_CHECK(x.dim() == 4, "conv2d: expected x of shape {} ({} layout), got shape {}",
                 nhwc ? "[N, H, W, C]" : "[N, C, H, W]", nhwc ? "nhwc" : "nchw", x.shape());
  COLOSSAL_CHECK(weight.dim() == 4,
                 "conv2d: expected weight of shape [out_channels, in_channels / groups, kH, kW], got shape {}",
                 weight.shape());
  COLOSSAL_CHECK(core::is_floating(x.dtype()), "conv2d: expected a floating x, got {}", x.dtype());
  COLOSSAL_CHECK(weight.dtype() == x.dtype(), "conv2d: weight is {} but x is {}; cast one to match", weight.dtype(),
                 x.dtype());
  COLOSSAL_CHECK(weight.device() == x.device(), "conv2d: weight is on {} but x is on {}", weight.device(), x.device());
  COLOSSAL_CHECK(groups > 0, "conv2d: groups must be positive, got {}", groups);
  COLOSSAL_CHECK(stride[0] > 0 && stride[1] > 0, "conv2d: stride must be positive, got {}", stride);
  COLOSSAL_CHECK(dilation[0] > 0 && dilation[1] > 0, "conv2d: dilation must be positive, got {}", dilation);
  COLOSSAL_CHECK(padding[0] >= 0 && padding[1] >= 0, "conv2d: padding must be non-negative, got {}", padding);

  Conv2dGeometry g;
  g.batch = x.size(0);
  g.in_channels = x.size(nhwc ? 3 : 1);
  g.in_height = x.size(nhwc ? 1 : 2);
  g.in_width = x.size(nhwc ? 2 : 3);
  g.out_channels = weight.size(0);
  g.kernel_height = weight.size(2);
  g.kernel_width = weight.size(3);
  g.stride_h = stride[0];
  g.stride_w = stride[1];
  g.pad_h = padding[0];
  g.pad_w = padding[1];
  g.dilation_h = dilation[0];
  g.dilation_w = dilation[1];
  g.groups = groups;

  COLOSSAL_CHECK(g.in_channels % groups == 0, "conv2d: x has {} channels (shape {}), not divisible by groups={}",
                 g.in_channels, x.shape(), groups);
  COLOSSAL_CHECK(g.out_channels % groups == 0,
                 "conv2d: weight has {} output channels (shape {}), not divisible by groups={}", g.out_channels,
                 weight.shape(), groups);
  COLOSSAL_CHECK(weight.size(1) * groups == g.in_channels,
                 "conv2d: weight of shape {} with groups={} expects {} input channels, but x of shape {} has {}",
                 weight.shape(), groups, weight.size(1) * groups, x.shape(), g.in_channels);
  COLOSSAL_CHECK(g.kernel_height > 0 && g.kernel_width > 0, "conv2d: weight of shape {} has an empty kernel",
                 weight.shape());
  if (bias.defined()) {
    COLOSSAL_CHECK(bias.dim() == 1 && bias.size(0) == g.out_channels,
                   "conv2d: expected bias of shape [{}] (weight's output channels), got shape {}", g.out_channels,
                   bias.shape());
    COLOSSAL_CHECK(bias.dtype() == x.dtype(), "conv2d: bias is {} but x is {}", bias.dtype(), x.dtype());
    COLOSSAL_CHECK(bias.device() == x.device(), "conv2d: bias is on {} but x is on {}", bias.device(), x.device());
  }

  // The extent a dilated kernel covers; the padded input must hold at least one such window.
  const int64_t extent_h = g.dilation_h * (g.kernel_height - 1) + 1;
  const int64_t extent_w = g.dilation_w * (g.kernel_width - 1) + 1;
  const int64_t padded_h = g.in_height + 2 * g.pad_h;
  const int64_t padded_w = g.in_width + 2 * g.pad_w;
  COLOSSAL_CHECK(padded_h >= extent_h && padded_w >= extent_w,
                 "conv2d: the padded input ({}x{} from x of shape {} with padding {}) is smaller than the dilated "
                 "kernel ({}x{} from weight of shape {} with dilation {}); the output size would not be positive",
                 padded_h, padded_w, x.shape(), padding, extent_h, extent_w, weight.shape(), dilation);
  g.out_height = (padded_h - extent_h) / g.stride_h + 1;
  g.out_width = (padded_w - extent_w) / g.stride_w + 1;
  return g;
}

/// Runs the forward stub into a fresh `out_shape` tensor and records the backward stub. The kernel
/// adds `bias` (nchw) itself; nhwc passes none.
Tensor run_conv2d(const char* name, const Tensor& x, const Tensor& weight, const Tensor& bias,
                  const Conv2dGeometry& geometry, const Shape& out_shape,
                  core::DispatchStub<Conv2dForwardKernel>& forward,
                  core::DispatchStub<Conv2dBackwardKernel>& backward) {
  const Tensor x_c = core::contiguous_raw(x);
  const Tensor weight_c = core::contiguous_raw(weight);
  const Tensor bias_c = bias.defined() ? core::contiguous_raw(bias) : Tensor();
  Tensor out = core::empty(out_shape, TensorOptions(x.dtype(), x.device()));
  if (out.numel() > 0) {
    if (x.numel() == 0) {
      // No input channels: every output is the bias alone.
      out.fill_(0.0);
      if (bias_c.defined()) out.copy_(core::expand_raw(core::view_raw(bias_c, {1, -1, 1, 1}), out.shape()));
    } else {
      forward(x.device(), out, x_c, weight_c, bias_c, geometry);
    }
  }
  autograd::record(
      name, {x, weight, bias}, {out},
      [x_saved = x_c.detach(), weight_saved = weight_c.detach(), geometry, &backward](const std::vector<Tensor>& grads,
                                                                                      const autograd::Node& node) {
        const TensorOptions options(x_saved.dtype(), x_saved.device());
        Tensor grad_x = node.needs_input_grad(0) ? core::empty(x_saved.shape(), options) : Tensor();
        Tensor grad_weight = node.needs_input_grad(1) ? core::empty(weight_saved.shape(), options) : Tensor();
        Tensor grad_bias = node.needs_input_grad(2) ? core::empty({geometry.out_channels}, options) : Tensor();
        const Tensor grad_out = core::contiguous_raw(grads[0]);
        if (grad_out.numel() == 0 || x_saved.numel() == 0) {
          // Nothing reaches the weight; the bias (nchw only) still collects every output's gradient.
          for (Tensor* t : {&grad_x, &grad_weight, &grad_bias}) {
            if (t->defined()) t->fill_(0.0);
          }
          if (grad_bias.defined() && grad_out.numel() > 0) grad_bias = sum(grad_out, {0, 2, 3});
        } else {
          backward(grad_out.device(), grad_x, grad_weight, grad_bias, grad_out, x_saved, weight_saved, geometry);
        }
        return std::vector<Tensor>{grad_x, grad_weight, grad_bias};
      });
  return out;
}

}  // namespace

Tensor to_nhwc(const Tensor& x) {
  COLOSSAL_CHECK(x.defined() && x.dim() == 4, "to_nhwc: expected an image [N, C, H, W], got shape {}",
                 x.defined() ? x.shape() : Shape{});
  return contiguous(permute(x, {0, 2, 3, 1}));
}

Tensor to_nchw(const Tensor& x) {
  COLOSSAL_CHECK(x.defined() && x.dim() == 4, "to_nchw: expected an image [N, H, W, C], got shape {}",
                 x.defined() ? x.shape() : Shape{});
  return contiguous(permute(x, {0, 3, 1, 2}));
}

Tensor conv2d(const Tensor& x, const Tensor& weight, const Tensor& bias, Pair stride, Pair padding, Pair dilation,
              int64_t groups, ImageLayout layout) {
  if (const auto dtype = autocast_dtype()) {
    const AutocastGuard off(std::nullopt);
    return conv2d(autocast::to_lower(x, *dtype), autocast::to_lower(weight, *dtype), autocast::to_lower(bias, *dtype),
                  stride, padding, dilation, groups, layout);
  }
  const Conv2dGeometry g = conv2d_geometry(x, weight, bias, stride, padding, dilation, groups, layout);
  if (layout == ImageLayout::nchw) {
    return run_conv2d("conv2d", x, weight, bias, g, {g.batch, g.out_channels, g.out_height, g.out_width},
                      conv2d_forward_stub, conv2d_backward_stub);
  }
  const bool half_precision = x.dtype() == DType::bf16 || x.dtype() == DType::f16;
  if (half_precision && g.kernel_height == 1 && g.kernel_width == 1 && g.stride_h == 1 && g.stride_w == 1 &&
      g.pad_h == 0 && g.pad_w == 0 && groups == 1) {
    // A pointwise convolution over nhwc pixels is a matrix product, [N * H * W, C] x [O, C]^T: one
    // cuBLASLt GEMM (bias in its epilogue), whose host cost is a fraction of a cuDNN call's. f16 and
    // bf16 only: both compute on tensor cores with f32 sums, where an f32 matmul may use TF32 but
    // an f32 convolution is strict f32 (Note [conv2d math on the GPU]).
    return linear(x, reshape(weight, {g.out_channels, g.in_channels}), bias);
  }
  if (!conv2d_nhwc_forward_stub.supports(x.device().type)) {
    return to_nhwc(conv2d(to_nchw(x), weight, bias, stride, padding, dilation, groups, ImageLayout::nchw));
  }
  // The kernel wants the filter channels-last too, [O, kH, kW, C / groups]: a recorded copy for
  // kernels larger than 1x1 (whose permuted view is already contiguous).
  const Tensor weight_nhwc = contiguous(permute(weight, {0, 2, 3, 1}));
  Tensor out =
      run_conv2d("conv2d_nhwc", x, weight_nhwc, Tensor(), g, {g.batch, g.out_height, g.out_width, g.out_channels},
                 conv2d_nhwc_forward_stub, conv2d_nhwc_backward_stub);
  return bias.defined() ? add(out, bias) : out;
}

}  // namespace colossal::ops
