// The stock hooks: see hooks.h.
#include "colossal/engine/hooks.h"

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstring>  // strerror
#include <iostream>
#include <utility>

#include <fmt/core.h>
#include <nlohmann/json.hpp>

#include "colossal/autograd/grad_mode.h"  // NoGradGuard
#include "colossal/core/error.h"          // COLOSSAL_CHECK
#include "colossal/engine/trainer.h"
#include "colossal/nn/metrics.h"       // topk_correct
#include "colossal/ops/elementwise.h"  // add

namespace colossal::engine {
namespace {

double seconds_since(std::chrono::steady_clock::time_point start) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
}

// The value of `key` in `table` as JSON, null when no hook wrote it.
nlohmann::json metric_or_null(const MetricTable& table, const std::string& key) {
  auto it = table.find(key);
  return it == table.end() ? nlohmann::json(nullptr) : nlohmann::json(it->second);
}

nlohmann::json optional_or_null(const std::optional<double>& value) {
  return value ? nlohmann::json(*value) : nlohmann::json(nullptr);
}

}  // namespace

// ---- LossHook

void DeviceLossSum::add(const Tensor& loss) {
  if (!loss.defined()) return;
  autograd::NoGradGuard no_grad;
  Tensor value = loss.detach();
  if (value.dtype() == DType::f16 || value.dtype() == DType::bf16) value = value.to(DType::f32);
  sum_ = sum_.defined() ? ops::add(sum_, value) : value.clone();
  ++count_;
}

double DeviceLossSum::mean() const {
  if (count_ == 0) return std::nan("");
  return sum_.to(Device{}).item<double>() / static_cast<double>(count_);
}

void DeviceLossSum::reset() {
  sum_ = Tensor();
  count_ = 0;
}

void LossHook::before_train_epoch(Trainer&) {
  train_.reset();
}

void LossHook::after_train_iter(Trainer&, const Tensor&, const Tensor&, const Tensor& loss) {
  train_.add(loss);
}

void LossHook::after_train_epoch(Trainer& trainer) {
  if (train_.count() > 0) trainer.train_metrics()["loss"] = train_.mean();
}

void LossHook::before_test_epoch(Trainer&) {
  test_.reset();
}

void LossHook::after_test_iter(Trainer&, const Tensor&, const Tensor&, const Tensor& loss) {
  test_.add(loss);
}

void LossHook::after_test_epoch(Trainer& trainer) {
  if (test_.count() > 0) trainer.test_metrics()["loss"] = test_.mean();
}

// ---- AccuracyHook

void AccuracyHook::before_test_epoch(Trainer&) {
  correct_ = 0;
  total_ = 0;
}

void AccuracyHook::after_test_iter(Trainer&, const Tensor& output, const Tensor& target, const Tensor&) {
  if (!target.defined()) return;
  const nn::AccuracyCounts counts = nn::topk_correct(output, target, {1}).front();
  correct_ += counts.correct;
  total_ += counts.total;
}

void AccuracyHook::after_test_epoch(Trainer& trainer) {
  if (total_ > 0) trainer.test_metrics()["accuracy"] = static_cast<double>(correct_) / static_cast<double>(total_);
}

// ---- LRSchedulerHook

LRSchedulerHook::LRSchedulerHook(std::shared_ptr<optim::LRScheduler> scheduler, bool by_epoch, int priority)
    : Hook(priority), scheduler_(std::move(scheduler)), by_epoch_(by_epoch) {
  COLOSSAL_CHECK(scheduler_ != nullptr, "LRSchedulerHook needs a scheduler");
}

void LRSchedulerHook::before_train_epoch(Trainer&) {
  const std::vector<double> lrs = scheduler_->last_lr();
  epoch_lr_ = lrs.empty() ? 0.0 : lrs.front();
}

void LRSchedulerHook::after_train_iter(Trainer& trainer, const Tensor&, const Tensor&, const Tensor&) {
  // Per step means per optimizer update: micro-steps inside an accumulation window do not count.
  if (!by_epoch_ && trainer.engine().last_step_updated()) scheduler_->step();
}

void LRSchedulerHook::after_train_epoch(Trainer& trainer) {
  trainer.train_metrics()["lr"] = epoch_lr_;
  if (by_epoch_) scheduler_->step();
}

// ---- ThroughputHook

void ThroughputHook::before_train_epoch(Trainer&) {
  samples_ = 0;
  start_ = std::chrono::steady_clock::now();
}

void ThroughputHook::after_train_iter(Trainer&, const Tensor& output, const Tensor& target, const Tensor&) {
  // The batch's samples: the target's rows where the rank has them (a pipeline's stages before the
  // last have no output), else the output's.
  const Tensor& counted = target.defined() && target.dim() > 0 ? target : output;
  if (counted.defined() && counted.dim() > 0) samples_ += counted.size(0);
}

void ThroughputHook::after_train_epoch(Trainer& trainer) {
  const double seconds = seconds_since(start_);
  trainer.train_metrics()["throughput"] = seconds > 0.0 ? static_cast<double>(samples_) / seconds : 0.0;
}

// ---- LogMetricByEpochHook

LogMetricByEpochHook::LogMetricByEpochHook(std::ostream* out, int priority)
    : Hook(priority), out_(out != nullptr ? out : &std::cout) {}

namespace {
void log_metrics(std::ostream& out, const Trainer& trainer, const char* phase, const MetricTable& metrics) {
  std::string line = fmt::format("Epoch {}/{} | {} |", trainer.cur_epoch() + 1, trainer.max_epochs(), phase);
  for (const auto& [key, value] : metrics) line += fmt::format(" {}={:.6g}", key, value);
  out << line << '\n' << std::flush;
}
}  // namespace

void LogMetricByEpochHook::after_train_epoch(Trainer& trainer) {
  log_metrics(*out_, trainer, "train", trainer.train_metrics());
}

void LogMetricByEpochHook::after_test_epoch(Trainer& trainer) {
  log_metrics(*out_, trainer, "test", trainer.test_metrics());
}

// ---- MetricsJsonlHook

MetricsJsonlHook::MetricsJsonlHook(std::string path, int64_t log_interval, bool append, int priority)
    : Hook(priority), path_(std::move(path)), log_interval_(log_interval), append_(append) {
  COLOSSAL_CHECK(log_interval_ >= 0, "MetricsJsonlHook: log_interval must be >= 0, got {}", log_interval_);
}

void MetricsJsonlHook::before_train(Trainer& trainer) {
  errno = 0;
  file_.reset(std::fopen(path_.c_str(), append_ ? "a" : "w"));
  if (file_ == nullptr) {
    const int error = errno;
    COLOSSAL_FAIL("metrics file '{}': cannot open it for writing: {}; give a writable path", path_,
                  std::strerror(error));
  }
  start_ = std::chrono::steady_clock::now();
  first_step_ = trainer.cur_step();
  epochs_written_ = 0;
  last_epoch_ = 0;
  final_train_loss_.reset();
  final_test_loss_.reset();
  final_test_accuracy_.reset();
  best_test_accuracy_.reset();
  throughput_sum_ = 0.0;
  throughput_count_ = 0;
}

void MetricsJsonlHook::before_train_iter(Trainer& trainer) {
  // The lr this iteration's update uses: an Engine-owned scheduler moves it on inside step().
  const auto& groups = trainer.engine().optimizer().param_groups();
  iter_lr_ = groups.empty() ? std::nan("") : groups[0].options.at("lr");
}

void MetricsJsonlHook::after_train_iter(Trainer& trainer, const Tensor&, const Tensor&, const Tensor& loss) {
  const int64_t step = trainer.cur_step() + 1;
  if (log_interval_ == 0 || step % log_interval_ != 0 || !loss.defined()) return;
  // The loss is read first: reading it waits for the step, so wall_s (seconds since training
  // began) is when the step finished, and differences of wall_s time steady-state steps.
  const double loss_value = loss.item<double>();
  nlohmann::json line = {{"event", "step"},
                         {"epoch", trainer.cur_epoch() + 1},
                         {"step", step},
                         {"loss", loss_value},
                         {"wall_s", seconds_since(start_)},
                         {"lr", std::isnan(iter_lr_) ? nlohmann::json(nullptr) : nlohmann::json(iter_lr_)}};
  Engine& engine = trainer.engine();
  if (auto norm = engine.last_grad_norm(); norm && engine.last_step_updated()) line["grad_norm"] = *norm;
  if (engine.amp() != nullptr) {
    line["loss_scale"] = engine.amp()->loss_scale();
    if (engine.last_step_updated()) line["skipped"] = engine.last_step_skipped();
  }
  write_line(line.dump());
}

void MetricsJsonlHook::after_train_epoch(Trainer& trainer) {
  // An epoch with a test pass is written once that pass has published its metrics.
  if (!trainer.testing_this_epoch()) write_epoch(trainer, false);
}

void MetricsJsonlHook::after_test(Trainer& trainer) {
  write_epoch(trainer, true);
}

void MetricsJsonlHook::write_epoch(Trainer& trainer, bool tested) {
  const MetricTable& train = trainer.train_metrics();
  const MetricTable empty;
  const MetricTable& test = tested ? trainer.test_metrics() : empty;
  nlohmann::json line = {{"event", "epoch"},
                         {"epoch", trainer.cur_epoch() + 1},
                         {"step", trainer.cur_step()},
                         {"train_loss", metric_or_null(train, "loss")},
                         {"test_loss", metric_or_null(test, "loss")},
                         {"test_accuracy", metric_or_null(test, "accuracy")},
                         {"samples_per_s", metric_or_null(train, "throughput")}};
  if (auto it = train.find("lr"); it != train.end()) line["lr"] = it->second;
  write_line(line.dump());
  ++epochs_written_;
  last_epoch_ = trainer.cur_epoch() + 1;

  if (auto it = train.find("loss"); it != train.end()) final_train_loss_ = it->second;
  if (auto it = test.find("loss"); it != test.end()) final_test_loss_ = it->second;
  if (auto it = test.find("accuracy"); it != test.end()) {
    final_test_accuracy_ = it->second;
    best_test_accuracy_ = std::max(best_test_accuracy_.value_or(it->second), it->second);
  }
  if (auto it = train.find("throughput"); it != train.end()) {
    throughput_sum_ += it->second;
    ++throughput_count_;
  }
}

void MetricsJsonlHook::after_train(Trainer& trainer) {
  // Built as JSON directly: routing it through std::optional trips a false -Wmaybe-uninitialized.
  const nlohmann::json mean_throughput = throughput_count_ > 0
                                             ? nlohmann::json(throughput_sum_ / static_cast<double>(throughput_count_))
                                             : nlohmann::json(nullptr);
  // The last epoch trained, numbered as its line; a run that trained none (resumed at its end) is
  // where the loop left cur_epoch(): the epochs completed before it.
  nlohmann::json summary = {{"event", "summary"},
                            {"epochs", epochs_written_ > 0 ? last_epoch_ : trainer.cur_epoch()},
                            {"epochs_this_run", epochs_written_},
                            {"steps", trainer.cur_step()},
                            {"steps_this_run", trainer.cur_step() - first_step_},
                            {"train_loss", optional_or_null(final_train_loss_)},
                            {"test_loss", optional_or_null(final_test_loss_)},
                            {"test_accuracy", optional_or_null(final_test_accuracy_)},
                            {"best_test_accuracy", optional_or_null(best_test_accuracy_)},
                            {"samples_per_s", mean_throughput},
                            {"wall_s", seconds_since(start_)}};
  write_line(summary.dump());
  std::FILE* file = file_.release();
  errno = 0;
  if (file != nullptr && std::fclose(file) != 0) {
    const int error = errno;
    COLOSSAL_FAIL("metrics file '{}': closing it failed: {}; the file may be incomplete", path_, std::strerror(error));
  }
}

void MetricsJsonlHook::write_line(const std::string& line) {
  COLOSSAL_CHECK(file_ != nullptr, "metrics file '{}': written before before_train opened it", path_);
  errno = 0;
  const bool written = std::fwrite(line.data(), 1, line.size(), file_.get()) == line.size() &&
                       std::fputc('\n', file_.get()) != EOF && std::fflush(file_.get()) == 0;
  if (!written) {
    const int error = errno;
    COLOSSAL_FAIL("metrics file '{}': writing failed: {}; free space on its disk or give another path", path_,
                  error != 0 ? std::strerror(error) : "unknown error");
  }
}

// ---- NonFiniteLossHook

// Note [Non-finite losses]
// A NaN or infinite training loss means the weights, the data or the arithmetic have gone wrong;
// without amp the update that follows spreads the NaN into every weight, so every later step, the
// epoch's mean loss and any checkpoint are garbage while the run goes on to exit 0. Reading each
// loss on the host would catch it at once but would make every step wait for the GPU. Instead each
// loss is copied into a device buffer (a copy_ into a slot: one small launch, no wait), and the
// buffer is read where the host waits anyway: at the log interval (the log hooks read the loss
// there), at an epoch's end (LossHook reads the mean), before a checkpoint (which copies the whole
// state to the host) and at the end. The buffer keeps every loss since the last read, so the error
// names the first bad step exactly, not only the interval it fell in.
// fp16 loss scaling (naive and torch modes) makes overflow part of normal training: the scaler
// skips the update and lowers the scale. The loss itself is computed before scaling, though, so a
// non-finite loss means the forward pass overflowed or met NaN weights, which a lower scale does
// not cure; a few such skipped updates are let through (a transient overflow), a long streak is
// not. An applied update after a non-finite loss is an error in every mode.

namespace {

constexpr int64_t kLossChunk = 256;  // losses per device buffer: 1 KiB in f32

const char* non_finite_name(double value) {
  return std::isnan(value) ? "NaN" : (value > 0 ? "+inf" : "-inf");
}

constexpr const char* kNonFiniteAdvice =
    "lower the learning rate (optimizer.lr) or lengthen its warmup, enable gradient clipping (clip_grad_norm), "
    "and check the data and any weights the run started from (model.weights, --resume) for NaN or inf values";

}  // namespace

NonFiniteLossHook::NonFiniteLossHook(int64_t check_interval, int64_t max_skipped_in_a_row, int priority)
    : Hook(priority), check_interval_(check_interval), max_skipped_in_a_row_(max_skipped_in_a_row) {
  COLOSSAL_CHECK(check_interval_ >= 0, "NonFiniteLossHook: check_interval must be >= 0 (0: not by iteration), got {}",
                 check_interval_);
  COLOSSAL_CHECK(max_skipped_in_a_row_ >= 1, "NonFiniteLossHook: max_skipped_in_a_row must be >= 1, got {}",
                 max_skipped_in_a_row_);
}

void NonFiniteLossHook::before_train(Trainer&) {
  chunks_.clear();
  records_.clear();
  pending_.clear();
  skipped_in_a_row_ = 0;
}

void NonFiniteLossHook::after_train_iter(Trainer& trainer, const Tensor&, const Tensor&, const Tensor& loss) {
  Engine& engine = trainer.engine();
  if (loss.defined()) {
    COLOSSAL_CHECK(loss.numel() == 1, "NonFiniteLossHook: the loss must be one value, got shape {}", loss.shape());
    const auto slot = static_cast<int64_t>(records_.size());
    if (slot / kLossChunk == static_cast<int64_t>(chunks_.size())) {
      // f64 losses (CPU reference runs) keep their range; 16-bit ones widen exactly to f32.
      const DType dtype = loss.dtype() == DType::f64 ? DType::f64 : DType::f32;
      chunks_.push_back(core::empty({kLossChunk}, TensorOptions(dtype, loss.device())));
    }
    autograd::NoGradGuard no_grad;
    chunks_[static_cast<size_t>(slot / kLossChunk)].select(0, slot % kLossChunk).copy_(loss.detach().reshape({}));
    records_.push_back({trainer.cur_step() + 1, trainer.cur_epoch() + 1, Outcome::pending, 0.0});
  }
  if (engine.last_step_updated()) {
    // This iteration ended its window: every iteration still pending fed this update.
    const Outcome outcome = engine.last_step_skipped() ? Outcome::skipped : Outcome::applied;
    for (std::vector<Record>* records : {&records_, &pending_}) {
      for (auto it = records->rbegin(); it != records->rend() && it->outcome == Outcome::pending; ++it) {
        it->outcome = outcome;
      }
    }
  }
  if (check_interval_ > 0 && (trainer.cur_step() + 1) % check_interval_ == 0) check(trainer);
}

void NonFiniteLossHook::after_train_epoch(Trainer& trainer) {
  // The Trainer drops a window the epoch left open: its iterations never reach an update.
  for (std::vector<Record>* records : {&records_, &pending_}) {
    for (auto it = records->rbegin(); it != records->rend() && it->outcome == Outcome::pending; ++it) {
      it->outcome = Outcome::dropped;
    }
  }
  check(trainer);
}

void NonFiniteLossHook::after_train(Trainer& trainer) {
  check(trainer);
}

void NonFiniteLossHook::check(Trainer& trainer) {
  std::vector<Record> read = std::move(pending_);
  pending_.clear();
  if (!records_.empty()) {
    // One wait for the device, at a point where the caller waits anyway (see the Note).
    std::vector<double> losses;
    for (size_t c = 0; c * kLossChunk < records_.size(); ++c) {
      const std::vector<double> chunk = chunks_[c].to(core::kCpu).to_vector<double>();
      losses.insert(losses.end(), chunk.begin(), chunk.end());
    }
    for (size_t i = 0; i < records_.size(); ++i) {
      records_[i].loss = losses[i];
      read.push_back(records_[i]);
    }
    records_.clear();
  }
  for (const Record& record : read) {
    if (record.outcome == Outcome::pending && trainer.engine().amp() != nullptr) {
      pending_.push_back(record);  // judged once its window's update says whether it was skipped
      continue;
    }
    judge(trainer, record);
  }
}

void NonFiniteLossHook::judge(Trainer& trainer, const Record& record) {
  const bool finite = std::isfinite(record.loss);
  const bool can_skip = trainer.engine().amp() != nullptr;
  if (can_skip && record.outcome == Outcome::dropped) return;  // never reached the weights
  if (can_skip && record.outcome == Outcome::skipped) {
    // Count skipped windows with a non-finite loss in a row: one per window, at its last iteration
    // (the one whose record comes last); a finite skipped window ends the streak.
    if (!finite) {
      if (++skipped_in_a_row_ >= max_skipped_in_a_row_) {
        COLOSSAL_FAIL(
            "the training loss was non-finite ({}) on {} iterations in a row whose fp16 updates the loss scaler "
            "skipped, the last at step {} (epoch {}/{}); loss scaling cannot cure a loss that overflows before "
            "it is scaled (NaN weights, or a forward pass beyond fp16's range: try bf16 = true). The run stops "
            "here without saving this state. Otherwise {}",
            non_finite_name(record.loss), skipped_in_a_row_, record.step, record.epoch, trainer.max_epochs(),
            kNonFiniteAdvice);
      }
    } else {
      skipped_in_a_row_ = 0;
    }
    return;
  }
  if (finite) {
    skipped_in_a_row_ = 0;
    return;
  }
  COLOSSAL_FAIL(
      "the training loss became {} at step {} (epoch {}/{}){}; the run stops here and saves no checkpoint of "
      "this state. To fix it, {}",
      non_finite_name(record.loss), record.step, record.epoch, trainer.max_epochs(),
      can_skip ? " on an update the fp16 loss scaler did not skip" : "", kNonFiniteAdvice);
}

}  // namespace colossal::engine
