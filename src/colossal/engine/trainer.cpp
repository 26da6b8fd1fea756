// Trainer: see trainer.h.
#include "colossal/engine/trainer.h"

#include <algorithm>
#include <utility>

#include <fmt/core.h>

#include "colossal/autograd/grad_mode.h"  // NoGradGuard
#include "colossal/core/error.h"          // COLOSSAL_CHECK

namespace colossal::engine {

void Trainer::fit(data::DataLoader& train_loader, int64_t epochs, data::DataLoader* test_loader, int64_t test_interval,
                  std::vector<std::shared_ptr<Hook>> hooks, bool display_progress) {
  COLOSSAL_CHECK(epochs >= 0, "fit: epochs must be >= 0, got {}", epochs);
  COLOSSAL_CHECK(test_interval >= 1, "fit: test_interval must be >= 1, got {}", test_interval);
  for (const auto& hook : hooks) COLOSSAL_CHECK(hook != nullptr, "fit: a hook is null");
  std::stable_sort(hooks.begin(), hooks.end(),
                   [](const auto& a, const auto& b) { return a->priority() < b->priority(); });
  hooks_ = std::move(hooks);
  max_epochs_ = epochs;
  cur_step_ = 0;

  call_hooks([&](Hook& h) { h.before_train(*this); });
  for (cur_epoch_ = 0; cur_epoch_ < epochs; ++cur_epoch_) {
    testing_this_epoch_ = test_loader != nullptr && cur_epoch_ % test_interval == 0;
    train_epoch(train_loader, display_progress);
    if (testing_this_epoch_) test_epoch(*test_loader, display_progress);
  }
  call_hooks([&](Hook& h) { h.after_train(*this); });
}

void Trainer::train_epoch(data::DataLoader& loader, bool display_progress) {
  engine_.train();
  loader.set_epoch(cur_epoch_);
  train_metrics_.clear();
  call_hooks([&](Hook& h) { h.before_train_epoch(*this); });
  cur_iter_ = 0;
  // A window left open by the previous epoch's last batches is dropped rather than mixed in.
  engine_.zero_grad();
  for (data::Batch& batch : loader) {
    call_hooks([&](Hook& h) { h.before_train_iter(*this); });
    Tensor loss = engine_.step(batch.input, batch.target);
    call_hooks([&](Hook& h) { h.after_train_iter(*this, engine_.last_output(), batch.target, loss); });
    ++cur_iter_;
    ++cur_step_;
  }
  call_hooks([&](Hook& h) { h.after_train_epoch(*this); });
  if (display_progress) {
    fmt::print("[Epoch {} / train] {} iterations\n", cur_epoch_, cur_iter_);
  }
}

void Trainer::test_epoch(data::DataLoader& loader, bool display_progress) {
  engine_.eval();
  loader.set_epoch(cur_epoch_);
  test_metrics_.clear();
  call_hooks([&](Hook& h) { h.before_test(*this); });
  call_hooks([&](Hook& h) { h.before_test_epoch(*this); });
  cur_iter_ = 0;
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
  }
  call_hooks([&](Hook& h) { h.after_test_epoch(*this); });
  call_hooks([&](Hook& h) { h.after_test(*this); });
  engine_.train();
  if (display_progress) {
    fmt::print("[Epoch {} / test] {} iterations\n", cur_epoch_, cur_iter_);
  }
}

}  // namespace colossal::engine
