// Lamb against values derived by hand: the per-tensor trust ratio ||p|| / ||r|| with weight decay
// inside r, its guards (1 when either norm is 0) and optional clamp, Colossal-AI's variant without
// bias correction over several steps, the Adam fallback, state_dict round trips and bad
// hyper-parameters; and guarded_ratio, the trust ratio's device-side select.
#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <memory>
#include <vector>

#include "colossal/optim/lamb.h"
#include "colossal/optim/trust_ratio.h"
#include "gradcheck.h"  // expect_values, EXPECT_ERROR_CONTAINS
#include "optim_test_util.h"

namespace colossal::optim {
namespace {

using colossal::testing::expect_values;
using testing::make_param;
using testing::set_grad;

// O(1) values from a handful of f64 operations per step (two norms of two elements, a quotient)
// over <= 4 steps: a few ulps (1e-16) of reordering at most. 1e-12 still catches a missing or
// misplaced trust ratio, which moves the values by >= 1e-3.
constexpr double kTol = 1e-12;

double norm2(double a, double b) {
  return std::sqrt(a * a + b * b);
}

TEST(Lamb, FirstStepScalesByTheTrustRatio) {
  // p = (3, 4), ||p|| = 5; g = (0.6, -0.8); lr 0.01, eps 1e-6, weight_decay 0.1, bias correction on.
  // Step 1: m_hat = g and v_hat = g^2, so r = g / (|g| + eps) + wd p:
  //   r = (0.6 / 0.600001 + 0.3, -0.8 / 0.800001 + 0.4) ~ (1.3, -0.6), ||r|| ~ 1.4318,
  //   trust = 5 / ||r|| ~ 3.492, p <- p - lr trust r.
  Tensor p = make_param({3.0, 4.0});
  Lamb lamb({p}, {.lr = 0.01, .eps = 1e-6, .weight_decay = 0.1});
  set_grad(p, {0.6, -0.8});
  lamb.step();
  const double r0 = 0.6 / (0.6 + 1e-6) + 0.1 * 3.0;
  const double r1 = -0.8 / (0.8 + 1e-6) + 0.1 * 4.0;
  const double trust = 5.0 / norm2(r0, r1);
  EXPECT_NEAR(trust, 3.492, 1e-3);  // the ratio is far from 1, so leaving it out would show
  expect_values(p, {3.0 - 0.01 * trust * r0, 4.0 - 0.01 * trust * r1}, kTol);
}

TEST(Lamb, ColossalAiVariantWithoutBiasCorrectionOverThreeSteps) {
  // colossalai.nn.optimizer.Lamb: r = m / (sqrt(v) + eps) + wd p, trust = ||p|| / ||r||,
  // p <- p - lr trust r; lr 0.02, betas (0.9, 0.99), eps 1e-6, weight_decay 0.01.
  const double lr = 0.02, b1 = 0.9, b2 = 0.99, eps = 1e-6, wd = 0.01;
  Tensor p = make_param({1.0, -2.0});
  Lamb lamb({p}, {.lr = lr, .beta1 = b1, .beta2 = b2, .eps = eps, .weight_decay = wd, .bias_correction = false});
  const std::vector<std::vector<double>> grads{{0.5, -0.25}, {0.1, 0.3}, {-0.2, 0.4}};
  double w[2] = {1.0, -2.0}, m[2] = {0.0, 0.0}, v[2] = {0.0, 0.0};
  for (int t = 1; t <= 3; ++t) {
    set_grad(p, grads[t - 1]);
    lamb.step();
    double r[2];
    for (int i = 0; i < 2; ++i) {
      m[i] = b1 * m[i] + (1.0 - b1) * grads[t - 1][i];
      v[i] = b2 * v[i] + (1.0 - b2) * grads[t - 1][i] * grads[t - 1][i];
      r[i] = m[i] / (std::sqrt(v[i]) + eps) + wd * w[i];
    }
    const double trust = norm2(w[0], w[1]) / norm2(r[0], r[1]);  // ||p|| before this step's update
    for (int i = 0; i < 2; ++i) w[i] -= lr * trust * r[i];
    expect_values(p, {w[0], w[1]}, kTol, "step " + std::to_string(t));
  }
}

TEST(Lamb, BiasCorrectedVariantOverThreeSteps) {
  // The header's default: m_hat = m / (1 - b1^t), v_hat = v / (1 - b2^t) before r.
  const double lr = 0.02, b1 = 0.9, b2 = 0.99, eps = 1e-6, wd = 0.01;
  Tensor p = make_param({1.0, -2.0});
  Lamb lamb({p}, {.lr = lr, .beta1 = b1, .beta2 = b2, .eps = eps, .weight_decay = wd});
  const std::vector<std::vector<double>> grads{{0.5, -0.25}, {0.1, 0.3}, {-0.2, 0.4}};
  double w[2] = {1.0, -2.0}, m[2] = {0.0, 0.0}, v[2] = {0.0, 0.0};
  for (int t = 1; t <= 3; ++t) {
    set_grad(p, grads[t - 1]);
    lamb.step();
    const double bc1 = 1.0 - std::pow(b1, t), bc2 = 1.0 - std::pow(b2, t);
    double r[2];
    for (int i = 0; i < 2; ++i) {
      m[i] = b1 * m[i] + (1.0 - b1) * grads[t - 1][i];
      v[i] = b2 * v[i] + (1.0 - b2) * grads[t - 1][i] * grads[t - 1][i];
      r[i] = (m[i] / bc1) / (std::sqrt(v[i] / bc2) + eps) + wd * w[i];
    }
    const double trust = norm2(w[0], w[1]) / norm2(r[0], r[1]);
    for (int i = 0; i < 2; ++i) w[i] -= lr * trust * r[i];
    expect_values(p, {w[0], w[1]}, kTol, "step " + std::to_string(t));
  }
}

TEST(Lamb, TrustRatioIsOneForAZeroWeight) {
  // ||p|| = 0 would make the ratio 0 and freeze p at zero forever; it is 1 instead. Without bias
  // correction, step 1: m = 0.1 g, v = 0.001 g^2, r = 0.1 g / (sqrt(0.001) |g| + eps).
  Tensor p = make_param({0.0, 0.0});
  Lamb lamb({p}, {.lr = 0.1, .eps = 1e-6, .weight_decay = 0.1, .bias_correction = false});
  set_grad(p, {0.5, -1.0});
  lamb.step();
  const double s = std::sqrt(0.001);
  expect_values(p, {-0.1 * (0.1 * 0.5) / (s * 0.5 + 1e-6), 0.1 * (0.1 * 1.0) / (s * 1.0 + 1e-6)}, kTol);
}

TEST(Lamb, TrustRatioIsOneForAZeroUpdate) {
  // A zero gradient and no decay give r = 0: 0 / 0 must not turn p into NaN.
  Tensor p = make_param({1.0, 2.0});
  Lamb lamb({p}, {.lr = 0.1});
  set_grad(p, {0.0, 0.0});
  lamb.step();
  expect_values(p, {1.0, 2.0}, 0.0);
}

TEST(Lamb, TrustRatioIsPerTensor) {
  // Same gradients, weights 10x apart: r is the same (no decay), so the steps are 10x apart.
  Tensor big = make_param({3.0, 4.0});
  Tensor small = make_param({0.3, 0.4});
  Lamb lamb({big, small}, {.lr = 0.01, .eps = 0.0});
  set_grad(big, {1.0, -1.0});
  set_grad(small, {1.0, -1.0});
  lamb.step();
  // Step 1 with eps 0: r = sign(g) = (1, -1), ||r|| = sqrt(2).
  const double r_norm = std::sqrt(2.0);
  expect_values(big, {3.0 - 0.01 * (5.0 / r_norm), 4.0 + 0.01 * (5.0 / r_norm)}, kTol);
  expect_values(small, {0.3 - 0.01 * (0.5 / r_norm), 0.4 + 0.01 * (0.5 / r_norm)}, kTol);
}

TEST(Lamb, TrustClipBoundsTheRatio) {
  // The ratio of FirstStepScalesByTheTrustRatio is ~3.49: a clip at 1 caps it, one at 10 does not.
  for (const double clip : {1.0, 10.0}) {
    Tensor p = make_param({3.0, 4.0});
    Lamb lamb({p}, {.lr = 0.01, .eps = 1e-6, .weight_decay = 0.1, .trust_clip = clip});
    set_grad(p, {0.6, -0.8});
    lamb.step();
    const double r0 = 0.6 / (0.6 + 1e-6) + 0.3, r1 = -0.8 / (0.8 + 1e-6) + 0.4;
    const double trust = std::min(5.0 / norm2(r0, r1), clip);
    expect_values(p, {3.0 - 0.01 * trust * r0, 4.0 - 0.01 * trust * r1}, kTol, "clip " + std::to_string(clip));
  }
}

TEST(Lamb, WithoutTrustRatioIsAdamWithDecayInTheUpdate) {
  // Colossal-AI's adam=True: p <- p - lr (m_hat / (sqrt(v_hat) + eps) + wd p).
  Tensor p = make_param({3.0, 4.0});
  Lamb lamb({p}, {.lr = 0.01, .eps = 1e-6, .weight_decay = 0.1, .use_trust_ratio = false});
  set_grad(p, {0.6, -0.8});
  lamb.step();
  expect_values(p, {3.0 - 0.01 * (0.6 / 0.600001 + 0.3), 4.0 - 0.01 * (-0.8 / 0.800001 + 0.4)}, kTol);
}

TEST(Lamb, DefaultsFollowColossalAi) {
  Lamb lamb({make_param({1.0})});
  const ParamGroup& group = lamb.param_groups()[0];
  EXPECT_EQ(lamb.name(), "LAMB");
  EXPECT_EQ(group.lr(), 1e-3);
  EXPECT_EQ(group.get("eps"), 1e-6);
  EXPECT_EQ(group.weight_decay(), 0.0);
  EXPECT_EQ(group.get("bias_correction"), 1.0);  // documented: off gives Colossal-AI's Lamb exactly
  EXPECT_EQ(group.get("use_trust_ratio"), 1.0);
  EXPECT_TRUE(std::isinf(group.get("trust_clip")));
}

TEST(Lamb, StateDictRoundTripContinuesBitIdentically) {
  testing::expect_state_dict_round_trip([](const NamedParameters& params) {
    return std::make_unique<Lamb>(make_param_groups(params, 0.01),
                                  LambOptions{.lr = 0.05, .beta1 = 0.8, .bias_correction = false});
  });
  testing::expect_state_dict_round_trip([](const NamedParameters& params) {
    return std::make_unique<Lamb>(make_param_groups(params, 0.01), LambOptions{.lr = 0.05, .trust_clip = 2.0});
  });
}

TEST(Lamb, RejectsBadHyperParameters) {
  Tensor p = make_param({1.0});
  EXPECT_ERROR_CONTAINS(Lamb({p}, {.lr = -1.0}), "LAMB: param group 0: lr must be a finite number >= 0, got -1");
  EXPECT_ERROR_CONTAINS(Lamb({p}, {.beta1 = -0.1}), "beta1 must be in [0, 1), got -0.1");
  EXPECT_ERROR_CONTAINS(Lamb({p}, {.beta2 = 1.0}), "LAMB: param group 0: beta2 must be in [0, 1), got 1");
  EXPECT_ERROR_CONTAINS(Lamb({p}, {.eps = -1e-6}), "eps must be a finite number >= 0, got -1e-06");
  EXPECT_ERROR_CONTAINS(Lamb({p}, {.weight_decay = -0.5}), "weight_decay must be a finite number >= 0, got -0.5");
  EXPECT_ERROR_CONTAINS(Lamb({p}, {.trust_clip = 0.0}), "trust_clip must be > 0 (infinity turns it off), got 0");
  EXPECT_ERROR_CONTAINS(Lamb({ParamGroup{.params = {p}, .options = {{"bias_correction", 2.0}}}}),
                        "bias_correction must be 0 (false) or 1 (true), got 2");
  EXPECT_ERROR_CONTAINS(Lamb({ParamGroup{.params = {p}, .options = {{"adam", 1.0}}}}),
                        "unknown option 'adam'; LAMB options are: beta1, beta2, bias_correction, eps, lr, trust_clip, "
                        "use_trust_ratio, weight_decay");
}

// guarded_ratio on its own: what LAMB and LARS compute their trust ratio with.

Tensor scalar(double value, DType dtype = DType::f64) {
  return core::scalar_tensor(value, dtype);
}

TEST(GuardedRatio, IsTheExactQuotientWhenBothGuardsArePositive) {
  const Tensor ratio = guarded_ratio(scalar(1.0), scalar(3.0), scalar(1.0), scalar(3.0));
  EXPECT_EQ(ratio.item<double>(), 1.0 / 3.0);  // bit for bit
  EXPECT_EQ(ratio.dtype(), DType::f64);
}

TEST(GuardedRatio, IsOneWhenAGuardIsZeroOrNaN) {
  const double nan = std::numeric_limits<double>::quiet_NaN();
  EXPECT_EQ(guarded_ratio(scalar(0.0), scalar(3.0), scalar(0.0), scalar(3.0)).item<double>(), 1.0);
  EXPECT_EQ(guarded_ratio(scalar(2.0), scalar(0.0), scalar(2.0), scalar(0.0)).item<double>(), 1.0);
  // A NaN norm counts as "not > 0", as torch.where(w_norm > 0 and g_norm > 0, ...) in Colossal-AI's Lars.
  EXPECT_EQ(guarded_ratio(scalar(nan), scalar(3.0), scalar(nan), scalar(3.0)).item<double>(), 1.0);
  EXPECT_EQ(guarded_ratio(scalar(2.0), scalar(nan), scalar(2.0), scalar(nan)).item<double>(), 1.0);
}

TEST(GuardedRatio, KeepsFloat32) {
  const Tensor ratio =
      guarded_ratio(scalar(1.0, DType::f32), scalar(4.0, DType::f32), scalar(1.0, DType::f32), scalar(4.0, DType::f32));
  EXPECT_EQ(ratio.dtype(), DType::f32);
  EXPECT_EQ(ratio.item<float>(), 0.25f);
}

}  // namespace
}  // namespace colossal::optim
