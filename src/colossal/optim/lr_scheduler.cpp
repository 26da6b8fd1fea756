// The schedulers' closed forms, and the base that applies them to an optimizer's groups.
#include "colossal/optim/lr_scheduler.h"

#include <algorithm>
#include <cmath>
#include <numbers>

#include "colossal/core/error.h"  // COLOSSAL_CHECK

namespace colossal::optim {

LRScheduler::LRScheduler(std::string name, Optimizer& optimizer) : name_(std::move(name)), optimizer_(optimizer) {
  for (size_t g = 0; g < optimizer.param_groups().size(); ++g) {
    const double lr = optimizer.param_groups()[g].lr();
    COLOSSAL_CHECK(lr >= 0.0 && std::isfinite(lr),
                   "{}: param group {} has lr {}; the base lr must be a finite number >= 0", name_, g, lr);
    base_lrs_.push_back(lr);
  }
}

void LRScheduler::check_groups(const char* what) const {
  COLOSSAL_CHECK(optimizer_.param_groups().size() == base_lrs_.size(),
                 "{}: {}: the optimizer has {} param group(s) but the scheduler was built for {}; build the scheduler "
                 "after adding groups",
                 name_, what, optimizer_.param_groups().size(), base_lrs_.size());
}

void LRScheduler::start() {
  last_step_ = 0;
  apply(0);
}

void LRScheduler::step() {
  check_groups("step");
  apply(last_step_ + 1);
  last_step_ += 1;
}

std::vector<double> LRScheduler::get_lr(int64_t step) const {
  COLOSSAL_CHECK(step >= 0, "{}: get_lr: step must be >= 0, got {}", name_, step);
  std::vector<double> lrs;
  for (double base : base_lrs_) lrs.push_back(lr_at(step, base));
  return lrs;
}

void LRScheduler::apply(int64_t step) {
  check_groups("apply");
  const std::vector<double> lrs = get_lr(step);
  for (size_t g = 0; g < lrs.size(); ++g) optimizer_.param_groups()[g].set_lr(lrs[g]);
}

StateDict LRScheduler::state_dict() const {
  return {{"last_step", core::scalar_tensor(static_cast<double>(last_step_), DType::i64)},
          {"base_lrs", core::from_vector(base_lrs_, {static_cast<int64_t>(base_lrs_.size())}, DType::f64)}};
}

void LRScheduler::load_state_dict(const StateDict& state_dict) {
  const std::string context = fmt::format("{}: load_state_dict: ", name_);
  for (const auto& [key, tensor] : state_dict) {
    COLOSSAL_CHECK(key == "last_step" || key == "base_lrs", "{}unexpected key '{}'; expected last_step and base_lrs",
                   context, key);
  }
  auto step_it = state_dict.find("last_step");
  auto base_it = state_dict.find("base_lrs");
  COLOSSAL_CHECK(step_it != state_dict.end() && step_it->second.defined(), "{}missing key 'last_step'", context);
  COLOSSAL_CHECK(base_it != state_dict.end() && base_it->second.defined(), "{}missing key 'base_lrs'", context);
  COLOSSAL_CHECK(step_it->second.numel() == 1, "{}'last_step' must hold one value, got shape {}", context,
                 step_it->second.shape());
  const auto step = step_it->second.item<int64_t>();
  COLOSSAL_CHECK(step >= 0, "{}'last_step' is {}; it must be >= 0", context, step);
  COLOSSAL_CHECK(base_it->second.dim() == 1 && base_it->second.numel() == static_cast<int64_t>(base_lrs_.size()),
                 "{}'base_lrs' has shape {} but the optimizer has {} param group(s)", context, base_it->second.shape(),
                 base_lrs_.size());
  std::vector<double> bases = base_it->second.to_vector<double>();
  for (size_t g = 0; g < bases.size(); ++g) {
    COLOSSAL_CHECK(bases[g] >= 0.0 && std::isfinite(bases[g]),
                   "{}'base_lrs' entry {} is {}; it must be finite and >= 0", context, g, bases[g]);
  }
  const std::vector<double> previous_bases = std::exchange(base_lrs_, std::move(bases));
  try {
    apply(step);  // may throw (OneCycleLR past its total), leaving the old state in place
  } catch (...) {
    base_lrs_ = previous_bases;
    throw;
  }
  last_step_ = step;
}

namespace {

void check_total_and_warmup(const char* name, int64_t total_steps, int64_t warmup_steps) {
  COLOSSAL_CHECK(total_steps > 0, "{}: total_steps must be > 0, got {}", name, total_steps);
  COLOSSAL_CHECK(warmup_steps >= 0 && warmup_steps < total_steps,
                 "{}: warmup_steps must be in [0, total_steps) = [0, {}), got {}", name, total_steps, warmup_steps);
}

void check_finite_non_negative(const char* name, const char* what, double value) {
  COLOSSAL_CHECK(value >= 0.0 && std::isfinite(value), "{}: {} must be a finite number >= 0, got {}", name, what,
                 value);
}

/// Colossal-AI's WarmupScheduler ramp: (step + 1) / warmup of the base lr.
double warmup_lr(int64_t step, int64_t warmup_steps, double base_lr) {
  return static_cast<double>(step + 1) / static_cast<double>(warmup_steps) * base_lr;
}

double cosine_lr(int64_t step, int64_t period, double base_lr, double eta_min) {
  return eta_min + (base_lr - eta_min) *
                       (1.0 + std::cos(std::numbers::pi * static_cast<double>(step) / static_cast<double>(period))) /
                       2.0;
}

double polynomial_lr(int64_t step, int64_t total_steps, double base_lr, double end_lr, double power) {
  const double progress = static_cast<double>(std::min(step, total_steps)) / static_cast<double>(total_steps);
  return (base_lr - end_lr) * std::pow(1.0 - progress, power) + end_lr;
}

std::vector<int64_t> sorted_milestones(const char* name, std::vector<int64_t> milestones) {
  for (int64_t m : milestones) COLOSSAL_CHECK(m >= 0, "{}: milestones must be >= 0, got {}", name, m);
  std::sort(milestones.begin(), milestones.end());
  return milestones;
}

double decay_by_milestones(int64_t step, const std::vector<int64_t>& milestones, double gamma, double base_lr) {
  const auto passed = std::upper_bound(milestones.begin(), milestones.end(), step) - milestones.begin();
  return base_lr * std::pow(gamma, static_cast<double>(passed));
}

}  // namespace

LinearWarmupLR::LinearWarmupLR(Optimizer& optimizer, int64_t total_steps, int64_t warmup_steps)
    : LRScheduler("LinearWarmupLR", optimizer), total_steps_(total_steps), warmup_steps_(warmup_steps) {
  check_total_and_warmup("LinearWarmupLR", total_steps, warmup_steps);
  start();
}

double LinearWarmupLR::lr_at(int64_t step, double base_lr) const {
  if (step < warmup_steps_) {
    return static_cast<double>(step + 1) / static_cast<double>(warmup_steps_ + 1) * base_lr;
  }
  return static_cast<double>(std::max<int64_t>(total_steps_ - step, 0)) /
         static_cast<double>(total_steps_ - warmup_steps_) * base_lr;
}

CosineAnnealingLR::CosineAnnealingLR(Optimizer& optimizer, int64_t total_steps, double eta_min)
    : LRScheduler("CosineAnnealingLR", optimizer), total_steps_(total_steps), eta_min_(eta_min) {
  COLOSSAL_CHECK(total_steps > 0, "CosineAnnealingLR: total_steps must be > 0, got {}", total_steps);
  check_finite_non_negative("CosineAnnealingLR", "eta_min", eta_min);
  start();
}

double CosineAnnealingLR::lr_at(int64_t step, double base_lr) const {
  return cosine_lr(step, total_steps_, base_lr, eta_min_);
}

CosineAnnealingWarmupLR::CosineAnnealingWarmupLR(Optimizer& optimizer, int64_t total_steps, int64_t warmup_steps,
                                                 double eta_min)
    : LRScheduler("CosineAnnealingWarmupLR", optimizer),
      total_steps_(total_steps),
      warmup_steps_(warmup_steps),
      eta_min_(eta_min) {
  check_total_and_warmup("CosineAnnealingWarmupLR", total_steps, warmup_steps);
  check_finite_non_negative("CosineAnnealingWarmupLR", "eta_min", eta_min);
  start();
}

double CosineAnnealingWarmupLR::lr_at(int64_t step, double base_lr) const {
  if (step < warmup_steps_) return warmup_lr(step, warmup_steps_, base_lr);
  return cosine_lr(step - warmup_steps_, total_steps_ - warmup_steps_, base_lr, eta_min_);
}

StepLR::StepLR(Optimizer& optimizer, int64_t step_size, double gamma)
    : LRScheduler("StepLR", optimizer), step_size_(step_size), gamma_(gamma) {
  COLOSSAL_CHECK(step_size > 0, "StepLR: step_size must be > 0, got {}", step_size);
  check_finite_non_negative("StepLR", "gamma", gamma);
  start();
}

double StepLR::lr_at(int64_t step, double base_lr) const {
  return base_lr * std::pow(gamma_, static_cast<double>(step / step_size_));
}

MultiStepLR::MultiStepLR(Optimizer& optimizer, std::vector<int64_t> milestones, double gamma)
    : LRScheduler("MultiStepLR", optimizer),
      milestones_(sorted_milestones("MultiStepLR", std::move(milestones))),
      gamma_(gamma) {
  check_finite_non_negative("MultiStepLR", "gamma", gamma);
  start();
}

double MultiStepLR::lr_at(int64_t step, double base_lr) const {
  return decay_by_milestones(step, milestones_, gamma_, base_lr);
}

MultiStepWarmupLR::MultiStepWarmupLR(Optimizer& optimizer, int64_t warmup_steps, std::vector<int64_t> milestones,
                                     double gamma)
    : LRScheduler("MultiStepWarmupLR", optimizer), warmup_steps_(warmup_steps), gamma_(gamma) {
  COLOSSAL_CHECK(warmup_steps >= 0, "MultiStepWarmupLR: warmup_steps must be >= 0, got {}", warmup_steps);
  COLOSSAL_CHECK(!milestones.empty(), "MultiStepWarmupLR: milestones cannot be empty");
  check_finite_non_negative("MultiStepWarmupLR", "gamma", gamma);
  for (int64_t m : sorted_milestones("MultiStepWarmupLR", std::move(milestones))) {
    if (m >= warmup_steps) milestones_.push_back(m);
  }
  start();
}

double MultiStepWarmupLR::lr_at(int64_t step, double base_lr) const {
  if (step < warmup_steps_) return warmup_lr(step, warmup_steps_, base_lr);
  return decay_by_milestones(step, milestones_, gamma_, base_lr);
}

PolynomialLR::PolynomialLR(Optimizer& optimizer, int64_t total_steps, double end_lr, double power)
    : LRScheduler("PolynomialLR", optimizer), total_steps_(total_steps), end_lr_(end_lr), power_(power) {
  COLOSSAL_CHECK(total_steps > 0, "PolynomialLR: total_steps must be > 0, got {}", total_steps);
  check_finite_non_negative("PolynomialLR", "end_lr", end_lr);
  check_finite_non_negative("PolynomialLR", "power", power);
  start();
}

double PolynomialLR::lr_at(int64_t step, double base_lr) const {
  return polynomial_lr(step, total_steps_, base_lr, end_lr_, power_);
}

PolynomialWarmupLR::PolynomialWarmupLR(Optimizer& optimizer, int64_t total_steps, int64_t warmup_steps, double end_lr,
                                       double power)
    : LRScheduler("PolynomialWarmupLR", optimizer),
      total_steps_(total_steps),
      warmup_steps_(warmup_steps),
      end_lr_(end_lr),
      power_(power) {
  check_total_and_warmup("PolynomialWarmupLR", total_steps, warmup_steps);
  check_finite_non_negative("PolynomialWarmupLR", "end_lr", end_lr);
  check_finite_non_negative("PolynomialWarmupLR", "power", power);
  start();
}

double PolynomialWarmupLR::lr_at(int64_t step, double base_lr) const {
  if (step < warmup_steps_) return warmup_lr(step, warmup_steps_, base_lr);
  return polynomial_lr(step - warmup_steps_, total_steps_ - warmup_steps_, base_lr, end_lr_, power_);
}

FlatAnnealingLR::FlatAnnealingLR(Optimizer& optimizer, int64_t total_steps, double pct_start)
    : LRScheduler("FlatAnnealingLR", optimizer) {
  COLOSSAL_CHECK(total_steps > 0, "FlatAnnealingLR: total_steps must be > 0, got {}", total_steps);
  COLOSSAL_CHECK(pct_start >= 0.0 && pct_start <= 1.0, "FlatAnnealingLR: pct_start must be in [0, 1], got {}",
                 pct_start);
  flat_steps_ = static_cast<int64_t>(static_cast<double>(total_steps) * pct_start);  // Python's int(): truncates
  anneal_steps_ = total_steps - flat_steps_;
  COLOSSAL_CHECK(anneal_steps_ > 0,
                 "FlatAnnealingLR: pct_start {} leaves no steps to anneal over (total_steps {}); use pct_start < 1",
                 pct_start, total_steps);
  start();
}

double FlatAnnealingLR::lr_at(int64_t step, double base_lr) const {
  if (step < flat_steps_) return base_lr;
  return cosine_lr(step - flat_steps_, anneal_steps_, base_lr, 0.0);
}

FlatAnnealingWarmupLR::FlatAnnealingWarmupLR(Optimizer& optimizer, int64_t total_steps, int64_t warmup_steps,
                                             double pct_start, double eta_min)
    : LRScheduler("FlatAnnealingWarmupLR", optimizer), warmup_steps_(warmup_steps), eta_min_(eta_min) {
  check_total_and_warmup("FlatAnnealingWarmupLR", total_steps, warmup_steps);
  COLOSSAL_CHECK(pct_start >= 0.0 && pct_start <= 1.0, "FlatAnnealingWarmupLR: pct_start must be in [0, 1], got {}",
                 pct_start);
  check_finite_non_negative("FlatAnnealingWarmupLR", "eta_min", eta_min);
  flat_steps_ = static_cast<int64_t>(static_cast<double>(total_steps - warmup_steps) * pct_start);
  anneal_steps_ = total_steps - warmup_steps - flat_steps_;
  COLOSSAL_CHECK(anneal_steps_ > 0,
                 "FlatAnnealingWarmupLR: pct_start {} leaves no steps to anneal over (total_steps {}, warmup_steps "
                 "{}); use pct_start < 1",
                 pct_start, total_steps, warmup_steps);
  start();
}

double FlatAnnealingWarmupLR::lr_at(int64_t step, double base_lr) const {
  if (step < warmup_steps_) return warmup_lr(step, warmup_steps_, base_lr);
  if (step < warmup_steps_ + flat_steps_) return base_lr;
  return cosine_lr(step - warmup_steps_ - flat_steps_, anneal_steps_, base_lr, eta_min_);
}

ExponentialLR::ExponentialLR(Optimizer& optimizer, double gamma)
    : LRScheduler("ExponentialLR", optimizer), gamma_(gamma) {
  check_finite_non_negative("ExponentialLR", "gamma", gamma);
  start();
}

double ExponentialLR::lr_at(int64_t step, double base_lr) const {
  return base_lr * std::pow(gamma_, static_cast<double>(step));
}

LambdaLR::LambdaLR(Optimizer& optimizer, std::function<double(int64_t)> lr_lambda)
    : LRScheduler("LambdaLR", optimizer), lr_lambda_(std::move(lr_lambda)) {
  COLOSSAL_CHECK(lr_lambda_ != nullptr, "LambdaLR: lr_lambda is empty");
  start();
}

double LambdaLR::lr_at(int64_t step, double base_lr) const {
  const double factor = lr_lambda_(step);
  COLOSSAL_CHECK(factor >= 0.0 && std::isfinite(factor),
                 "LambdaLR: lr_lambda({}) returned {}; the factor must be a finite number >= 0", step, factor);
  return base_lr * factor;
}

OneCycleLR::OneCycleLR(Optimizer& optimizer, int64_t total_steps, OneCycleOptions options)
    : LRScheduler("OneCycleLR", optimizer), total_steps_(total_steps), options_(options) {
  const OneCycleOptions& o = options_;
  COLOSSAL_CHECK(total_steps > 0, "OneCycleLR: total_steps must be > 0, got {}", total_steps);
  COLOSSAL_CHECK(o.pct_start >= 0.0 && o.pct_start <= 1.0, "OneCycleLR: pct_start must be in [0, 1], got {}",
                 o.pct_start);
  COLOSSAL_CHECK(o.div_factor > 0.0 && std::isfinite(o.div_factor),
                 "OneCycleLR: div_factor must be a finite number > 0, got {}", o.div_factor);
  COLOSSAL_CHECK(o.final_div_factor > 0.0 && std::isfinite(o.final_div_factor),
                 "OneCycleLR: final_div_factor must be a finite number > 0, got {}", o.final_div_factor);
  using enum Level;
  const double total = static_cast<double>(total_steps);
  const double mom_max = o.max_momentum, mom_base = o.base_momentum;
  if (o.three_phase) {
    phases_ = {{o.pct_start * total - 1.0, initial, max, mom_max, mom_base},
               {2.0 * o.pct_start * total - 2.0, max, initial, mom_base, mom_max},
               {total - 1.0, initial, final, mom_max, mom_max}};
  } else {
    phases_ = {{o.pct_start * total - 1.0, initial, max, mom_max, mom_base},
               {total - 1.0, max, final, mom_base, mom_max}};
  }
  if (o.cycle_momentum) {
    COLOSSAL_CHECK(mom_base >= 0.0 && mom_base < 1.0 && mom_max >= 0.0 && mom_max < 1.0,
                   "OneCycleLR: base_momentum and max_momentum must be in [0, 1), got {} and {}", mom_base, mom_max);
    const ParamGroup& first = optimizer.param_groups().front();
    momentum_key_ = first.has("momentum") ? "momentum" : first.has("beta1") ? "beta1" : "";
    COLOSSAL_CHECK(!momentum_key_.empty(),
                   "OneCycleLR: cycle_momentum needs an optimizer with a 'momentum' or 'beta1' option; {} has neither "
                   "(set cycle_momentum = false)",
                   optimizer.name());
  }
  start();
}

std::pair<const OneCycleLR::Phase*, double> OneCycleLR::locate(int64_t step) const {
  COLOSSAL_CHECK(step <= total_steps_,
                 "OneCycleLR: tried to step {} times; the schedule has total_steps = {} (build it with more steps)",
                 step, total_steps_);
  const auto s = static_cast<double>(step);
  double start_step = 0.0;
  for (size_t i = 0; i < phases_.size(); ++i) {
    const Phase& phase = phases_[i];
    if (s <= phase.end_step || i + 1 == phases_.size()) {
      const double length = phase.end_step - start_step;
      return {&phase, length == 0.0 ? 1.0 : (s - start_step) / length};
    }
    start_step = phase.end_step;
  }
  COLOSSAL_FAIL("OneCycleLR: no phase for step {}", step);  // unreachable: the last phase takes every step
}

double OneCycleLR::anneal(double start, double end, double pct) const {
  if (options_.anneal_strategy == AnnealStrategy::linear) return (end - start) * pct + start;
  return end + (start - end) / 2.0 * (std::cos(std::numbers::pi * pct) + 1.0);
}

double OneCycleLR::level_lr(Level level, double max_lr) const {
  const double initial = max_lr / options_.div_factor;
  switch (level) {
    case Level::initial:
      return initial;
    case Level::max:
      return max_lr;
    case Level::final:
      return initial / options_.final_div_factor;
  }
  return max_lr;
}

double OneCycleLR::lr_at(int64_t step, double base_lr) const {
  const auto [phase, pct] = locate(step);
  return anneal(level_lr(phase->start_lr, base_lr), level_lr(phase->end_lr, base_lr), pct);
}

double OneCycleLR::momentum_at(int64_t step) const {
  COLOSSAL_CHECK(options_.cycle_momentum, "OneCycleLR: momentum_at needs cycle_momentum = true");
  const auto [phase, pct] = locate(step);
  return anneal(phase->start_momentum, phase->end_momentum, pct);
}

void OneCycleLR::apply(int64_t step) {
  LRScheduler::apply(step);
  if (!options_.cycle_momentum) return;
  const double momentum = momentum_at(step);
  for (ParamGroup& group : optimizer().param_groups()) group.set(momentum_key_, momentum);
}

}  // namespace colossal::optim
