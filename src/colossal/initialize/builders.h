// Builders of a training run's pieces from a TrainConfig (config/train_config.h): datasets with
// their transforms (data_builders.cpp), the model, the loss, the optimizer and the LR scheduler
// (builders.cpp). Each checks the config keys it reads (model.options, data.options, ...) and throws
// colossal::Error naming the key of anything it cannot build.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "colossal/config/train_config.h"
#include "colossal/core/random.h"  // Generator
#include "colossal/core/tensor.h"
#include "colossal/data/batch.h"  // BatchTransform
#include "colossal/data/batch_stage.h"
#include "colossal/data/dataset.h"
#include "colossal/data/sampler.h"
#include "colossal/data/transform.h"    // Transform
#include "colossal/engine/engine.h"     // Criterion
#include "colossal/nn/models/gpt2.h"    // GPT2Config
#include "colossal/nn/models/resnet.h"  // ResNetConfig
#include "colossal/nn/models/vit.h"     // ViTConfig
#include "colossal/nn/module.h"
#include "colossal/optim/lr_scheduler.h"
#include "colossal/optim/optimizer.h"

namespace colossal::initialize {

/// Throws colossal::Error("train --config: <what>").
[[noreturn]] void unsupported(const std::string& what);

/// train.device resolved: "auto" is the first GPU when one is usable, else the CPU; "cuda" without
/// a usable GPU is unsupported().
Device pick_device(const config::TrainConfig& c);

/// The training and (optional) test sets of data.dataset with data.transforms applied, and what
/// the model is built for: image geometry and class count, or the token window and vocabulary.
struct Datasets {
  std::shared_ptr<data::Dataset> train, test;
  /// Images: channels, side (square, after the transforms) and classes; 0 for token data.
  int64_t channels = 0, image_size = 0, num_classes = 0;
  /// Applied by the training loader to each collated batch (mixup); null: none. The test loader
  /// must not apply it.
  std::shared_ptr<const data::BatchTransform> batch_transform;
  /// The per-sample pipelines (ToTensor included), for logs: the training one with the
  /// augmentations, the test one with only the deterministic transforms. Null for token data.
  std::shared_ptr<const data::Transform> train_transform, test_transform;
  /// Token data (data.dataset = "tokens"): tokens per sample T (input [T], target [T], the next
  /// tokens) and the vocabulary every id is checked against; 0 for images.
  int64_t seq_len = 0, vocab_size = 0;
  /// The same images with the pipeline's tail left to batch stages (Note [Batch stages] in
  /// data/batch_stage.cpp): datasets that stop after the last uint8 transform (synthetic f32 images
  /// without transforms: pixel keys), and the stages a loader runs where its batches go (ToTensor,
  /// resize, normalize, mixup; or the synthetic pixels). A loader over train with train_stage (and
  /// no batch_transform) gives the batches of train with batch_transform, bit for bit on the CPU.
  /// Unset for token data and pipelines whose float transforms cannot move (one after center_crop
  /// on floats, say); test_stage may be null (the test images need nothing more).
  struct Staged {
    std::shared_ptr<data::Dataset> train, test;
    std::shared_ptr<const data::BatchStage> train_stage, test_stage;
  };
  std::optional<Staged> staged;
};

/// data.dataset at data.path (and data.test_path) with data.transforms and data.options. In
/// data.path and data.test_path, "$NAME" or "${NAME}" is replaced by the environment variable
/// (Colossal-AI's tutorials keep datasets under $DATA). Images: the training set gets every
/// transform in the order listed, the test set only the deterministic ones (resize, center_crop,
/// normalize); ToTensor is inserted before the first transform that needs float pixels. Tokens:
/// random windows of data.seq_len tokens (0: the model's context) for training, consecutive ones
/// for the test file.
Datasets make_datasets(const config::TrainConfig& c);

/// The GPT-2 that model.preset (default "gpt2", 124M) and model.options describe, validated;
/// make_model builds it and make_datasets takes the default window and the vocabulary from it.
/// Throws naming the key when model.name is not "gpt2" or an option is unknown or out of range.
nn::models::GPT2Config gpt2_config(const config::TrainConfig& c);

/// The ViT that model.preset and model.options describe for `d`'s images and classes, validated
/// (heads against parallel.tensor.size too); make_model builds it.
nn::models::ViTConfig vit_config(const config::TrainConfig& c, const Datasets& d);

/// The ResNet that model.preset (default "resnet50") and model.options describe for `d`'s images and
/// classes, validated; make_model builds it. Throws naming the key when an option is unknown or out of
/// range.
nn::models::ResNetConfig resnet_config(const config::TrainConfig& c, const Datasets& d);

/// How make_model builds: the pieces of the model's layers() built at full size (GPT-2, ViT and
/// ResNet; empty: all), the others stand-ins (Note [Pieces built] in nn/models/layer_view.h); quiet: no
/// "model: ..." line.
struct ModelBuild {
  nn::models::PieceFilter pieces;
  bool quiet = false;
};

/// model.name with model.preset and model.options, sized for `d`; `init` draws the initial
/// weights, `dropout` the dropout masks (and must outlive the model).
std::shared_ptr<nn::Module> make_model(const config::TrainConfig& c, const Datasets& d, core::Generator& init,
                                       core::Generator& dropout, const ModelBuild& build = {});

/// The training loss for the model's output against the batch's target: for token data the
/// language-model cross-entropy of logits [B, T, V] against targets [B, T]; for images
/// cross-entropy with train.label_smoothing, and when mixup is on (d.batch_transform) soft-target
/// cross-entropy for the mixed [B, C] targets (smoothing already blended in by mixup), while the
/// unmixed test batches keep class indices.
engine::Criterion make_criterion(const config::TrainConfig& c, const Datasets& d);

/// optimizer.* over `params`.
std::shared_ptr<optim::Optimizer> make_optimizer(const config::TrainConfig& c, std::vector<Tensor> params);
/// optimizer.* over a model's named parameters: with optimizer.no_decay_bias_and_norm (the default)
/// biases, norm parameters and other 1-D parameters go to a group without weight decay
/// (optim::default_no_weight_decay), as timm and Megatron-LM do.
std::shared_ptr<optim::Optimizer> make_optimizer(const config::TrainConfig& c, const optim::NamedParameters& params);
/// optimizer.* over explicit parameter groups; a group's own options win over the config's.
std::shared_ptr<optim::Optimizer> make_optimizer(const config::TrainConfig& c, std::vector<optim::ParamGroup> params);

/// lr_scheduler.* for a run of `total_steps` optimizer updates, `steps_per_epoch` of them per epoch
/// (for warmup_epochs); null when the learning rate stays constant. A linear or cosine warmup longer
/// than a run cut short (train.max_steps) is shortened to fit it, with a note on stdout; one longer
/// than an explicit lr_scheduler.total_steps is an error.
std::shared_ptr<optim::LRScheduler> make_scheduler(const config::TrainConfig& c, optim::Optimizer& opt,
                                                   int64_t total_steps, int64_t steps_per_epoch);

}  // namespace colossal::initialize
