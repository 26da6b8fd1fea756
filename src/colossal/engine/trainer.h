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

class Trainer {
 public:
  explicit Trainer(Engine& engine) : engine_(engine) {}

  /// For each epoch e in [0, epochs): a training pass over train_loader (set_epoch(e) first) and,
  /// when test_loader is given and e % test_interval == 0 (Colossal-AI's rule), a test pass.
  /// Hooks are sorted by priority (stable). Order of calls:
  ///   before_train; per epoch { before_train_epoch; per batch { before_train_iter; after_train_iter }
  ///   after_train_epoch; [before_test; before_test_epoch; per batch { before_test_iter;
  ///   after_test_iter } after_test_epoch; after_test] }; after_train.
  /// display_progress prints one line per epoch pass to stdout.
  void fit(data::DataLoader& train_loader, int64_t epochs, data::DataLoader* test_loader = nullptr,
           int64_t test_interval = 1, std::vector<std::shared_ptr<Hook>> hooks = {}, bool display_progress = false);

  Engine& engine() { return engine_; }
  /// The epoch being run (0-based), and the number of epochs of the current fit().
  int64_t cur_epoch() const { return cur_epoch_; }
  int64_t max_epochs() const { return max_epochs_; }
  /// Training iterations done so far across epochs, and the iteration within the current pass.
  int64_t cur_step() const { return cur_step_; }
  int64_t cur_iter() const { return cur_iter_; }
  /// Whether the current epoch runs a test pass.
  bool testing_this_epoch() const { return testing_this_epoch_; }
  /// Metrics of the current epoch, written by metric hooks (cleared at each before_*_epoch).
  MetricTable& train_metrics() { return train_metrics_; }
  MetricTable& test_metrics() { return test_metrics_; }
  const std::vector<std::shared_ptr<Hook>>& hooks() const { return hooks_; }

 private:
  void train_epoch(data::DataLoader& loader, bool display_progress);
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
  MetricTable train_metrics_;
  MetricTable test_metrics_;
};

}  // namespace colossal::engine
