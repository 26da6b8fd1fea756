// LayerNorm: parameter setup and the fused ops::layer_norm call.
#include "colossal/nn/layer_norm.h"

#include <fmt/format.h>

#include "colossal/ops/nn_functional.h"  // layer_norm

namespace colossal::nn {

LayerNorm::LayerNorm(Shape normalized_shape, double eps, bool elementwise_affine, bool bias)
    : Module("LayerNorm"), normalized_shape_(std::move(normalized_shape)), eps_(eps) {
  COLOSSAL_CHECK(!normalized_shape_.empty(), "LayerNorm: normalized_shape must have at least one dimension");
  for (int64_t size : normalized_shape_) {
    COLOSSAL_CHECK(size > 0, "LayerNorm: normalized_shape {} must have positive sizes", normalized_shape_);
  }
  COLOSSAL_CHECK(eps > 0.0, "LayerNorm: eps must be positive, got {}", eps);
  weight_ = &register_parameter("weight", elementwise_affine ? core::ones(normalized_shape_) : Tensor());
  bias_ = &register_parameter("bias", elementwise_affine && bias ? core::zeros(normalized_shape_) : Tensor());
}

Tensor LayerNorm::forward(const Tensor& x) {
  return ops::layer_norm(x, normalized_shape_, *weight_, *bias_, eps_);
}

std::string LayerNorm::extra_repr() const {
  return fmt::format("{}, eps={}, elementwise_affine={}", normalized_shape_, eps_, weight_->defined());
}

}  // namespace colossal::nn
