// The stock hooks of Colossal-AI's trainer: per-epoch loss and top-1 accuracy, LR scheduling by
// epoch or by step, throughput, a log line per epoch, a JSONL metrics file (one object per
// epoch, then a summary) that scripts and dashboards read, and the guard that stops a run whose
// loss became NaN or infinite.
#pragma once

#include <chrono>
#include <cstdint>
#include <cstdio>
#include <iosfwd>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "colossal/engine/hook.h"
#include "colossal/optim/lr_scheduler.h"

namespace colossal::engine {

/// A running sum of detached losses kept on their device (16-bit losses widened to f32) and read on
/// the host only by mean(): reading each loss as it comes would synchronise the GPU at every step.
class DeviceLossSum {
 public:
  void add(const Tensor& loss);
  /// The mean of the losses added since reset(): one host read. NaN when none was added.
  double mean() const;
  int64_t count() const { return count_; }
  void reset();

 private:
  Tensor sum_;
  int64_t count_ = 0;
};

/// Mean of the per-iteration losses of each pass: train_metrics()["loss"] at after_train_epoch and
/// test_metrics()["loss"] at after_test_epoch (Colossal-AI's LossHook and LossMetric). The sum stays on
/// the losses' device (f32 or wider) until the pass ends, so the hook adds no host sync to a step.
class LossHook : public Hook {
 public:
  explicit LossHook(int priority = 0) : Hook(priority) {}
  std::string name() const override { return "LossHook"; }
  void before_train_epoch(Trainer& trainer) override;
  void after_train_iter(Trainer& trainer, const Tensor& output, const Tensor& target, const Tensor& loss) override;
  void after_train_epoch(Trainer& trainer) override;
  void before_test_epoch(Trainer& trainer) override;
  void after_test_iter(Trainer& trainer, const Tensor& output, const Tensor& target, const Tensor& loss) override;
  void after_test_epoch(Trainer& trainer) override;

 private:
  DeviceLossSum train_, test_;  // read once per pass
};

/// Top-1 accuracy over the whole test pass (correct / total rows): test_metrics()["accuracy"].
class AccuracyHook : public Hook {
 public:
  explicit AccuracyHook(int priority = 0) : Hook(priority) {}
  std::string name() const override { return "AccuracyHook"; }
  void before_test_epoch(Trainer& trainer) override;
  void after_test_iter(Trainer& trainer, const Tensor& output, const Tensor& target, const Tensor& loss) override;
  void after_test_epoch(Trainer& trainer) override;

 private:
  int64_t correct_ = 0, total_ = 0;
};

/// Steps `scheduler` after every training epoch (by_epoch) or after every optimizer update, and
/// records the first group's lr of the epoch in train_metrics()["lr"]. Give the Engine no scheduler
/// when using this hook, or the schedule advances twice.
class LRSchedulerHook : public Hook {
 public:
  LRSchedulerHook(std::shared_ptr<optim::LRScheduler> scheduler, bool by_epoch, int priority = 1);
  std::string name() const override { return "LRSchedulerHook"; }
  void before_train_epoch(Trainer& trainer) override;
  void after_train_iter(Trainer& trainer, const Tensor& output, const Tensor& target, const Tensor& loss) override;
  void after_train_epoch(Trainer& trainer) override;

 private:
  std::shared_ptr<optim::LRScheduler> scheduler_;
  bool by_epoch_;
  double epoch_lr_ = 0.0;
};

/// Training samples per second of wall time over each training pass: train_metrics()["throughput"].
/// Priority 5 so that it publishes before the logging hooks (priority 10) read it.
class ThroughputHook : public Hook {
 public:
  explicit ThroughputHook(int priority = 5) : Hook(priority) {}
  std::string name() const override { return "ThroughputHook"; }
  void before_train_epoch(Trainer& trainer) override;
  void after_train_iter(Trainer& trainer, const Tensor& output, const Tensor& target, const Tensor& loss) override;
  void after_train_epoch(Trainer& trainer) override;

 private:
  std::chrono::steady_clock::time_point start_;
  int64_t samples_ = 0;
};

/// Prints "Epoch 1/10 | train | loss=0.6931 throughput=1234.5" after each pass to `out` (stdout by
/// default), as Colossal-AI's LogMetricByEpochHook; epochs are shown 1-based.
class LogMetricByEpochHook : public Hook {
 public:
  explicit LogMetricByEpochHook(std::ostream* out = nullptr, int priority = 10);
  std::string name() const override { return "LogMetricByEpochHook"; }
  void after_train_epoch(Trainer& trainer) override;
  void after_test_epoch(Trainer& trainer) override;

 private:
  std::ostream* out_;
};

/// Writes `path` (truncated at before_train, or appended to when `append`, as a resumed run does),
/// one JSON object per line, flushed as written so that a crashed run keeps what it logged:
///   every `log_interval` training iterations (0: never)
///     {"event": "step", "epoch": e, "step": s, "loss": ..., "wall_s": ..., "lr": ..., ["grad_norm": ...],
///      ["loss_scale": ..., "skipped": bool (mixed precision)]}
///   (lr: the one this iteration's update used; wall_s: seconds since before_train when the step
///   finished: reading the loss waits for it, so differences time steady-state steps)
///   after each epoch (after its test pass, if any)
///     {"event": "epoch", "epoch": e, "step": s, "train_loss": ..., "test_loss": ..., "test_accuracy": ...,
///      "samples_per_s": ..., ["lr": ...]}
///   at after_train
///     {"event": "summary", "epochs": E, "epochs_this_run": ..., "steps": S, "steps_this_run": ...,
///      "train_loss": ..., "test_loss": ..., "test_accuracy": ..., "best_test_accuracy": ...,
///      "samples_per_s": ..., "wall_s": ...}
/// with e 1-based as the console prints it ("Epoch 1/3"), s counting training iterations (the
/// one just done included), E the number of the last epoch trained (that of the last epoch line;
/// an epoch cut short by train.max_steps counts, and a resumed run counts the epochs before it),
/// losses and accuracy those of the last epoch (the summary's samples_per_s the mean over
/// epochs), and null for a metric no hook produced.
/// Every write is checked: a failed open, write or flush (a full disk, /dev/full, a removed
/// mount) throws colossal::Error naming the file and the system's reason, which ends the run
/// with an error instead of a silently empty file.
class MetricsJsonlHook : public Hook {
 public:
  explicit MetricsJsonlHook(std::string path, int64_t log_interval = 0, bool append = false, int priority = 10);
  std::string name() const override { return "MetricsJsonlHook"; }
  void before_train(Trainer& trainer) override;
  void before_train_iter(Trainer& trainer) override;
  void after_train_iter(Trainer& trainer, const Tensor& output, const Tensor& target, const Tensor& loss) override;
  void after_train_epoch(Trainer& trainer) override;
  void after_test(Trainer& trainer) override;
  void after_train(Trainer& trainer) override;

 private:
  void write_epoch(Trainer& trainer, bool tested);
  /// Appends `line` and a newline and flushes; throws naming the file and strerror on failure.
  void write_line(const std::string& line);

  struct CloseFile {
    void operator()(std::FILE* file) const { std::fclose(file); }
  };

  double iter_lr_ = 0.0;  // the lr of the current iteration's update
  std::string path_;
  int64_t log_interval_;
  bool append_;
  std::unique_ptr<std::FILE, CloseFile> file_;  // stdio, so that every failure comes with its errno
  std::chrono::steady_clock::time_point start_;
  int64_t first_step_ = 0;
  int64_t epochs_written_ = 0;
  int64_t last_epoch_ = 0;  // 1-based, of the last epoch line
  std::optional<double> final_train_loss_, final_test_loss_, final_test_accuracy_, best_test_accuracy_;
  double throughput_sum_ = 0.0;
  int64_t throughput_count_ = 0;
};

/// Stops a run whose training loss became NaN or infinite, before the broken state is logged as
/// a result or saved as a checkpoint; see Note [Non-finite losses] in hooks.cpp.
/// Each iteration's loss is copied into a buffer on its own device (one small copy, no host
/// synchronisation); the host reads the buffer only where a host read happens anyway: every
/// `check_interval` training iterations (pass train.log_interval; 0: not by iteration), at the
/// end of every epoch, at the end of training, and when SaveCheckpointHook is about to save
/// (it calls check()). A non-finite loss then throws colossal::Error naming the first such
/// step (1-based iteration, as the JSONL "step") and epoch (1-based, as logged) and what to do.
/// Under mixed precision (Engine::amp()) an update the fp16 loss scaler skipped for overflow is
/// normal and the losses of its window are let through, but `max_skipped_in_a_row` iterations in
/// a row with a non-finite loss, all in skipped updates, stop the run too: the loss is computed
/// before any scaling, so a lower scale cannot cure it (NaN weights, or a forward pass beyond
/// fp16's range). Micro-steps of a window that never reached its update (dropped at an epoch's
/// end) are let through under mixed precision and judged like updates without it.
/// Priority 50: after the logging hooks (priority <= 10), so the log lines of the failing
/// interval are written, and before SaveCheckpointHook (100) at after_train_iter and
/// after_train_epoch. Install it on every rank of a data-parallel run: the reported loss is the
/// group's mean, so every rank sees the same losses and stops at the same interval or epoch check
/// (a rank that also saves checkpoints checks before each save as well, and may stop first).
class NonFiniteLossHook : public Hook {
 public:
  explicit NonFiniteLossHook(int64_t check_interval = 0, int64_t max_skipped_in_a_row = 16, int priority = 50);
  std::string name() const override { return "NonFiniteLossHook"; }
  void before_train(Trainer& trainer) override;
  void after_train_iter(Trainer& trainer, const Tensor& output, const Tensor& target, const Tensor& loss) override;
  void after_train_epoch(Trainer& trainer) override;
  void after_train(Trainer& trainer) override;
  /// Reads the losses recorded since the last check (one copy to the host per buffer chunk) and
  /// throws if one of them is non-finite on an update that was not skipped (see above).
  void check(Trainer& trainer);
  /// Iterations recorded and not yet read by check().
  int64_t unchecked() const { return static_cast<int64_t>(records_.size()); }

 private:
  /// What became of the update an iteration's gradients went into.
  enum class Outcome { pending, applied, skipped, dropped };
  struct Record {
    int64_t step;   // 1-based iteration number
    int64_t epoch;  // 1-based
    Outcome outcome;
    double loss;  // set once read from the device
  };
  void judge(Trainer& trainer, const Record& record);

  int64_t check_interval_, max_skipped_in_a_row_;
  std::vector<Tensor> chunks_;   // device buffers of kLossChunk losses each, filled in order
  std::vector<Record> records_;  // the unread iterations, one per buffered loss
  std::vector<Record> pending_;  // read, but their window has not reached its update yet
  int64_t skipped_in_a_row_ = 0;
};

}  // namespace colossal::engine
