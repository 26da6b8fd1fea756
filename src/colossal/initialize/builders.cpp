// The model, loss, optimizer and LR scheduler builders of builders.h (the datasets are in
// data_builders.cpp).
#include "colossal/initialize/builders.h"

#include <fmt/format.h>

#include <algorithm>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <variant>
#include <vector>

#include "colossal/config/train_config.h"
#include "colossal/core/build_config.h"  // COLOSSAL_WITH_CUDA
#include "colossal/core/cuda_device.h"   // is_available
#include "colossal/core/dtype.h"         // is_floating
#include "colossal/core/error.h"
#include "colossal/nn/models/gpt2.h"     // GPT2, GPT2Config, lm_cross_entropy
#include "colossal/nn/models/resnet.h"   // ResNet, ResNetConfig
#include "colossal/nn/models/vit.h"      // VisionTransformer, ViTConfig
#include "colossal/ops/nn_functional.h"  // cross_entropy
#include "colossal/optim/adam.h"
#include "colossal/optim/lamb.h"
#include "colossal/optim/lars.h"
#include "colossal/optim/lr_scheduler.h"
#include "colossal/optim/sgd.h"

namespace colossal::initialize {

using config::TrainConfig;

[[noreturn]] void unsupported(const std::string& what) {
  throw Error(fmt::format("train --config: {}", what));
}

Device pick_device(const TrainConfig& c) {
  switch (c.train.device) {
    case config::DeviceKind::kCpu:
      return Device{};
    case config::DeviceKind::kCuda:
      if (!core::cuda::is_available()) {
        unsupported(fmt::format("train.device = \"cuda\" but {}; use \"cpu\" or \"auto\"",
                                COLOSSAL_WITH_CUDA ? "no GPU is visible" : "this build has no CUDA"));
      }
      return Device{core::DeviceType::cuda, 0};
    case config::DeviceKind::kAuto:
      break;
  }
  return core::cuda::is_available() ? Device{core::DeviceType::cuda, 0} : Device{};
}

namespace {

/// An array of integers at `key`, each at least `min`; nullopt when absent.
std::optional<std::vector<int64_t>> get_int_list(const config::OptionTable& o, std::string_view key, int64_t min) {
  const auto it = o.values().find(key);
  if (it == o.values().end()) return std::nullopt;
  const auto* array = std::get_if<config::OptionValue::Array>(&it->second.value);
  std::vector<int64_t> values;
  for (size_t i = 0; array != nullptr && i < array->size(); ++i) {
    const int64_t* value = std::get_if<int64_t>(&(*array)[i].value);
    if (value == nullptr || *value < min) {
      array = nullptr;
      break;
    }
    values.push_back(*value);
  }
  if (array == nullptr) {
    unsupported(fmt::format("{}.{} = {}: expected an array of integers of at least {}", o.prefix(), key,
                            config::to_toml(it->second), min));
  }
  return values;
}

/// Image models take image data and a class count covering every label.
void check_image_model(const TrainConfig& c, const Datasets& d, int64_t num_classes) {
  if (d.seq_len > 0 || d.image_size == 0) {
    unsupported(fmt::format("model.name = \"{}\" classifies images; data.dataset = \"{}\" is not an image dataset",
                            config::to_string(c.model.name), config::to_string(c.data.dataset)));
  }
  if (num_classes < d.num_classes) {
    unsupported(fmt::format("model.options.num_classes = {} is fewer than the {} classes of data.dataset = \"{}\"",
                            num_classes, d.num_classes, config::to_string(c.data.dataset)));
  }
  if (d.batch_transform && num_classes != d.num_classes) {
    unsupported(
        fmt::format("model.options.num_classes = {} must equal the dataset's {} classes with mixup (its soft "
                    "targets have one column per class)",
                    num_classes, d.num_classes));
  }
}

/// model.options.checkpoint_activations: a boolean, false when absent. The names other libraries
/// use for the same switch are pointed at it rather than reported as unknown.
bool checkpoint_activations(const config::OptionTable& o) {
  for (std::string_view alias : {"gradient_checkpointing", "checkpoint", "activation_checkpointing"}) {
    if (o.values().contains(alias)) {
      unsupported(
          fmt::format("{}.{}: colossal calls activation checkpointing checkpoint_activations (Hugging "
                      "Face's gradient_checkpointing, Colossal-AI's checkpoint); set "
                      "{}.checkpoint_activations = true",
                      o.prefix(), alias, o.prefix()));
    }
  }
  return o.get_bool("checkpoint_activations", false);
}

/// The run log's line for the switch, printed when it is on.
void print_checkpointing(bool on, int64_t blocks, std::string_view what) {
  if (!on) return;
  fmt::print(
      "model: activation checkpointing on: each of the {} {} keeps only its input from forward and is "
      "recomputed in backward\n",
      blocks, what);
}

}  // namespace

nn::models::ViTConfig vit_config(const TrainConfig& c, const Datasets& d) {
  const config::OptionTable& o = c.model.options;
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
  } else if (p == "vit_large_patch16_224") {
    v = nn::models::ViTConfig::vit_large_patch16_224(d.num_classes);
  } else {
    unsupported(fmt::format("model.preset = \"{}\" is not a ViT preset", p));
  }
  v.checkpoint_activations = checkpoint_activations(o);  // before the unknown keys: it names aliases
  o.reject_unknown({"img_size", "patch_size", "in_chans", "num_classes", "embed_dim", "depth", "num_heads", "mlp_ratio",
                    "qkv_bias", "dropout", "drop_rate", "attn_drop_rate", "drop_path_rate", "zero_head_init",
                    "checkpoint_activations"});
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
  check_image_model(c, d, v.num_classes);
  if (v.img_size != d.image_size || v.in_chans != d.channels) {
    unsupported(
        fmt::format("model.options img_size {} / in_chans {} do not match the data ({} x {} x {} after "
                    "data.transforms)",
                    v.img_size, v.in_chans, d.channels, d.image_size, d.image_size));
  }
  try {
    v.validate();
  } catch (const Error& e) {
    throw Error(fmt::format("model.options: {}", e.what()));
  }
  // Checked here, where the config is read, so that `colossal describe` says it too and no rank builds
  // anything first; the tensor-parallel attention checks it again (parallel/tp/heads.h).
  const int tp = c.parallel.tensor.size;
  COLOSSAL_CHECK(tp <= 1 || v.num_heads % tp == 0,
                 "model.options.num_heads = {}{}: a ViT's heads do not split over parallel.tensor.size = {} ranks "
                 "(each rank holds whole heads); set model.options.num_heads to a multiple of {} that divides "
                 "embed_dim = {}, or a tensor size that divides {}",
                 v.num_heads, o.contains("num_heads") ? "" : fmt::format(" (model.preset = \"{}\")", p), tp, tp,
                 v.embed_dim, v.num_heads);
  return v;
}

namespace {

std::shared_ptr<nn::Module> make_vit(const TrainConfig& c, const Datasets& d, core::Generator& init,
                                     core::Generator& dropout, const ModelBuild& build) {
  const nn::models::ViTConfig v = vit_config(c, d);
  if (!build.quiet) {
    fmt::print("model: ViT img {} patch {} embed {} depth {} heads {} mlp_ratio {} classes {} ({} parameters)\n",
               v.img_size, v.patch_size, v.embed_dim, v.depth, v.num_heads, v.mlp_ratio, v.num_classes,
               v.num_parameters());
    print_checkpointing(v.checkpoint_activations, v.depth, "transformer blocks");
  }
  return std::make_shared<nn::models::VisionTransformer>(v, &init, &dropout, build.pieces);
}

}  // namespace

nn::models::ResNetConfig resnet_config(const TrainConfig& c, const Datasets& d) {
  const config::OptionTable& o = c.model.options;
  using nn::models::ResNetConfig;
  const std::string& p = c.model.preset;
  ResNetConfig r;
  if (p == "resnet18") {
    r = ResNetConfig::resnet18(d.num_classes);
  } else if (p == "resnet34") {
    r = ResNetConfig::resnet34(d.num_classes);
  } else if (p.empty() || p == "resnet50") {
    r = ResNetConfig::resnet50(d.num_classes);
  } else {
    unsupported(fmt::format("model.preset = \"{}\" is not a ResNet preset", p));
  }
  r.checkpoint_activations = checkpoint_activations(o);  // before the unknown keys: it names aliases
  o.reject_unknown({"num_classes", "in_chans", "cifar_stem", "zero_init_residual", "block", "layers", "width",
                    "channels_last", "checkpoint_activations"});
  r.num_classes = o.get_int("num_classes", d.num_classes, 1);
  r.in_chans = o.get_int("in_chans", d.channels, 1);
  r.cifar_stem = o.get_bool("cifar_stem", r.cifar_stem);
  r.zero_init_residual = o.get_bool("zero_init_residual", r.zero_init_residual);
  r.width = o.get_int("width", r.width, 1, 1 << 16);
  // channels_last is the fast layout on the GPU and only costs transposes on the CPU.
  r.channels_last = o.get_bool("channels_last", pick_device(c).is_cuda());
  const std::string block =
      o.get_string("block", r.block == nn::models::ResNetBlockKind::basic ? "basic" : "bottleneck");
  if (block == "basic") {
    r.block = nn::models::ResNetBlockKind::basic;
  } else if (block == "bottleneck") {
    r.block = nn::models::ResNetBlockKind::bottleneck;
  } else {
    unsupported(
        fmt::format("model.options.block = \"{}\" must be \"basic\" (ResNet-18/34) or \"bottleneck\" "
                    "(ResNet-50)",
                    block));
  }
  if (auto layers = get_int_list(o, "layers", 1)) {
    if (layers->size() != 4) {
      unsupported(
          fmt::format("model.options.layers has {} entries; it needs 4 (blocks in layer1..layer4)", layers->size()));
    }
    std::copy(layers->begin(), layers->end(), r.layers.begin());
  }
  check_image_model(c, d, r.num_classes);
  if (r.in_chans != d.channels) {
    unsupported(
        fmt::format("model.options.in_chans = {} does not match the data's {} channels", r.in_chans, d.channels));
  }
  try {
    r.validate();
  } catch (const Error& e) {
    throw Error(fmt::format("model.options: {}", e.what()));
  }
  return r;
}

namespace {

std::shared_ptr<nn::Module> make_resnet(const TrainConfig& c, const Datasets& d, core::Generator& init,
                                        const ModelBuild& build) {
  const nn::models::ResNetConfig r = resnet_config(c, d);
  if (!build.quiet) {
    // The count computed, not the built model's: under a pipeline this rank builds its stage's pieces
    // only, the others as stand-ins (Note [Pieces built]).
    fmt::print("model: ResNet {} blocks [{}, {}, {}, {}] width {} {} stem, {}, classes {} ({} parameters)\n",
               r.block == nn::models::ResNetBlockKind::basic ? "basic" : "bottleneck", r.layers[0], r.layers[1],
               r.layers[2], r.layers[3], r.width, r.cifar_stem ? "CIFAR 3x3" : "ImageNet 7x7",
               r.channels_last ? "channels_last" : "NCHW", r.num_classes, r.num_parameters());
    print_checkpointing(r.checkpoint_activations, r.layers[0] + r.layers[1] + r.layers[2] + r.layers[3],
                        "residual blocks");
  }
  return std::make_shared<nn::models::ResNet>(r, &init, build.pieces);
}

}  // namespace

nn::models::GPT2Config gpt2_config(const TrainConfig& c) {
  using nn::models::GPT2Config;
  if (c.model.name != config::ModelName::kGpt2) {
    unsupported(fmt::format("model.name = \"{}\" is not \"gpt2\"", config::to_string(c.model.name)));
  }
  const std::string& p = c.model.preset;
  GPT2Config g;
  if (p.empty() || p == "gpt2") {
    g = GPT2Config::gpt2_124m();
  } else if (p == "gpt2-medium") {
    g = GPT2Config::gpt2_350m();
  } else if (p == "gpt2-large") {
    g = GPT2Config::gpt2_774m();
  } else if (p == "gpt2-xl") {
    g = GPT2Config::gpt2_1558m();
  } else {
    unsupported(fmt::format("model.preset = \"{}\" is not a GPT-2 preset", p));
  }
  const config::OptionTable& o = c.model.options;
  g.checkpoint_activations = checkpoint_activations(o);  // before the unknown keys: it names aliases
  o.reject_unknown({"n_layer", "n_embd", "n_head", "n_positions", "vocab_size", "vocab_multiple", "dropout",
                    "layer_norm_epsilon", "initializer_range", "checkpoint_activations"});
  g.n_layer = o.get_int("n_layer", g.n_layer, 1);
  g.n_embd = o.get_int("n_embd", g.n_embd, 1);
  g.n_head = o.get_int("n_head", g.n_head, 1);
  g.n_positions = o.get_int("n_positions", g.n_positions, 1);
  // Token files are uint16: a larger vocabulary could never be read.
  g.vocab_size = o.get_int("vocab_size", g.vocab_size, 1, 65536);
  g.vocab_multiple = o.get_int("vocab_multiple", g.vocab_multiple, 1, 1 << 16);
  g.dropout = o.get_double("dropout", g.dropout, 0, 1);
  g.layer_norm_epsilon = o.get_double("layer_norm_epsilon", g.layer_norm_epsilon, 0, 1);
  g.initializer_range = o.get_double("initializer_range", g.initializer_range, 0);
  try {
    g.validate();
  } catch (const Error& e) {
    throw Error(fmt::format("model.options: {}", e.what()));
  }
  return g;
}

std::shared_ptr<nn::Module> make_model(const TrainConfig& c, const Datasets& d, core::Generator& init,
                                       core::Generator& dropout, const ModelBuild& build) {
  switch (c.model.name) {
    case config::ModelName::kVit:
      return make_vit(c, d, init, dropout, build);
    case config::ModelName::kResnet:
      return make_resnet(c, d, init, build);
    case config::ModelName::kGpt2: {
      const nn::models::GPT2Config g = gpt2_config(c);
      if (d.seq_len == 0) {
        unsupported(
            fmt::format("model.name = \"gpt2\" is a language model: data.dataset must be \"tokens\", not "
                        "\"{}\"",
                        config::to_string(c.data.dataset)));
      }
      if (!build.quiet) {
        fmt::print(
            "model: GPT-2 {} layers, {} wide, {} heads, context {}, vocab {} (padded {}), dropout {} ({} "
            "parameters)\n",
            g.n_layer, g.n_embd, g.n_head, g.n_positions, g.vocab_size, g.padded_vocab_size(), g.dropout,
            g.num_parameters());
        print_checkpointing(g.checkpoint_activations, g.n_layer, "transformer blocks");
      }
      return std::make_shared<nn::models::GPT2>(g, &init, &dropout, build.pieces);
    }
    case config::ModelName::kMlp:
      unsupported("model.name = \"mlp\" is the built-in job: run `colossal train` without --config");
  }
  unsupported("model.name");
}

engine::Criterion make_criterion(const TrainConfig& c, const Datasets& d) {
  if (d.seq_len > 0) {
    if (c.train.label_smoothing > 0) {
      unsupported(
          "train.label_smoothing applies to image classes; the language model of data.dataset = \"tokens\" "
          "trains on the plain next-token cross-entropy (set it to 0)");
    }
    return [](const Tensor& logits, const Tensor& target) { return nn::models::lm_cross_entropy(logits, target); };
  }
  ops::CrossEntropyOptions hard;
  hard.label_smoothing = c.train.label_smoothing;
  if (!d.batch_transform) {
    return [hard](const Tensor& out, const Tensor& target) { return ops::cross_entropy(out, target, hard); };
  }
  // Mixed training batches carry soft targets [B, C] with the smoothing already blended in; the
  // test batches are not mixed and keep class indices.
  return [hard](const Tensor& out, const Tensor& target) {
    if (core::is_floating(target.dtype())) return ops::cross_entropy(out, target, ops::CrossEntropyOptions{});
    return ops::cross_entropy(out, target, hard);
  };
}

std::shared_ptr<optim::Optimizer> make_optimizer(const TrainConfig& c, std::vector<Tensor> params) {
  return make_optimizer(c, optim::single_group(std::move(params)));
}

std::shared_ptr<optim::Optimizer> make_optimizer(const TrainConfig& c, const optim::NamedParameters& params) {
  if (!c.optimizer.no_decay_bias_and_norm) {
    std::vector<Tensor> all;
    for (const auto& [name, param] : params) all.push_back(param);
    return make_optimizer(c, optim::single_group(std::move(all)));
  }
  return make_optimizer(c, optim::make_param_groups(params, c.optimizer.weight_decay));
}

std::shared_ptr<optim::Optimizer> make_optimizer(const TrainConfig& c, std::vector<optim::ParamGroup> params) {
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
  int64_t warmup = s.warmup_steps > 0 ? s.warmup_steps : s.warmup_epochs * steps_per_epoch;
  const int64_t total = s.total_steps > 0 ? s.total_steps : total_steps;
  const bool decays = s.name == config::SchedulerName::kLinear || s.name == config::SchedulerName::kCosine;
  if (decays && warmup >= total) {
    const std::string_view warmup_key = s.warmup_steps > 0 ? "warmup_steps" : "warmup_epochs";
    if (s.total_steps > 0) {
      unsupported(fmt::format("lr_scheduler.{} ({} steps) must be shorter than lr_scheduler.total_steps = {}",
                              warmup_key, warmup, total));
    }
    // A run cut short (train.max_steps = 2 to try a config) cannot hold the whole warmup: the
    // schedule is compressed into it rather than refused.
    fmt::print(
        "lr_scheduler: the warmup of {} steps (lr_scheduler.{}) does not fit this run of {} updates; warming "
        "up over {} instead\n",
        warmup, warmup_key, total, total - 1);
    warmup = total - 1;
  }
  switch (s.name) {
    case config::SchedulerName::kConstant:
      if (warmup > 0) return std::make_shared<optim::MultiStepWarmupLR>(opt, warmup, std::vector<int64_t>{}, 1.0);
      return nullptr;
    case config::SchedulerName::kLinear:
      return std::make_shared<optim::LinearWarmupLR>(opt, total, warmup);
    case config::SchedulerName::kCosine:
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

}  // namespace colossal::initialize
