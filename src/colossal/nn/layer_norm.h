// LayerNorm: normalisation over the trailing dimensions with a learned elementwise scale and shift
// (GPT-2's ln_1/ln_2/ln_f, ViT's norm1/norm2/norm).
#pragma once

#include "colossal/nn/module.h"

namespace colossal::nn {

/// weight (ones) and bias (zeros) of normalized_shape when elementwise_affine; bias alone can be
/// left out (torch's bias=False).
class LayerNorm : public Module {
 public:
  LayerNorm(Shape normalized_shape, double eps = 1e-5, bool elementwise_affine = true, bool bias = true);
  explicit LayerNorm(int64_t normalized_size, double eps = 1e-5, bool elementwise_affine = true, bool bias = true)
      : LayerNorm(Shape{normalized_size}, eps, elementwise_affine, bias) {}
  Tensor forward(const Tensor& x) override;
  std::string extra_repr() const override;

  const Tensor& weight() const { return *weight_; }
  const Tensor& bias() const { return *bias_; }
  const Shape& normalized_shape() const { return normalized_shape_; }
  double eps() const { return eps_; }

 private:
  Shape normalized_shape_;
  double eps_;
  Tensor* weight_;
  Tensor* bias_;
};

}  // namespace colossal::nn
