// Helpers shared by the optimizer tests: f64 parameters with hand-set gradients, and reading a
// tensor back as doubles.
#pragma once

#include <vector>

#include "colossal/core/tensor.h"

namespace colossal::optim::testing {

/// A leaf f64 parameter (requires grad) holding `values` with `shape` (1-D when empty).
inline Tensor make_param(const std::vector<double>& values, Shape shape = {}) {
  if (shape.empty()) shape = {static_cast<int64_t>(values.size())};
  Tensor p = core::from_vector(values, shape, DType::f64);
  p.set_requires_grad(true);
  return p;
}

/// Sets p's gradient to `values` (in p's shape and dtype). Tensors are handles: the copy shares p.
inline void set_grad(Tensor p, const std::vector<double>& values) {
  p.set_grad(core::from_vector(values, p.shape(), DType::f64).to(p.dtype()));
}

inline std::vector<double> values_of(const Tensor& t) {
  return t.to_vector<double>();
}

}  // namespace colossal::optim::testing
