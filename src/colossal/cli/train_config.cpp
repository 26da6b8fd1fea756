// train_from_config: see train_config.h. Everything the config asks for that this path cannot do
// yet fails before training with a message naming the key.
#include "colossal/cli/train_config.h"

#include <fmt/format.h>

#include <algorithm>
#include <chrono>
#include <memory>
#include <string>
#include <vector>

#include "colossal/cli/builders.h"
#include "colossal/config/train_config.h"
#include "colossal/core/error.h"
#include "colossal/data/data_loader.h"
#include "colossal/data/sampler.h"
#include "colossal/engine/engine.h"
#include "colossal/engine/hooks.h"
#include "colossal/engine/trainer.h"
#include "colossal/ops/nn_functional.h"

namespace colossal::cli {
namespace {

using config::TrainConfig;

void reject_unsupported(const TrainConfig& c) {
  if (c.parallel.pipeline > 1 || c.parallel.tensor.size > 1 || c.parallel.data > 1) {
    unsupported(
        "parallel.* (pipeline, tensor, data > 1) needs the distributed launcher; train --config runs one process");
  }
  if (c.fp16.mode != config::AmpMode::kOff)
    unsupported("fp16.mode other than \"off\" is not supported by train --config yet");
  if (c.bf16) unsupported("bf16 = true is not supported by train --config yet");
  if (c.zero.stage > 0) unsupported("zero.stage > 0 is not supported by train --config yet");
  if (!c.train.checkpoint_dir.empty())
    unsupported("train.checkpoint_dir: checkpointing is not supported by train --config yet");
  if (!c.train.resume_from.empty()) unsupported("train.resume_from: resuming is not supported by train --config yet");
  if (c.train.device == config::DeviceKind::kCuda) {
    unsupported("train.device = \"cuda\": train --config runs on the CPU only for now (use \"cpu\" or \"auto\")");
  }
}

}  // namespace

int train_from_config(const std::string& path, const std::vector<std::string>& overrides,
                      const std::string& metrics_path) {
  const TrainConfig c = config::load_config(path, overrides);
  reject_unsupported(c);
  if (c.train.epochs == 0 && c.train.max_steps == 0) unsupported("train.epochs and train.max_steps are both 0");

  Datasets d = make_datasets(c);
  const auto seed = static_cast<uint64_t>(c.train.seed);
  core::Generator init(seed), dropout(seed + 7);
  std::shared_ptr<nn::Module> model = make_model(c, d, init, dropout);

  // Steps per epoch and the run's length in epochs, with max_steps bounding it.
  const int64_t batch = c.data.batch_size;
  const int64_t n = d.train->size();
  int64_t steps_per_epoch = c.data.drop_last ? n / batch : (n + batch - 1) / batch;
  if (steps_per_epoch == 0)
    unsupported(fmt::format("data.batch_size {} exceeds the training set ({} samples)", batch, n));
  const int64_t accum = c.gradient_accumulation;
  int64_t epochs = c.train.epochs;
  std::shared_ptr<data::Sampler> sampler;
  if (c.data.shuffle) {
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
  lo.pin_memory = false;  // CPU only
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

  std::shared_ptr<optim::Optimizer> optimizer = make_optimizer(c, model->parameters());
  std::shared_ptr<optim::LRScheduler> scheduler =
      make_scheduler(c, *optimizer, total_updates, std::max<int64_t>(1, steps_per_epoch / accum));

  engine::EngineOptions eo;
  eo.gradient_accumulation = accum;
  if (c.clip_grad_norm > 0) eo.clip_grad_norm = c.clip_grad_norm;
  engine::Engine eng(model, optimizer, make_criterion(c, d), eo, scheduler);

  std::vector<std::shared_ptr<engine::Hook>> hooks = {
      std::make_shared<engine::LossHook>(), std::make_shared<engine::AccuracyHook>(),
      std::make_shared<engine::ThroughputHook>(), std::make_shared<engine::LogMetricByEpochHook>()};
  if (!metrics_path.empty()) hooks.push_back(std::make_shared<engine::MetricsJsonlHook>(metrics_path));

  fmt::print(
      "train: {} samples ({} steps/epoch of {}), {} epoch(s), {} optimizer updates; {} lr {}, scheduler {}, "
      "workers {}\n",
      n, steps_per_epoch, batch, epochs, total_updates, config::to_string(c.optimizer.name), c.optimizer.lr,
      config::to_string(c.lr_scheduler.name), c.data.num_workers);
  const auto start = std::chrono::steady_clock::now();
  engine::Trainer trainer(eng);
  trainer.fit(train_loader, epochs, test_loader.get(), std::max<int64_t>(1, c.train.test_interval), hooks,
              /*display_progress=*/false);
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  fmt::print("done: {} steps in {:.1f} s ({:.3f} s/step incl. evaluation)\n", trainer.cur_step(), seconds,
             seconds / static_cast<double>(std::max<int64_t>(1, trainer.cur_step())));
  return 0;
}

}  // namespace colossal::cli
