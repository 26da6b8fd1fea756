// clip_grad_norm, total_grad_norm and vector_norm against hand values: the 2-, inf-, 1- and 3-norm
// over several tensors, torch's max_norm / (total + 1e-6) factor, no clipping when under the limit,
// parameters without gradients, non-finite norms, f32 gradients and bad arguments.
#include <gtest/gtest.h>

#include <cmath>
#include <functional>
#include <limits>
#include <memory>
#include <vector>

#include "colossal/optim/adam.h"
#include "colossal/optim/clip_grad.h"
#include "colossal/optim/sgd.h"
#include "gradcheck.h"  // expect_values, EXPECT_ERROR_CONTAINS
#include "optim_test_util.h"

namespace colossal::optim {
namespace {

using colossal::testing::expect_values;
using testing::make_param;
using testing::set_grad;
using testing::values_of;

// Norms of a few O(1..100) numbers and one quotient in f64: a few ulps of 13 (~1e-15). 1e-12 still
// separates torch's 1e-6 in the denominator (a 1e-7 relative change here) from its absence.
constexpr double kTol = 1e-12;
constexpr double kNaN = std::numeric_limits<double>::quiet_NaN();
constexpr double kInf = std::numeric_limits<double>::infinity();

TEST(ClipGradNorm, ScalesAllGradientsByOneGlobalFactor) {
  // ||(3, 4, 12)|| = 13 over both tensors (5 and 12 on their own); max_norm 6.5 gives the factor
  // 6.5 / (13 + 1e-6) ~ 0.5 for every gradient.
  Tensor a = make_param({1.0, 1.0});
  Tensor b = make_param({1.0});
  set_grad(a, {3.0, 4.0});
  set_grad(b, {12.0});
  const double total = clip_grad_norm({a, b}, 6.5);
  EXPECT_EQ(total, 13.0);  // sqrt(169): exact
  const double factor = 6.5 / (13.0 + 1e-6);
  expect_values(a.grad(), {3.0 * factor, 4.0 * factor}, kTol);
  expect_values(b.grad(), {12.0 * factor}, kTol);
  expect_values(a, {1.0, 1.0}, 0.0);  // parameters untouched
}

TEST(ClipGradNorm, OnDeviceReturnsTheNormAsATensorAndScalesTheSame) {
  // The Engine's path: the total stays a 0-d f64 tensor where the gradients live (no host read),
  // and the gradients are scaled exactly as clip_grad_norm scales them.
  Tensor a = make_param({1.0, 1.0});
  Tensor b = make_param({1.0});
  set_grad(a, {3.0, 4.0});
  set_grad(b, {12.0});
  const Tensor total = clip_grad_norm_on_device({a, b}, 6.5);
  EXPECT_EQ(total.dim(), 0);
  EXPECT_EQ(total.dtype(), DType::f64);
  EXPECT_EQ(total.device(), a.grad().device());
  EXPECT_EQ(total.item<double>(), 13.0);
  const double factor = 6.5 / (13.0 + 1e-6);
  expect_values(a.grad(), {3.0 * factor, 4.0 * factor}, kTol);
  expect_values(b.grad(), {12.0 * factor}, kTol);
}

TEST(ClipGradNorm, InfNormUsesTheLargestMagnitude) {
  Tensor a = make_param({0.0, 0.0});
  Tensor b = make_param({0.0});
  set_grad(a, {3.0, -7.0});
  set_grad(b, {5.0});
  const double total = clip_grad_norm({a, b}, 3.5, kInfNorm);
  EXPECT_EQ(total, 7.0);
  const double factor = 3.5 / (7.0 + 1e-6);
  expect_values(a.grad(), {3.0 * factor, -7.0 * factor}, kTol);
  expect_values(b.grad(), {5.0 * factor}, kTol);
}

TEST(ClipGradNorm, LeavesGradientsBitIdenticalUnderTheLimit) {
  Tensor a = make_param({0.0, 0.0});
  Tensor b = make_param({0.0});
  set_grad(a, {0.3, -0.4});
  set_grad(b, {1.2});
  const std::vector<double> a_before = values_of(a.grad()), b_before = values_of(b.grad());
  const double total = clip_grad_norm({a, b}, 100.0);
  EXPECT_NEAR(total, 1.3, kTol);
  EXPECT_EQ(values_of(a.grad()), a_before);
  EXPECT_EQ(values_of(b.grad()), b_before);
}

TEST(ClipGradNorm, ClipsSlightlyAtExactlyTheLimit) {
  // torch divides by total + 1e-6, so a total equal to max_norm still scales by 13 / (13 + 1e-6).
  Tensor a = make_param({0.0, 0.0, 0.0});
  set_grad(a, {3.0, 4.0, 12.0});
  EXPECT_EQ(clip_grad_norm({a}, 13.0), 13.0);
  const double factor = 13.0 / (13.0 + 1e-6);
  expect_values(a.grad(), {3.0 * factor, 4.0 * factor, 12.0 * factor}, kTol);
  EXPECT_LT(a.grad().to_vector<double>()[2], 12.0);
}

TEST(ClipGradNorm, SkipsParametersWithoutGradients) {
  Tensor with = make_param({0.0, 0.0});
  Tensor without = make_param({5.0});
  set_grad(with, {6.0, 8.0});
  const double total = clip_grad_norm({without, with}, 5.0);
  EXPECT_EQ(total, 10.0);
  const double factor = 5.0 / (10.0 + 1e-6);
  expect_values(with.grad(), {6.0 * factor, 8.0 * factor}, kTol);
  EXPECT_FALSE(without.grad().defined());
}

TEST(ClipGradNorm, NoGradientsGiveZero) {
  Tensor a = make_param({1.0});
  EXPECT_EQ(clip_grad_norm({a}, 1.0), 0.0);
  EXPECT_EQ(clip_grad_norm({}, 1.0), 0.0);
  EXPECT_FALSE(a.grad().defined());
}

TEST(ClipGradNorm, OneNormAndThreeNorm) {
  Tensor a = make_param({0.0, 0.0});
  Tensor b = make_param({0.0});
  set_grad(a, {3.0, -4.0});
  set_grad(b, {12.0});
  EXPECT_EQ(clip_grad_norm({a, b}, 100.0, 1.0), 19.0);  // 3 + 4 + 12
  // (27 + 64 + 1728)^(1/3) = 1819^(1/3) ~ 12.21
  EXPECT_NEAR(clip_grad_norm({a, b}, 100.0, 3.0), std::cbrt(1819.0), kTol);
  const double total = clip_grad_norm({a, b}, 9.5, 1.0);
  const double factor = 9.5 / (19.0 + 1e-6);
  EXPECT_EQ(total, 19.0);
  expect_values(a.grad(), {3.0 * factor, -4.0 * factor}, kTol);
}

TEST(ClipGradNorm, ZeroMaxNormZeroesEveryGradient) {
  Tensor a = make_param({0.0, 0.0});
  set_grad(a, {3.0, -4.0});
  EXPECT_EQ(clip_grad_norm({a}, 0.0), 5.0);
  expect_values(a.grad(), {0.0, 0.0}, 0.0);
}

TEST(ClipGradNorm, Float32Gradients) {
  Tensor a = core::zeros({3}, DType::f32);
  a.set_requires_grad(true);
  set_grad(a, {3.0, 4.0, 12.0});
  const double total = clip_grad_norm({a}, 6.5);
  EXPECT_EQ(total, 13.0);  // 9 + 16 + 144 and its root are exact in f32 too
  EXPECT_EQ(a.grad().dtype(), DType::f32);
  const double factor = 6.5 / (13.0 + 1e-6);
  // f32 rounding of the scaled values (ulp of 6 is 4.8e-7).
  expect_values(a.grad(), {3.0 * factor, 4.0 * factor, 12.0 * factor}, 1e-6);
}

TEST(ClipGradNorm, NonFiniteTotalThrowsBeforeTouchingGradients) {
  Tensor a = make_param({0.0, 0.0});
  set_grad(a, {kNaN, 1.0});
  EXPECT_ERROR_CONTAINS(clip_grad_norm({a}, 1.0, 2.0, /*error_if_nonfinite=*/true),
                        "clip_grad_norm: the total 2-norm of the gradients is nan");
  EXPECT_TRUE(std::isnan(values_of(a.grad())[0]));
  EXPECT_EQ(values_of(a.grad())[1], 1.0);  // untouched
}

TEST(ClipGradNorm, NonFiniteTotalPropagatesAsTorchDoes) {
  // NaN: the factor is NaN and so is every gradient. Inf: the factor is 0 (inf * 0 = NaN).
  Tensor a = make_param({0.0, 0.0});
  set_grad(a, {kNaN, 1.0});
  EXPECT_TRUE(std::isnan(clip_grad_norm({a}, 1.0)));
  EXPECT_TRUE(std::isnan(values_of(a.grad())[1]));
  set_grad(a, {kInf, 1.0});
  EXPECT_EQ(clip_grad_norm({a}, 1.0), kInf);
  EXPECT_TRUE(std::isnan(values_of(a.grad())[0]));
  EXPECT_EQ(values_of(a.grad())[1], 0.0);
}

TEST(ClipGradNorm, RejectsBadArguments) {
  Tensor a = make_param({0.0});
  set_grad(a, {1.0});
  EXPECT_ERROR_CONTAINS(clip_grad_norm({a}, -1.0), "clip_grad_norm: max_norm must be >= 0, got -1");
  EXPECT_ERROR_CONTAINS(clip_grad_norm({a}, 1.0, 0.0),
                        "clip_grad_norm: norm_type must be a positive number or infinity (kInfNorm), got 0");
  EXPECT_ERROR_CONTAINS(clip_grad_norm({a}, 1.0, kNaN), "norm_type must be a positive number or infinity");
  EXPECT_ERROR_CONTAINS(total_grad_norm({a}, -2.0), "total_grad_norm: norm_type must be a positive number");
  EXPECT_ERROR_CONTAINS(total_grad_norm({a, Tensor()}), "total_grad_norm: parameter 1 is an undefined tensor");
  expect_values(a.grad(), {1.0}, 0.0);
}

TEST(TotalGradNorm, IsAZeroDimF64Tensor) {
  Tensor a = core::zeros({2}, DType::f32);
  a.set_requires_grad(true);
  set_grad(a, {0.6, 0.8});
  const Tensor total = total_grad_norm({a});
  EXPECT_EQ(total.dim(), 0);
  EXPECT_EQ(total.dtype(), DType::f64);
  EXPECT_NEAR(total.item<double>(), 1.0, 1e-7);  // f32 squares of 0.6 and 0.8: ulp 6e-8
  expect_values(a.grad(), {0.6, 0.8}, 1e-7);     // not scaled
  EXPECT_EQ(total_grad_norm({}).item<double>(), 0.0);
}

TEST(VectorNorm, HandValues) {
  const Tensor t = core::from_vector<double>({3.0, -4.0, 0.0, 12.0}, {2, 2});
  EXPECT_EQ(vector_norm(t).item<double>(), 13.0);
  EXPECT_EQ(vector_norm(t, kInfNorm).item<double>(), 12.0);
  EXPECT_EQ(vector_norm(t, 1.0).item<double>(), 19.0);
  EXPECT_NEAR(vector_norm(t, 3.0).item<double>(), std::cbrt(1819.0), kTol);
  EXPECT_EQ(vector_norm(core::zeros({0}, DType::f64)).item<double>(), 0.0);
}

TEST(VectorNorm, HalfPrecisionAccumulatesInFloat32) {
  // 300^2 = 90000 overflows f16 (max 65504); in f32 the norm of (300, 400) is 500.
  const Tensor t = core::from_vector<double>({300.0, 400.0}, {2}).to(DType::f16);
  const Tensor n = vector_norm(t);
  EXPECT_EQ(n.dtype(), DType::f32);
  EXPECT_EQ(n.item<double>(), 500.0);
  EXPECT_EQ(vector_norm(t.to(DType::bf16), kInfNorm).dtype(), DType::f32);
}

TEST(VectorNorm, RejectsBadInputs) {
  EXPECT_ERROR_CONTAINS(vector_norm(Tensor()), "vector_norm: undefined tensor");
  EXPECT_ERROR_CONTAINS(vector_norm(core::zeros({2}, DType::i64)), "vector_norm: expected a floating tensor, got");
  EXPECT_ERROR_CONTAINS(vector_norm(core::zeros({2}, DType::f64), -1.0),
                        "vector_norm: norm_type must be a positive number or infinity (kInfNorm), got -1");
}

TEST(SumOfSquares, ScalesInPlaceFirstAndSumsInFloat64) {
  // 2 * (3, 4) and 2 * (12): squares 36 + 64 + 576 = 676, the tensors left scaled.
  Tensor a = core::from_vector<double>({3.0, 4.0}, {2}).to(DType::f32);
  Tensor b = core::from_vector<double>({12.0}, {1}).to(DType::bf16);
  const Tensor total = sum_of_squares({a, b}, 2.0);
  EXPECT_EQ(total.dtype(), DType::f64);
  EXPECT_EQ(total.dim(), 0);
  EXPECT_EQ(total.item<double>(), 676.0);
  expect_values(a, {6.0, 8.0}, 0.0);
  expect_values(b, {24.0}, 0.0);
  EXPECT_EQ(sum_of_squares({a}).item<double>(), 100.0);  // scale 1: nothing written
  expect_values(a, {6.0, 8.0}, 0.0);
  EXPECT_EQ(sum_of_squares({}).item<double>(), 0.0);
}

TEST(SumOfSquares, IsNonFiniteExactlyWhenAnElementIs) {
  // 1e20 is a finite f32 whose f32 square overflows; squared in f64 it does not (mixed precision's
  // overflow check must not skip a step for it), while an inf or NaN element makes the sum non-finite.
  const Tensor big = core::from_vector<double>({1e20, 1.0}, {2}).to(DType::f32);
  EXPECT_TRUE(std::isfinite(sum_of_squares({big}).item<double>()));
  EXPECT_TRUE(std::isinf(sum_of_squares({big, core::from_vector<double>({kInf}, {1}).to(DType::f32)}).item<double>()));
  EXPECT_TRUE(std::isnan(sum_of_squares({core::from_vector<double>({kNaN, 1.0}, {2})}).item<double>()));
  EXPECT_ERROR_CONTAINS(sum_of_squares({core::zeros({2}, DType::i64)}), "sum_of_squares: tensor 0 is i64");
}

TEST(ScaleInPlace, MultipliesByTheScaleRoundedToEachDtype) {
  Tensor a = core::from_vector<double>({1.0, -2.0}, {2});
  Tensor b = core::from_vector<double>({3.0}, {1}).to(DType::f32);
  const Tensor scale = core::full({}, 1.0 / 3.0, DType::f64);
  scale_({a, b}, scale);
  expect_values(a, {1.0 / 3.0, -2.0 / 3.0}, 0.0);                            // f64: the f64 scale
  EXPECT_EQ(b.to_vector<float>()[0], 3.0f * static_cast<float>(1.0 / 3.0));  // f32: the scale rounded to f32 first
}

// Clipping through the optimizer (the Engine's path) updates the parameters bit for bit as clipping
// the gradients in place and then stepping does, for an optimizer that takes the scale inside its
// update (AdamW: .grad is left unclipped) and for one that scales in place first (SGD).
void expect_deferred_clipping_matches(const std::function<std::unique_ptr<Optimizer>(std::vector<Tensor>)>& make,
                                      bool grads_untouched) {
  auto params = [] {
    return std::vector<Tensor>{make_param({0.5, -1.0, 1.5, 2.0}, {2, 2}).to(DType::f32).detach(),
                               make_param({0.25, -0.75}).to(DType::f32).detach()};
  };
  std::vector<Tensor> eager = params(), deferred = params();
  for (auto* list : {&eager, &deferred}) {
    for (Tensor& p : *list) p.set_requires_grad(true);
  }
  auto eager_opt = make(eager);
  auto deferred_opt = make(deferred);
  for (int step = 0; step < 3; ++step) {
    const std::vector<std::vector<double>> grads{{3.0 + step, -4.0, 0.1 * step, 7.0}, {12.0, -0.3 * step}};
    for (size_t i = 0; i < 2; ++i) {
      set_grad(eager[i], grads[i]);
      set_grad(deferred[i], grads[i]);
    }
    const Tensor norm_eager = clip_grad_norm_on_device(eager, 1.5);
    eager_opt->step();
    const Tensor norm = total_grad_norm(deferred, 2.0);
    EXPECT_EQ(norm.item<double>(), norm_eager.item<double>());
    deferred_opt->scale_gradients_in_next_step(clip_coefficient(norm, 1.5));
    deferred_opt->step();
    for (size_t i = 0; i < 2; ++i) {
      EXPECT_EQ(deferred[i].to_vector<float>(), eager[i].to_vector<float>()) << "step " << step << " param " << i;
      if (grads_untouched) {
        EXPECT_EQ(deferred[i].grad().to_vector<double>(),
                  core::from_vector(grads[i], {static_cast<int64_t>(grads[i].size())}, DType::f64)
                      .to(DType::f32)
                      .to_vector<double>());
      }
    }
  }
  // The scale is used once: a step without a new one is unclipped, and zero_grad forgets a pending one.
  deferred_opt->scale_gradients_in_next_step(core::full({}, 0.0, DType::f64));
  deferred_opt->zero_grad();
  set_grad(deferred[0], {1.0, 1.0, 1.0, 1.0});
  const std::vector<float> before = deferred[0].to_vector<float>();
  deferred_opt->step();
  EXPECT_NE(deferred[0].to_vector<float>(), before);
}

TEST(ScaleGradientsInNextStep, AdamWEqualsClippingInPlace) {
  expect_deferred_clipping_matches(
      [](std::vector<Tensor> p) {
        return std::make_unique<AdamW>(std::move(p), AdamOptions{.lr = 0.1, .weight_decay = 0.01});
      },
      /*grads_untouched=*/true);
}

TEST(ScaleGradientsInNextStep, SgdEqualsClippingInPlace) {
  expect_deferred_clipping_matches(
      [](std::vector<Tensor> p) { return std::make_unique<Sgd>(std::move(p), SgdOptions{.lr = 0.1, .momentum = 0.9}); },
      /*grads_untouched=*/false);
}

}  // namespace
}  // namespace colossal::optim
