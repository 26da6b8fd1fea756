// Linear and Conv1D: both are one ops::linear call; Conv1D hands it a transposed view of its
// [in, out] weight, which BLAS reads as a transpose flag, so neither layout costs a copy.
#include "colossal/nn/linear.h"

#include <fmt/format.h>

#include "colossal/nn/init.h"
#include "colossal/ops/linalg.h"  // linear

namespace colossal::nn {

Linear::Linear(int64_t in_features, int64_t out_features, bool bias, core::Generator* generator)
    : Module("Linear"), in_features_(in_features), out_features_(out_features) {
  COLOSSAL_CHECK(in_features > 0 && out_features > 0, "Linear: features must be positive, got in {} and out {}",
                 in_features, out_features);
  weight_ = &register_parameter("weight", core::empty({out_features, in_features}));
  bias_ = &register_parameter("bias", bias ? core::empty({out_features}) : Tensor());
  init::default_linear_init_(*weight_, *bias_, generator);
}

Tensor Linear::forward(const Tensor& x) {
  return ops::linear(x, *weight_, *bias_);
}

std::string Linear::extra_repr() const {
  return fmt::format("in_features={}, out_features={}, bias={}", in_features_, out_features_, bias_->defined());
}

Conv1D::Conv1D(int64_t in_features, int64_t out_features, core::Generator* generator)
    : Module("Conv1D"), in_features_(in_features), out_features_(out_features) {
  COLOSSAL_CHECK(in_features > 0 && out_features > 0, "Conv1D: features must be positive, got in {} and out {}",
                 in_features, out_features);
  weight_ = &register_parameter("weight", core::empty({in_features, out_features}));
  bias_ = &register_parameter("bias", core::zeros({out_features}));
  init::normal_(*weight_, 0.0, 0.02, generator);
}

Tensor Conv1D::forward(const Tensor& x) {
  return ops::linear(x, weight_->t(), *bias_);
}

std::string Conv1D::extra_repr() const {
  return fmt::format("in_features={}, out_features={}", in_features_, out_features_);
}

}  // namespace colossal::nn
