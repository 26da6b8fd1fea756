// train_from_config: see train_command.h. Everything the config asks for that this path cannot do
// yet fails before training with a message naming the key.
#include "colossal/cli/train_command.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "colossal/amp/mixed_precision_optimizer.h"
#include "colossal/cli/builders.h"
#include "colossal/comm/bootstrap.h"
#include "colossal/comm/init.h"
#include "colossal/comm/process_group.h"
#include "colossal/config/train_config.h"
#include "colossal/core/build_config.h"  // COLOSSAL_WITH_CUDA
#include "colossal/core/cuda_device.h"   // is_available
#include "colossal/core/error.h"
#include "colossal/data/data_loader.h"
#include "colossal/data/sampler.h"
#include "colossal/engine/checkpoint.h"
#include "colossal/engine/engine.h"
#include "colossal/engine/hooks.h"
#include "colossal/engine/log_hooks.h"
#include "colossal/engine/trainer.h"
#include "colossal/nn/hub_weights.h"
#include "colossal/ops/nn_functional.h"
#include "colossal/parallel/parallel_context.h"

namespace colossal::cli {
namespace {

using config::TrainConfig;

void reject_unsupported(const TrainConfig& c) {
  if (c.parallel.pipeline > 1 || c.parallel.tensor.size > 1) {
    unsupported(
        "parallel.pipeline and parallel.tensor.size > 1 are not supported by train --config yet (data "
        "parallelism is: parallel.data)");
  }
  if (c.zero.stage > 0) unsupported("zero.stage > 0 is not supported by train --config yet");
}

/// fp16 / bf16 as the Engine's mixed-precision options (amp/mixed_precision_optimizer.h).
std::optional<amp::AmpOptions> make_amp_options(const TrainConfig& c) {
  if (c.bf16) return amp::AmpOptions::for_mode(amp::AmpMode::bf16);
  if (c.fp16.mode == config::AmpMode::kOff) return std::nullopt;
  amp::AmpOptions o =
      amp::AmpOptions::for_mode(c.fp16.mode == config::AmpMode::kTorch ? amp::AmpMode::torch : amp::AmpMode::naive);
  o.scaler.initial_scale = c.fp16.initial_scale;
  o.scaler.growth_factor = c.fp16.growth_factor;
  o.scaler.backoff_factor = c.fp16.backoff_factor;
  o.scaler.hysteresis = c.fp16.hysteresis;
  if (c.fp16.growth_interval > 0) o.scaler.growth_interval = c.fp16.growth_interval;  // 0: the mode's default
  o.scaler.max_scale = c.fp16.max_scale;
  return o;
}

/// The data-parallel world of this run: the processes the launcher started (comm/bootstrap.h), which
/// must be parallel.data of them when that is set. Null for a single process.
std::shared_ptr<comm::ProcessGroup> make_data_parallel_group(const TrainConfig& c) {
  const comm::DistEnv env = comm::read_dist_env();
  if (env.world_size == 1) {
    if (c.parallel.data > 1) {
      unsupported(
          fmt::format("parallel.data = {} needs {} processes, but this is a single process; start them with "
                      "`colossal run --nproc_per_node {} -- colossal train --config ...` (or mpirun, torchrun, "
                      "srun)",
                      c.parallel.data, c.parallel.data, c.parallel.data));
    }
    return nullptr;
  }
  if (c.parallel.data != 0 && c.parallel.data != env.world_size) {
    unsupported(
        fmt::format("parallel.data = {} but {} processes were started ({}); set parallel.data = {} or 0 "
                    "(all of them)",
                    c.parallel.data, env.world_size, env.describe(), env.world_size));
  }
  comm::InitOptions options;
  if (c.train.device == config::DeviceKind::kCpu) options.backend = comm::Backend::mpi;
  // The layout's groups (only the data group is used until pipeline and tensor parallelism land).
  const parallel::ParallelContext context =
      parallel::ParallelContext::create(c.parallel, comm::init_process_group(options, env));
  return context.group(parallel::GroupKind::kData);
}

/// What must agree between a checkpoint and the run resuming from it for the data position to mean
/// the same batches, with the config keys that set each.
std::map<std::string, std::string> resume_invariants(const TrainConfig& c, int64_t train_size, int64_t steps_per_epoch,
                                                     int dp_size) {
  return {{"data.batch_size", std::to_string(c.data.batch_size)},
          {"data.shuffle", c.data.shuffle ? "true" : "false"},
          {"train.seed", std::to_string(c.train.seed)},
          {"gradient_accumulation", std::to_string(c.gradient_accumulation)},
          {"data-parallel ranks", std::to_string(dp_size)},
          {"training set size", std::to_string(train_size)},
          {"steps per epoch", std::to_string(steps_per_epoch)}};
}

}  // namespace

std::string toml_string(const std::string& text) {
  std::string out = "\"";
  for (const char ch : text) {
    if (ch == '"' || ch == '\\') {
      out += '\\';
      out += ch;
    } else if (static_cast<unsigned char>(ch) < 0x20 || ch == 0x7f) {
      out += fmt::format("\\u{:04X}", static_cast<unsigned>(static_cast<unsigned char>(ch)));
    } else {
      out += ch;
    }
  }
  return out + '"';
}

int train_from_config(const std::string& path, const std::vector<std::string>& overrides,
                      const std::string& metrics_path) {
  const TrainConfig c = config::load_config(path, overrides);
  reject_unsupported(c);
  if (c.train.epochs == 0 && c.train.max_steps == 0) unsupported("train.epochs and train.max_steps are both 0");
  const std::shared_ptr<comm::ProcessGroup> dp_group = make_data_parallel_group(c);
  const int dp_rank = dp_group ? dp_group->rank() : 0, dp_size = dp_group ? dp_group->size() : 1;
  // Under data parallelism each rank works where its group's tensors live (its GPU under NCCL).
  const Device device = dp_group ? dp_group->device() : pick_device(c);
  const bool rank0 = dp_rank == 0;

  Datasets d = make_datasets(c);
  const auto seed = static_cast<uint64_t>(c.train.seed);
  core::Generator init(seed), dropout(seed + 7);
  std::shared_ptr<nn::Module> model = make_model(c, d, init, dropout);
  if (!c.model.weights.empty()) {
    const nn::HubImportReport report = nn::import_hub_weights(*model, c.model.weights);
    fmt::print("model.weights: loaded {}{}{}\n", c.model.weights,
               report.stripped_transformer_prefix ? " (names without \"transformer.\")" : "",
               report.dropped.empty() ? "" : fmt::format("; left out {}", fmt::join(report.dropped, ", ")));
  }
  model->to(device);

  // Steps per epoch and the run's length in epochs, with max_steps bounding it.
  const int64_t batch = c.data.batch_size;
  const int64_t n = d.train->size();
  int64_t steps_per_epoch = c.data.drop_last ? n / batch : (n + batch - 1) / batch;  // per rank: see below
  if (steps_per_epoch == 0)
    unsupported(fmt::format("data.batch_size {} exceeds the training set ({} samples)", batch, n));
  const int64_t accum = c.gradient_accumulation;
  int64_t epochs = c.train.epochs;
  std::shared_ptr<data::Sampler> sampler;
  if (dp_group) {
    // data.batch_size is per rank; each rank takes every dp_size-th sample of one shared order.
    sampler =
        std::make_shared<data::DistributedSampler>(n, data::DistributedSamplerOptions{.rank = dp_rank,
                                                                                      .world_size = dp_size,
                                                                                      .shuffle = c.data.shuffle,
                                                                                      .seed = seed,
                                                                                      .drop_last = c.data.drop_last});
    steps_per_epoch = c.data.drop_last ? sampler->size() / batch : (sampler->size() + batch - 1) / batch;
    if (steps_per_epoch == 0) {
      unsupported(fmt::format("data.batch_size {} exceeds a rank's share of the training set ({} of {} samples)", batch,
                              sampler->size(), n));
    }
  } else if (c.data.shuffle) {
    sampler = std::make_shared<data::RandomSampler>(n, seed);
  } else {
    sampler = std::make_shared<data::SequentialSampler>(n);
  }
  if (c.train.max_steps > 0) {
    const int64_t max_iters = c.train.max_steps * accum;
    if (epochs == 0 || max_iters < epochs * steps_per_epoch) {
      epochs = (max_iters + steps_per_epoch - 1) / steps_per_epoch;
      if (epochs == 1 && max_iters < steps_per_epoch) {
        sampler = std::make_shared<TruncatedSampler>(sampler, max_iters * batch);
        steps_per_epoch = max_iters;
      }
    }
  }
  const int64_t total_updates = std::max<int64_t>(1, epochs * steps_per_epoch / accum);

  data::DataLoaderOptions lo;
  lo.batch_size = batch;
  lo.drop_last = c.data.drop_last;
  lo.shuffle = c.data.shuffle;
  lo.seed = seed;
  lo.num_workers = c.data.num_workers;
  if (device.is_cuda()) {
    lo.device = device;  // pinned staging and side-stream copies
  }
  lo.batch_transform = d.batch_transform;
  data::DataLoader train_loader(d.train, lo, sampler);
  std::unique_ptr<data::DataLoader> test_loader;
  if (d.test && d.test->size() > 0 && c.train.test_interval > 0) {
    data::DataLoaderOptions to = lo;
    to.shuffle = false;
    to.drop_last = false;
    to.batch_transform = nullptr;
    test_loader = std::make_unique<data::DataLoader>(d.test, to);
  }

  std::shared_ptr<optim::Optimizer> optimizer = make_optimizer(c, model->named_parameters());
  std::shared_ptr<optim::LRScheduler> scheduler =
      make_scheduler(c, *optimizer, total_updates, std::max<int64_t>(1, steps_per_epoch / accum));

  engine::EngineOptions eo;
  eo.gradient_accumulation = accum;
  if (c.clip_grad_norm > 0) eo.clip_grad_norm = c.clip_grad_norm;
  eo.amp = make_amp_options(c);
  // The class-target cross-entropies make_criterion builds compute in f32 from 16-bit logits and
  // return an f32 loss: the f32 copy of the logits would change nothing. Soft (mixup) targets must
  // share the logits' dtype, so those keep the f32 output.
  if (eo.amp && !d.batch_transform) eo.amp->output_to_f32 = false;
  eo.data_parallel_group = dp_group;
  engine::Engine eng(model, optimizer, make_criterion(c, d), eo, scheduler);
  engine::Trainer trainer(eng);

  // Generators that draw after initialisation; checkpoints carry their states.
  const engine::NamedGenerators generators = {{"dropout", &dropout}, {"default", &core::default_generator()}};
  std::map<std::string, std::string> invariants = resume_invariants(c, n, steps_per_epoch, dp_size);
  bool resumed = false;
  if (!c.train.resume_from.empty()) {
    const std::filesystem::path file = engine::find_checkpoint(c.train.resume_from);
    const engine::CheckpointInfo info = engine::load_checkpoint(file, eng, generators);
    for (const auto& [key, value] : invariants) {
      auto it = info.extra.find(key);
      if (it != info.extra.end() && it->second != value) {
        unsupported(
            fmt::format("train.resume_from {}: the checkpoint was written with {} = {}, this run has {}; "
                        "resume with the checkpoint's config",
                        file.string(), key, it->second, value));
      }
    }
    if (info.position.epoch >= epochs) {
      fmt::print("resume: {} is already at epoch {} of {}: nothing left to train\n", file.string(), info.position.epoch,
                 epochs);
    }
    trainer.resume_at(info.position);
    resumed = true;
    fmt::print("resume: {} (epoch {}, batch {} of it, step {}, {} optimizer updates)\n", file.string(),
               info.position.epoch + 1, info.position.iter, info.position.step, info.num_updates);
  }

  // Every rank computes the metrics; rank 0 alone logs, writes files and checkpoints (the replicas
  // are equal). Every rank evaluates the whole test set, so rank 0's test metrics are the full ones.
  std::vector<std::shared_ptr<engine::Hook>> hooks = {std::make_shared<engine::LossHook>(),
                                                      std::make_shared<engine::AccuracyHook>(),
                                                      std::make_shared<engine::ThroughputHook>()};
  if (rank0) {
    hooks.push_back(std::make_shared<engine::LogMetricByEpochHook>());
    hooks.push_back(std::make_shared<engine::LogTimingHook>());
    hooks.push_back(std::make_shared<engine::LogMemoryHook>());
    // With a progress bar the bar shows the running loss; without one, a line every log_interval steps.
    if (!c.train.progress) {
      hooks.push_back(std::make_shared<engine::LogMetricByStepHook>(nullptr, c.train.log_interval));
    }
    if (!metrics_path.empty()) {
      hooks.push_back(std::make_shared<engine::MetricsJsonlHook>(metrics_path, c.train.log_interval, resumed));
    }
    if (!c.train.log_dir.empty()) {
      hooks.push_back(std::make_shared<engine::TensorboardHook>(c.train.log_dir, c.train.log_interval));
    }
    if (!c.train.checkpoint_dir.empty()) {
      invariants["config"] = config::describe(c);
      hooks.push_back(
          std::make_shared<engine::SaveCheckpointHook>(c.train.checkpoint_dir, generators, c.train.checkpoint_interval,
                                                       c.train.checkpoint_steps, invariants, c.train.keep_checkpoints));
    }
  }

  fmt::print(
      "train: {} samples ({} steps/epoch of {}), {} epoch(s), {} optimizer updates; {} lr {}, scheduler {}, "
      "workers {}, device {}{}\n",
      n, steps_per_epoch, batch, epochs, total_updates, config::to_string(c.optimizer.name), c.optimizer.lr,
      config::to_string(c.lr_scheduler.name), c.data.num_workers, device,
      dp_group ? fmt::format(", data parallel: rank {} of {} ({})", dp_rank, dp_size, dp_group->backend_name()) : "");
  std::fflush(stdout);
  const auto start = std::chrono::steady_clock::now();
  trainer.fit(train_loader, epochs, test_loader.get(), std::max<int64_t>(1, c.train.test_interval), hooks,
              c.train.progress && rank0);
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  fmt::print("done: {} steps in {:.1f} s ({:.3f} s/step incl. evaluation)\n", trainer.cur_step(), seconds,
             seconds / static_cast<double>(std::max<int64_t>(1, trainer.cur_step())));
  return 0;
}

}  // namespace colossal::cli
