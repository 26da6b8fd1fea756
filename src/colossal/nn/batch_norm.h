// BatchNorm2d: per-channel normalisation of NCHW images with running statistics for evaluation,
// under PyTorch's parameter and buffer names (weight, bias, running_mean, running_var,
// num_batches_tracked) so ResNet checkpoints load as they are.
#pragma once

#include <optional>

#include "colossal/nn/module.h"
#include "colossal/ops/conv.h"  // ImageLayout

namespace colossal::nn {

class BatchNorm2d : public Module {
 public:
  /// momentum: running = (1 - momentum) * running + momentum * batch; nullopt gives the
  /// cumulative average over all batches seen (momentum 1 / num_batches_tracked), as PyTorch's
  /// momentum=None. Without track_running_stats there are no buffers and evaluation also
  /// normalises with the batch's statistics.
  /// layout: that of x and the output (Note [image layouts] in ops/conv.h).
  BatchNorm2d(int64_t num_features, double eps = 1e-5, std::optional<double> momentum = 0.1, bool affine = true,
              bool track_running_stats = true, ops::ImageLayout layout = ops::ImageLayout::nchw);
  Tensor forward(const Tensor& x) override;
  /// relu(forward(x)) through ops::batch_norm_relu2d (one fused pass each way on CUDA in nhwc).
  Tensor forward_relu(const Tensor& x);
  /// relu(forward(x) + residual) through ops::batch_norm_add_relu2d (one fused pass forward on CUDA in
  /// nhwc): the end of a residual block.
  Tensor forward_add_relu(const Tensor& x, const Tensor& residual);
  std::string extra_repr() const override;

  const Tensor& weight() const { return *weight_; }
  const Tensor& bias() const { return *bias_; }
  const Tensor& running_mean() const { return *running_mean_; }
  const Tensor& running_var() const { return *running_var_; }
  const Tensor& num_batches_tracked() const { return *num_batches_tracked_; }
  int64_t num_features() const { return num_features_; }
  ops::ImageLayout layout() const { return layout_; }

 private:
  /// The batch norm, then relu when `relu`, with `residual` (if defined) added before the relu.
  Tensor normalize(const Tensor& x, bool relu, const Tensor& residual = Tensor());

  int64_t num_features_;
  double eps_;
  std::optional<double> momentum_;
  ops::ImageLayout layout_;
  Tensor* weight_;
  Tensor* bias_;
  Tensor* running_mean_;
  Tensor* running_var_;
  Tensor* num_batches_tracked_;
};

}  // namespace colossal::nn
