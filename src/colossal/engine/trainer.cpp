// Trainer: see trainer.h.
#include "colossal/engine/trainer.h"

#include <algorithm>
#include <cmath>
#include <optional>
#include <utility>

#include <fmt/core.h>

#include "colossal/autograd/grad_mode.h"  // NoGradGuard
#include "colossal/core/error.h"          // COLOSSAL_CHECK
#include "colossal/core/profiler.h"       // step_begin, Scope
#include "colossal/engine/progress_bar.h"

namespace colossal::engine {

void Trainer::fit(data::DataLoader& train_loader, int64_t epochs, data::DataLoader* test_loader, int64_t test_interval,
                  std::vector<std::shared_ptr<Hook>> hooks, bool display_progress, FitLimits limits) {
  COLOSSAL_CHECK(limits.max_updates >= 0, "fit: max_updates must be >= 0, got {}", limits.max_updates);
  COLOSSAL_CHECK(epochs >= 0, "fit: epochs must be >= 0, got {}", epochs);
  COLOSSAL_CHECK(test_interval >= 1, "fit: test_interval must be >= 1, got {}", test_interval);
  for (const auto& hook : hooks) COLOSSAL_CHECK(hook != nullptr, "fit: a hook is null");
  std::stable_sort(hooks.begin(), hooks.end(),
                   [](const auto& a, const auto& b) { return a->priority() < b->priority(); });
  hooks_ = std::move(hooks);
  max_epochs_ = epochs;
  const TrainPosition start = std::exchange(start_, TrainPosition{});
  COLOSSAL_CHECK(start.epoch >= 0 && start.iter >= 0 && start.step >= 0, "fit: bad resume position epoch {} iter {}",
                 start.epoch, start.iter);
  cur_step_ = start.step;

  call_hooks([&](Hook& h) { h.before_train(*this); });
  const auto done = [&] { return limits.max_updates > 0 && engine_.num_updates() >= limits.max_updates; };
  for (cur_epoch_ = start.epoch; cur_epoch_ < epochs && !done(); ++cur_epoch_) {
    testing_this_epoch_ = test_loader != nullptr && cur_epoch_ % test_interval == 0;
    train_epoch(train_loader, cur_epoch_ == start.epoch ? start.iter : 0, display_progress, limits);
    if (testing_this_epoch_) test_epoch(*test_loader, display_progress);
    if (epoch_cut_) break;
  }
  core::profiler::finish();  // a run that ended inside the profiling window
  call_hooks([&](Hook& h) { h.after_train(*this); });
}

void Trainer::resume_at(TrainPosition position) {
  COLOSSAL_CHECK(position.epoch >= 0 && position.iter >= 0 && position.step >= 0,
                 "resume_at: epoch, iter and step must be >= 0, got {}, {}, {}", position.epoch, position.iter,
                 position.step);
  start_ = position;
}

std::string Trainer::pass_label(const char* pass) const {
  return fmt::format("epoch {}/{} {}", cur_epoch_ + 1, max_epochs_, pass);
}

void Trainer::train_epoch(data::DataLoader& loader, int64_t first_iter, bool display_progress, FitLimits limits) {
  const int64_t max_updates = limits.max_updates;
  epoch_cut_ = false;
  engine_.train();
  loader.set_epoch(cur_epoch_);
  train_metrics_.clear();
  call_hooks([&](Hook& h) { h.before_train_epoch(*this); });
  cur_iter_ = first_iter;
  // A window left open by the previous epoch's last batches is dropped rather than mixed in.
  engine_.zero_grad();
  std::optional<ProgressBar> bar;
  if (display_progress) bar.emplace(pass_label("train"), loader.size(), first_iter);
  loader.start(first_iter);
  while (true) {
    core::profiler::step_begin(cur_step_);  // COLOSSAL_PROFILE's window (core/profiler.h)
    std::optional<data::Batch> batch;
    {
      core::profiler::Scope scope("data: next batch");
      batch = loader.next();
    }
    if (!batch) break;
    core::profiler::Scope step_scope("train step");
    call_hooks([&](Hook& h) { h.before_train_iter(*this); });
    Tensor loss = engine_.step(batch->input, batch->target);
    {
      core::profiler::Scope scope("hooks: after_train_iter", engine_.device());
      call_hooks([&](Hook& h) { h.after_train_iter(*this, engine_.last_output(), batch->target, loss); });
    }
    ++cur_iter_;
    ++cur_step_;
    if (bar) bar->update(cur_iter_, [&] { return loss.item<double>(); });
    if (max_updates > 0 && engine_.num_updates() >= max_updates) {
      // train.max_steps: the run ends here, mid-epoch when the epoch has batches left.
      epoch_cut_ = cur_iter_ < loader.size();
      break;
    }
  }
  if (bar) bar->finish();
  // A cut epoch is tested only when the limits say so; the hooks see the decision.
  if (epoch_cut_ && !limits.test_cut_epoch) testing_this_epoch_ = false;
  call_hooks([&](Hook& h) { h.after_train_epoch(*this); });
}

void Trainer::test_epoch(data::DataLoader& loader, bool display_progress) {
  engine_.eval();
  loader.set_epoch(cur_epoch_);
  test_metrics_.clear();
  call_hooks([&](Hook& h) { h.before_test(*this); });
  call_hooks([&](Hook& h) { h.before_test_epoch(*this); });
  cur_iter_ = 0;
  std::optional<ProgressBar> bar;
  if (display_progress) bar.emplace(pass_label("test"), loader.size());
  for (data::Batch& batch : loader) {
    call_hooks([&](Hook& h) { h.before_test_iter(*this); });
    Tensor output = engine_.evaluate(batch.input);
    Tensor loss;
    if (batch.target.defined()) {
      autograd::NoGradGuard no_grad;
      loss = engine_.criterion(output, batch.target);
    }
    call_hooks([&](Hook& h) { h.after_test_iter(*this, output, batch.target, loss); });
    ++cur_iter_;
    if (bar) bar->update(cur_iter_, [&] { return loss.defined() ? loss.item<double>() : std::nan(""); });
  }
  if (bar) bar->finish();
  call_hooks([&](Hook& h) { h.after_test_epoch(*this); });
  call_hooks([&](Hook& h) { h.after_test(*this); });
  engine_.train();
}

}  // namespace colossal::engine
