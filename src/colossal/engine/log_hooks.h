// The logging hooks of Colossal-AI's trainer beyond the per-epoch line: TensorBoard event files,
// a line every N optimizer steps, host and CUDA memory, and per-epoch timing. Hooks that publish
// into the trainer's metric tables run at priority 5, before the writers (priority 10) read them.
#pragma once

#include <chrono>
#include <cstdint>
#include <iosfwd>
#include <memory>
#include <optional>
#include <string>

#include "colossal/engine/engine.h"  // Engine; parallel::zero::ModelStateBytes
#include "colossal/engine/hook.h"
#include "colossal/engine/hooks.h"  // DeviceLossSum
#include "colossal/engine/tensorboard.h"

namespace colossal::engine {

/// Writes a TensorBoard event file (see EventFileWriter) in `log_dir`, opened at before_train and
/// closed at after_train; one file per fit().
///   Every `step_interval` training iterations (0: never): train/loss (that iteration's loss),
///   train/lr (the first param group's lr the iteration ran with) and, after an update with
///   clipping on, train/grad_norm, at step = iterations done including this one.
///   After each training pass: every train_metrics() entry as train/<name>, and after each test
///   pass every test_metrics() entry as test/<name>, at step = trainer.cur_step() (the iterations
///   done), so an epoch's point sits on its last iteration. A per-epoch name whose tag is already
///   written per step (loss, lr) becomes train/epoch_<name>, so the two series never share a tag.
/// The file is flushed after each pass, so TensorBoard sees whole epochs while training runs.
class TensorboardHook : public Hook {
 public:
  explicit TensorboardHook(std::string log_dir, int64_t step_interval = 1, int priority = 10);
  std::string name() const override { return "TensorboardHook"; }
  void before_train(Trainer& trainer) override;
  void before_train_iter(Trainer& trainer) override;
  void after_train_iter(Trainer& trainer, const Tensor& output, const Tensor& target, const Tensor& loss) override;
  void after_train_epoch(Trainer& trainer) override;
  void after_test_epoch(Trainer& trainer) override;
  void after_train(Trainer& trainer) override;

  /// The event file of the current (or last) fit(); empty before the first.
  const std::string& event_file() const { return event_file_; }

 private:
  std::string log_dir_;
  int64_t step_interval_;
  std::unique_ptr<EventFileWriter> writer_;
  std::string event_file_;
  std::optional<double> iter_lr_;
};

/// Prints "step 20 | epoch 1/3 | loss=0.693147 lr=0.1" to `out` (stdout by default) after every
/// `interval`-th optimizer update (micro-steps of an accumulation window do not count; step is
/// Engine::num_updates()). loss is the mean of the iteration losses since the previous line and lr
/// the first param group's lr the update used (Colossal-AI's LogMetricByStepHook).
class LogMetricByStepHook : public Hook {
 public:
  explicit LogMetricByStepHook(std::ostream* out = nullptr, int64_t interval = 1, int priority = 10);
  std::string name() const override { return "LogMetricByStepHook"; }
  void before_train_epoch(Trainer& trainer) override;
  void before_train_iter(Trainer& trainer) override;
  void after_train_iter(Trainer& trainer, const Tensor& output, const Tensor& target, const Tensor& loss) override;

 private:
  std::ostream* out_;
  int64_t interval_;
  DeviceLossSum losses_;  // read at each log line, not at each step
  std::optional<double> iter_lr_;
};

/// Host memory of this process from /proc/self/status, in bytes; unset where not readable.
struct HostMemory {
  std::optional<int64_t> rss_bytes;       ///< VmRSS: resident now
  std::optional<int64_t> peak_rss_bytes;  ///< VmHWM: highest resident so far
};
HostMemory read_host_memory();

/// The model states this rank holds, as the ZeRO paper counts them (no activations, no buffers):
/// under ZeRO its handler's count (parallel::zero::ZeroHandler::model_state_bytes); otherwise the
/// parameters and optimizer buffers as held, gradients as large as the parameters (what backward
/// fills) and the mixed-precision wrapper's fp32 masters (naive, bf16).
parallel::zero::ModelStateBytes model_state_bytes(Engine& engine);

/// Reports memory at before_train (a baseline line) and after each training pass, as Colossal-AI's
/// LogMemoryByEpochHook: host RSS and its high-water mark and, in a CUDA build with a GPU, the
/// caching allocator's allocated, reserved and peak-allocated bytes on the current device. After
/// each pass it publishes, in MiB, train_metrics()["host_rss_mib"], ["host_peak_rss_mib"] and with
/// CUDA ["cuda_allocated_mib"], ["cuda_reserved_mib"], ["cuda_peak_allocated_mib"], and prints
///   "Epoch 1/3 | memory | host_rss=512.0MiB host_peak_rss=530.2MiB cuda:0 allocated=... reserved=... peak=..."
/// to `out` (stdout by default), followed by this rank's model states (model_state_bytes:
/// " model_states=...MiB (parameters=... gradients=... masters=... optimizer=...)", published as
/// ["model_states_mib"], ["model_parameters_mib"], ["model_gradients_mib"], ["model_masters_mib"],
/// ["model_optimizer_mib"]). The peak is not reset, so it is the run's peak so far.
class LogMemoryHook : public Hook {
 public:
  explicit LogMemoryHook(std::ostream* out = nullptr, int priority = 5);
  std::string name() const override { return "LogMemoryHook"; }
  void before_train(Trainer& trainer) override;
  void after_train_epoch(Trainer& trainer) override;

 private:
  std::ostream* out_;
};

/// Wall time of every pass (Colossal-AI's LogTimingByEpochHook): after a training pass
/// train_metrics()["epoch_time_s"] and ["iter_time_s"] (the mean per iteration), after a test pass
/// the same keys in test_metrics(), each also printed to `out` (stdout by default) as
///   "Epoch 1/3 | train | time 12.345s, 41.15ms/iter over 300 iters"
/// and "Training took 123.4s" at after_train. In a CUDA build with a GPU the current device is
/// synchronised before each clock reading, so queued kernels count in the epoch that queued them.
class LogTimingHook : public Hook {
 public:
  explicit LogTimingHook(std::ostream* out = nullptr, int priority = 5);
  std::string name() const override { return "LogTimingHook"; }
  void before_train(Trainer& trainer) override;
  void before_train_epoch(Trainer& trainer) override;
  void after_train_iter(Trainer& trainer, const Tensor& output, const Tensor& target, const Tensor& loss) override;
  void after_train_epoch(Trainer& trainer) override;
  void before_test_epoch(Trainer& trainer) override;
  void after_test_iter(Trainer& trainer, const Tensor& output, const Tensor& target, const Tensor& loss) override;
  void after_test_epoch(Trainer& trainer) override;
  void after_train(Trainer& trainer) override;

 private:
  std::ostream* out_;
  std::chrono::steady_clock::time_point train_start_, epoch_start_;
  int64_t iterations_ = 0;
};

}  // namespace colossal::engine
