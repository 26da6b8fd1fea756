// Sgd against hand-computed updates and an independent scalar recurrence of torch.optim.SGD:
// plain steps, momentum with dampening, Nesterov, weight-decay groups, f32, and bad hyper-parameters.
#include <gtest/gtest.h>

#include <memory>
#include <vector>

#include "colossal/optim/sgd.h"
#include "gradcheck.h"  // expect_values, EXPECT_ERROR_CONTAINS
#include "optim_test_util.h"

namespace colossal::optim {
namespace {

using colossal::testing::expect_values;
using testing::make_param;
using testing::set_grad;

// Every expected value below is an O(1) number computed in f64 by at most a handful of operations
// per step, in the same order as the implementation, over <= 5 steps: a few ulps (1e-16) at most.
// 1e-12 leaves room for reassociation without hiding any wrong formula (those are off by >= 1e-4).
constexpr double kTol = 1e-12;

/// torch.optim.SGD for one scalar, written from its documented update rule.
struct SgdReference {
  double lr, momentum = 0.0, dampening = 0.0, weight_decay = 0.0;
  bool nesterov = false;
  double buffer = 0.0;
  bool has_buffer = false;

  double step(double p, double g) {
    double d = g + weight_decay * p;
    if (momentum != 0.0) {
      buffer = has_buffer ? momentum * buffer + (1.0 - dampening) * d : d;
      has_buffer = true;
      d = nesterov ? d + momentum * buffer : buffer;
    }
    return p - lr * d;
  }
};

/// Gradient of element i at step t (1-based): varied in sign and size, never all zero.
double grad_at(int t, size_t i) {
  return 0.3 * static_cast<double>(i + 1) * (t % 2 == 0 ? -1.0 : 1.0) + 0.1 * t;
}

void run_against_reference(SgdOptions options, int steps) {
  const std::vector<double> initial{1.0, -2.0, 0.5};
  Tensor p = make_param(initial);
  Sgd sgd({p}, options);
  std::vector<SgdReference> ref(initial.size(), SgdReference{options.lr, options.momentum, options.dampening,
                                                             options.weight_decay, options.nesterov});
  std::vector<double> expected = initial;
  for (int t = 1; t <= steps; ++t) {
    std::vector<double> grad(initial.size());
    for (size_t i = 0; i < grad.size(); ++i) grad[i] = grad_at(t, i);
    set_grad(p, grad);
    sgd.step();
    for (size_t i = 0; i < expected.size(); ++i) expected[i] = ref[i].step(expected[i], grad[i]);
    expect_values(p, expected, kTol, "step " + std::to_string(t));
  }
}

TEST(Sgd, PlainStepMatchesHandValues) {
  Tensor p = make_param({1.0, -2.0});
  Sgd sgd({p}, {.lr = 0.1});
  set_grad(p, {0.5, -1.0});
  sgd.step();
  expect_values(p, {0.95, -1.9}, kTol);  // 1 - 0.1 * 0.5; -2 - 0.1 * (-1)
  EXPECT_EQ(sgd.state(0, 0).step, 1);
  EXPECT_TRUE(sgd.state(0, 0).buffers.empty());  // no momentum, no buffer
}

TEST(Sgd, MomentumMatchesHandValues) {
  Tensor p = make_param({1.0});
  Sgd sgd({p}, {.lr = 0.1, .momentum = 0.9});
  set_grad(p, {0.5});
  sgd.step();
  expect_values(p, {0.95}, kTol);  // buffer = g = 0.5 on the first step; 1 - 0.1 * 0.5
  set_grad(p, {0.5});
  sgd.step();
  expect_values(p, {0.855}, kTol);  // buffer = 0.9 * 0.5 + 0.5 = 0.95; 0.95 - 0.1 * 0.95
  expect_values(sgd.state(0, 0).buffers.at("momentum_buffer"), {0.95}, kTol);
}

TEST(Sgd, MomentumWithDampeningMatchesRecurrence) {
  run_against_reference({.lr = 0.05, .momentum = 0.9, .dampening = 0.3}, 5);
}

TEST(Sgd, NesterovMatchesRecurrence) {
  run_against_reference({.lr = 0.05, .momentum = 0.8, .nesterov = true}, 5);
}

TEST(Sgd, NesterovMatchesHandValues) {
  Tensor p = make_param({1.0});
  Sgd sgd({p}, {.lr = 0.1, .momentum = 0.5, .nesterov = true});
  set_grad(p, {1.0});
  sgd.step();
  expect_values(p, {0.85}, kTol);  // buffer = 1; d = 1 + 0.5 * 1 = 1.5; 1 - 0.15
  set_grad(p, {1.0});
  sgd.step();
  expect_values(p, {0.675}, kTol);  // buffer = 0.5 * 1 + 1 = 1.5; d = 1 + 0.5 * 1.5 = 1.75; 0.85 - 0.175
}

TEST(Sgd, CoupledWeightDecayMatchesRecurrence) {
  run_against_reference({.lr = 0.1, .momentum = 0.9, .weight_decay = 0.01}, 4);
}

TEST(Sgd, WeightDecayGroupsLeaveBiasesUndecayed) {
  Tensor weight = make_param({1.0, 2.0, 3.0, 4.0}, {2, 2});
  Tensor bias = make_param({1.0, -1.0});
  Sgd sgd(make_param_groups({{"fc.weight", weight}, {"fc.bias", bias}}, 0.5), {.lr = 0.1});
  ASSERT_EQ(sgd.param_groups().size(), 2u);
  set_grad(weight, {0.1, 0.1, 0.1, 0.1});
  set_grad(bias, {0.1, 0.1});
  sgd.step();
  // weight: w - 0.1 * (0.1 + 0.5 w); bias: b - 0.1 * 0.1 (its group has weight_decay 0).
  expect_values(weight,
                {1.0 - 0.1 * (0.1 + 0.5), 2.0 - 0.1 * (0.1 + 1.0), 3.0 - 0.1 * (0.1 + 1.5), 4.0 - 0.1 * (0.1 + 2.0)},
                kTol);
  expect_values(bias, {0.99, -1.01}, kTol);
}

TEST(Sgd, GroupOptionsOverrideDefaults) {
  Tensor a = make_param({1.0});
  Tensor b = make_param({1.0});
  ParamGroup fast{.params = {b}, .options = {{"lr", 1.0}}};
  Sgd sgd({ParamGroup{.params = {a}}, fast}, {.lr = 0.1});
  EXPECT_EQ(sgd.param_groups()[0].lr(), 0.1);
  EXPECT_EQ(sgd.param_groups()[1].lr(), 1.0);
  EXPECT_EQ(sgd.param_groups()[1].get("momentum"), 0.0);  // filled from the defaults
  set_grad(a, {0.5});
  set_grad(b, {0.5});
  sgd.step();
  expect_values(a, {0.95}, kTol);
  expect_values(b, {0.5}, kTol);
}

TEST(Sgd, SkipsParametersWithoutGradient) {
  Tensor a = make_param({1.0});
  Tensor b = make_param({2.0});
  Sgd sgd({a, b}, {.lr = 0.1, .momentum = 0.9});
  set_grad(a, {1.0});
  sgd.step();
  expect_values(a, {0.9}, kTol);
  expect_values(b, {2.0}, 0.0);
  EXPECT_EQ(sgd.find_state(0, 1), nullptr);  // b was never updated, so it has no state
}

TEST(Sgd, UpdatesFloat32Parameters) {
  Tensor p = core::from_vector<float>({1.0f, -2.0f}, {2});
  p.set_requires_grad(true);
  Sgd sgd({p}, {.lr = 0.1, .momentum = 0.9});
  set_grad(p, {0.5, 0.25});
  sgd.step();
  set_grad(p, {0.5, 0.25});
  sgd.step();
  EXPECT_EQ(p.dtype(), DType::f32);
  // f32 rounding of values near 1: ulp 1.2e-7, a few operations per step.
  expect_values(p, {0.855, -2.0 - 0.1 * 0.25 - 0.1 * (0.9 * 0.25 + 0.25)}, 1e-6);
}

TEST(Sgd, StateDictRoundTripContinuesBitIdentically) {
  testing::expect_state_dict_round_trip([](const NamedParameters& params) {
    return std::make_unique<Sgd>(make_param_groups(params, 0.01), SgdOptions{.lr = 0.1, .momentum = 0.9});
  });
  testing::expect_state_dict_round_trip([](const NamedParameters& params) {
    return std::make_unique<Sgd>(make_param_groups(params, 0.01),
                                 SgdOptions{.lr = 0.1, .momentum = 0.8, .nesterov = true});
  });
  testing::expect_state_dict_round_trip([](const NamedParameters& params) {  // no momentum: step counts only
    return std::make_unique<Sgd>(make_param_groups(params, 0.01), SgdOptions{.lr = 0.1});
  });
}

TEST(Sgd, RejectsBadHyperParameters) {
  Tensor p = make_param({1.0});
  EXPECT_ERROR_CONTAINS(Sgd({p}, {.lr = -0.1}), "SGD: param group 0: lr must be a finite number >= 0, got -0.1");
  EXPECT_ERROR_CONTAINS(Sgd({p}, {.momentum = -0.5}), "momentum must be a finite number >= 0, got -0.5");
  EXPECT_ERROR_CONTAINS(Sgd({p}, {.weight_decay = -1.0}), "weight_decay must be a finite number >= 0, got -1");
  EXPECT_ERROR_CONTAINS(Sgd({p}, {.nesterov = true}), "nesterov needs momentum > 0 and dampening == 0");
  EXPECT_ERROR_CONTAINS(Sgd({p}, {.momentum = 0.9, .dampening = 0.1, .nesterov = true}),
                        "got momentum 0.9 and dampening 0.1");
  Tensor q = make_param({1.0});
  EXPECT_ERROR_CONTAINS(Sgd({ParamGroup{.params = {p}}, ParamGroup{.params = {q}, .options = {{"lr", -1.0}}}}),
                        "SGD: param group 1: lr must be");
  EXPECT_ERROR_CONTAINS(Sgd({ParamGroup{.params = {p}, .options = {{"betas", 0.9}}}}),
                        "unknown option 'betas'; SGD options are: dampening, lr, momentum, nesterov, weight_decay");
}

TEST(Sgd, StepRejectsLrChangedToInvalid) {
  Tensor p = make_param({1.0});
  Sgd sgd({p}, {.lr = 0.1});
  sgd.param_groups()[0].set_lr(-0.5);
  set_grad(p, {1.0});
  EXPECT_ERROR_CONTAINS(sgd.step(), "lr must be a finite number >= 0, got -0.5");
  expect_values(p, {1.0}, 0.0);  // nothing was updated
  EXPECT_EQ(sgd.find_state(0, 0), nullptr);
}

}  // namespace
}  // namespace colossal::optim
