// max_pool2d, avg_pool2d and adaptive_avg_pool2d: window validation, output sizes, the device
// kernels and their backward records. nhwc runs max_pool2d's nhwc kernels where the backend has them
// and otherwise transposes around the nchw op (Note [image layouts] in ops/conv.h).
#include "colossal/autograd/function.h"  // record
#include "colossal/core/view.h"          // contiguous_raw
#include "colossal/ops/conv.h"           // pooling declarations
#include "colossal/ops/conv_kernels.h"   // pooling stubs, Pool2dGeometry
#include "colossal/ops/reduction.h"      // mean

namespace colossal::ops {

constinit core::DispatchStub<MaxPool2dForwardKernel> max_pool2d_forward_stub("max_pool2d");
constinit core::DispatchStub<MaxPool2dBackwardKernel> max_pool2d_backward_stub("max_pool2d_backward");
constinit core::DispatchStub<MaxPool2dForwardKernel> max_pool2d_nhwc_forward_stub("max_pool2d_nhwc");
constinit core::DispatchStub<MaxPool2dBackwardKernel> max_pool2d_nhwc_backward_stub("max_pool2d_nhwc_backward");
constinit core::DispatchStub<AvgPool2dForwardKernel> avg_pool2d_forward_stub("avg_pool2d");
constinit core::DispatchStub<AvgPool2dBackwardKernel> avg_pool2d_backward_stub("avg_pool2d_backward");
constinit core::DispatchStub<AdaptiveAvgPool2dForwardKernel> adaptive_avg_pool2d_forward_stub("adaptive_avg_pool2d");
constinit core::DispatchStub<AdaptiveAvgPool2dBackwardKernel> adaptive_avg_pool2d_backward_stub(
    "adaptive_avg_pool2d_backward");

namespace {

void check_image(const Tensor& x, const char* op, ImageLayout layout) {
  const bool nhwc = layout == ImageLayout::nhwc;
  COLOSSAL_CHECK(x.defined(), "{}: x must be defined", op);
  COLOSSAL_CHECK(x.dim() == 4, "{}: expected x of shape {} ({} layout), got shape {}", op,
                 nhwc ? "[N, H, W, C]" : "[N, C, H, W]", nhwc ? "nhwc" : "nchw", x.shape());
  COLOSSAL_CHECK(core::is_floating(x.dtype()), "{}: expected a floating x, got {}", op, x.dtype());
}

/// x's height and width dimensions in `layout`.
Pair spatial_dims(ImageLayout layout) {
  return layout == ImageLayout::nhwc ? Pair{1, 2} : Pair{2, 3};
}

/// Validates a pooling window against x and returns it with the default stride resolved.
Pool2dGeometry pool_geometry(const Tensor& x, Pair kernel, Pair stride, Pair padding, const char* op,
                             ImageLayout layout = ImageLayout::nchw) {
  check_image(x, op, layout);
  const auto [dim_h, dim_w] = spatial_dims(layout);
  COLOSSAL_CHECK(kernel[0] > 0 && kernel[1] > 0, "{}: kernel must be positive, got {}", op, kernel);
  if (stride == Pair{0, 0}) stride = kernel;
  COLOSSAL_CHECK(stride[0] > 0 && stride[1] > 0,
                 "{}: stride must be positive (or {{0, 0}} for the kernel size), got {}", op, stride);
  COLOSSAL_CHECK(padding[0] >= 0 && padding[1] >= 0, "{}: padding must be non-negative, got {}", op, padding);
  // Beyond half the kernel a window could lie entirely in the padding (PyTorch's rule).
  COLOSSAL_CHECK(padding[0] <= kernel[0] / 2 && padding[1] <= kernel[1] / 2,
                 "{}: padding {} must be at most half the kernel {} (at most [{}, {}])", op, padding, kernel,
                 kernel[0] / 2, kernel[1] / 2);
  COLOSSAL_CHECK(x.size(dim_h) + 2 * padding[0] >= kernel[0] && x.size(dim_w) + 2 * padding[1] >= kernel[1],
                 "{}: kernel {} is larger than the padded input (x of shape {} with padding {}); the output size "
                 "would not be positive",
                 op, kernel, x.shape(), padding);
  Pool2dGeometry g;
  g.kernel_h = kernel[0];
  g.kernel_w = kernel[1];
  g.stride_h = stride[0];
  g.stride_w = stride[1];
  g.pad_h = padding[0];
  g.pad_w = padding[1];
  return g;
}

Shape pool_output_shape(const Tensor& x, const Pool2dGeometry& g, ImageLayout layout = ImageLayout::nchw) {
  const auto [dim_h, dim_w] = spatial_dims(layout);
  const int64_t out_h = (x.size(dim_h) + 2 * g.pad_h - g.kernel_h) / g.stride_h + 1;
  const int64_t out_w = (x.size(dim_w) + 2 * g.pad_w - g.kernel_w) / g.stride_w + 1;
  if (layout == ImageLayout::nhwc) return {x.size(0), out_h, out_w, x.size(3)};
  return {x.size(0), x.size(1), out_h, out_w};
}

TensorOptions options_of(const Tensor& t) {
  return TensorOptions(t.dtype(), t.device());
}

}  // namespace

Tensor max_pool2d(const Tensor& x, Pair kernel, Pair stride, Pair padding, ImageLayout layout) {
  const Pool2dGeometry geometry = pool_geometry(x, kernel, stride, padding, "max_pool2d", layout);
  const bool nhwc = layout == ImageLayout::nhwc;
  // The nhwc kernels keep each maximum's offset in its window as a byte.
  if (nhwc && (!max_pool2d_nhwc_forward_stub.supports(x.device().type) || kernel[0] * kernel[1] > 256)) {
    return to_nhwc(max_pool2d(to_nchw(x), kernel, stride, padding));
  }
  auto& forward_stub = nhwc ? max_pool2d_nhwc_forward_stub : max_pool2d_forward_stub;
  auto& backward_stub = nhwc ? max_pool2d_nhwc_backward_stub : max_pool2d_backward_stub;
  const Tensor x_c = core::contiguous_raw(x);
  Tensor out = core::empty(pool_output_shape(x, geometry, layout), options_of(x));
  Tensor indices = core::empty(out.shape(), TensorOptions(nhwc ? DType::u8 : DType::i64, x.device()));
  if (out.numel() > 0) forward_stub(x.device(), out, indices, x_c, geometry);
  autograd::record("max_pool2d", {x}, {out},
                   [indices = indices.detach(), input_shape = x.shape(), geometry, &backward_stub](
                       const std::vector<Tensor>& grads, const autograd::Node&) {
                     Tensor grad_x = core::empty(input_shape, options_of(grads[0]));
                     if (grads[0].numel() == 0) {
                       grad_x.fill_(0.0);
                     } else {
                       backward_stub(grad_x.device(), grad_x, core::contiguous_raw(grads[0]), indices, geometry);
                     }
                     return std::vector<Tensor>{grad_x};
                   });
  return out;
}

Tensor avg_pool2d(const Tensor& x, Pair kernel, Pair stride, Pair padding, bool count_include_pad, ImageLayout layout) {
  if (layout == ImageLayout::nhwc) {
    check_image(x, "avg_pool2d", layout);
    return to_nhwc(avg_pool2d(to_nchw(x), kernel, stride, padding, count_include_pad));
  }
  Pool2dGeometry geometry = pool_geometry(x, kernel, stride, padding, "avg_pool2d");
  geometry.count_include_pad = count_include_pad;
  const Tensor x_c = core::contiguous_raw(x);
  Tensor out = core::empty(pool_output_shape(x, geometry), options_of(x));
  if (out.numel() > 0) avg_pool2d_forward_stub(x.device(), out, x_c, geometry);
  autograd::record("avg_pool2d", {x}, {out},
                   [geometry, input_shape = x.shape()](const std::vector<Tensor>& grads, const autograd::Node&) {
                     Tensor grad_x = core::empty(input_shape, options_of(grads[0]));
                     if (grads[0].numel() == 0) {
                       grad_x.fill_(0.0);
                     } else {
                       avg_pool2d_backward_stub(grad_x.device(), grad_x, core::contiguous_raw(grads[0]), geometry);
                     }
                     return std::vector<Tensor>{grad_x};
                   });
  return out;
}

Tensor adaptive_avg_pool2d(const Tensor& x, Pair output_size, ImageLayout layout) {
  if (layout == ImageLayout::nhwc) {
    check_image(x, "adaptive_avg_pool2d", layout);
    COLOSSAL_CHECK(x.size(1) > 0 && x.size(2) > 0,
                   "adaptive_avg_pool2d: x of shape {} (nhwc) has an empty spatial size; every window would be empty",
                   x.shape());
    if (output_size == Pair{1, 1}) return mean(x, {1, 2}, true);  // the global pool: one reduction, no transposes
    return to_nhwc(adaptive_avg_pool2d(to_nchw(x), output_size));
  }
  check_image(x, "adaptive_avg_pool2d", layout);
  COLOSSAL_CHECK(output_size[0] > 0 && output_size[1] > 0, "adaptive_avg_pool2d: output_size must be positive, got {}",
                 output_size);
  COLOSSAL_CHECK(x.size(2) > 0 && x.size(3) > 0,
                 "adaptive_avg_pool2d: x of shape {} has an empty spatial size; every window would be empty",
                 x.shape());
  const Tensor x_c = core::contiguous_raw(x);
  Tensor out = core::empty({x.size(0), x.size(1), output_size[0], output_size[1]}, options_of(x));
  if (out.numel() > 0) adaptive_avg_pool2d_forward_stub(x.device(), out, x_c);
  autograd::record("adaptive_avg_pool2d", {x}, {out},
                   [input_shape = x.shape()](const std::vector<Tensor>& grads, const autograd::Node&) {
                     Tensor grad_x = core::empty(input_shape, options_of(grads[0]));
                     if (grads[0].numel() == 0) {
                       grad_x.fill_(0.0);
                     } else {
                       adaptive_avg_pool2d_backward_stub(grad_x.device(), grad_x, core::contiguous_raw(grads[0]));
                     }
                     return std::vector<Tensor>{grad_x};
                   });
  return out;
}

}  // namespace colossal::ops
