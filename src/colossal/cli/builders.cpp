// Builders of a training run's pieces from a TrainConfig: see builders.h.
#include "colossal/cli/builders.h"

#include <fmt/format.h>

#include <algorithm>
#include <chrono>
#include <memory>
#include <string>
#include <vector>

#include "colossal/config/train_config.h"
#include "colossal/core/build_config.h"  // COLOSSAL_WITH_CUDA
#include "colossal/core/error.h"
#include "colossal/data/cifar10.h"
#include "colossal/data/data_loader.h"
#include "colossal/data/dataset.h"
#include "colossal/data/mnist.h"
#include "colossal/data/sampler.h"
#include "colossal/data/synthetic.h"
#include "colossal/data/transform.h"
#include "colossal/data/transforms.h"
#include "colossal/engine/engine.h"
#include "colossal/engine/hooks.h"
#include "colossal/engine/trainer.h"
#include "colossal/nn/models/vit.h"
#include "colossal/ops/nn_functional.h"
#include "colossal/optim/adam.h"
#include "colossal/optim/lamb.h"
#include "colossal/optim/lars.h"
#include "colossal/optim/lr_scheduler.h"
#include "colossal/optim/sgd.h"

namespace colossal::cli {

using config::TrainConfig;

[[noreturn]] void unsupported(const std::string& what) {
  throw Error(fmt::format("train --config: {}", what));
}

std::vector<int64_t> TruncatedSampler::indices() const {
  inner_->set_epoch(epoch());
  std::vector<int64_t> all = inner_->indices();
  all.resize(static_cast<size_t>(size()));
  return all;
}

Datasets make_datasets(const TrainConfig& c) {
  Datasets d;
  const config::OptionTable& opt = c.data.options;
  std::vector<std::shared_ptr<const data::Transform>> transforms;
  bool u8_images = true;
  std::vector<double> mean, std;
  switch (c.data.dataset) {
    case config::DatasetName::kSynthetic: {
      opt.reject_unknown({"size", "test_size", "image_size", "channels", "num_classes"});
      data::SyntheticImageOptions so;
      so.size = opt.get_int("size", 1024, 1);
      d.image_size = opt.get_int("image_size", 28, 1);
      d.channels = opt.get_int("channels", 1, 1);
      d.num_classes = opt.get_int("num_classes", 10, 2);
      so.image_shape = {d.channels, d.image_size, d.image_size};
      so.num_classes = d.num_classes;
      so.seed = static_cast<uint64_t>(c.train.seed);
      d.train = std::make_shared<data::SyntheticImageDataset>(so);
      so.size = opt.get_int("test_size", 256, 0);
      so.seed += 1;
      if (so.size > 0) d.test = std::make_shared<data::SyntheticImageDataset>(so);
      u8_images = false;
      break;
    }
    case config::DatasetName::kMnist:
    case config::DatasetName::kFashionMnist: {
      opt.reject_unknown({"normalize_mean", "normalize_std"});
      std::string dir = c.data.path;
      if (dir.empty() && c.data.dataset == config::DatasetName::kFashionMnist) {
        if (auto found = data::find_fashion_mnist()) dir = *found;
      }
      if (dir.empty()) {
        unsupported(
            fmt::format("data.path is empty and data.dataset = \"{}\" has no default location (fashion_mnist: set "
                        "$COLOSSAL_FASHION_MNIST_DIR or install Debian's dataset-fashion-mnist)",
                        config::to_string(c.data.dataset)));
      }
      d.train = std::make_shared<data::MnistDataset>(dir, data::Split::train);
      d.test =
          std::make_shared<data::MnistDataset>(c.data.test_path.empty() ? dir : c.data.test_path, data::Split::test);
      d.channels = 1;
      d.image_size = 28;
      d.num_classes = data::MnistDataset::kNumClasses;
      const bool fashion = c.data.dataset == config::DatasetName::kFashionMnist;
      mean = {opt.get_double("normalize_mean", fashion ? 0.2860 : 0.1307)};
      std = {opt.get_double("normalize_std", fashion ? 0.3530 : 0.3081, 1e-12)};
      break;
    }
    case config::DatasetName::kCifar10: {
      opt.reject_unknown({});
      if (c.data.path.empty())
        unsupported("data.path must name the CIFAR-10 binary folder for data.dataset = \"cifar10\"");
      d.train = std::make_shared<data::Cifar10Dataset>(c.data.path, data::Split::train);
      d.test = std::make_shared<data::Cifar10Dataset>(c.data.test_path.empty() ? c.data.path : c.data.test_path,
                                                      data::Split::test);
      d.channels = 3;
      d.image_size = 32;
      d.num_classes = data::Cifar10Dataset::kNumClasses;
      mean = {0.4914, 0.4822, 0.4465};
      std = {0.2470, 0.2435, 0.2616};
      break;
    }
    case config::DatasetName::kTokens:
      unsupported("data.dataset = \"tokens\" (language modelling) is not supported by train --config yet");
  }
  bool normalize = false;
  for (const std::string& t : c.data.transforms) {
    if (t != "normalize") {
      unsupported(
          fmt::format("data.transforms entry \"{}\" is not supported by train --config yet (only \"normalize\")", t));
    }
    if (!u8_images) unsupported("data.transforms \"normalize\" does not apply to data.dataset = \"synthetic\"");
    normalize = true;
  }
  if (u8_images) {
    transforms.push_back(std::make_shared<data::ToTensor>());
    if (normalize) transforms.push_back(std::make_shared<data::Normalize>(mean, std));
    auto compose = std::make_shared<data::Compose>(transforms);
    const auto seed = static_cast<uint64_t>(c.train.seed);
    d.train = std::make_shared<data::TransformDataset>(d.train, compose, seed);
    if (d.test) d.test = std::make_shared<data::TransformDataset>(d.test, compose, seed + 1);
  }
  return d;
}

std::shared_ptr<nn::Module> make_model(const TrainConfig& c, const Datasets& d, core::Generator& init,
                                       core::Generator& dropout) {
  const config::OptionTable& o = c.model.options;
  switch (c.model.name) {
    case config::ModelName::kVit: {
      nn::models::ViTConfig v;
      const std::string& p = c.model.preset;
      if (p.empty() || p == "vit_tiny_patch4_28") {
        v = nn::models::ViTConfig::vit_tiny_patch4_28(d.num_classes);
      } else if (p == "vit_tiny_patch4_32") {
        v = nn::models::ViTConfig::vit_tiny_patch4_32(d.num_classes);
      } else if (p == "vit_tiny_patch16_224") {
        v = nn::models::ViTConfig::vit_tiny_patch16_224(d.num_classes);
      } else if (p == "vit_small_patch16_224") {
        v = nn::models::ViTConfig::vit_small_patch16_224(d.num_classes);
      } else if (p == "vit_base_patch16_224") {
        v = nn::models::ViTConfig::vit_base_patch16_224(d.num_classes);
      } else {
        v = nn::models::ViTConfig::vit_large_patch16_224(d.num_classes);
      }
      o.reject_unknown({"img_size", "patch_size", "in_chans", "num_classes", "embed_dim", "depth", "num_heads",
                        "mlp_ratio", "qkv_bias", "dropout", "drop_rate", "attn_drop_rate", "drop_path_rate",
                        "zero_head_init"});
      v.img_size = o.get_int("img_size", d.image_size, 1);
      v.in_chans = o.get_int("in_chans", d.channels, 1);
      v.num_classes = o.get_int("num_classes", d.num_classes, 1);
      v.patch_size = o.get_int("patch_size", v.patch_size, 1);
      v.embed_dim = o.get_int("embed_dim", v.embed_dim, 1);
      v.depth = o.get_int("depth", v.depth, 1);
      v.num_heads = o.get_int("num_heads", v.num_heads, 1);
      v.mlp_ratio = o.get_double("mlp_ratio", v.mlp_ratio, 0);
      v.qkv_bias = o.get_bool("qkv_bias", v.qkv_bias);
      const double dropout_p = o.get_double("dropout", 0.0, 0, 1);
      v.drop_rate = o.get_double("drop_rate", dropout_p, 0, 1);
      v.pos_drop_rate = dropout_p;
      v.proj_drop_rate = dropout_p;
      v.attn_drop_rate = o.get_double("attn_drop_rate", 0.0, 0, 1);
      v.drop_path_rate = o.get_double("drop_path_rate", 0.0, 0, 1);
      v.zero_head_init = o.get_bool("zero_head_init", v.zero_head_init);
      if (v.img_size != d.image_size || v.in_chans != d.channels) {
        unsupported(fmt::format("model.options img_size {} / in_chans {} do not match the data ({} x {} x {})",
                                v.img_size, v.in_chans, d.channels, d.image_size, d.image_size));
      }
      try {
        v.validate();
      } catch (const Error& e) {
        throw Error(fmt::format("model.options: {}", e.what()));
      }
      fmt::print("model: ViT img {} patch {} embed {} depth {} heads {} mlp_ratio {} classes {} ({} parameters)\n",
                 v.img_size, v.patch_size, v.embed_dim, v.depth, v.num_heads, v.mlp_ratio, v.num_classes,
                 v.num_parameters());
      return std::make_shared<nn::models::VisionTransformer>(v, &init, &dropout);
    }
    case config::ModelName::kMlp:
      unsupported("model.name = \"mlp\" is the built-in job: run `colossal train` without --config");
    case config::ModelName::kGpt2:
    case config::ModelName::kResnet:
      break;
  }
  unsupported(fmt::format("model.name = \"{}\" is not supported by train --config yet (only \"vit\")",
                          config::to_string(c.model.name)));
}

engine::Criterion make_criterion(const TrainConfig& c, const Datasets&) {
  ops::CrossEntropyOptions ce;
  ce.label_smoothing = c.train.label_smoothing;
  return [ce](const Tensor& out, const Tensor& target) { return ops::cross_entropy(out, target, ce); };
}

std::shared_ptr<optim::Optimizer> make_optimizer(const TrainConfig& c, std::vector<Tensor> params) {
  const config::OptimizerConfig& o = c.optimizer;
  switch (o.name) {
    case config::OptimizerName::kSgd: {
      optim::SgdOptions s;
      s.lr = o.lr;
      s.momentum = o.momentum;
      s.weight_decay = o.weight_decay;
      s.nesterov = o.nesterov;
      return std::make_shared<optim::Sgd>(std::move(params), s);
    }
    case config::OptimizerName::kAdam:
    case config::OptimizerName::kAdamw: {
      optim::AdamOptions a = o.name == config::OptimizerName::kAdamw ? optim::adamw_defaults() : optim::AdamOptions{};
      a.lr = o.lr;
      a.beta1 = o.betas[0];
      a.beta2 = o.betas[1];
      a.eps = o.eps;
      a.weight_decay = o.weight_decay;
      if (o.name == config::OptimizerName::kAdamw) return std::make_shared<optim::AdamW>(std::move(params), a);
      return std::make_shared<optim::Adam>(std::move(params), a);
    }
    case config::OptimizerName::kLamb: {
      optim::LambOptions l;
      l.lr = o.lr;
      l.beta1 = o.betas[0];
      l.beta2 = o.betas[1];
      l.eps = o.eps;
      l.weight_decay = o.weight_decay;
      return std::make_shared<optim::Lamb>(std::move(params), l);
    }
    case config::OptimizerName::kLars: {
      optim::LarsOptions l;
      l.lr = o.lr;
      l.momentum = o.momentum;
      l.weight_decay = o.weight_decay;
      return std::make_shared<optim::Lars>(std::move(params), l);
    }
  }
  unsupported("optimizer.name");
}

std::shared_ptr<optim::LRScheduler> make_scheduler(const TrainConfig& c, optim::Optimizer& opt, int64_t total_steps,
                                                   int64_t steps_per_epoch) {
  const config::LrSchedulerConfig& s = c.lr_scheduler;
  const int64_t warmup = s.warmup_steps > 0 ? s.warmup_steps : s.warmup_epochs * steps_per_epoch;
  const int64_t total = s.total_steps > 0 ? s.total_steps : total_steps;
  switch (s.name) {
    case config::SchedulerName::kConstant:
      if (warmup > 0) return std::make_shared<optim::MultiStepWarmupLR>(opt, warmup, std::vector<int64_t>{}, 1.0);
      return nullptr;
    case config::SchedulerName::kLinear:
      return std::make_shared<optim::LinearWarmupLR>(opt, total, warmup);
    case config::SchedulerName::kCosine:
      if (warmup >= total) {
        unsupported(
            fmt::format("lr_scheduler warmup ({} steps) must be shorter than the run ({} steps)", warmup, total));
      }
      return std::make_shared<optim::CosineAnnealingWarmupLR>(opt, total, warmup, s.eta_min);
    case config::SchedulerName::kMultistep:
      if (warmup > 0) return std::make_shared<optim::MultiStepWarmupLR>(opt, warmup, s.milestones, s.gamma);
      return std::make_shared<optim::MultiStepLR>(opt, s.milestones, s.gamma);
    case config::SchedulerName::kPolynomial:
      if (warmup > 0) unsupported("lr_scheduler.name = \"polynomial\" with a warmup is not supported yet");
      return std::make_shared<optim::PolynomialLR>(opt, total, s.eta_min, s.power);
  }
  unsupported("lr_scheduler.name");
}

}  // namespace colossal::cli
