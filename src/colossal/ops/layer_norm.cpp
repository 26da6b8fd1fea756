// layer_norm: shape checks, the [rows, cols] view over the normalised trailing dimensions, and
// autograd through the fused forward (which saves each row's mean and rstd) and backward kernels.
#include "colossal/autograd/engine.h"    // accumulation_target, mark_accumulated
#include "colossal/autograd/function.h"  // record
#include "colossal/core/view.h"          // contiguous_raw, view_raw
#include "colossal/ops/autocast.h"
#include "colossal/ops/nn_functional.h"
#include "colossal/ops/nn_kernels.h"

namespace colossal::ops {

constinit core::DispatchStub<LayerNormForwardKernel> layer_norm_forward_stub("layer_norm_forward");
constinit core::DispatchStub<LayerNormBackwardKernel> layer_norm_backward_stub("layer_norm_backward");

namespace {

void check_affine(const char* name, const Tensor& param, const Tensor& x, const Shape& normalized_shape) {
  if (!param.defined()) return;
  COLOSSAL_CHECK(param.shape() == normalized_shape, "layer_norm: {} has shape {} but normalized_shape is {}", name,
                 param.shape(), normalized_shape);
  COLOSSAL_CHECK(param.dtype() == x.dtype(), "layer_norm: {} is {} but the input is {}; convert one so they match",
                 name, param.dtype(), x.dtype());
  COLOSSAL_CHECK(param.device() == x.device(), "layer_norm: {} is on {} but the input is on {}", name, param.device(),
                 x.device());
}

}  // namespace

Tensor layer_norm(const Tensor& x, const Shape& normalized_shape, const Tensor& weight, const Tensor& bias,
                  double eps) {
  if (autocast_dtype()) {
    const AutocastGuard off(std::nullopt);
    return layer_norm(autocast::to_f32(x), normalized_shape, autocast::to_f32(weight), autocast::to_f32(bias), eps);
  }
  COLOSSAL_CHECK(x.defined(), "layer_norm: the input is undefined");
  COLOSSAL_CHECK(core::is_floating(x.dtype()),
                 "layer_norm: expected a floating input (f32, f64, f16, bf16), got {} of shape {}", x.dtype(),
                 x.shape());
  const int64_t norm_rank = static_cast<int64_t>(normalized_shape.size());
  COLOSSAL_CHECK(norm_rank >= 1, "layer_norm: normalized_shape must name at least one dimension, got []");
  COLOSSAL_CHECK(norm_rank <= x.dim() && Shape(x.shape().end() - norm_rank, x.shape().end()) == normalized_shape,
                 "layer_norm: normalized_shape {} does not match the trailing dimensions of the input shape {}",
                 normalized_shape, x.shape());
  COLOSSAL_CHECK(eps >= 0, "layer_norm: eps must be non-negative, got {}", eps);
  check_affine("weight", weight, x, normalized_shape);
  check_affine("bias", bias, x, normalized_shape);

  const int64_t cols = core::shape_numel(normalized_shape);
  const int64_t rows = core::shape_numel(Shape(x.shape().begin(), x.shape().end() - norm_rank));
  const DType stat_dtype = x.dtype() == DType::f64 ? DType::f64 : DType::f32;
  const Tensor input = core::view_raw(core::contiguous_raw(x), {rows, cols});
  const Tensor weight_c = weight.defined() ? core::view_raw(core::contiguous_raw(weight), {cols}) : Tensor();
  const Tensor bias_c = bias.defined() ? core::view_raw(core::contiguous_raw(bias), {cols}) : Tensor();
  Tensor out = core::empty(x.shape(), TensorOptions(x.dtype(), x.device()));
  Tensor mean = core::empty({rows}, TensorOptions(stat_dtype, x.device()));
  Tensor rstd = core::empty({rows}, TensorOptions(stat_dtype, x.device()));
  if (x.numel() > 0) {
    layer_norm_forward_stub(x.device(), core::view_raw(out, {rows, cols}), mean, rstd, input, weight_c, bias_c, eps);
  }

  autograd::record(
      "layer_norm", {x, weight, bias}, {out},
      [input = input.detach(), weight_c = weight_c.defined() ? weight_c.detach() : Tensor(), mean = mean.detach(),
       rstd = rstd.detach(), x_shape = x.shape(),
       normalized_shape](const std::vector<Tensor>& grads, const autograd::Node& node) {
        const int64_t rows = input.size(0), cols = input.size(1);
        const TensorOptions options(input.dtype(), input.device());
        Tensor grad_x, grad_weight, grad_bias;
        // The input's gradient added into the sum waiting for it (a residual's), when
        // there is one (Note [Gradient accumulation in the op] in autograd/engine.cpp).
        bool accumulate_x = false;
        if (node.needs_input_grad(0)) {
          const Tensor target = autograd::accumulation_target(node, 0, input.dtype());
          accumulate_x = target.defined() && target.is_contiguous() && target.shape() == x_shape;
          grad_x = accumulate_x ? core::view_raw(target, {rows, cols}) : core::empty({rows, cols}, options);
        }
        if (node.needs_input_grad(1)) grad_weight = core::empty({cols}, options);
        if (node.needs_input_grad(2)) grad_bias = core::empty({cols}, options);
        const Tensor grad_y = core::view_raw(core::contiguous_raw(grads[0]), {rows, cols});
        layer_norm_backward_stub(input.device(), grad_x, grad_weight, grad_bias, grad_y, input, mean, rstd, weight_c,
                                 accumulate_x);
        if (accumulate_x) {
          autograd::mark_accumulated(node, 0);
          grad_x = Tensor();
        } else if (grad_x.defined()) {
          grad_x = core::view_raw(grad_x, x_shape);
        }
        if (grad_weight.defined()) grad_weight = core::view_raw(grad_weight, normalized_shape);
        if (grad_bias.defined()) grad_bias = core::view_raw(grad_bias, normalized_shape);
        return std::vector<Tensor>{grad_x, grad_weight, grad_bias};
      });
  return out;
}

}  // namespace colossal::ops
