// Internal to config/: the one list of TrainConfig's keys. visit_fields hands a visitor every field
// with its dotted key and its constraint; loading (load.cpp), checking and describing (describe.cpp)
// are visitors over it, so a new field is one line here plus its member in train_config.h.
#pragma once

#include <cstdint>
#include <limits>
#include <span>
#include <string_view>

#include "colossal/config/train_config.h"

namespace colossal::config::detail {

/// Integers in [min, max].
struct IntRange {
  int64_t min;
  int64_t max;
};

/// Finite floats between min and max, each end open or closed.
struct FloatRange {
  double min;
  double max;
  bool min_open = false;
  bool max_open = false;
};

/// An array's length in [min, max].
struct ArraySize {
  std::size_t min;
  std::size_t max;
};

/// The strings a string (or each string of an array) may be.
struct Choices {
  std::span<const std::string_view> names;
};

template <class E>
struct EnumEntry {
  E value;
  std::string_view name;
};

inline constexpr int64_t kIntMax = std::numeric_limits<int64_t>::max();
inline constexpr double kInf = std::numeric_limits<double>::infinity();
/// Process counts (parallel sizes) beyond any machine: a guard against a stray extra digit.
inline constexpr int64_t kMaxRanks = 1 << 20;
/// Bounds for int-typed fields, so that a value always fits the member.
inline constexpr int64_t kIntFieldMax = std::numeric_limits<int>::max();

inline constexpr EnumEntry<TensorParallelMode> kTensorParallelModes[] = {
    {TensorParallelMode::k1d, "1d"},
    {TensorParallelMode::k2d, "2d"},
    {TensorParallelMode::k2p5d, "2.5d"},
    {TensorParallelMode::k3d, "3d"},
};
inline constexpr EnumEntry<TensorAllReduce> kTensorAllReduces[] = {{TensorAllReduce::kAuto, "auto"},
                                                                   {TensorAllReduce::kCopyEngines, "copy_engines"},
                                                                   {TensorAllReduce::kNccl, "nccl"}};
inline constexpr EnumEntry<PipelineP2P> kPipelineP2Ps[] = {
    {PipelineP2P::kAuto, "auto"}, {PipelineP2P::kCopyEngines, "copy_engines"}, {PipelineP2P::kNccl, "nccl"}};
inline constexpr EnumEntry<TensorSplit> kTensorSplits[] = {{TensorSplit::kColumn, "column"},
                                                           {TensorSplit::kRow, "row"},
                                                           {TensorSplit::kReplicate, "replicate"},
                                                           {TensorSplit::kVocab, "vocab"}};
inline constexpr EnumEntry<AmpMode> kAmpModes[] = {
    {AmpMode::kOff, "off"}, {AmpMode::kTorch, "torch"}, {AmpMode::kNaive, "naive"}};
inline constexpr EnumEntry<PipelinePartition> kPipelinePartitions[] = {{PipelinePartition::kBalanced, "balanced"},
                                                                       {PipelinePartition::kUniform, "uniform"},
                                                                       {PipelinePartition::kMeasured, "measured"}};
inline constexpr EnumEntry<ZeroPlacement> kZeroPlacements[] = {
    {ZeroPlacement::kCuda, "cuda"}, {ZeroPlacement::kCpu, "cpu"}, {ZeroPlacement::kAuto, "auto"}};
inline constexpr EnumEntry<ModelName> kModelNames[] = {
    {ModelName::kMlp, "mlp"}, {ModelName::kGpt2, "gpt2"}, {ModelName::kVit, "vit"}, {ModelName::kResnet, "resnet"}};
inline constexpr EnumEntry<DatasetName> kDatasetNames[] = {{DatasetName::kSynthetic, "synthetic"},
                                                           {DatasetName::kMnist, "mnist"},
                                                           {DatasetName::kFashionMnist, "fashion_mnist"},
                                                           {DatasetName::kCifar10, "cifar10"},
                                                           {DatasetName::kTokens, "tokens"}};
inline constexpr EnumEntry<OptimizerName> kOptimizerNames[] = {{OptimizerName::kSgd, "sgd"},
                                                               {OptimizerName::kAdam, "adam"},
                                                               {OptimizerName::kAdamw, "adamw"},
                                                               {OptimizerName::kLamb, "lamb"},
                                                               {OptimizerName::kLars, "lars"}};
inline constexpr EnumEntry<SchedulerName> kSchedulerNames[] = {{SchedulerName::kConstant, "constant"},
                                                               {SchedulerName::kLinear, "linear"},
                                                               {SchedulerName::kCosine, "cosine"},
                                                               {SchedulerName::kMultistep, "multistep"},
                                                               {SchedulerName::kPolynomial, "polynomial"}};
inline constexpr EnumEntry<DeviceKind> kDeviceKinds[] = {
    {DeviceKind::kAuto, "auto"}, {DeviceKind::kCpu, "cpu"}, {DeviceKind::kCuda, "cuda"}};

// enum_entries(E{}) finds an enum's table by overload.
inline std::span<const EnumEntry<TensorParallelMode>> enum_entries(TensorParallelMode) {
  return kTensorParallelModes;
}
inline std::span<const EnumEntry<TensorAllReduce>> enum_entries(TensorAllReduce) {
  return kTensorAllReduces;
}
inline std::span<const EnumEntry<PipelineP2P>> enum_entries(PipelineP2P) {
  return kPipelineP2Ps;
}
inline std::span<const EnumEntry<TensorSplit>> enum_entries(TensorSplit) {
  return kTensorSplits;
}
inline std::span<const EnumEntry<AmpMode>> enum_entries(AmpMode) {
  return kAmpModes;
}
inline std::span<const EnumEntry<PipelinePartition>> enum_entries(PipelinePartition) {
  return kPipelinePartitions;
}
inline std::span<const EnumEntry<ZeroPlacement>> enum_entries(ZeroPlacement) {
  return kZeroPlacements;
}
inline std::span<const EnumEntry<ModelName>> enum_entries(ModelName) {
  return kModelNames;
}
inline std::span<const EnumEntry<DatasetName>> enum_entries(DatasetName) {
  return kDatasetNames;
}
inline std::span<const EnumEntry<OptimizerName>> enum_entries(OptimizerName) {
  return kOptimizerNames;
}
inline std::span<const EnumEntry<SchedulerName>> enum_entries(SchedulerName) {
  return kSchedulerNames;
}
inline std::span<const EnumEntry<DeviceKind>> enum_entries(DeviceKind) {
  return kDeviceKinds;
}

inline constexpr std::string_view kTransformNames[] = {"random_crop", "random_flip",  "resize", "center_crop",
                                                       "normalize",   "auto_augment", "mixup"};

/// Presets per model (see ModelConfig::preset); they mirror the named configs in nn/models.
inline constexpr std::string_view kGpt2Presets[] = {"gpt2", "gpt2-medium", "gpt2-large", "gpt2-xl"};
inline constexpr std::string_view kVitPresets[] = {"vit_tiny_patch16_224", "vit_small_patch16_224",
                                                   "vit_base_patch16_224", "vit_large_patch16_224",
                                                   "vit_tiny_patch4_32",   "vit_tiny_patch4_28"};
inline constexpr std::string_view kResnetPresets[] = {"resnet18", "resnet34", "resnet50"};

inline std::span<const std::string_view> model_presets(ModelName name) {
  switch (name) {
    case ModelName::kGpt2:
      return kGpt2Presets;
    case ModelName::kVit:
      return kVitPresets;
    case ModelName::kResnet:
      return kResnetPresets;
    case ModelName::kMlp:
      break;
  }
  return {};
}

/// Calls `visitor(key, field, constraints...)` for every field of `config` (a TrainConfig, const or
/// not), in the order describe() prints them. Field types and their constraints:
///   bool; int and int64_t with IntRange; double with FloatRange; std::string (free); an enum (its
///   enum_entries are the choices); std::vector<std::string> with Choices; std::vector<double> with
///   FloatRange and ArraySize; std::vector<int64_t> with IntRange; OptionTable (free-form);
///   std::vector<TensorSpecRule> (an array of { pattern, spec } tables).
template <class Config, class Visitor>
void visit_fields(Config& c, Visitor& v) {
  v("gradient_accumulation", c.gradient_accumulation, IntRange{1, kIntFieldMax});
  v("clip_grad_norm", c.clip_grad_norm, FloatRange{0, kInf});
  v("bf16", c.bf16);

  v("parallel.data", c.parallel.data, IntRange{0, kMaxRanks});
  v("parallel.pipeline", c.parallel.pipeline, IntRange{1, kMaxRanks});
  v("parallel.num_microbatches", c.parallel.num_microbatches, IntRange{1, kIntFieldMax});
  v("parallel.num_chunks", c.parallel.num_chunks, IntRange{1, 1024});
  v("parallel.partition", c.parallel.partition);
  v("parallel.partition_sizes", c.parallel.partition_sizes, IntRange{1, kIntFieldMax});
  v("parallel.pipeline_report", c.parallel.pipeline_report, IntRange{0, kIntFieldMax});
  v("parallel.pipeline_p2p", c.parallel.pipeline_p2p);
  v("parallel.tensor.size", c.parallel.tensor.size, IntRange{1, kMaxRanks});
  v("parallel.tensor.mode", c.parallel.tensor.mode);
  v("parallel.tensor.depth", c.parallel.tensor.depth, IntRange{1, kMaxRanks});
  v("parallel.tensor.sequence_parallel", c.parallel.tensor.sequence_parallel);
  v("parallel.tensor.overlap_chunks", c.parallel.tensor.overlap_chunks, IntRange{1, 64});
  v("parallel.tensor.row_blocks", c.parallel.tensor.row_blocks, IntRange{0, 64});
  v("parallel.tensor.all_reduce", c.parallel.tensor.all_reduce);
  v("parallel.tensor.fused_residual", c.parallel.tensor.fused_residual);
  v("parallel.tensor.specs", c.parallel.tensor.specs);
  // Up to a week (comm::kMaxCollectiveTimeoutSeconds): anything longer is a typo, not a wait.
  v("parallel.timeout_s", c.parallel.timeout_s, FloatRange{0, 7 * 24 * 3600, /*min_open=*/true});

  v("fp16.mode", c.fp16.mode);
  v("fp16.initial_scale", c.fp16.initial_scale, FloatRange{0, kInf, true});
  v("fp16.growth_factor", c.fp16.growth_factor, FloatRange{1, kInf, true});
  v("fp16.backoff_factor", c.fp16.backoff_factor, FloatRange{0, 1, true, true});
  v("fp16.growth_interval", c.fp16.growth_interval, IntRange{0, kIntFieldMax});
  v("fp16.hysteresis", c.fp16.hysteresis, IntRange{1, kIntFieldMax});
  v("fp16.max_scale", c.fp16.max_scale, FloatRange{0, kInf, true});

  v("zero.stage", c.zero.stage, IntRange{0, 3});
  v("zero.placement_policy", c.zero.placement_policy);
  v("zero.offload_optimizer", c.zero.offload_optimizer);
  v("zero.chunk_size_mb", c.zero.chunk_size_mb, IntRange{1, 1 << 20});
  v("zero.reduce_bucket_mb", c.zero.reduce_bucket_mb, IntRange{1, 1 << 20});

  v("model.name", c.model.name);
  v("model.preset", c.model.preset);
  v("model.options", c.model.options);
  v("model.weights", c.model.weights);

  v("data.dataset", c.data.dataset);
  v("data.path", c.data.path);
  v("data.test_path", c.data.test_path);
  v("data.batch_size", c.data.batch_size, IntRange{1, kIntFieldMax});
  v("data.num_workers", c.data.num_workers, IntRange{0, 1024});
  v("data.shuffle", c.data.shuffle);
  v("data.drop_last", c.data.drop_last);
  v("data.pin_memory", c.data.pin_memory);
  v("data.seq_len", c.data.seq_len, IntRange{0, kIntFieldMax});
  v("data.transforms", c.data.transforms, Choices{kTransformNames});
  v("data.options", c.data.options);

  v("optimizer.name", c.optimizer.name);
  v("optimizer.lr", c.optimizer.lr, FloatRange{0, kInf, true});
  v("optimizer.weight_decay", c.optimizer.weight_decay, FloatRange{0, kInf});
  v("optimizer.betas", c.optimizer.betas, FloatRange{0, 1, false, true}, ArraySize{2, 2});
  v("optimizer.eps", c.optimizer.eps, FloatRange{0, kInf, true});
  v("optimizer.momentum", c.optimizer.momentum, FloatRange{0, 1, false, true});
  v("optimizer.nesterov", c.optimizer.nesterov);
  v("optimizer.no_decay_bias_and_norm", c.optimizer.no_decay_bias_and_norm);

  v("lr_scheduler.name", c.lr_scheduler.name);
  v("lr_scheduler.warmup_steps", c.lr_scheduler.warmup_steps, IntRange{0, kIntMax});
  v("lr_scheduler.warmup_epochs", c.lr_scheduler.warmup_epochs, IntRange{0, kIntMax});
  v("lr_scheduler.total_steps", c.lr_scheduler.total_steps, IntRange{0, kIntMax});
  v("lr_scheduler.eta_min", c.lr_scheduler.eta_min, FloatRange{0, kInf});
  v("lr_scheduler.milestones", c.lr_scheduler.milestones, IntRange{1, kIntMax});
  v("lr_scheduler.gamma", c.lr_scheduler.gamma, FloatRange{0, 1, true, false});
  v("lr_scheduler.power", c.lr_scheduler.power, FloatRange{0, kInf, true});

  v("train.epochs", c.train.epochs, IntRange{0, kIntMax});
  v("train.max_steps", c.train.max_steps, IntRange{0, kIntMax});
  v("train.seed", c.train.seed, IntRange{0, kIntMax});
  v("train.log_interval", c.train.log_interval, IntRange{1, kIntMax});
  v("train.test_interval", c.train.test_interval, IntRange{0, kIntMax});
  v("train.checkpoint_dir", c.train.checkpoint_dir);
  v("train.checkpoint_interval", c.train.checkpoint_interval, IntRange{0, kIntMax});
  v("train.checkpoint_steps", c.train.checkpoint_steps, IntRange{0, kIntMax});
  v("train.keep_checkpoints", c.train.keep_checkpoints, IntRange{0, kIntMax});
  v("train.resume_from", c.train.resume_from);
  v("train.log_dir", c.train.log_dir);
  v("train.label_smoothing", c.train.label_smoothing, FloatRange{0, 1, false, true});
  v("train.device", c.train.device);
  v("train.tf32", c.train.tf32);
  v("train.progress", c.train.progress);
}

}  // namespace colossal::config::detail
