// Global-norm gradient clipping. Per-tensor norms are combined into one f64 scalar on the device;
// clipping multiplies by min(max_norm / (total + 1e-6), 1), which leaves unclipped gradients
// bit-identical (x * 1 == x).
//
// Note [Clipping in one pass]
// Written per tensor with ops, the L2 norm of GPT-2's 148 gradients is ~600 launches (square, sum,
// cast, add) and clipping ~150 more, most of them on tensors of a few thousand elements: on a GPU
// that is launch-bound, 3.3 ms of a 33 ms step where one read of the 0.5 GB of f32 gradients takes
// ~0.15 ms. So the L2 case goes through sum_of_squares_stub, one multi-tensor pass (the optimizers'
// launcher, cuda/multi_tensor_apply.cuh) writing one f64 partial per chunk and one block summing them
// in a fixed order: the same bits every run, no atomics, no host read. The clipping factor stays a
// 0-d device tensor; the Engine hands it to the optimizer (Optimizer::scale_gradients_in_next_step),
// whose fused update multiplies each gradient as it reads it, so clipping costs no write pass at all.
// Mixed precision's unscale is folded into the same pass (sum_of_squares with a scale), which also
// gives the overflow check: a non-finite gradient makes the sum non-finite.
#include "colossal/optim/clip_grad.h"

#include <fmt/format.h>

#include <cmath>
#include <string>

#include "colossal/autograd/grad_mode.h"  // NoGradGuard
#include "colossal/core/error.h"          // COLOSSAL_CHECK
#include "colossal/core/view.h"           // cast_raw
#include "colossal/ops/elementwise.h"     // abs, pow, mul_, clamp
#include "colossal/ops/reduction.h"       // sum, max

namespace colossal::optim {

constinit core::DispatchStub<SumOfSquaresKernel> sum_of_squares_stub("sum_of_squares");
constinit core::DispatchStub<ScaleKernel> scale_stub("scale_");
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

/// x <- x * scale, the scale in x's accumulation type and the product rounded once to x's dtype, as
/// the kernels do. (ops::mul_ would round a 16-bit tensor's f32 scale to 16 bits first, a double
/// scalar would make it multiply in f64.)
void scale_in_place(const Tensor& x, const Tensor& scale) {
  const Tensor s = scale_for(scale, x.dtype());
  if (s.dtype() == x.dtype()) {
    Tensor target = x;
    ops::mul_(target, s);
  } else {
    x.copy_(ops::mul(x, s));  // in f32 by promotion; copy_ rounds to nearest even
  }
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
  std::vector<Tensor> grads;
  for (size_t i = 0; i < params.size(); ++i) {
    COLOSSAL_CHECK(params[i].defined(), "total_grad_norm: parameter {} is an undefined tensor", i);
    const Tensor grad = params[i].grad();
    if (!grad.defined()) continue;
    COLOSSAL_CHECK(grads.empty() || grad.device() == grads.front().device(),
                   "total_grad_norm: gradient of parameter {} is on {} but earlier gradients are on {}; all gradients "
                   "must be on one device",
                   i, grad.device(), grads.front().device());
    grads.push_back(grad);
  }
  if (grads.empty()) return core::zeros({}, DType::f64);
  if (norm_type == 2.0) return ops::sqrt(sum_of_squares(grads));  // Note [Clipping in one pass]
  Tensor total;
  for (const Tensor& grad : grads) {
    Tensor partial = norm_partial(grad, norm_type);
    if (partial.dtype() != DType::f64) partial = core::cast_raw(partial, DType::f64);
    total = !total.defined()        ? partial
            : std::isinf(norm_type) ? ops::maximum(total, partial)
                                    : ops::add(total, partial);
  }
  return finish_norm(total, norm_type);
}

Tensor sum_of_squares(const std::vector<Tensor>& tensors, double scale) {
  autograd::NoGradGuard no_grad;
  std::vector<Tensor> fused;
  Tensor total;
  auto add = [&](Tensor partial) {
    if (partial.dtype() != DType::f64) partial = core::cast_raw(partial, DType::f64);
    total = total.defined() ? ops::add(total, partial) : partial;
  };
  for (size_t i = 0; i < tensors.size(); ++i) {
    const Tensor& t = tensors[i];
    COLOSSAL_CHECK(t.defined(), "sum_of_squares: tensor {} is undefined", i);
    COLOSSAL_CHECK(core::is_floating(t.dtype()), "sum_of_squares: tensor {} is {}, expected a floating dtype", i,
                   t.dtype());
    COLOSSAL_CHECK(t.device() == tensors.front().device(),
                   "sum_of_squares: tensor {} is on {} but tensor 0 is on {}; all tensors must be on one device", i,
                   t.device(), tensors.front().device());
    if (t.numel() == 0) continue;
    if (sum_of_squares_stub.supports(t.device().type) && t.is_contiguous()) {
      fused.push_back(t);
      continue;
    }
    Tensor x = t;
    if (scale != 1.0) scale_in_place(x, core::full({}, scale, TensorOptions(DType::f64, x.device())));
    // Squared in f64, as the kernel does: no square overflows, so the sum is non-finite exactly
    // when some element is (mixed precision's overflow check relies on it).
    const Tensor wide = core::cast_raw(x, DType::f64);
    add(ops::sum(ops::mul(wide, wide)));
  }
  if (!fused.empty()) add(sum_of_squares_stub(fused.front().device(), fused, scale));
  if (!total.defined()) {
    return core::zeros({}, TensorOptions(DType::f64, tensors.empty() ? core::kCpu : tensors.front().device()));
  }
  return total;
}

void scale_(const std::vector<Tensor>& tensors, const Tensor& scale) {
  COLOSSAL_CHECK(scale.defined() && scale.numel() == 1, "scale_: expected a one-element scale tensor, got {}",
                 scale.defined() ? fmt::format("shape {}", scale.shape()) : std::string("an undefined tensor"));
  autograd::NoGradGuard no_grad;
  std::vector<Tensor> fused;
  for (const Tensor& t : tensors) {
    if (!t.defined() || t.numel() == 0) continue;
    if (scale_stub.supports(t.device().type) && t.is_contiguous() && t.device() == scale.device() &&
        core::is_floating(t.dtype())) {
      fused.push_back(t);
    } else {
      scale_in_place(t, scale);
    }
  }
  if (!fused.empty()) scale_stub(scale.device(), fused, scale);
}

Tensor clip_coefficient(const Tensor& total_norm, double max_norm) {
  COLOSSAL_CHECK(max_norm >= 0.0, "clip_grad_norm: max_norm must be >= 0, got {}", max_norm);
  autograd::NoGradGuard no_grad;
  const Tensor factor = ops::clamp(
      ops::div(core::full({}, max_norm, TensorOptions(DType::f64, total_norm.device())), ops::add(total_norm, 1e-6)),
      0.0, 1.0);
  return factor.dtype() == DType::f64 ? factor : core::cast_raw(factor, DType::f64);
}

Tensor scale_for(const Tensor& scale, DType dtype) {
  const DType acc = core::is_reduced_float(dtype) ? DType::f32 : dtype;
  return scale.dtype() == acc ? scale : core::cast_raw(scale, acc);
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
  std::vector<Tensor> grads;
  for (const Tensor& p : params) {
    if (Tensor grad = p.grad(); grad.defined()) grads.push_back(grad);
  }
  scale_(grads, clip_coefficient(total_norm, max_norm));
}

double clip_grad_norm(const std::vector<Tensor>& params, double max_norm, double norm_type, bool error_if_nonfinite) {
  return clip_grad_norm_on_device(params, max_norm, norm_type, error_if_nonfinite).item<double>();
}

}  // namespace colossal::optim
