// Trainer: Colossal-AI's epoch loop over an Engine. fit() trains for a number of epochs, tests
// every `test_interval` epochs, and calls the hooks at each hook point; metric hooks publish
// their per-epoch values in the trainer's metric tables for the logging hooks to read.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "colossal/data/data_loader.h"
#include "colossal/engine/engine.h"
#include "colossal/engine/hook.h"

namespace colossal::engine {

/// Metric name ("loss", "accuracy", "throughput") -> value of the current epoch.
using MetricTable = std::map<std::string, double>;

/// Where a run stands between two iterations: what a checkpoint records and what a resumed fit()
/// starts from.
struct TrainPosition {
  int64_t epoch = 0;  ///< the epoch in progress (0-based)
  int64_t iter = 0;   ///< batches of that epoch already trained
  int64_t step = 0;   ///< training iterations done across all epochs

  friend bool operator==(const TrainPosition&, const TrainPosition&) = default;
};

/// Bounds of a fit() beyond its epoch count.
struct FitLimits {
  /// Stop once the engine has made this many optimizer updates (counted from a resumed checkpoint's
  /// count), mid-epoch if need be (config train.max_steps); 0: no bound besides the epochs.
  int64_t max_updates = 0;
  /// Test passes follow completed epochs (every test_interval-th). An epoch cut short by
  /// max_updates gets one only when this is true (a run bounded by max_steps alone, epochs = 0,
  /// whose only chance to test is its end).
  bool test_cut_epoch = false;
};

class Trainer {
 public:
  explicit Trainer(Engine& engine) : engine_(engine) {}

  /// For each epoch e in [0, epochs): a training pass over train_loader (set_epoch(e) first) and,
  /// when test_loader is given and e % test_interval == 0 (Colossal-AI's rule), a test pass.
  /// Hooks are sorted by priority (stable). Order of calls:
  ///   before_train; per epoch { before_train_epoch; per batch { before_train_iter; after_train_iter }
  ///   after_train_epoch; [before_test; before_test_epoch; per batch { before_test_iter;
  ///   after_test_iter } after_test_epoch; after_test] }; after_train.
  /// display_progress draws a ProgressBar per pass on stderr (epoch, step/total, rate, ETA, loss).
  /// After resume_at(p), the first epoch is p.epoch and its first p.iter batches are skipped (the
  /// loader hands out the remaining ones exactly as a full pass would); before_train still runs.
  /// With limits.max_updates the run ends once the engine has made that many updates: the epoch in
  /// progress ends there (after_train_epoch runs, position_after_epoch() is the cut) and no later
  /// epoch starts.
  void fit(data::DataLoader& train_loader, int64_t epochs, data::DataLoader* test_loader = nullptr,
           int64_t test_interval = 1, std::vector<std::shared_ptr<Hook>> hooks = {}, bool display_progress = false,
           FitLimits limits = {});

  /// Makes the next fit() continue from `position` (restored from a checkpoint) instead of epoch 0.
  void resume_at(TrainPosition position);

  Engine& engine() { return engine_; }
  /// The epoch being run (0-based), and the number of epochs of the current fit().
  int64_t cur_epoch() const { return cur_epoch_; }
  int64_t max_epochs() const { return max_epochs_; }
  /// Training iterations done so far across epochs, and the iteration within the current pass.
  int64_t cur_step() const { return cur_step_; }
  int64_t cur_iter() const { return cur_iter_; }
  /// The position once the current training iteration has finished (inside after_train_iter), or
  /// once the current epoch's training pass has (inside after_train_epoch and later in the epoch).
  TrainPosition position_after_iter() const { return {cur_epoch_, cur_iter_ + 1, cur_step_ + 1}; }
  /// After an epoch cut short by FitLimits::max_updates, that is where the cut fell (the same epoch,
  /// its batches done so far), so that a resumed run goes on from mid-epoch.
  TrainPosition position_after_epoch() const {
    return epoch_cut_ ? TrainPosition{cur_epoch_, cur_iter_, cur_step_} : TrainPosition{cur_epoch_ + 1, 0, cur_step_};
  }
  /// Whether the current epoch's training pass stopped early at FitLimits::max_updates.
  bool epoch_cut() const { return epoch_cut_; }
  /// Whether the current epoch runs a test pass (false from its after_train_epoch on when the epoch
  /// was cut short and FitLimits::test_cut_epoch is off).
  bool testing_this_epoch() const { return testing_this_epoch_; }
  /// Metrics of the current epoch, written by metric hooks (cleared at each before_*_epoch).
  MetricTable& train_metrics() { return train_metrics_; }
  MetricTable& test_metrics() { return test_metrics_; }
  const std::vector<std::shared_ptr<Hook>>& hooks() const { return hooks_; }

 private:
  void train_epoch(data::DataLoader& loader, int64_t first_iter, bool display_progress, FitLimits limits);
  std::string pass_label(const char* pass) const;
  void test_epoch(data::DataLoader& loader, bool display_progress);
  template <class Fn>
  void call_hooks(Fn&& fn) {
    for (auto& hook : hooks_) fn(*hook);
  }

  Engine& engine_;
  std::vector<std::shared_ptr<Hook>> hooks_;
  int64_t cur_epoch_ = 0;
  int64_t max_epochs_ = 0;
  int64_t cur_step_ = 0;
  int64_t cur_iter_ = 0;
  bool testing_this_epoch_ = false;
  bool epoch_cut_ = false;
  TrainPosition start_;  // where the next fit() begins (resume_at)
  MetricTable train_metrics_;
  MetricTable test_metrics_;
};

}  // namespace colossal::engine
