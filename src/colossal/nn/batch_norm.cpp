// BatchNorm2d: buffers, the momentum rule and the fused ops::batch_norm2d call (and its relu and
// residual variants).
#include "colossal/nn/batch_norm.h"

#include <fmt/format.h>

#include "colossal/autograd/checkpoint.h"  // is_recomputing
#include "colossal/autograd/grad_mode.h"   // NoGradGuard
#include "colossal/ops/conv.h"             // batch_norm2d
#include "colossal/ops/elementwise.h"      // add_

namespace colossal::nn {

BatchNorm2d::BatchNorm2d(int64_t num_features, double eps, std::optional<double> momentum, bool affine,
                         bool track_running_stats, ops::ImageLayout layout)
    : Module("BatchNorm2d"), num_features_(num_features), eps_(eps), momentum_(momentum), layout_(layout) {
  COLOSSAL_CHECK(num_features > 0, "BatchNorm2d: num_features must be positive, got {}", num_features);
  COLOSSAL_CHECK(eps > 0.0, "BatchNorm2d: eps must be positive, got {}", eps);
  COLOSSAL_CHECK(!momentum || (*momentum >= 0.0 && *momentum <= 1.0),
                 "BatchNorm2d: momentum must be in [0, 1] (or nullopt for a cumulative average), got {}", *momentum);
  weight_ = &register_parameter("weight", affine ? core::ones({num_features}) : Tensor());
  bias_ = &register_parameter("bias", affine ? core::zeros({num_features}) : Tensor());
  running_mean_ = &register_buffer("running_mean", track_running_stats ? core::zeros({num_features}) : Tensor());
  running_var_ = &register_buffer("running_var", track_running_stats ? core::ones({num_features}) : Tensor());
  num_batches_tracked_ =
      &register_buffer("num_batches_tracked", track_running_stats ? core::zeros({}, DType::i64) : Tensor());
}

Tensor BatchNorm2d::forward(const Tensor& x) {
  return normalize(x, false);
}

Tensor BatchNorm2d::forward_relu(const Tensor& x) {
  return normalize(x, true);
}

Tensor BatchNorm2d::forward_add_relu(const Tensor& x, const Tensor& residual) {
  return normalize(x, true, residual);
}

Tensor BatchNorm2d::normalize(const Tensor& x, bool relu, const Tensor& residual) {
  const bool tracking = running_mean_->defined();
  const bool use_batch_stats = is_training() || !tracking;
  // An activation-checkpointing recompute repeats a training forward whose running statistics
  // were already updated: it normalises by the same batch statistics and leaves them alone.
  const bool update_stats = is_training() && tracking && !autograd::is_recomputing();
  double momentum = momentum_.value_or(0.0);
  if (update_stats) {
    autograd::NoGradGuard no_grad;
    ops::add_(*num_batches_tracked_, 1.0);
    if (!momentum_) momentum = 1.0 / num_batches_tracked_->item<double>();
  }
  // Without running stats (none tracked, or none to update) the op gets none and uses the batch's.
  Tensor no_mean, no_var;
  Tensor& mean = update_stats || !is_training() ? *running_mean_ : no_mean;
  Tensor& var = update_stats || !is_training() ? *running_var_ : no_var;
  if (residual.defined()) {
    return ops::batch_norm_add_relu2d(x, residual, mean, var, *weight_, *bias_, use_batch_stats, momentum, eps_,
                                      layout_);
  }
  auto op = relu ? ops::batch_norm_relu2d : ops::batch_norm2d;
  return op(x, mean, var, *weight_, *bias_, use_batch_stats, momentum, eps_, layout_);
}

std::string BatchNorm2d::extra_repr() const {
  return fmt::format("{}, eps={}, momentum={}, affine={}, track_running_stats={}{}", num_features_, eps_,
                     momentum_ ? fmt::format("{}", *momentum_) : "None", weight_->defined(), running_mean_->defined(),
                     layout_ == ops::ImageLayout::nhwc ? ", layout=nhwc" : "");
}

}  // namespace colossal::nn
