// Global-norm gradient clipping. Per-tensor norms are combined into one f64 scalar on the device;
// clipping multiplies by min(max_norm / (total + 1e-6), 1), which leaves unclipped gradients
// bit-identical (x * 1 == x).
#include "colossal/optim/clip_grad.h"

#include <cmath>

#include "colossal/autograd/grad_mode.h"  // NoGradGuard
#include "colossal/core/error.h"          // COLOSSAL_CHECK
#include "colossal/core/view.h"           // cast_raw
#include "colossal/ops/elementwise.h"     // abs, pow, mul_, clamp
#include "colossal/ops/reduction.h"       // sum, max

namespace colossal::optim {
namespace {

void check_norm_type(double norm_type, const char* op) {
  COLOSSAL_CHECK(norm_type > 0.0 && !std::isnan(norm_type),
                 "{}: norm_type must be a positive number or infinity (kInfNorm), got {}", op, norm_type);
}

/// sum |t|^p (or max |t| for the inf-norm), 0-d in the accumulation dtype.
Tensor norm_partial(const Tensor& t, double norm_type) {
  const DType dtype = t.dtype() == DType::f64 ? DType::f64 : DType::f32;
  const Tensor x = t.dtype() == dtype ? t : core::cast_raw(t, dtype);
  if (x.numel() == 0) return core::zeros({}, TensorOptions(dtype, t.device()));
  if (std::isinf(norm_type)) return ops::max(ops::abs(x));
  if (norm_type == 2.0) return ops::sum(ops::mul(x, x));
  if (norm_type == 1.0) return ops::sum(ops::abs(x));
  return ops::sum(ops::pow(ops::abs(x), norm_type));
}

/// The p-th root of a sum of p-th powers (identity for the inf-norm).
Tensor finish_norm(const Tensor& partial, double norm_type) {
  if (std::isinf(norm_type) || norm_type == 1.0) return partial;
  if (norm_type == 2.0) return ops::sqrt(partial);
  return ops::pow(partial, 1.0 / norm_type);
}

}  // namespace

Tensor vector_norm(const Tensor& t, double norm_type) {
  COLOSSAL_CHECK(t.defined(), "vector_norm: undefined tensor");
  COLOSSAL_CHECK(core::is_floating(t.dtype()), "vector_norm: expected a floating tensor, got {}", t.dtype());
  check_norm_type(norm_type, "vector_norm");
  autograd::NoGradGuard no_grad;
  return finish_norm(norm_partial(t, norm_type), norm_type);
}

Tensor total_grad_norm(const std::vector<Tensor>& params, double norm_type) {
  check_norm_type(norm_type, "total_grad_norm");
  autograd::NoGradGuard no_grad;
  Tensor total;
  for (size_t i = 0; i < params.size(); ++i) {
    COLOSSAL_CHECK(params[i].defined(), "total_grad_norm: parameter {} is an undefined tensor", i);
    const Tensor grad = params[i].grad();
    if (!grad.defined()) continue;
    Tensor partial = norm_partial(grad, norm_type);
    if (partial.dtype() != DType::f64) partial = core::cast_raw(partial, DType::f64);
    if (!total.defined()) {
      total = partial;
      continue;
    }
    COLOSSAL_CHECK(partial.device() == total.device(),
                   "total_grad_norm: gradient of parameter {} is on {} but earlier gradients are on {}; all gradients "
                   "must be on one device",
                   i, partial.device(), total.device());
    total = std::isinf(norm_type) ? ops::maximum(total, partial) : ops::add(total, partial);
  }
  if (!total.defined()) return core::zeros({}, DType::f64);
  return finish_norm(total, norm_type);
}

Tensor clip_grad_norm_on_device(const std::vector<Tensor>& params, double max_norm, double norm_type,
                                bool error_if_nonfinite) {
  check_norm_type(norm_type, "clip_grad_norm");
  COLOSSAL_CHECK(max_norm >= 0.0, "clip_grad_norm: max_norm must be >= 0, got {}", max_norm);
  autograd::NoGradGuard no_grad;
  const Tensor total = total_grad_norm(params, norm_type);
  // error_if_nonfinite needs the value before scaling.
  if (error_if_nonfinite) {
    const double total_value = total.item<double>();
    COLOSSAL_CHECK(std::isfinite(total_value),
                   "clip_grad_norm: the total {}-norm of the gradients is {}; pass error_if_nonfinite = false to clip "
                   "anyway",
                   norm_type, total_value);
  }
  scale_grads_to_norm(params, max_norm, total);
  return total;
}

void scale_grads_to_norm(const std::vector<Tensor>& params, double max_norm, const Tensor& total_norm) {
  COLOSSAL_CHECK(max_norm >= 0.0, "clip_grad_norm: max_norm must be >= 0, got {}", max_norm);
  autograd::NoGradGuard no_grad;
  const Tensor factor = ops::clamp(
      ops::div(core::full({}, max_norm, TensorOptions(DType::f64, total_norm.device())), ops::add(total_norm, 1e-6)),
      0.0, 1.0);
  for (const Tensor& p : params) {
    Tensor grad = p.grad();
    if (grad.defined() && grad.numel() > 0) ops::mul_(grad, factor);
  }
}

double clip_grad_norm(const std::vector<Tensor>& params, double max_norm, double norm_type, bool error_if_nonfinite) {
  return clip_grad_norm_on_device(params, max_norm, norm_type, error_if_nonfinite).item<double>();
}

}  // namespace colossal::optim
