// Dropout (through ops::dropout) and DropPath (a per-sample keep mask multiplied in).
#include "colossal/nn/dropout.h"

#include <fmt/format.h>

#include "colossal/core/view.h"          // cast_raw
#include "colossal/ops/elementwise.h"    // mul, lt
#include "colossal/ops/nn_functional.h"  // dropout

namespace colossal::nn {

Dropout::Dropout(double p, core::Generator* generator) : Module("Dropout"), p_(p), generator_(generator) {
  COLOSSAL_CHECK(p >= 0.0 && p <= 1.0, "Dropout: probability p must be in [0, 1], got {}", p);
}

Tensor Dropout::forward(const Tensor& x) {
  return ops::dropout(x, p_, is_training(), generator_);
}

Tensor Dropout::forward_add(const Tensor& x, const Tensor& residual) {
  return ops::dropout_add(x, residual, p_, is_training(), generator_);
}

std::string Dropout::extra_repr() const {
  return fmt::format("p={}", p_);
}

DropPath::DropPath(double p, core::Generator* generator) : Module("DropPath"), p_(p), generator_(generator) {
  COLOSSAL_CHECK(p >= 0.0 && p <= 1.0, "DropPath: drop probability p must be in [0, 1], got {}", p);
}

Tensor DropPath::forward(const Tensor& x) {
  if (!is_training() || p_ == 0.0) return x;
  COLOSSAL_CHECK(x.dim() >= 1, "DropPath: the input needs a batch dimension, got shape {}", x.shape());
  COLOSSAL_CHECK(core::is_floating(x.dtype()), "DropPath: expected a floating tensor, got {} of shape {}", x.dtype(),
                 x.shape());
  const double keep_prob = 1.0 - p_;
  Shape mask_shape(static_cast<size_t>(x.dim()), 1);
  mask_shape[0] = x.size(0);
  // A uniform below keep_prob keeps the sample: P(keep) = keep_prob, as timm's bernoulli_(keep_prob).
  const Tensor uniform = core::rand(mask_shape, TensorOptions(DType::f32, x.device()), generator_);
  Tensor mask = core::cast_raw(ops::lt(uniform, keep_prob), x.dtype());
  if (keep_prob > 0.0) mask = ops::mul(mask, 1.0 / keep_prob);  // with p = 1 nothing survives to scale
  return ops::mul(x, mask);
}

std::string DropPath::extra_repr() const {
  return fmt::format("drop_prob={}", p_);
}

}  // namespace colossal::nn
