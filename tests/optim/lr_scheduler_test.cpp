// Every LR scheduler against Colossal-AI's (and torch's) formula at every step of a short schedule
// (total 10, warmup 3), with the expected values written out here rather than taken from the
// implementation; OneCycleLR's momentum too; stepping per iteration and per epoch; state_dict
// round trips; and bad arguments.
#include <gtest/gtest.h>

#include <cmath>
#include <functional>
#include <numbers>
#include <string>
#include <vector>

#include "colossal/optim/adam.h"
#include "colossal/optim/lr_scheduler.h"
#include "colossal/optim/sgd.h"
#include "gradcheck.h"  // expect_values, EXPECT_ERROR_CONTAINS
#include "optim_test_util.h"

namespace colossal::optim {
namespace {

using colossal::testing::expect_values;
using testing::make_param;
using testing::set_grad;

// lrs are <= 0.1, each from a handful of f64 operations (a cos, a pow): a few ulps of 0.1 (1e-17).
// 1e-15 still catches an off-by-one step or a wrong denominator, which move an lr by >= 1e-4.
constexpr double kTol = 1e-15;
constexpr double kPi = std::numbers::pi;
constexpr int64_t kTotal = 10;
constexpr int64_t kWarmup = 3;

/// An Sgd with two groups, base lrs 0.1 and 0.02, so every check covers per-group base lrs.
struct TwoGroups {
  Tensor a = make_param({1.0});
  Tensor b = make_param({1.0});
  Sgd sgd{{ParamGroup{.params = {a}}, ParamGroup{.params = {b}, .options = {{"lr", 0.02}}}}, {.lr = 0.1}};
};

constexpr double kBaseLrs[2] = {0.1, 0.02};

/// Expects the lr of every group to equal expected(step, base) after construction (step 0) and
/// after each of `last_step` calls to step(); also that get_lr / last_lr / last_step agree.
void expect_schedule(LRScheduler& scheduler, Optimizer& optimizer, int64_t last_step,
                     const std::function<double(int64_t step, double base)>& expected) {
  for (int64_t step = 0; step <= last_step; ++step) {
    if (step > 0) scheduler.step();
    EXPECT_EQ(scheduler.last_step(), step);
    for (size_t g = 0; g < 2; ++g) {
      const double want = expected(step, kBaseLrs[g]);
      EXPECT_NEAR(optimizer.param_groups()[g].lr(), want, kTol)
          << scheduler.name() << " step " << step << " group " << g;
      EXPECT_EQ(scheduler.get_lr(step)[g], optimizer.param_groups()[g].lr());
      EXPECT_EQ(scheduler.last_lr()[g], optimizer.param_groups()[g].lr());
    }
  }
}

TEST(LinearWarmupLR, EveryStep) {
  TwoGroups m;
  LinearWarmupLR scheduler(m.sgd, kTotal, kWarmup);
  EXPECT_EQ(scheduler.base_lrs(), (std::vector<double>{0.1, 0.02}));
  // Colossal-AI: e < w: lr (e + 1) / (w + 1); else lr (T - e) / (T - w). Past T it would turn
  // negative; ours stays at 0.
  expect_schedule(scheduler, m.sgd, kTotal + 2, [](int64_t e, double lr) {
    if (e < 3) return lr * static_cast<double>(e + 1) / 4.0;
    if (e <= 10) return lr * static_cast<double>(10 - e) / 7.0;
    return 0.0;
  });
}

TEST(LinearWarmupLR, HandValues) {
  TwoGroups m;
  LinearWarmupLR scheduler(m.sgd, kTotal, kWarmup);
  const std::vector<double> expected{0.025,   0.05,    0.075,   0.1,     0.6 / 7, 0.5 / 7,
                                     0.4 / 7, 0.3 / 7, 0.2 / 7, 0.1 / 7, 0.0};
  for (int64_t e = 0; e <= kTotal; ++e) {
    if (e > 0) scheduler.step();
    EXPECT_NEAR(m.sgd.param_groups()[0].lr(), expected[static_cast<size_t>(e)], kTol) << "step " << e;
  }
}

TEST(CosineAnnealingLR, EveryStep) {
  TwoGroups m;
  CosineAnnealingLR scheduler(m.sgd, kTotal, 0.001);
  expect_schedule(scheduler, m.sgd, kTotal, [](int64_t e, double lr) {
    return 0.001 + (lr - 0.001) * (1.0 + std::cos(kPi * static_cast<double>(e) / 10.0)) / 2.0;
  });
  EXPECT_NEAR(m.sgd.param_groups()[0].lr(), 0.001, kTol);  // eta_min at T
}

TEST(CosineAnnealingWarmupLR, EveryStep) {
  TwoGroups m;
  CosineAnnealingWarmupLR scheduler(m.sgd, kTotal, kWarmup, 0.001);
  // Colossal-AI's WarmupScheduler ramps to the full lr at e = w - 1 ((e + 1) / w), then the cosine
  // runs over T - w = 7 steps from e = w.
  expect_schedule(scheduler, m.sgd, kTotal, [](int64_t e, double lr) {
    if (e < 3) return lr * static_cast<double>(e + 1) / 3.0;
    return 0.001 + (lr - 0.001) * (1.0 + std::cos(kPi * static_cast<double>(e - 3) / 7.0)) / 2.0;
  });
}

TEST(StepLR, EveryStep) {
  TwoGroups m;
  StepLR scheduler(m.sgd, 3, 0.5);
  expect_schedule(scheduler, m.sgd, kTotal, [](int64_t e, double lr) {
    if (e < 3) return lr;
    if (e < 6) return lr * 0.5;
    if (e < 9) return lr * 0.25;
    return lr * 0.125;
  });
}

TEST(MultiStepLR, EveryStepWithUnsortedAndRepeatedMilestones) {
  TwoGroups m;
  // Sorted {2, 5, 8, 8}: torch counts a repeated milestone twice.
  MultiStepLR scheduler(m.sgd, {5, 8, 2, 8}, 0.1);
  expect_schedule(scheduler, m.sgd, kTotal, [](int64_t e, double lr) {
    if (e < 2) return lr;
    if (e < 5) return lr * 0.1;
    if (e < 8) return lr * 0.01;
    return lr * 1e-4;
  });
}

TEST(MultiStepWarmupLR, EveryStepDroppingMilestonesInsideWarmup) {
  TwoGroups m;
  MultiStepWarmupLR scheduler(m.sgd, kWarmup, {2, 5, 8}, 0.5);  // 2 < warmup: dropped
  expect_schedule(scheduler, m.sgd, kTotal, [](int64_t e, double lr) {
    if (e < 3) return lr * static_cast<double>(e + 1) / 3.0;
    if (e < 5) return lr;
    if (e < 8) return lr * 0.5;
    return lr * 0.25;
  });
}

TEST(PolynomialLR, EveryStep) {
  TwoGroups m;
  PolynomialLR scheduler(m.sgd, kTotal, 0.001, 2.0);
  // (lr - end) (1 - min(e, T) / T)^power + end; end_lr from T on.
  expect_schedule(scheduler, m.sgd, kTotal + 2, [](int64_t e, double lr) {
    const double remaining = 1.0 - static_cast<double>(std::min<int64_t>(e, 10)) / 10.0;
    return (lr - 0.001) * remaining * remaining + 0.001;
  });
  EXPECT_NEAR(m.sgd.param_groups()[0].lr(), 0.001, kTol);
}

TEST(PolynomialWarmupLR, EveryStep) {
  TwoGroups m;
  PolynomialWarmupLR scheduler(m.sgd, kTotal, kWarmup, 0.001, 2.0);
  expect_schedule(scheduler, m.sgd, kTotal, [](int64_t e, double lr) {
    if (e < 3) return lr * static_cast<double>(e + 1) / 3.0;
    const double remaining = 1.0 - static_cast<double>(e - 3) / 7.0;
    return (lr - 0.001) * remaining * remaining + 0.001;
  });
}

TEST(FlatAnnealingLR, EveryStep) {
  TwoGroups m;
  FlatAnnealingLR scheduler(m.sgd, kTotal, 0.72);
  // flat = int(10 * 0.72) = 7 steps at lr, then a cosine to 0 over the last 3.
  expect_schedule(scheduler, m.sgd, kTotal, [](int64_t e, double lr) {
    if (e < 7) return lr;
    return lr * (1.0 + std::cos(kPi * static_cast<double>(e - 7) / 3.0)) / 2.0;
  });
}

TEST(FlatAnnealingWarmupLR, EveryStep) {
  TwoGroups m;
  FlatAnnealingWarmupLR scheduler(m.sgd, kTotal, kWarmup, 0.5, 0.001);
  // flat = int((10 - 3) * 0.5) = 3 steps at lr after the warmup, then a cosine over 10 - 3 - 3 = 4.
  expect_schedule(scheduler, m.sgd, kTotal, [](int64_t e, double lr) {
    if (e < 3) return lr * static_cast<double>(e + 1) / 3.0;
    if (e < 6) return lr;
    return 0.001 + (lr - 0.001) * (1.0 + std::cos(kPi * static_cast<double>(e - 6) / 4.0)) / 2.0;
  });
}

TEST(ExponentialLR, EveryStep) {
  TwoGroups m;
  ExponentialLR scheduler(m.sgd, 0.8);
  expect_schedule(scheduler, m.sgd, kTotal,
                  [](int64_t e, double lr) { return lr * std::pow(0.8, static_cast<double>(e)); });
}

TEST(LambdaLR, EveryStep) {
  TwoGroups m;
  LambdaLR scheduler(m.sgd, [](int64_t e) { return 1.0 / static_cast<double>(e + 1); });
  expect_schedule(scheduler, m.sgd, kTotal, [](int64_t e, double lr) { return lr / static_cast<double>(e + 1); });
}

/// torch's _annealing_cos and _annealing_linear.
double anneal_cos(double start, double end, double pct) {
  return end + (start - end) / 2.0 * (std::cos(kPi * pct) + 1.0);
}
double anneal_linear(double start, double end, double pct) {
  return (end - start) * pct + start;
}

TEST(OneCycleLR, TwoPhaseCosineEveryStep) {
  TwoGroups m;
  OneCycleLR scheduler(m.sgd, kTotal);  // pct_start 0.3, div 25, final_div 1e4, momentum 0.95 -> 0.85
  // Phase ends (torch): 0.3 * 10 - 1 = 2, then 10 - 1 = 9. initial = max / 25, min = initial / 1e4.
  expect_schedule(scheduler, m.sgd, kTotal, [](int64_t e, double max_lr) {
    const double initial = max_lr / 25.0, min_lr = initial / 1e4;
    const auto s = static_cast<double>(e);
    if (e <= 2) return anneal_cos(initial, max_lr, s / 2.0);
    return anneal_cos(max_lr, min_lr, (s - 2.0) / 7.0);
  });
  EXPECT_ERROR_CONTAINS(scheduler.step(), "OneCycleLR: tried to step 11 times; the schedule has total_steps = 10");
  EXPECT_EQ(scheduler.last_step(), kTotal);
}

TEST(OneCycleLR, HandValuesAtThePhaseEnds) {
  TwoGroups m;
  OneCycleLR scheduler(m.sgd, kTotal);
  EXPECT_NEAR(m.sgd.param_groups()[0].lr(), 0.004, kTol);  // 0.1 / 25
  EXPECT_NEAR(m.sgd.param_groups()[0].get("momentum"), 0.95, kTol);
  scheduler.step();
  scheduler.step();
  EXPECT_NEAR(m.sgd.param_groups()[0].lr(), 0.1, kTol);  // the peak at step 2
  EXPECT_NEAR(m.sgd.param_groups()[1].lr(), 0.02, kTol);
  EXPECT_NEAR(m.sgd.param_groups()[0].get("momentum"), 0.85, kTol);
  for (int i = 0; i < 7; ++i) scheduler.step();
  EXPECT_NEAR(m.sgd.param_groups()[0].lr(), 4e-7, kTol);  // 0.004 / 1e4 at step 9
  EXPECT_NEAR(m.sgd.param_groups()[0].get("momentum"), 0.95, kTol);
}

TEST(OneCycleLR, MomentumCyclesInverselyEveryStep) {
  TwoGroups m;
  OneCycleLR scheduler(m.sgd, kTotal);
  for (int64_t e = 0; e <= kTotal; ++e) {
    if (e > 0) scheduler.step();
    const auto s = static_cast<double>(e);
    const double expected = e <= 2 ? anneal_cos(0.95, 0.85, s / 2.0) : anneal_cos(0.85, 0.95, (s - 2.0) / 7.0);
    EXPECT_NEAR(m.sgd.param_groups()[0].get("momentum"), expected, kTol) << "step " << e;
    EXPECT_NEAR(m.sgd.param_groups()[1].get("momentum"), expected, kTol) << "step " << e;
    EXPECT_NEAR(scheduler.momentum_at(e), expected, kTol);
  }
}

TEST(OneCycleLR, ThreePhaseLinearEveryStep) {
  TwoGroups m;
  OneCycleLR scheduler(m.sgd, kTotal,
                       {.pct_start = 0.3, .anneal_strategy = AnnealStrategy::linear, .three_phase = true});
  // Phase ends: 2, 2 * 0.3 * 10 - 2 = 4, 9.
  expect_schedule(scheduler, m.sgd, kTotal, [](int64_t e, double max_lr) {
    const double initial = max_lr / 25.0, min_lr = initial / 1e4;
    const auto s = static_cast<double>(e);
    if (e <= 2) return anneal_linear(initial, max_lr, s / 2.0);
    if (e <= 4) return anneal_linear(max_lr, initial, (s - 2.0) / 2.0);
    return anneal_linear(initial, min_lr, (s - 4.0) / 5.0);
  });
  for (int64_t e = 0; e <= kTotal; ++e) {
    const auto s = static_cast<double>(e);
    const double expected = e <= 2   ? anneal_linear(0.95, 0.85, s / 2.0)
                            : e <= 4 ? anneal_linear(0.85, 0.95, (s - 2.0) / 2.0)
                                     : 0.95;
    EXPECT_NEAR(scheduler.momentum_at(e), expected, kTol) << "step " << e;
  }
}

TEST(OneCycleLR, CyclesBeta1OfAdam) {
  Tensor p = make_param({1.0});
  Adam adam({p}, {.lr = 0.1, .beta1 = 0.5});
  OneCycleLR scheduler(adam, kTotal, {.base_momentum = 0.8, .max_momentum = 0.9});
  EXPECT_NEAR(adam.param_groups()[0].get("beta1"), 0.9, kTol);
  scheduler.step();
  EXPECT_NEAR(adam.param_groups()[0].get("beta1"), anneal_cos(0.9, 0.8, 0.5), kTol);
  EXPECT_EQ(adam.param_groups()[0].get("beta2"), 0.999);  // untouched
}

TEST(OneCycleLR, LeavesMomentumAloneWithoutCycling) {
  TwoGroups m;
  m.sgd.param_groups()[0].set("momentum", 0.5);
  OneCycleLR scheduler(m.sgd, kTotal, {.cycle_momentum = false});
  scheduler.step();
  EXPECT_EQ(m.sgd.param_groups()[0].get("momentum"), 0.5);
  EXPECT_ERROR_CONTAINS(scheduler.momentum_at(1), "OneCycleLR: momentum_at needs cycle_momentum = true");
}

TEST(LRScheduler, TheOptimizerUsesTheScheduledLr) {
  // SGD with g = 1 moves p by exactly the lr of each step: 0.025, 0.05, 0.075 under LinearWarmupLR.
  TwoGroups m;
  LinearWarmupLR scheduler(m.sgd, kTotal, kWarmup);
  for (int i = 0; i < 3; ++i) {
    set_grad(m.a, {1.0});
    set_grad(m.b, {1.0});
    m.sgd.step();
    scheduler.step();
  }
  expect_values(m.a, {1.0 - 0.025 - 0.05 - 0.075}, kTol);
  expect_values(m.b, {1.0 - 0.005 - 0.01 - 0.015}, kTol);
}

TEST(LRScheduler, SteppingPerEpochKeepsTheLrForTheWholeEpoch) {
  // Counts in epochs, step() once per epoch of 4 iterations: the lr changes only between epochs.
  TwoGroups m;
  StepLR scheduler(m.sgd, /*step_size=*/2, /*gamma=*/0.5);
  for (int epoch = 0; epoch < 5; ++epoch) {
    const double expected = 0.1 * std::pow(0.5, epoch / 2);
    for (int iteration = 0; iteration < 4; ++iteration) {
      EXPECT_NEAR(m.sgd.param_groups()[0].lr(), expected, kTol) << "epoch " << epoch << " iteration " << iteration;
      set_grad(m.a, {1.0});
      m.sgd.step();
    }
    scheduler.step();
  }
  // 4 iterations at each of 0.1, 0.1, 0.05, 0.05, 0.025.
  expect_values(m.a, {1.0 - 4.0 * (0.1 + 0.1 + 0.05 + 0.05 + 0.025)}, 1e-14);
}

TEST(LRScheduler, SteppingPerIterationMatchesTheSameScheduleInIterations) {
  // The same cosine counted in iterations (4 per epoch) is the per-epoch one at epoch boundaries.
  TwoGroups per_epoch, per_iteration;
  CosineAnnealingLR by_epoch(per_epoch.sgd, 5);
  CosineAnnealingLR by_iteration(per_iteration.sgd, 20);
  for (int epoch = 1; epoch <= 5; ++epoch) {
    by_epoch.step();
    for (int i = 0; i < 4; ++i) by_iteration.step();
    EXPECT_NEAR(per_iteration.sgd.param_groups()[0].lr(), per_epoch.sgd.param_groups()[0].lr(), kTol);
  }
}

TEST(LRScheduler, StateDictRoundTrip) {
  TwoGroups first;
  CosineAnnealingWarmupLR scheduler(first.sgd, kTotal, kWarmup, 0.001);
  for (int i = 0; i < 5; ++i) scheduler.step();
  const StateDict saved = scheduler.state_dict();
  EXPECT_EQ(saved.at("last_step").item<int64_t>(), 5);
  expect_values(saved.at("base_lrs"), {0.1, 0.02}, 0.0);

  // A restarted run: its optimizer's lrs are whatever the config says (0.5 here).
  TwoGroups second;
  for (ParamGroup& group : second.sgd.param_groups()) group.set_lr(0.5);
  CosineAnnealingWarmupLR restored(second.sgd, kTotal, kWarmup, 0.001);
  restored.load_state_dict(saved);
  EXPECT_EQ(restored.last_step(), 5);
  EXPECT_EQ(restored.base_lrs(), (std::vector<double>{0.1, 0.02}));
  for (int step = 5; step <= kTotal; ++step) {
    if (step > 5) {
      scheduler.step();
      restored.step();
    }
    for (size_t g = 0; g < 2; ++g) {
      EXPECT_EQ(second.sgd.param_groups()[g].lr(), first.sgd.param_groups()[g].lr()) << "step " << step;
    }
  }
}

TEST(LRScheduler, LoadStateDictRejectsBadStateAndKeepsItsOwn) {
  TwoGroups m;
  OneCycleLR scheduler(m.sgd, kTotal);
  scheduler.step();
  const double lr = m.sgd.param_groups()[0].lr();
  StateDict state = scheduler.state_dict();
  state["last_step"] = core::scalar_tensor(11.0, DType::i64);
  EXPECT_ERROR_CONTAINS(scheduler.load_state_dict(state), "OneCycleLR: tried to step 11 times");
  EXPECT_EQ(scheduler.last_step(), 1);
  EXPECT_EQ(scheduler.base_lrs(), (std::vector<double>{0.1, 0.02}));
  EXPECT_EQ(m.sgd.param_groups()[0].lr(), lr);

  state = scheduler.state_dict();
  state["base_lrs"] = core::from_vector<double>({0.1}, {1});
  EXPECT_ERROR_CONTAINS(scheduler.load_state_dict(state),
                        "OneCycleLR: load_state_dict: 'base_lrs' has shape [1] but the optimizer has 2 param group(s)");
  state = scheduler.state_dict();
  state.erase("last_step");
  EXPECT_ERROR_CONTAINS(scheduler.load_state_dict(state), "missing key 'last_step'");
  state = scheduler.state_dict();
  state["epoch"] = core::scalar_tensor(1.0, DType::i64);
  EXPECT_ERROR_CONTAINS(scheduler.load_state_dict(state), "unexpected key 'epoch'");
}

TEST(LRScheduler, RejectsGroupsAddedAfterConstruction) {
  TwoGroups m;
  StepLR scheduler(m.sgd, 2);
  m.sgd.add_param_group(ParamGroup{.params = {make_param({1.0})}});
  EXPECT_ERROR_CONTAINS(scheduler.step(),
                        "StepLR: step: the optimizer has 3 param group(s) but the scheduler was built for 2");
}

TEST(LRScheduler, RejectsBadArguments) {
  TwoGroups m;
  EXPECT_ERROR_CONTAINS(LinearWarmupLR(m.sgd, 0), "LinearWarmupLR: total_steps must be > 0, got 0");
  EXPECT_ERROR_CONTAINS(LinearWarmupLR(m.sgd, 10, 10),
                        "LinearWarmupLR: warmup_steps must be in [0, total_steps) = [0, 10), got 10");
  EXPECT_ERROR_CONTAINS(CosineAnnealingWarmupLR(m.sgd, 10, -1), "warmup_steps must be in [0, total_steps)");
  EXPECT_ERROR_CONTAINS(CosineAnnealingLR(m.sgd, 10, -0.1),
                        "CosineAnnealingLR: eta_min must be a finite number >= 0, got -0.1");
  EXPECT_ERROR_CONTAINS(StepLR(m.sgd, 0), "StepLR: step_size must be > 0, got 0");
  EXPECT_ERROR_CONTAINS(StepLR(m.sgd, 2, -0.5), "StepLR: gamma must be a finite number >= 0, got -0.5");
  EXPECT_ERROR_CONTAINS(MultiStepLR(m.sgd, {3, -1}), "MultiStepLR: milestones must be >= 0, got -1");
  EXPECT_ERROR_CONTAINS(MultiStepWarmupLR(m.sgd, 3, {}), "MultiStepWarmupLR: milestones cannot be empty");
  EXPECT_ERROR_CONTAINS(PolynomialLR(m.sgd, 10, 0.001, -1.0), "PolynomialLR: power must be a finite number >= 0");
  EXPECT_ERROR_CONTAINS(PolynomialWarmupLR(m.sgd, 10, 3, -0.001), "PolynomialWarmupLR: end_lr must be a finite number");
  EXPECT_ERROR_CONTAINS(FlatAnnealingLR(m.sgd, 10, 1.5), "FlatAnnealingLR: pct_start must be in [0, 1], got 1.5");
  EXPECT_ERROR_CONTAINS(FlatAnnealingLR(m.sgd, 10, 1.0), "FlatAnnealingLR: pct_start 1 leaves no steps to anneal");
  EXPECT_ERROR_CONTAINS(FlatAnnealingWarmupLR(m.sgd, 10, 3, 0.5, -1.0),
                        "FlatAnnealingWarmupLR: eta_min must be a finite number >= 0, got -1");
  EXPECT_ERROR_CONTAINS(ExponentialLR(m.sgd, -0.5), "ExponentialLR: gamma must be a finite number >= 0, got -0.5");
  EXPECT_ERROR_CONTAINS(LambdaLR(m.sgd, nullptr), "LambdaLR: lr_lambda is empty");
  EXPECT_ERROR_CONTAINS(LambdaLR(m.sgd, [](int64_t e) { return e == 0 ? 1.0 : -1.0; }).step(),
                        "LambdaLR: lr_lambda(1) returned -1; the factor must be a finite number >= 0");
  EXPECT_ERROR_CONTAINS(OneCycleLR(m.sgd, 0), "OneCycleLR: total_steps must be > 0, got 0");
  EXPECT_ERROR_CONTAINS(OneCycleLR(m.sgd, 10, {.pct_start = 1.5}), "OneCycleLR: pct_start must be in [0, 1], got 1.5");
  EXPECT_ERROR_CONTAINS(OneCycleLR(m.sgd, 10, {.div_factor = 0.0}),
                        "OneCycleLR: div_factor must be a finite number > 0, got 0");
  EXPECT_ERROR_CONTAINS(OneCycleLR(m.sgd, 10, {.max_momentum = 1.0}),
                        "OneCycleLR: base_momentum and max_momentum must be in [0, 1), got 0.85 and 1");
  StepLR scheduler(m.sgd, 2);
  EXPECT_ERROR_CONTAINS(scheduler.get_lr(-1), "StepLR: get_lr: step must be >= 0, got -1");
}

}  // namespace
}  // namespace colossal::optim
