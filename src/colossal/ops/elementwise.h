// Elementwise ops with NumPy broadcasting, differentiable: arithmetic, the unary math and
// activation functions, comparisons (not differentiable, bool results) and in-place updates for
// optimizers and initialisation (not recorded). Mixed dtypes promote (core::promote_types).
#pragma once

#include "colossal/core/tensor.h"

namespace colossal::ops {

Tensor add(const Tensor& a, const Tensor& b, double alpha = 1.0);  ///< a + alpha * b
Tensor sub(const Tensor& a, const Tensor& b, double alpha = 1.0);  ///< a - alpha * b
Tensor mul(const Tensor& a, const Tensor& b);
Tensor div(const Tensor& a, const Tensor& b);
Tensor add(const Tensor& a, double b);
Tensor mul(const Tensor& a, double b);
Tensor div(const Tensor& a, double b);
Tensor neg(const Tensor& a);
/// a ** exponent, elementwise.
Tensor pow(const Tensor& a, double exponent);
/// a ** b with broadcasting; a must be positive where b's gradient is wanted.
Tensor pow(const Tensor& a, const Tensor& b);
Tensor maximum(const Tensor& a, const Tensor& b);
Tensor minimum(const Tensor& a, const Tensor& b);
Tensor clamp(const Tensor& a, double min, double max);

Tensor exp(const Tensor& a);
Tensor log(const Tensor& a);
Tensor tanh(const Tensor& a);
Tensor sqrt(const Tensor& a);
Tensor rsqrt(const Tensor& a);
Tensor abs(const Tensor& a);
Tensor relu(const Tensor& a);
Tensor sigmoid(const Tensor& a);
Tensor silu(const Tensor& a);

enum class GeluApproximation { none, tanh };
/// none: x * Phi(x) with the exact normal CDF; tanh: GPT-2's "gelu_new" approximation.
Tensor gelu(const Tensor& a, GeluApproximation approximation = GeluApproximation::none);

// Comparisons: bool tensors, no gradient.
Tensor eq(const Tensor& a, const Tensor& b);
Tensor ne(const Tensor& a, const Tensor& b);
Tensor lt(const Tensor& a, const Tensor& b);
Tensor le(const Tensor& a, const Tensor& b);
Tensor gt(const Tensor& a, const Tensor& b);
Tensor ge(const Tensor& a, const Tensor& b);
Tensor eq(const Tensor& a, double b);
Tensor gt(const Tensor& a, double b);
Tensor lt(const Tensor& a, double b);

// In place, not recorded by autograd. They refuse a leaf that requires grad while grad mode is on
// (wrap optimizer updates in NoGradGuard), because the graph would silently lose the change.
Tensor& add_(Tensor& a, const Tensor& b, double alpha = 1.0);  ///< a += alpha * b (b broadcast to a)
Tensor& add_(Tensor& a, double b);
Tensor& mul_(Tensor& a, const Tensor& b);
Tensor& mul_(Tensor& a, double b);
/// a += value * b * c (the AdamW/LAMB building block).
Tensor& addcmul_(Tensor& a, const Tensor& b, const Tensor& c, double value = 1.0);
/// a += value * b / c.
Tensor& addcdiv_(Tensor& a, const Tensor& b, const Tensor& c, double value = 1.0);

}  // namespace colossal::ops

namespace colossal::core {
// Operators live in core's namespace so argument-dependent lookup finds them for Tensor.
inline Tensor operator+(const Tensor& a, const Tensor& b) { return ops::add(a, b); }
inline Tensor operator-(const Tensor& a, const Tensor& b) { return ops::sub(a, b); }
inline Tensor operator*(const Tensor& a, const Tensor& b) { return ops::mul(a, b); }
inline Tensor operator/(const Tensor& a, const Tensor& b) { return ops::div(a, b); }
inline Tensor operator+(const Tensor& a, double b) { return ops::add(a, b); }
inline Tensor operator-(const Tensor& a, double b) { return ops::add(a, -b); }
inline Tensor operator*(const Tensor& a, double b) { return ops::mul(a, b); }
inline Tensor operator/(const Tensor& a, double b) { return ops::div(a, b); }
inline Tensor operator+(double a, const Tensor& b) { return ops::add(b, a); }
inline Tensor operator-(double a, const Tensor& b) { return ops::add(ops::neg(b), a); }
inline Tensor operator*(double a, const Tensor& b) { return ops::mul(b, a); }
inline Tensor operator-(const Tensor& a) { return ops::neg(a); }
}  // namespace colossal::core
