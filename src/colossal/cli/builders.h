// Builders of a training run's pieces from a TrainConfig (config/train_config.h): datasets with
// their transforms, the model, the optimizer and the LR scheduler. Each checks the config keys it
// reads (model.options, data.options, ...) and throws colossal::Error naming the key of anything
// it cannot build.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "colossal/config/train_config.h"
#include "colossal/core/random.h"  // Generator
#include "colossal/core/tensor.h"
#include "colossal/data/dataset.h"
#include "colossal/data/sampler.h"
#include "colossal/data/batch.h"  // BatchTransform
#include "colossal/engine/engine.h"  // Criterion
#include "colossal/nn/module.h"
#include "colossal/optim/lr_scheduler.h"
#include "colossal/optim/optimizer.h"

namespace colossal::cli {

/// Throws colossal::Error("train --config: <what>").
[[noreturn]] void unsupported(const std::string& what);

/// The first `limit` indices of another sampler's order (train.max_steps within one epoch).
class TruncatedSampler final : public data::Sampler {
 public:
  TruncatedSampler(std::shared_ptr<data::Sampler> inner, int64_t limit) : inner_(std::move(inner)), limit_(limit) {}
  int64_t size() const override { return std::min(limit_, inner_->size()); }
  std::vector<int64_t> indices() const override;

 private:
  std::shared_ptr<data::Sampler> inner_;
  int64_t limit_;
};

/// The training and (optional) test sets of data.dataset with data.transforms applied, and the
/// image geometry and class count the model is built for.
struct Datasets {
  std::shared_ptr<data::Dataset> train, test;
  int64_t channels = 0, image_size = 0, num_classes = 0;
  /// Applied by the training loader to each collated batch (mixup); null: none.
  std::shared_ptr<const data::BatchTransform> batch_transform;
};

Datasets make_datasets(const config::TrainConfig& c);

/// model.name with model.preset and model.options, sized for `d`; `init` draws the initial
/// weights, `dropout` the dropout masks.
std::shared_ptr<nn::Module> make_model(const config::TrainConfig& c, const Datasets& d, core::Generator& init,
                                       core::Generator& dropout);

/// The training loss: cross-entropy with train.label_smoothing (soft targets when the batches are
/// mixed).
engine::Criterion make_criterion(const config::TrainConfig& c, const Datasets& d);

/// optimizer.* over `params`.
std::shared_ptr<optim::Optimizer> make_optimizer(const config::TrainConfig& c, std::vector<Tensor> params);

/// lr_scheduler.* for a run of `total_steps` optimizer updates, `steps_per_epoch` of them per epoch
/// (for warmup_epochs); null when the learning rate stays constant.
std::shared_ptr<optim::LRScheduler> make_scheduler(const config::TrainConfig& c, optim::Optimizer& opt,
                                                   int64_t total_steps, int64_t steps_per_epoch);

}  // namespace colossal::cli
