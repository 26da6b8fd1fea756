// The stock hooks: see hooks.h.
#include "colossal/engine/hooks.h"

#include <algorithm>
#include <cmath>
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

void ThroughputHook::after_train_iter(Trainer&, const Tensor& output, const Tensor&, const Tensor&) {
  if (output.defined() && output.dim() > 0) samples_ += output.size(0);
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
  file_ = std::ofstream(path_, std::ios::out | (append_ ? std::ios::app : std::ios::trunc));
  COLOSSAL_CHECK(file_.good(), "MetricsJsonlHook: cannot open '{}' for writing", path_);
  start_ = std::chrono::steady_clock::now();
  first_step_ = trainer.cur_step();
  epochs_written_ = 0;
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
  nlohmann::json line = {{"event", "step"},
                         {"epoch", trainer.cur_epoch()},
                         {"step", step},
                         {"loss", loss.item<double>()},
                         {"lr", std::isnan(iter_lr_) ? nlohmann::json(nullptr) : nlohmann::json(iter_lr_)}};
  Engine& engine = trainer.engine();
  if (auto norm = engine.last_grad_norm(); norm && engine.last_step_updated()) line["grad_norm"] = *norm;
  if (engine.amp() != nullptr) {
    line["loss_scale"] = engine.amp()->loss_scale();
    if (engine.last_step_updated()) line["skipped"] = engine.last_step_skipped();
  }
  file_ << line.dump() << '\n' << std::flush;
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
                         {"epoch", trainer.cur_epoch()},
                         {"step", trainer.cur_step()},
                         {"train_loss", metric_or_null(train, "loss")},
                         {"test_loss", metric_or_null(test, "loss")},
                         {"test_accuracy", metric_or_null(test, "accuracy")},
                         {"samples_per_s", metric_or_null(train, "throughput")}};
  if (auto it = train.find("lr"); it != train.end()) line["lr"] = it->second;
  file_ << line.dump() << '\n' << std::flush;
  ++epochs_written_;

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
  nlohmann::json summary = {{"event", "summary"},
                            {"epochs", epochs_written_},
                            {"steps", trainer.cur_step()},
                            {"steps_this_run", trainer.cur_step() - first_step_},
                            {"train_loss", optional_or_null(final_train_loss_)},
                            {"test_loss", optional_or_null(final_test_loss_)},
                            {"test_accuracy", optional_or_null(final_test_accuracy_)},
                            {"best_test_accuracy", optional_or_null(best_test_accuracy_)},
                            {"samples_per_s", mean_throughput},
                            {"wall_s", seconds_since(start_)}};
  file_ << summary.dump() << '\n' << std::flush;
  file_.close();
}

}  // namespace colossal::engine
