// batch_norm2d, batch_norm_relu2d and batch_norm_add_relu2d: validate shapes and dtypes, run the
// fused forward kernel (which also updates the running statistics in training) and record the fused
// backward kernel.
#include "colossal/autograd/function.h"  // record
#include "colossal/core/view.h"          // contiguous_raw
#include "colossal/ops/autocast.h"
#include "colossal/ops/conv.h"                 // batch_norm2d
#include "colossal/ops/conv_kernels.h"         // batch_norm stubs
#include "colossal/ops/elementwise.h"          // relu, add (the fused ops composed where no kernel fuses them)
#include "colossal/ops/elementwise_kernels.h"  // unary_backward_stub (the relu's gradient from the output)

namespace colossal::ops {

constinit core::DispatchStub<BatchNormForwardKernel> batch_norm_forward_stub("batch_norm2d");
constinit core::DispatchStub<BatchNormBackwardKernel> batch_norm_backward_stub("batch_norm2d_backward");
constinit core::DispatchStub<BatchNormForwardKernel> batch_norm_nhwc_forward_stub("batch_norm2d_nhwc");
constinit core::DispatchStub<BatchNormBackwardKernel> batch_norm_nhwc_backward_stub("batch_norm2d_nhwc_backward");
constinit core::DispatchStub<BatchNormForwardKernel> batch_norm_relu_nhwc_forward_stub("batch_norm_relu2d_nhwc");
constinit core::DispatchStub<BatchNormReluBackwardKernel> batch_norm_relu_nhwc_backward_stub(
    "batch_norm_relu2d_nhwc_backward");
constinit core::DispatchStub<BatchNormAddReluForwardKernel> batch_norm_add_relu_nhwc_forward_stub(
    "batch_norm_add_relu2d_nhwc");

namespace {

void check_per_channel(const Tensor& t, const char* what, const Tensor& x, int64_t channel_dim, bool same_dtype) {
  if (!t.defined()) return;
  const int64_t channels = x.size(channel_dim);
  COLOSSAL_CHECK(t.dim() == 1 && t.size(0) == channels,
                 "batch_norm2d: expected {} of shape [{}] (the channels of x, shape {}), got shape {}", what, channels,
                 x.shape(), t.shape());
  COLOSSAL_CHECK(t.device() == x.device(), "batch_norm2d: {} is on {} but x is on {}", what, t.device(), x.device());
  if (same_dtype) {
    COLOSSAL_CHECK(t.dtype() == x.dtype(), "batch_norm2d: {} is {} but x is {}", what, t.dtype(), x.dtype());
  } else {
    COLOSSAL_CHECK(core::is_floating(t.dtype()), "batch_norm2d: expected a floating {}, got {}", what, t.dtype());
  }
}

/// batch_norm2d, then relu when `relu`, with `residual` (when defined) added before the relu.
Tensor batch_norm_impl(const Tensor& x, Tensor& running_mean, Tensor& running_var, const Tensor& weight,
                       const Tensor& bias, bool training, double momentum, double eps, ImageLayout layout, bool relu,
                       const Tensor& residual = Tensor()) {
  if (residual.defined()) {
    COLOSSAL_CHECK(x.defined(), "batch_norm_add_relu2d: x must be defined");
    COLOSSAL_CHECK(residual.shape() == x.shape(),
                   "batch_norm_add_relu2d: the residual must have x's shape {}, got shape {}", x.shape(),
                   residual.shape());
    COLOSSAL_CHECK(residual.device() == x.device(), "batch_norm_add_relu2d: the residual is on {} but x is on {}",
                   residual.device(), x.device());
    const bool fused = !autocast_dtype() && layout == ImageLayout::nhwc && residual.dtype() == x.dtype() &&
                       batch_norm_add_relu_nhwc_forward_stub.supports(x.device().type);
    if (!fused) {
      return ops::relu(
          ops::add(batch_norm_impl(x, running_mean, running_var, weight, bias, training, momentum, eps, layout, false),
                   residual));
    }
  }
  if (autocast_dtype()) {
    const AutocastGuard off(std::nullopt);
    return batch_norm_impl(autocast::to_f32(x), running_mean, running_var, autocast::to_f32(weight),
                           autocast::to_f32(bias), training, momentum, eps, layout, relu);
  }
  const bool nhwc = layout == ImageLayout::nhwc;
  COLOSSAL_CHECK(x.defined(), "batch_norm2d: x must be defined");
  COLOSSAL_CHECK(x.dim() == 4, "batch_norm2d: expected x of shape {} ({} layout), got shape {}",
                 nhwc ? "[N, H, W, C]" : "[N, C, H, W]", nhwc ? "nhwc" : "nchw", x.shape());
  COLOSSAL_CHECK(core::is_floating(x.dtype()), "batch_norm2d: expected a floating x, got {}", x.dtype());
  COLOSSAL_CHECK(eps > 0.0, "batch_norm2d: eps must be positive, got {}", eps);
  COLOSSAL_CHECK(running_mean.defined() == running_var.defined(),
                 "batch_norm2d: running_mean and running_var must both be defined or both undefined");
  const int64_t channel_dim = nhwc ? 3 : 1;
  // Running statistics may be kept in a wider dtype than x (f32 statistics for f16 activations).
  check_per_channel(running_mean, "running_mean", x, channel_dim, false);
  check_per_channel(running_var, "running_var", x, channel_dim, false);
  check_per_channel(weight, "weight", x, channel_dim, true);
  check_per_channel(bias, "bias", x, channel_dim, true);
  if (training) {
    int64_t per_channel = 1;
    for (int64_t d = 0; d < 4; ++d) per_channel *= d == channel_dim ? 1 : x.size(d);
    COLOSSAL_CHECK(per_channel > 1,
                   "batch_norm2d: training needs more than one value per channel to compute a variance, got x of "
                   "shape {}",
                   x.shape());
    COLOSSAL_CHECK(momentum >= 0.0 && momentum <= 1.0, "batch_norm2d: momentum must be in [0, 1], got {}", momentum);
  } else {
    COLOSSAL_CHECK(running_mean.defined(), "batch_norm2d: evaluation mode needs running_mean and running_var");
  }
  if (nhwc && !batch_norm_nhwc_forward_stub.supports(x.device().type)) {
    return to_nhwc(batch_norm_impl(to_nchw(x), running_mean, running_var, weight, bias, training, momentum, eps,
                                   ImageLayout::nchw, relu));
  }
  if (relu && !(nhwc && batch_norm_relu_nhwc_forward_stub.supports(x.device().type))) {
    return ops::relu(
        batch_norm_impl(x, running_mean, running_var, weight, bias, training, momentum, eps, layout, false));
  }
  auto& forward_stub = relu   ? batch_norm_relu_nhwc_forward_stub
                       : nhwc ? batch_norm_nhwc_forward_stub
                              : batch_norm_forward_stub;
  const Tensor residual_c = residual.defined() ? core::contiguous_raw(residual) : Tensor();

  const Tensor x_c = core::contiguous_raw(x);
  const Tensor weight_c = weight.defined() ? core::contiguous_raw(weight) : Tensor();
  const Tensor bias_c = bias.defined() ? core::contiguous_raw(bias) : Tensor();
  const TensorOptions stat_options(x.dtype() == DType::f64 ? DType::f64 : DType::f32, x.device());
  const int64_t channels = x.size(channel_dim);
  Tensor y = core::empty(x.shape(), TensorOptions(x.dtype(), x.device()));
  Tensor save_mean = core::empty({channels}, stat_options);
  Tensor save_invstd = core::empty({channels}, stat_options);
  if (x.numel() > 0) {
    // The kernel updates contiguous statistics in place; non-contiguous ones get the result copied back.
    Tensor mean_c = running_mean.defined() ? core::contiguous_raw(running_mean) : Tensor();
    Tensor var_c = running_var.defined() ? core::contiguous_raw(running_var) : Tensor();
    if (residual.defined()) {
      batch_norm_add_relu_nhwc_forward_stub(x.device(), y, save_mean, save_invstd, x_c, residual_c, mean_c, var_c,
                                            weight_c, bias_c, training, momentum, eps);
    } else {
      forward_stub(x.device(), y, save_mean, save_invstd, x_c, mean_c, var_c, weight_c, bias_c, training, momentum,
                   eps);
    }
    if (training && mean_c.defined()) {
      if (!mean_c.is_same(running_mean)) running_mean.copy_(mean_c);
      if (!var_c.is_same(running_var)) running_var.copy_(var_c);
    }
  }
  const bool add = residual.defined();
  autograd::record(
      add    ? "batch_norm_add_relu2d"
      : relu ? "batch_norm_relu2d"
             : "batch_norm2d",
      {x, weight, bias, residual}, {y},
      [x_saved = x_c.detach(), weight_saved = weight_c.defined() ? weight_c.detach() : Tensor(),
       bias_saved = relu && !add && bias_c.defined() ? bias_c.detach() : Tensor(),
       y_saved = add ? y.detach() : Tensor(), mean_saved = save_mean.detach(), invstd_saved = save_invstd.detach(),
       training, channel_dim, nhwc, relu](const std::vector<Tensor>& grads, const autograd::Node& node) {
        const TensorOptions options(x_saved.dtype(), x_saved.device());
        const int64_t channels = x_saved.size(channel_dim);
        Tensor grad_x = node.needs_input_grad(0) ? core::empty(x_saved.shape(), options) : Tensor();
        Tensor grad_weight = node.needs_input_grad(1) ? core::empty({channels}, options) : Tensor();
        Tensor grad_bias = node.needs_input_grad(2) ? core::empty({channels}, options) : Tensor();
        Tensor grad_y = core::contiguous_raw(grads[0]);
        Tensor grad_residual;
        if (y_saved.defined()) {
          // relu(batch_norm(x) + residual): the relu's gradient, taken from the output (positive
          // exactly where the sum is), is the residual's and the batch norm's upstream gradient.
          Tensor grad_sum = core::empty(y_saved.shape(), options);
          unary_backward_stub(grad_y.device(), UnaryOp::relu, grad_sum, grad_y, y_saved, Tensor(), 0.0, 0.0);
          if (node.needs_input_grad(3)) grad_residual = grad_sum;
          grad_y = grad_sum;
        }
        if (x_saved.numel() == 0) {
          for (Tensor* t : {&grad_weight, &grad_bias}) {
            if (t->defined()) t->fill_(0.0);
          }
        } else if (grad_x.defined() || grad_weight.defined() || grad_bias.defined()) {
          if (relu && !y_saved.defined()) {
            batch_norm_relu_nhwc_backward_stub(grad_y.device(), grad_x, grad_weight, grad_bias, grad_y, x_saved,
                                               weight_saved, bias_saved, mean_saved, invstd_saved, training);
          } else {
            auto& backward_stub = nhwc ? batch_norm_nhwc_backward_stub : batch_norm_backward_stub;
            backward_stub(grad_y.device(), grad_x, grad_weight, grad_bias, grad_y, x_saved, weight_saved, mean_saved,
                          invstd_saved, training);
          }
        }
        return std::vector<Tensor>{grad_x, grad_weight, grad_bias, grad_residual};
      });
  return y;
}

}  // namespace

Tensor batch_norm2d(const Tensor& x, Tensor& running_mean, Tensor& running_var, const Tensor& weight,
                    const Tensor& bias, bool training, double momentum, double eps, ImageLayout layout) {
  return batch_norm_impl(x, running_mean, running_var, weight, bias, training, momentum, eps, layout, false);
}

Tensor batch_norm_relu2d(const Tensor& x, Tensor& running_mean, Tensor& running_var, const Tensor& weight,
                         const Tensor& bias, bool training, double momentum, double eps, ImageLayout layout) {
  return batch_norm_impl(x, running_mean, running_var, weight, bias, training, momentum, eps, layout, true);
}

Tensor batch_norm_add_relu2d(const Tensor& x, const Tensor& residual, Tensor& running_mean, Tensor& running_var,
                             const Tensor& weight, const Tensor& bias, bool training, double momentum, double eps,
                             ImageLayout layout) {
  COLOSSAL_CHECK(residual.defined(), "batch_norm_add_relu2d: the residual must be defined");
  return batch_norm_impl(x, running_mean, running_var, weight, bias, training, momentum, eps, layout, true, residual);
}

}  // namespace colossal::ops
