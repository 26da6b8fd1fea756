// Learning-rate schedulers with Colossal-AI's formulas (colossalai.nn.lr_scheduler, which wraps
// torch.optim.lr_scheduler where it can): linear and cosine with warmup, step, multi-step, one-cycle,
// polynomial, flat-then-cosine, exponential and lambda. Each sets the "lr" of every param group of
// an optimizer from that group's base lr.
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "colossal/optim/optimizer.h"

namespace colossal::optim {

/// A schedule is a closed form lr(step, base_lr), step counted from 0. Construction captures each
/// group's current lr as its base lr and sets step 0's lr (as torch's schedulers do); each step()
/// then advances by one and sets the next. Whether a "step" is an iteration or an epoch is the
/// caller's choice: call step() once per iteration (Colossal-AI's engine does, with total_steps in
/// iterations) or once per epoch (with the step counts in epochs).
class LRScheduler {
 public:
  virtual ~LRScheduler() = default;
  LRScheduler(const LRScheduler&) = delete;
  LRScheduler& operator=(const LRScheduler&) = delete;

  /// Advances to the next step and sets every group's lr (and momentum, for OneCycleLR) for it.
  void step();
  /// Every group's lr at `step` (>= 0), without changing anything.
  std::vector<double> get_lr(int64_t step) const;
  /// The step whose lr is set now: 0 after construction, +1 per step().
  int64_t last_step() const { return last_step_; }
  const std::vector<double>& base_lrs() const { return base_lrs_; }
  /// The lr this scheduler set last, per group.
  std::vector<double> last_lr() const { return get_lr(last_step_); }
  const std::string& name() const { return name_; }

  /// "last_step" (i64 0-d) and "base_lrs" (f64, one per group).
  StateDict state_dict() const;
  /// Restores both and sets the optimizer's lrs for the restored step. Throws naming the key when
  /// one is missing or does not fit this optimizer's groups.
  void load_state_dict(const StateDict& state_dict);

 protected:
  LRScheduler(std::string name, Optimizer& optimizer);
  /// The lr at `step` of a group whose base lr is `base_lr`. `step` >= 0.
  virtual double lr_at(int64_t step, double base_lr) const = 0;
  /// Sets the optimizer's hyper-parameters for `step`; OneCycleLR adds momentum.
  virtual void apply(int64_t step);
  /// Sets step 0; the derived constructor calls it once its fields are set.
  void start();
  Optimizer& optimizer() const { return optimizer_; }

 private:
  void check_groups(const char* what) const;

  std::string name_;
  Optimizer& optimizer_;
  std::vector<double> base_lrs_;
  int64_t last_step_ = 0;
};

/// Linear warmup, then linear decay to 0 at total_steps (Colossal-AI's LinearWarmupLR):
///   step < warmup:  base * (step + 1) / (warmup + 1)
///   otherwise:      base * (total - step) / (total - warmup)
/// Past total_steps Colossal-AI's formula turns negative; here it stays at 0.
class LinearWarmupLR : public LRScheduler {
 public:
  LinearWarmupLR(Optimizer& optimizer, int64_t total_steps, int64_t warmup_steps = 0);

 protected:
  double lr_at(int64_t step, double base_lr) const override;

 private:
  int64_t total_steps_, warmup_steps_;
};

/// eta_min + (base - eta_min) (1 + cos(pi step / total)) / 2 (torch's CosineAnnealingLR closed form
/// with T_max = total_steps, which Colossal-AI's CosineAnnealingLR is). Past total_steps it rises
/// again, periodically, as torch's does.
class CosineAnnealingLR : public LRScheduler {
 public:
  CosineAnnealingLR(Optimizer& optimizer, int64_t total_steps, double eta_min = 0.0);

 protected:
  double lr_at(int64_t step, double base_lr) const override;

 private:
  int64_t total_steps_;
  double eta_min_;
};

/// Colossal-AI's CosineAnnealingWarmupLR (its WarmupScheduler around a cosine of total - warmup steps):
///   step < warmup:  base * (step + 1) / warmup
///   otherwise:      eta_min + (base - eta_min) (1 + cos(pi (step - warmup) / (total - warmup))) / 2
class CosineAnnealingWarmupLR : public LRScheduler {
 public:
  CosineAnnealingWarmupLR(Optimizer& optimizer, int64_t total_steps, int64_t warmup_steps = 0, double eta_min = 0.0);

 protected:
  double lr_at(int64_t step, double base_lr) const override;

 private:
  int64_t total_steps_, warmup_steps_;
  double eta_min_;
};

/// base * gamma^(step / step_size) (integer division; torch's StepLR).
class StepLR : public LRScheduler {
 public:
  StepLR(Optimizer& optimizer, int64_t step_size, double gamma = 0.1);

 protected:
  double lr_at(int64_t step, double base_lr) const override;

 private:
  int64_t step_size_;
  double gamma_;
};

/// base * gamma^(number of milestones <= step) (torch's MultiStepLR; a repeated milestone counts
/// twice).
class MultiStepLR : public LRScheduler {
 public:
  MultiStepLR(Optimizer& optimizer, std::vector<int64_t> milestones, double gamma = 0.1);

 protected:
  double lr_at(int64_t step, double base_lr) const override;

 private:
  std::vector<int64_t> milestones_;  // sorted
  double gamma_;
};

/// Colossal-AI's MultiStepWarmupLR: base * (step + 1) / warmup during warmup, then
/// base * gamma^(number of milestones m >= warmup with m <= step); milestones inside the warmup
/// are dropped, as Colossal-AI drops them.
class MultiStepWarmupLR : public LRScheduler {
 public:
  MultiStepWarmupLR(Optimizer& optimizer, int64_t warmup_steps, std::vector<int64_t> milestones, double gamma = 0.1);

 protected:
  double lr_at(int64_t step, double base_lr) const override;

 private:
  int64_t warmup_steps_;
  std::vector<int64_t> milestones_;  // sorted, all >= warmup_steps
  double gamma_;
};

/// Colossal-AI's PolynomialLR: (base - end_lr) (1 - min(step, total) / total)^power + end_lr.
class PolynomialLR : public LRScheduler {
 public:
  PolynomialLR(Optimizer& optimizer, int64_t total_steps, double end_lr = 1e-4, double power = 1.0);

 protected:
  double lr_at(int64_t step, double base_lr) const override;

 private:
  int64_t total_steps_;
  double end_lr_, power_;
};

/// Colossal-AI's PolynomialWarmupLR: base * (step + 1) / warmup during warmup, then PolynomialLR
/// over total - warmup steps counted from the end of warmup.
class PolynomialWarmupLR : public LRScheduler {
 public:
  PolynomialWarmupLR(Optimizer& optimizer, int64_t total_steps, int64_t warmup_steps = 0, double end_lr = 1e-4,
                     double power = 1.0);

 protected:
  double lr_at(int64_t step, double base_lr) const override;

 private:
  int64_t total_steps_, warmup_steps_;
  double end_lr_, power_;
};

/// Colossal-AI's FlatAnnealingLR: the base lr for flat = floor(total * pct_start) steps, then a
/// cosine to 0 over the anneal = total - flat steps left (its DelayerScheduler around a cosine):
///   step < flat:  base
///   otherwise:    base (1 + cos(pi (step - flat) / anneal)) / 2
class FlatAnnealingLR : public LRScheduler {
 public:
  FlatAnnealingLR(Optimizer& optimizer, int64_t total_steps, double pct_start = 0.72);

 protected:
  double lr_at(int64_t step, double base_lr) const override;

 private:
  int64_t flat_steps_, anneal_steps_;
};

/// Colossal-AI's FlatAnnealingWarmupLR: linear warmup, the base lr for
/// flat = floor((total - warmup) * pct_start) steps, then a cosine over anneal = total - warmup - flat:
///   step < warmup:         base * (step + 1) / warmup
///   step < warmup + flat:  base
///   otherwise:             eta_min + (base - eta_min) (1 + cos(pi (step - warmup - flat) / anneal)) / 2
class FlatAnnealingWarmupLR : public LRScheduler {
 public:
  FlatAnnealingWarmupLR(Optimizer& optimizer, int64_t total_steps, int64_t warmup_steps = 0, double pct_start = 0.72,
                        double eta_min = 0.0);

 protected:
  double lr_at(int64_t step, double base_lr) const override;

 private:
  int64_t warmup_steps_, flat_steps_, anneal_steps_;
  double eta_min_;
};

/// base * gamma^step (torch's ExponentialLR, which Colossal-AI re-exports).
class ExponentialLR : public LRScheduler {
 public:
  explicit ExponentialLR(Optimizer& optimizer, double gamma = 1.0);

 protected:
  double lr_at(int64_t step, double base_lr) const override;

 private:
  double gamma_;
};

/// base * lr_lambda(step) (torch's LambdaLR, which Colossal-AI re-exports), one function for every
/// group. The function is not part of state_dict: rebuild the scheduler with it, then load.
class LambdaLR : public LRScheduler {
 public:
  LambdaLR(Optimizer& optimizer, std::function<double(int64_t)> lr_lambda);

 protected:
  double lr_at(int64_t step, double base_lr) const override;

 private:
  std::function<double(int64_t)> lr_lambda_;
};

enum class AnnealStrategy { cos, linear };

/// The options of OneCycleLR, with torch's (and Colossal-AI's) defaults.
struct OneCycleOptions {
  double pct_start = 0.3;  ///< fraction of the steps spent raising the lr, in [0, 1]
  AnnealStrategy anneal_strategy = AnnealStrategy::cos;
  /// Cycle momentum inversely to the lr between max_momentum and base_momentum: the group option
  /// "momentum" (SGD, LARS) or else "beta1" (Adam, AdamW, LAMB).
  bool cycle_momentum = true;
  double base_momentum = 0.85;
  double max_momentum = 0.95;
  double div_factor = 25.0;       ///< initial lr = max lr / div_factor
  double final_div_factor = 1e4;  ///< final lr = initial lr / final_div_factor
  bool three_phase = false;       ///< fast.ai's two phases (false) or the paper's three (true)
};

/// torch's OneCycleLR as Colossal-AI wraps it: each group's lr at construction is its max lr.
/// Phases (two-phase): initial -> max over steps [0, pct_start * total - 1], then max -> final over
/// the rest up to total - 1; three-phase: initial -> max, max -> initial (ending at
/// 2 pct_start total - 2), initial -> final. Within a phase, pct = (step - start) / (end - start)
/// and the value anneals from start to end: cos: end + (start - end) (1 + cos(pi pct)) / 2,
/// linear: start + (end - start) pct. Steps past total_steps throw, as torch does. Where torch
/// would divide by a zero phase length (pct_start * total == 1), the phase's end value is used.
class OneCycleLR : public LRScheduler {
 public:
  OneCycleLR(Optimizer& optimizer, int64_t total_steps, OneCycleOptions options = {});
  /// Every group's momentum (or beta1) at `step`; throws if cycle_momentum is off.
  double momentum_at(int64_t step) const;

 protected:
  double lr_at(int64_t step, double base_lr) const override;
  void apply(int64_t step) override;

 private:
  /// A phase's lr endpoints, resolved per group as torch does: initial = max / div_factor,
  /// final = initial / final_div_factor.
  enum class Level { initial, max, final };
  struct Phase {
    double end_step;
    Level start_lr, end_lr;
    double start_momentum, end_momentum;
  };
  double level_lr(Level level, double max_lr) const;
  /// Which phase `step` falls in and how far along it is.
  std::pair<const Phase*, double> locate(int64_t step) const;
  double anneal(double start, double end, double pct) const;

  int64_t total_steps_;
  OneCycleOptions options_;
  std::vector<Phase> phases_;
  std::string momentum_key_;
};

}  // namespace colossal::optim
