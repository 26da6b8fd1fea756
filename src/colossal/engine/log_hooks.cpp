// The logging hooks: see log_hooks.h.
#include "colossal/engine/log_hooks.h"

#include <fstream>
#include <iostream>
#include <sstream>
#include <utility>

#include <fmt/core.h>

#include "colossal/core/allocator.h"    // memory_stats
#include "colossal/core/cuda_device.h"  // is_available, current_device, synchronize
#include "colossal/core/error.h"        // COLOSSAL_CHECK
#include "colossal/engine/trainer.h"

namespace colossal::engine {
namespace {

constexpr double kBytesPerMib = 1024.0 * 1024.0;

double seconds_since(std::chrono::steady_clock::time_point start) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
}

// The lr of the optimizer's first param group now, as LRSchedulerHook reports it; unset without groups.
std::optional<double> current_lr(Trainer& trainer) {
  const auto& groups = trainer.engine().optimizer().param_groups();
  if (groups.empty()) return std::nullopt;
  return groups.front().lr();
}

std::string epoch_prefix(const Trainer& trainer, const char* phase) {
  return fmt::format("Epoch {}/{} | {} |", trainer.cur_epoch() + 1, trainer.max_epochs(), phase);
}

// Clock readings see the GPU work queued before them only once the device has drained.
void synchronize_gpu() {
  if (core::cuda::is_available()) core::cuda::synchronize(core::cuda_device(core::cuda::current_device()));
}

}  // namespace

// ---- TensorboardHook

TensorboardHook::TensorboardHook(std::string log_dir, int64_t step_interval, int priority)
    : Hook(priority), log_dir_(std::move(log_dir)), step_interval_(step_interval) {
  COLOSSAL_CHECK(!log_dir_.empty(), "TensorboardHook needs a log directory");
  COLOSSAL_CHECK(step_interval_ >= 0, "TensorboardHook: step_interval must be >= 0 (0: no per-step scalars), got {}",
                 step_interval_);
}

void TensorboardHook::before_train(Trainer&) {
  writer_ = std::make_unique<EventFileWriter>(log_dir_);
  event_file_ = writer_->path();
}

void TensorboardHook::before_train_iter(Trainer& trainer) {
  // Read before the step: the update (or a by-step scheduler hook after it) moves the lr on.
  iter_lr_ = current_lr(trainer);
}

void TensorboardHook::after_train_iter(Trainer& trainer, const Tensor&, const Tensor&, const Tensor& loss) {
  // cur_step() advances after this hook point, so this iteration is number cur_step() + 1.
  const int64_t step = trainer.cur_step() + 1;
  if (!writer_ || step_interval_ == 0 || step % step_interval_ != 0) return;
  if (loss.defined()) writer_->add_scalar("train/loss", loss.item<double>(), step);
  if (iter_lr_) writer_->add_scalar("train/lr", *iter_lr_, step);
  const Engine& engine = trainer.engine();
  if (engine.last_step_updated() && engine.last_grad_norm()) {
    writer_->add_scalar("train/grad_norm", *engine.last_grad_norm(), step);
  }
}

void TensorboardHook::after_train_epoch(Trainer& trainer) {
  if (!writer_) return;
  for (const auto& [key, value] : trainer.train_metrics()) {
    const bool written_per_step = step_interval_ > 0 && (key == "loss" || key == "lr" || key == "grad_norm");
    writer_->add_scalar(written_per_step ? "train/epoch_" + key : "train/" + key, value, trainer.cur_step());
  }
  writer_->flush();
}

void TensorboardHook::after_test_epoch(Trainer& trainer) {
  if (!writer_) return;
  for (const auto& [key, value] : trainer.test_metrics()) writer_->add_scalar("test/" + key, value, trainer.cur_step());
  writer_->flush();
}

void TensorboardHook::after_train(Trainer&) {
  if (!writer_) return;
  writer_->close();
  writer_.reset();
}

// ---- LogMetricByStepHook

LogMetricByStepHook::LogMetricByStepHook(std::ostream* out, int64_t interval, int priority)
    : Hook(priority), out_(out != nullptr ? out : &std::cout), interval_(interval) {
  COLOSSAL_CHECK(interval_ >= 1, "LogMetricByStepHook: interval must be >= 1, got {}", interval_);
}

void LogMetricByStepHook::before_train_epoch(Trainer&) {
  // The Trainer drops a window left open at the end of an epoch, so its losses go with it.
  losses_.reset();
}

void LogMetricByStepHook::before_train_iter(Trainer& trainer) {
  iter_lr_ = current_lr(trainer);
}

void LogMetricByStepHook::after_train_iter(Trainer& trainer, const Tensor&, const Tensor&, const Tensor& loss) {
  losses_.add(loss);
  const Engine& engine = trainer.engine();
  if (!engine.last_step_updated() || engine.num_updates() % interval_ != 0) return;
  std::string line =
      fmt::format("step {} | epoch {}/{} |", engine.num_updates(), trainer.cur_epoch() + 1, trainer.max_epochs());
  if (losses_.count() > 0) line += fmt::format(" loss={:.6g}", losses_.mean());
  if (iter_lr_) line += fmt::format(" lr={:.6g}", *iter_lr_);
  *out_ << line << '\n' << std::flush;
  losses_.reset();
}

// ---- LogMemoryHook

HostMemory read_host_memory() {
  HostMemory memory;
  std::ifstream status("/proc/self/status");
  std::string line;
  while (std::getline(status, line)) {
    // Lines read "VmRSS:\t  123456 kB".
    std::istringstream fields(line);
    std::string key, unit;
    int64_t value = 0;
    if (!(fields >> key >> value >> unit) || unit != "kB") continue;
    if (key == "VmRSS:") memory.rss_bytes = value * 1024;
    if (key == "VmHWM:") memory.peak_rss_bytes = value * 1024;
  }
  return memory;
}

LogMemoryHook::LogMemoryHook(std::ostream* out, int priority)
    : Hook(priority), out_(out != nullptr ? out : &std::cout) {}

namespace {
// Appends " <label>=<MiB>MiB" to `line` and, when `metrics` is given, publishes metrics[key].
void report_mib(std::string& line, MetricTable* metrics, const char* label, const char* key, double bytes) {
  const double mib = bytes / kBytesPerMib;
  line += fmt::format(" {}={:.1f}MiB", label, mib);
  if (metrics != nullptr) (*metrics)[key] = mib;
}

std::string memory_line(MetricTable* metrics) {
  std::string line;
  const HostMemory host = read_host_memory();
  if (host.rss_bytes) report_mib(line, metrics, "host_rss", "host_rss_mib", static_cast<double>(*host.rss_bytes));
  if (host.peak_rss_bytes) {
    report_mib(line, metrics, "host_peak_rss", "host_peak_rss_mib", static_cast<double>(*host.peak_rss_bytes));
  }
  if (core::cuda::is_available()) {
    const core::Device device = core::cuda_device(core::cuda::current_device());
    const core::MemoryStats stats = core::memory_stats(device);
    line += fmt::format(" {}", device.str());
    report_mib(line, metrics, "allocated", "cuda_allocated_mib", static_cast<double>(stats.allocated_bytes));
    report_mib(line, metrics, "reserved", "cuda_reserved_mib", static_cast<double>(stats.reserved_bytes));
    report_mib(line, metrics, "peak", "cuda_peak_allocated_mib", static_cast<double>(stats.peak_allocated_bytes));
  }
  return line;
}
}  // namespace

void LogMemoryHook::before_train(Trainer&) {
  *out_ << "Before training | memory |" << memory_line(nullptr) << '\n' << std::flush;
}

parallel::zero::ModelStateBytes model_state_bytes(Engine& engine) {
  if (parallel::zero::ZeroHandler* zero = engine.zero()) return zero->model_state_bytes();
  parallel::zero::ModelStateBytes bytes;
  for (const Tensor& param : engine.model().parameters()) {
    bytes.parameters += static_cast<int64_t>(param.nbytes());
    if (param.requires_grad()) bytes.gradients += static_cast<int64_t>(param.nbytes());
  }
  const optim::Optimizer& optimizer = engine.optimizer();
  for (size_t g = 0; g < optimizer.param_groups().size(); ++g) {
    for (size_t i = 0; i < optimizer.param_groups()[g].params.size(); ++i) {
      if (const optim::ParamState* state = optimizer.find_state(g, i)) {
        for (const auto& [name, buffer] : state->buffers)
          bytes.optimizer_states += static_cast<int64_t>(buffer.nbytes());
      }
    }
  }
  if (amp::MixedPrecisionOptimizer* amp = engine.amp(); amp != nullptr && amp->mode() != amp::AmpMode::torch) {
    for (const Tensor& master : amp->master_params()) bytes.master_weights += static_cast<int64_t>(master.nbytes());
  }
  return bytes;
}

void LogMemoryHook::after_train_epoch(Trainer& trainer) {
  MetricTable& metrics = trainer.train_metrics();
  std::string line = memory_line(&metrics);
  const parallel::zero::ModelStateBytes states = model_state_bytes(trainer.engine());
  const auto mib = [](int64_t bytes) { return static_cast<double>(bytes) / kBytesPerMib; };
  metrics["model_states_mib"] = mib(states.total());
  metrics["model_parameters_mib"] = mib(states.parameters);
  metrics["model_gradients_mib"] = mib(states.gradients);
  metrics["model_masters_mib"] = mib(states.master_weights);
  metrics["model_optimizer_mib"] = mib(states.optimizer_states);
  line += fmt::format(
      " model_states={:.1f}MiB (parameters={:.1f}MiB gradients={:.1f}MiB masters={:.1f}MiB optimizer={:.1f}MiB)",
      mib(states.total()), mib(states.parameters), mib(states.gradients), mib(states.master_weights),
      mib(states.optimizer_states));
  // ZeRO's optimizer offload: the masters and moments on the host, apart from the device's states.
  if (parallel::zero::ZeroHandler* zero = trainer.engine().zero(); zero != nullptr && zero->offloads_optimizer()) {
    metrics["model_host_mib"] = mib(zero->host_bytes());
    metrics["model_pinned_host_mib"] = mib(zero->pinned_host_bytes());
    line += fmt::format(" host={:.1f}MiB (pinned={:.1f}MiB)", mib(zero->host_bytes()), mib(zero->pinned_host_bytes()));
  }
  *out_ << epoch_prefix(trainer, "memory") << line << '\n' << std::flush;
}

// ---- LogTimingHook

LogTimingHook::LogTimingHook(std::ostream* out, int priority)
    : Hook(priority), out_(out != nullptr ? out : &std::cout) {}

namespace {
void publish_timing(std::ostream& out, const Trainer& trainer, const char* phase, MetricTable& metrics, double seconds,
                    int64_t iterations) {
  metrics["epoch_time_s"] = seconds;
  std::string line = fmt::format("{} time {:.3f}s", epoch_prefix(trainer, phase), seconds);
  if (iterations > 0) {
    const double per_iteration = seconds / static_cast<double>(iterations);
    metrics["iter_time_s"] = per_iteration;
    line += fmt::format(", {:.2f}ms/iter over {} iters", 1e3 * per_iteration, iterations);
  }
  out << line << '\n' << std::flush;
}
}  // namespace

void LogTimingHook::before_train(Trainer&) {
  synchronize_gpu();
  train_start_ = std::chrono::steady_clock::now();
}

void LogTimingHook::before_train_epoch(Trainer&) {
  synchronize_gpu();
  iterations_ = 0;
  epoch_start_ = std::chrono::steady_clock::now();
}

void LogTimingHook::after_train_iter(Trainer&, const Tensor&, const Tensor&, const Tensor&) {
  ++iterations_;
}

void LogTimingHook::after_train_epoch(Trainer& trainer) {
  synchronize_gpu();
  publish_timing(*out_, trainer, "train", trainer.train_metrics(), seconds_since(epoch_start_), iterations_);
}

void LogTimingHook::before_test_epoch(Trainer&) {
  synchronize_gpu();
  iterations_ = 0;
  epoch_start_ = std::chrono::steady_clock::now();
}

void LogTimingHook::after_test_iter(Trainer&, const Tensor&, const Tensor&, const Tensor&) {
  ++iterations_;
}

void LogTimingHook::after_test_epoch(Trainer& trainer) {
  synchronize_gpu();
  publish_timing(*out_, trainer, "test", trainer.test_metrics(), seconds_since(epoch_start_), iterations_);
}

void LogTimingHook::after_train(Trainer&) {
  synchronize_gpu();
  *out_ << fmt::format("Training took {:.3f}s", seconds_since(train_start_)) << '\n' << std::flush;
}

}  // namespace colossal::engine
