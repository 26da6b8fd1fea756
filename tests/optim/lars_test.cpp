// Lars against values derived by hand and an independent recurrence of Colossal-AI's Lars: the
// trust ratio eta ||p|| / (||g|| + wd ||p|| + eps) with its guards and clamp, the elementwise
// gradient clip, momentum scaled by this step's ratio, groups without adaptation, state_dict round
// trips and bad hyper-parameters.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <memory>
#include <vector>

#include "colossal/optim/lars.h"
#include "gradcheck.h"  // expect_values, EXPECT_ERROR_CONTAINS
#include "optim_test_util.h"

namespace colossal::optim {
namespace {

using colossal::testing::expect_values;
using testing::make_param;
using testing::set_grad;

// O(1) values from a handful of f64 operations per step over <= 4 steps: a few ulps (1e-16) of
// reordering (lr * trust * b vs (b * trust) * lr). 1e-12 still catches a wrong ratio or a misplaced
// decay, which move the values by >= 1e-4.
constexpr double kTol = 1e-12;

double norm(const std::vector<double>& x) {
  double sum = 0.0;
  for (double v : x) sum += v * v;
  return std::sqrt(sum);
}

/// colossalai.nn.optimizer.Lars for one tensor, written from its source.
struct LarsReference {
  double lr, momentum, eta, weight_decay, eps, trust_clip = 50.0, grad_clip = 10.0;
  std::vector<double> buffer;

  void step(std::vector<double>& p, const std::vector<double>& g) {
    const double w_norm = norm(p), g_norm = norm(g);
    double trust = w_norm > 0.0 && g_norm > 0.0 ? eta * w_norm / (g_norm + weight_decay * w_norm + eps) : 1.0;
    trust = std::clamp(trust, 0.0, trust_clip);
    std::vector<double> d(p.size());
    for (size_t i = 0; i < p.size(); ++i) d[i] = std::clamp(g[i] + weight_decay * p[i], -grad_clip, grad_clip);
    if (momentum != 0.0) {
      if (buffer.empty()) {
        buffer = d;
      } else {
        for (size_t i = 0; i < d.size(); ++i) buffer[i] = momentum * buffer[i] + d[i];
      }
      d = buffer;
    }
    for (size_t i = 0; i < p.size(); ++i) p[i] -= lr * trust * d[i];
  }
};

TEST(Lars, OneStepWrittenOutByHand) {
  // p = (3, 4), ||p|| = 5; g = (0.6, 0.8), ||g|| = 1; eta 0.02, weight_decay 0.1, eps 0, lr 0.5.
  // trust = 0.02 * 5 / (1 + 0.1 * 5) = 1/15; d = g + 0.1 p = (0.9, 1.2); p <- p - 0.5 / 15 * d.
  Tensor p = make_param({3.0, 4.0});
  Lars lars({p}, {.lr = 0.5, .eta = 0.02, .weight_decay = 0.1});
  set_grad(p, {0.6, 0.8});
  lars.step();
  expect_values(p, {2.97, 3.96}, kTol);
}

TEST(Lars, MomentumMatchesRecurrence) {
  // The buffer accumulates unscaled decayed gradients; each step's trust ratio scales it whole.
  const LarsOptions options{.lr = 0.1, .momentum = 0.9, .eta = 0.01, .weight_decay = 0.05, .eps = 1e-8};
  Tensor p = make_param({1.0, -2.0, 0.5});
  Lars lars({p}, options);
  LarsReference ref{options.lr, options.momentum, options.eta, options.weight_decay, options.eps};
  std::vector<double> expected{1.0, -2.0, 0.5};
  const std::vector<std::vector<double>> grads{
      {0.5, -0.25, 1.0}, {0.1, 0.3, -0.7}, {-0.2, 0.4, 0.05}, {1.5, 0.0, -0.3}};
  for (size_t t = 0; t < grads.size(); ++t) {
    set_grad(p, grads[t]);
    lars.step();
    ref.step(expected, grads[t]);
    expect_values(p, expected, kTol, "step " + std::to_string(t + 1));
  }
  expect_values(lars.state(0, 0).buffers.at("momentum_buffer"), ref.buffer, kTol);
}

TEST(Lars, MomentumWrittenOutByHand) {
  // p = (3, 4); g = (0.6, 0.8) both steps; eta 0.02, no decay, lr 1, momentum 0.5.
  // Step 1: trust = 0.02 * 5 / 1 = 0.1, b = g, p = (3, 4) - 0.1 g = (2.94, 3.92), ||p|| = 4.9.
  // Step 2: trust = 0.02 * 4.9 = 0.098, b = 0.5 g + g = (0.9, 1.2), p -= 0.098 b.
  Tensor p = make_param({3.0, 4.0});
  Lars lars({p}, {.lr = 1.0, .momentum = 0.5, .eta = 0.02});
  set_grad(p, {0.6, 0.8});
  lars.step();
  expect_values(p, {2.94, 3.92}, kTol);
  set_grad(p, {0.6, 0.8});
  lars.step();
  expect_values(p, {2.94 - 0.098 * 0.9, 3.92 - 0.098 * 1.2}, kTol);
}

TEST(Lars, ClipsTheDecayedGradientElementwise) {
  // Colossal-AI clamps to [-10, 10] after decay; the trust ratio uses the unclipped ||g||.
  Tensor p = make_param({1.0, 1.0});
  Lars lars({p}, {.lr = 0.1});  // eta 1e-3, no decay
  set_grad(p, {30.0, -0.5});
  lars.step();
  const double trust = 1e-3 * std::sqrt(2.0) / std::sqrt(900.25);
  expect_values(p, {1.0 - 0.1 * trust * 10.0, 1.0 + 0.1 * trust * 0.5}, kTol);
}

TEST(Lars, GradClipCanBeTurnedOff) {
  Tensor p = make_param({1.0, 1.0});
  Lars lars({p}, {.lr = 0.1, .grad_clip = std::numeric_limits<double>::infinity()});
  set_grad(p, {30.0, -0.5});
  lars.step();
  const double trust = 1e-3 * std::sqrt(2.0) / std::sqrt(900.25);
  expect_values(p, {1.0 - 0.1 * trust * 30.0, 1.0 + 0.1 * trust * 0.5}, kTol);
}

TEST(Lars, ClampsTheTrustRatio) {
  // ||p|| = 500, ||g|| = 0.001: eta ||p|| / ||g|| = 1e-3 * 500 / 1e-3 = 500, clamped to 50.
  Tensor p = make_param({300.0, 400.0});
  Lars lars({p}, {.lr = 0.1});
  set_grad(p, {0.0006, 0.0008});
  lars.step();
  expect_values(p, {300.0 - 0.1 * 50.0 * 0.0006, 400.0 - 0.1 * 50.0 * 0.0008}, kTol);
}

TEST(Lars, TrustRatioIsOneForAZeroGradientOrWeight) {
  // A zero gradient: the ratio would be eta ||p|| / (wd ||p||) = 0.1; it is 1, so p <- p - lr wd p.
  Tensor p = make_param({1.0, 2.0});
  Lars lars({p}, {.lr = 0.5, .eta = 0.01, .weight_decay = 0.1});
  set_grad(p, {0.0, 0.0});
  lars.step();
  expect_values(p, {1.0 - 0.5 * 0.1 * 1.0, 2.0 - 0.5 * 0.1 * 2.0}, kTol);
  // A zero weight: the ratio would be 0 and p would never move; it is 1, so p <- -lr g.
  Tensor zero = make_param({0.0, 0.0});
  Lars zero_lars({zero}, {.lr = 0.5, .eta = 0.01, .weight_decay = 0.1});
  set_grad(zero, {0.5, -1.0});
  zero_lars.step();
  expect_values(zero, {-0.25, 0.5}, kTol);
}

TEST(Lars, WithoutAdaptationIsClippedMomentumSgdWithoutDecay) {
  // Colossal-AI's lars=False group: no trust ratio and no weight decay, but still the clip.
  Tensor p = make_param({3.0, 4.0});
  Lars lars({p}, {.lr = 0.1, .momentum = 0.9, .weight_decay = 0.5, .adaptation = false});
  set_grad(p, {20.0, -1.0});
  lars.step();
  expect_values(p, {3.0 - 0.1 * 10.0, 4.0 + 0.1 * 1.0}, kTol);  // b = clamp(g) = (10, -1)
  set_grad(p, {1.0, 1.0});
  lars.step();
  expect_values(p, {2.0 - 0.1 * 10.0, 4.1 - 0.1 * 0.1}, kTol);  // b = 0.9 b + g = (10, 0.1)
}

TEST(Lars, NoDecayGroupSkipsAdaptationPerGroup) {
  Tensor weight = make_param({3.0, 4.0, 0.0, 0.0}, {2, 2});
  Tensor bias = make_param({1.0, 1.0});
  std::vector<ParamGroup> groups = make_param_groups({{"fc.weight", weight}, {"fc.bias", bias}}, 0.1);
  groups[1].set("adaptation", 0.0);
  Lars lars(std::move(groups), {.lr = 0.5, .eta = 0.02});
  set_grad(weight, {0.6, 0.8, 0.0, 0.0});
  set_grad(bias, {0.5, -0.5});
  lars.step();
  expect_values(weight, {2.97, 3.96, 0.0, 0.0}, kTol);  // as OneStepWrittenOutByHand
  expect_values(bias, {0.75, 1.25}, kTol);              // plain SGD: b - 0.5 g
}

TEST(Lars, DefaultsFollowColossalAi) {
  Lars lars({make_param({1.0})});
  const ParamGroup& group = lars.param_groups()[0];
  EXPECT_EQ(lars.name(), "LARS");
  EXPECT_EQ(group.lr(), 1e-3);
  EXPECT_EQ(group.get("momentum"), 0.0);
  EXPECT_EQ(group.get("eta"), 1e-3);
  EXPECT_EQ(group.weight_decay(), 0.0);
  EXPECT_EQ(group.get("eps"), 0.0);
  EXPECT_EQ(group.get("trust_clip"), 50.0);
  EXPECT_EQ(group.get("grad_clip"), 10.0);
  EXPECT_EQ(group.get("adaptation"), 1.0);
}

TEST(Lars, StateDictRoundTripContinuesBitIdentically) {
  testing::expect_state_dict_round_trip([](const NamedParameters& params) {
    return std::make_unique<Lars>(make_param_groups(params, 0.01),
                                  LarsOptions{.lr = 0.5, .momentum = 0.9, .eta = 0.02, .eps = 1e-9});
  });
}

TEST(Lars, RejectsBadHyperParameters) {
  Tensor p = make_param({1.0});
  EXPECT_ERROR_CONTAINS(Lars({p}, {.lr = -1.0}), "LARS: param group 0: lr must be a finite number >= 0, got -1");
  EXPECT_ERROR_CONTAINS(Lars({p}, {.momentum = -0.9}), "momentum must be a finite number >= 0, got -0.9");
  EXPECT_ERROR_CONTAINS(Lars({p}, {.eta = 0.0}), "LARS: param group 0: eta must be in (0, 1], got 0");
  EXPECT_ERROR_CONTAINS(Lars({p}, {.eta = 1.5}), "eta must be in (0, 1], got 1.5");
  EXPECT_ERROR_CONTAINS(Lars({p}, {.weight_decay = -1.0}), "weight_decay must be a finite number >= 0, got -1");
  EXPECT_ERROR_CONTAINS(Lars({p}, {.eps = -1.0}), "eps must be a finite number >= 0, got -1");
  EXPECT_ERROR_CONTAINS(Lars({p}, {.trust_clip = 0.0}), "trust_clip must be a finite number > 0, got 0");
  EXPECT_ERROR_CONTAINS(Lars({p}, {.grad_clip = -10.0}), "grad_clip must be > 0 (infinity turns it off), got -10");
  EXPECT_ERROR_CONTAINS(Lars({ParamGroup{.params = {p}, .options = {{"eeta", 0.01}}}}),
                        "unknown option 'eeta'; LARS options are: adaptation, eps, eta, grad_clip, lr, momentum, "
                        "trust_clip, weight_decay");
}

}  // namespace
}  // namespace colossal::optim
