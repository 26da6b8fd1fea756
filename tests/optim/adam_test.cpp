// Adam and AdamW against values derived by hand and an independent scalar recurrence of
// torch.optim.Adam / AdamW: bias correction, AdamW's decoupled decay (applied before the update),
// AMSGrad, per-parameter step counts, no-decay groups, f32, state_dict round trips and bad
// hyper-parameters.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <memory>
#include <vector>

#include "colossal/optim/adam.h"
#include "gradcheck.h"  // expect_values, EXPECT_ERROR_CONTAINS
#include "optim_test_util.h"

namespace colossal::optim {
namespace {

using colossal::testing::expect_values;
using testing::make_param;
using testing::set_grad;

// Every expected value is an O(1) number computed in f64 with a handful of operations per step
// over <= 5 steps; the implementation may order them differently (sqrt(v) / sqrt(bc2) vs
// sqrt(v / bc2)), which moves the result by a few ulps (1e-16). 1e-12 leaves room for that and
// still catches any wrong formula: a missing bias correction or a misplaced decay moves the values
// by >= 1e-4.
constexpr double kTol = 1e-12;

/// torch.optim.Adam / AdamW for one scalar, written from their documented update rules.
struct AdamReference {
  double lr, beta1, beta2, eps, weight_decay;
  bool decoupled = false, amsgrad = false;
  double m = 0.0, v = 0.0, v_max = 0.0;
  int t = 0;

  double step(double p, double g) {
    t += 1;
    if (decoupled) {
      p *= 1.0 - lr * weight_decay;
    } else {
      g += weight_decay * p;
    }
    m = beta1 * m + (1.0 - beta1) * g;
    v = beta2 * v + (1.0 - beta2) * g * g;
    v_max = std::max(v_max, v);
    const double second = amsgrad ? v_max : v;
    const double m_hat = m / (1.0 - std::pow(beta1, t));
    const double v_hat = second / (1.0 - std::pow(beta2, t));
    return p - lr * m_hat / (std::sqrt(v_hat) + eps);
  }
};

/// Gradient of element i at step t (1-based): varied in sign and size, never all zero.
double grad_at(int t, size_t i) {
  return 0.3 * static_cast<double>(i + 1) * (t % 2 == 0 ? -1.0 : 1.0) + 0.1 * t;
}

template <class Opt>
void run_against_reference(AdamOptions options, bool decoupled, int steps) {
  const std::vector<double> initial{1.0, -2.0, 0.5};
  Tensor p = make_param(initial);
  Opt optimizer({p}, options);
  std::vector<AdamReference> ref(initial.size(), AdamReference{options.lr, options.beta1, options.beta2, options.eps,
                                                               options.weight_decay, decoupled, options.amsgrad});
  std::vector<double> expected = initial;
  for (int t = 1; t <= steps; ++t) {
    std::vector<double> grad(initial.size());
    for (size_t i = 0; i < grad.size(); ++i) grad[i] = grad_at(t, i);
    set_grad(p, grad);
    optimizer.step();
    for (size_t i = 0; i < expected.size(); ++i) expected[i] = ref[i].step(expected[i], grad[i]);
    expect_values(p, expected, kTol, "step " + std::to_string(t));
  }
  EXPECT_EQ(optimizer.state(0, 0).step, steps);
}

TEST(Adam, FirstStepMovesEachElementByLrTimesSignOfGradient) {
  // At t = 1 bias correction undoes the (1 - beta) factors: m_hat = g, v_hat = g^2, so the update
  // is lr * g / (|g| + eps) whatever the betas.
  Tensor p = make_param({1.0, -2.0});
  Adam adam({p}, {.lr = 0.1, .beta1 = 0.8, .beta2 = 0.99, .eps = 1e-8});
  set_grad(p, {0.5, -4.0});
  adam.step();
  expect_values(p, {1.0 - 0.1 * 0.5 / (0.5 + 1e-8), -2.0 + 0.1 * 4.0 / (4.0 + 1e-8)}, kTol);
  const ParamState& state = adam.state(0, 0);
  EXPECT_EQ(state.step, 1);
  expect_values(state.buffers.at("exp_avg"), {0.2 * 0.5, 0.2 * -4.0}, kTol);        // (1 - beta1) g
  expect_values(state.buffers.at("exp_avg_sq"), {0.01 * 0.25, 0.01 * 16.0}, kTol);  // (1 - beta2) g^2
  EXPECT_FALSE(state.buffers.contains("max_exp_avg_sq"));                           // amsgrad off
}

TEST(Adam, ThreeStepsWrittenOutByHand) {
  // lr 0.1, betas (0.9, 0.999), eps 1e-8, weight_decay 0.1 (L2: added to the gradient).
  const double lr = 0.1, b1 = 0.9, b2 = 0.999, eps = 1e-8, wd = 0.1;
  Tensor p = make_param({1.0, -2.0});
  Adam adam({p}, {.lr = lr, .beta1 = b1, .beta2 = b2, .eps = eps, .weight_decay = wd});
  const std::vector<std::vector<double>> grads{{0.5, -0.25}, {0.1, 0.3}, {-0.2, 0.4}};
  double w[2] = {1.0, -2.0}, m[2] = {0.0, 0.0}, v[2] = {0.0, 0.0};
  for (int t = 1; t <= 3; ++t) {
    set_grad(p, grads[t - 1]);
    adam.step();
    const double bc1 = 1.0 - std::pow(b1, t), bc2 = 1.0 - std::pow(b2, t);
    for (int i = 0; i < 2; ++i) {
      const double g = grads[t - 1][i] + wd * w[i];  // L2: the decay enters the moments
      m[i] = b1 * m[i] + (1.0 - b1) * g;
      v[i] = b2 * v[i] + (1.0 - b2) * g * g;
      w[i] -= lr * (m[i] / bc1) / (std::sqrt(v[i] / bc2) + eps);
    }
    expect_values(p, {w[0], w[1]}, kTol, "step " + std::to_string(t));
  }
}

TEST(AdamW, ThreeStepsWrittenOutByHand) {
  // lr 0.1, betas (0.9, 0.999), eps 1e-8, weight_decay 0.1, decoupled: p <- p (1 - lr wd) first,
  // then the plain Adam update from the undecayed gradient.
  const double lr = 0.1, b1 = 0.9, b2 = 0.999, eps = 1e-8, wd = 0.1;
  Tensor p = make_param({1.0, -2.0});
  AdamW adamw({p}, {.lr = lr, .beta1 = b1, .beta2 = b2, .eps = eps, .weight_decay = wd});
  const std::vector<std::vector<double>> grads{{0.5, -0.25}, {0.1, 0.3}, {-0.2, 0.4}};

  // Step 1: m_hat = g and v_hat = g^2, so the Adam part is lr * g / (|g| + eps).
  set_grad(p, grads[0]);
  adamw.step();
  const double w1[2] = {1.0 * (1.0 - lr * wd) - lr * 0.5 / (0.5 + eps),
                        -2.0 * (1.0 - lr * wd) + lr * 0.25 / (0.25 + eps)};
  expect_values(p, {w1[0], w1[1]}, kTol, "step 1");
  // m1 = 0.1 g1, v1 = 0.001 g1^2.
  const double m1[2] = {0.1 * 0.5, 0.1 * -0.25}, v1[2] = {0.001 * 0.25, 0.001 * 0.0625};

  // Step 2: g2 = (0.1, 0.3); bias corrections 1 - 0.81 = 0.19 and 1 - 0.998001 = 0.001999.
  set_grad(p, grads[1]);
  adamw.step();
  double w2[2], m2[2], v2[2];
  for (int i = 0; i < 2; ++i) {
    m2[i] = 0.9 * m1[i] + 0.1 * grads[1][i];
    v2[i] = 0.999 * v1[i] + 0.001 * grads[1][i] * grads[1][i];
    w2[i] = w1[i] * (1.0 - lr * wd) - lr * (m2[i] / 0.19) / (std::sqrt(v2[i] / 0.001999) + eps);
  }
  expect_values(p, {w2[0], w2[1]}, kTol, "step 2");

  // Step 3: g3 = (-0.2, 0.4); bias corrections 1 - 0.729 = 0.271 and 1 - 0.997002999 = 0.002997001.
  set_grad(p, grads[2]);
  adamw.step();
  double w3[2];
  for (int i = 0; i < 2; ++i) {
    const double m3 = 0.9 * m2[i] + 0.1 * grads[2][i];
    const double v3 = 0.999 * v2[i] + 0.001 * grads[2][i] * grads[2][i];
    w3[i] = w2[i] * (1.0 - lr * wd) - lr * (m3 / 0.271) / (std::sqrt(v3 / 0.002997001) + eps);
  }
  expect_values(p, {w3[0], w3[1]}, kTol, "step 3");
}

TEST(AdamW, DecayIsDecoupledFromTheMoments) {
  // With a zero gradient the moments stay 0, so the Adam part is 0 / (0 + eps) = 0 and AdamW only
  // shrinks p by (1 - lr wd). Adam's L2 decay instead feeds wd p into the moments and moves p by
  // ~lr against sign(p).
  Tensor decoupled = make_param({2.0, -4.0});
  Tensor coupled = make_param({2.0, -4.0});
  AdamW adamw({decoupled}, {.lr = 0.1, .weight_decay = 0.5});
  Adam adam({coupled}, {.lr = 0.1, .weight_decay = 0.5});
  set_grad(decoupled, {0.0, 0.0});
  set_grad(coupled, {0.0, 0.0});
  adamw.step();
  adam.step();
  expect_values(decoupled, {2.0 * 0.95, -4.0 * 0.95}, kTol);
  expect_values(adamw.state(0, 0).buffers.at("exp_avg"), {0.0, 0.0}, 0.0);
  // Adam: g = 0.5 p = (1, -2); step 1 moves by lr g / (|g| + eps).
  expect_values(coupled, {2.0 - 0.1 * 1.0 / (1.0 + 1e-8), -4.0 + 0.1 * 2.0 / (2.0 + 1e-8)}, kTol);
}

TEST(AdamW, DecayIsAppliedBeforeTheUpdate) {
  // p (1 - lr wd) - lr u, not (p - lr u)(1 - lr wd): the two differ by lr^2 wd u = 0.05 here.
  Tensor p = make_param({1.0});
  AdamW adamw({p}, {.lr = 0.5, .eps = 0.0, .weight_decay = 0.2});
  set_grad(p, {3.0});
  adamw.step();
  expect_values(p, {1.0 * 0.9 - 0.5 * 1.0}, kTol);  // u = g / |g| = 1 at step 1 with eps = 0
}

TEST(Adam, MatchesRecurrenceOverFiveSteps) {
  run_against_reference<Adam>({.lr = 0.01, .beta1 = 0.8, .beta2 = 0.95, .eps = 1e-6, .weight_decay = 0.05}, false, 5);
}

TEST(AdamW, MatchesRecurrenceOverFiveSteps) {
  run_against_reference<AdamW>({.lr = 0.01, .beta1 = 0.8, .beta2 = 0.95, .eps = 1e-6, .weight_decay = 0.05}, true, 5);
}

TEST(AdamW, AmsgradMatchesRecurrence) {
  run_against_reference<AdamW>({.lr = 0.02, .beta1 = 0.7, .beta2 = 0.9, .weight_decay = 0.01, .amsgrad = true}, true,
                               5);
}

TEST(Adam, AmsgradKeepsTheLargestSecondMoment) {
  Tensor p = make_param({1.0});
  Adam adam({p}, {.lr = 0.1, .amsgrad = true});
  set_grad(p, {1.0});
  adam.step();  // v1 = 0.001
  set_grad(p, {0.01});
  adam.step();  // v2 = 0.999 * 0.001 + 0.001 * 1e-4 = 0.0009991 < v1
  const ParamState& state = adam.state(0, 0);
  expect_values(state.buffers.at("exp_avg_sq"), {0.0009991}, kTol);
  expect_values(state.buffers.at("max_exp_avg_sq"), {0.001}, kTol);
  // Step 2 divides by sqrt(v_max / bc2): m2 = 0.9 * 0.1 + 0.1 * 0.01 = 0.091.
  const double step1 = 1.0 - 0.1 * 1.0 / (1.0 + 1e-8);
  expect_values(p, {step1 - 0.1 * (0.091 / 0.19) / (std::sqrt(0.001 / 0.001999) + 1e-8)}, kTol);
}

TEST(Adam, StepCountsArePerParameter) {
  // b first gets a gradient at the second step, so its bias correction uses t = 1 then.
  Tensor a = make_param({1.0});
  Tensor b = make_param({1.0});
  Adam adam({a, b}, {.lr = 0.1});
  set_grad(a, {0.5});
  adam.step();
  EXPECT_EQ(adam.find_state(0, 1), nullptr);
  expect_values(b, {1.0}, 0.0);
  set_grad(a, {0.5});
  set_grad(b, {-2.0});
  adam.step();
  EXPECT_EQ(adam.state(0, 0).step, 2);
  EXPECT_EQ(adam.state(0, 1).step, 1);
  expect_values(b, {1.0 + 0.1 * 2.0 / (2.0 + 1e-8)}, kTol);
}

TEST(AdamW, NoDecayGroupLeavesBiasUndecayed) {
  Tensor weight = make_param({1.0, 2.0, 3.0, 4.0}, {2, 2});
  Tensor bias = make_param({1.0, -1.0});
  AdamW adamw(make_param_groups({{"fc.weight", weight}, {"fc.bias", bias}}, 0.5), {.lr = 0.1});
  ASSERT_EQ(adamw.param_groups().size(), 2u);
  EXPECT_EQ(adamw.param_groups()[0].weight_decay(), 0.5);
  EXPECT_EQ(adamw.param_groups()[1].weight_decay(), 0.0);
  set_grad(weight, {0.0, 0.0, 0.0, 0.0});
  set_grad(bias, {0.0, 0.0});
  adamw.step();
  expect_values(weight, {0.95, 1.9, 2.85, 3.8}, kTol);  // (1 - 0.1 * 0.5) w
  expect_values(bias, {1.0, -1.0}, 0.0);                // weight_decay 0: untouched
}

TEST(AdamW, UsesTorchDefaults) {
  Tensor p = make_param({1.0});
  AdamW adamw({p});
  const ParamGroup& group = adamw.param_groups()[0];
  EXPECT_EQ(group.lr(), 1e-3);
  EXPECT_EQ(group.get("beta1"), 0.9);
  EXPECT_EQ(group.get("beta2"), 0.999);
  EXPECT_EQ(group.get("eps"), 1e-8);
  EXPECT_EQ(group.weight_decay(), 1e-2);
  EXPECT_EQ(group.get("amsgrad"), 0.0);
  EXPECT_EQ(adamw.name(), "AdamW");
  Adam adam({make_param({1.0})});
  EXPECT_EQ(adam.param_groups()[0].weight_decay(), 0.0);
}

TEST(AdamW, UpdatesFloat32Parameters) {
  Tensor p = core::from_vector<float>({1.0f, -2.0f}, {2});
  p.set_requires_grad(true);
  AdamW adamw({p}, {.lr = 0.1, .weight_decay = 0.1});
  set_grad(p, {0.5, -0.25});
  adamw.step();
  EXPECT_EQ(p.dtype(), DType::f32);
  EXPECT_EQ(adamw.state(0, 0).buffers.at("exp_avg").dtype(), DType::f32);
  // f32 rounding of values near 1 (ulp 1.2e-7) over a handful of operations.
  expect_values(p, {0.99 - 0.1, -1.98 + 0.1}, 1e-6);
}

TEST(Adam, StateDictRoundTripContinuesBitIdentically) {
  testing::expect_state_dict_round_trip([](const NamedParameters& params) {
    return std::make_unique<Adam>(make_param_groups(params, 0.1),
                                  AdamOptions{.lr = 0.05, .beta1 = 0.8, .weight_decay = 0.1, .amsgrad = true});
  });
}

TEST(AdamW, StateDictRoundTripContinuesBitIdentically) {
  testing::expect_state_dict_round_trip([](const NamedParameters& params) {
    return std::make_unique<AdamW>(make_param_groups(params, 0.1), AdamOptions{.lr = 0.05, .beta2 = 0.9});
  });
}

TEST(Adam, StateDictHoldsStepsMomentsAndOptions) {
  Tensor p = make_param({1.0, 2.0});
  Adam adam({p}, {.lr = 0.1});
  set_grad(p, {0.5, 0.5});
  adam.step();
  const StateDict state = adam.state_dict();
  EXPECT_EQ(state.at("state.0.step").item<int64_t>(), 1);
  expect_values(state.at("state.0.exp_avg"), {0.05, 0.05}, kTol);
  expect_values(state.at("state.0.exp_avg_sq"), {0.00025, 0.00025}, kTol);
  EXPECT_EQ(state.at("param_groups.0.lr").item<double>(), 0.1);
  EXPECT_EQ(state.at("param_groups.0.beta2").item<double>(), 0.999);
  EXPECT_EQ(state.at("param_groups.0.params").to_vector<int64_t>(), std::vector<int64_t>{0});
}

TEST(Adam, LoadStateDictRejectsAnotherOptimizersState) {
  Tensor p = make_param({1.0});
  AdamW source({p});
  set_grad(p, {1.0});
  source.step();
  StateDict state = source.state_dict();
  state["param_groups.0.momentum"] = core::scalar_tensor(0.9, DType::f64);
  Adam target({make_param({1.0})}, {.lr = 0.5});
  EXPECT_ERROR_CONTAINS(target.load_state_dict(state),
                        "Adam: load_state_dict: key 'param_groups.0.momentum' names option 'momentum', which Adam does "
                        "not have");
  EXPECT_EQ(target.param_groups()[0].lr(), 0.5);  // left unchanged
  EXPECT_EQ(target.find_state(0, 0), nullptr);
}

TEST(Adam, RejectsBadHyperParameters) {
  Tensor p = make_param({1.0});
  EXPECT_ERROR_CONTAINS(Adam({p}, {.lr = -0.1}), "Adam: param group 0: lr must be a finite number >= 0, got -0.1");
  EXPECT_ERROR_CONTAINS(Adam({p}, {.beta1 = 1.0}), "Adam: param group 0: beta1 must be in [0, 1), got 1");
  EXPECT_ERROR_CONTAINS(Adam({p}, {.beta2 = -0.5}), "beta2 must be in [0, 1), got -0.5");
  EXPECT_ERROR_CONTAINS(Adam({p}, {.eps = -1.0}), "eps must be a finite number >= 0, got -1");
  EXPECT_ERROR_CONTAINS(AdamW({p}, {.weight_decay = -0.01}),
                        "AdamW: param group 0: weight_decay must be a finite number >= 0, got -0.01");
  EXPECT_ERROR_CONTAINS(AdamW({p}, {.lr = std::nan("")}), "lr must be a finite number >= 0, got nan");
  EXPECT_ERROR_CONTAINS(Adam({ParamGroup{.params = {p}, .options = {{"amsgrad", 0.5}}}}),
                        "amsgrad must be 0 (false) or 1 (true), got 0.5");
  EXPECT_ERROR_CONTAINS(Adam({ParamGroup{.params = {p}, .options = {{"momentum", 0.9}}}}),
                        "unknown option 'momentum'; Adam options are: amsgrad, beta1, beta2, eps, lr, weight_decay");
}

TEST(Adam, StepRejectsBetaChangedToInvalid) {
  Tensor p = make_param({1.0});
  Adam adam({p});
  adam.param_groups()[0].set("beta1", 1.0);  // a scheduler or the user wrote it
  set_grad(p, {1.0});
  EXPECT_ERROR_CONTAINS(adam.step(), "Adam: param group 0: beta1 must be in [0, 1), got 1");
  expect_values(p, {1.0}, 0.0);
  EXPECT_EQ(adam.find_state(0, 0), nullptr);
}

}  // namespace
}  // namespace colossal::optim
