// TrainConfig: everything a training run is configured by, in Colossal-AI's vocabulary (parallel,
// fp16, zero, gradient_accumulation, clip_grad_norm, ...), loaded from TOML with `--set key=value`
// overrides and checked at load so that a typo or a bad value fails before any GPU is touched.
#pragma once

#include <cstdint>
#include <filesystem>
#include <functional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "colossal/config/option_table.h"

namespace colossal::config {

/// How tensor-parallel layers split their weights (Colossal-AI's parallel.tensor.mode).
enum class TensorParallelMode {
  k1d,    ///< "1d": Megatron-LM column/row splits over all tp ranks
  k2d,    ///< "2d": SUMMA over a q x q grid; tensor.size = q*q
  k2p5d,  ///< "2.5d": depth stacked q x q grids; tensor.size = depth*q*q
  k3d,    ///< "3d": a d x d x d cube; tensor.size = d*d*d
};

/// parallel.tensor.all_reduce: what sums the tensor group's large tensors (the row layers' outputs,
/// the column layers' input gradients, the vocabulary-parallel embedding's output).
enum class TensorAllReduce {
  kAuto,  ///< "auto": the copy engines where the group is two GPUs of one host that map each other's memory, else NCCL
  kCopyEngines,  ///< "copy_engines": the copy engines (Note [Pair all-reduce by the copy engines]); an error where they
                 ///< cannot
  kNccl,         ///< "nccl": NCCL's kernels
};

/// fp16.mode: Colossal-AI's AMP_TYPE, plus "off".
enum class AmpMode {
  kOff,    ///< "off": fp32 (or bf16, see TrainConfig::bf16)
  kTorch,  ///< "torch": autocast with a dynamic grad scaler, fp32 parameters
  kNaive,  ///< "naive": fp16 parameters, fp32 master copy, dynamic loss scale with hysteresis
};

/// parallel.partition: how a pipeline cuts the model's pieces among its stages (and their chunks).
enum class PipelinePartition {
  kBalanced,  ///< "balanced": by parameter count (Colossal-AI's partition_balanced)
  kUniform,   ///< "uniform": by piece count (Colossal-AI's partition_uniform)
  kMeasured,  ///< "measured": by each piece's forward and backward time, measured at start-up
};

/// parallel.pipeline_p2p: what carries the activations and gradients between a pipeline's stages.
enum class PipelineP2P {
  kAuto,  ///< "auto": the copy engines where neighbouring stages' GPUs are of one host and map each other's memory
  kCopyEngines,  ///< "copy_engines": the copy engines (Note [Pair sends and receives by the copy engines]); an error
                 ///< where they cannot
  kNccl,         ///< "nccl": NCCL's send and receive kernels
};

/// zero.placement_policy: where ZeRO-3 (Gemini) keeps parameter chunks between uses.
enum class ZeroPlacement {
  kCuda,  ///< "cuda": on the GPU
  kCpu,   ///< "cpu": in pinned host memory, fetched for each use
  kAuto,  ///< "auto": on the GPU while memory lasts, the rest on the host (Gemini's policy)
};

enum class ModelName { kMlp, kGpt2, kVit, kResnet };                              ///< "mlp" "gpt2" "vit" "resnet"
enum class DatasetName { kSynthetic, kMnist, kFashionMnist, kCifar10, kTokens };  ///< see DataConfig::dataset
enum class OptimizerName { kSgd, kAdam, kAdamw, kLamb, kLars };  ///< "sgd" "adam" "adamw" "lamb" "lars"
/// lr_scheduler.name; each may start with a linear warmup (warmup_steps or warmup_epochs), which
/// gives Colossal-AI's *WarmupLR variants: "linear" is LinearWarmupLR, "cosine" with warmup
/// CosineAnnealingWarmupLR, and so on.
enum class SchedulerName {
  kConstant,    ///< "constant": lr throughout (after any warmup)
  kLinear,      ///< "linear": decays linearly to 0 at total_steps
  kCosine,      ///< "cosine": cosine annealing to eta_min at total_steps
  kMultistep,   ///< "multistep": multiplied by gamma at each of milestones
  kPolynomial,  ///< "polynomial": (1 - t/total)^power decay to eta_min
};
enum class DeviceKind { kAuto, kCpu, kCuda };  ///< "auto" (cuda when present) "cpu" "cuda"

/// parallel.tensor.specs[i].spec: how a parameter lives on the 1D tensor-parallel group (the
/// tutorial's ShardSpec, by name). On a linear layer's weight (GPT-2's Conv1D [in, out]):
enum class TensorSplit {
  kColumn,     ///< "column": output features split (ShardSpec([-1])); on wte / wpe the embedding dimension
  kRow,        ///< "row": input features split (ShardSpec([0])), after a column split
  kReplicate,  ///< "replicate": whole on every rank
  kVocab,      ///< "vocab": wte's rows (the vocabulary) split, with the vocabulary-parallel loss
};

/// One entry of parallel.tensor.specs: the parameters whose names match `pattern` get `spec`.
struct TensorSpecRule {
  /// A glob over the model's parameter names (h.0.mlp.c_fc.weight): `*` any run of characters,
  /// dots included, `?` one character; or, after "re:", an ECMAScript regular expression that must
  /// match the whole name.
  std::string pattern;
  TensorSplit spec = TensorSplit::kReplicate;

  /// Whether `name` matches the pattern (which load_config has checked).
  bool matches(std::string_view name) const;

  friend bool operator==(const TensorSpecRule&, const TensorSpecRule&) = default;
};

/// The config-file spelling of each enum value ("2.5d", "adamw", ...).
std::string_view to_string(TensorSplit value);
std::string_view to_string(TensorParallelMode value);
std::string_view to_string(TensorAllReduce value);
std::string_view to_string(PipelineP2P value);
std::string_view to_string(AmpMode value);
std::string_view to_string(ZeroPlacement value);
std::string_view to_string(ModelName value);
std::string_view to_string(DatasetName value);
std::string_view to_string(OptimizerName value);
std::string_view to_string(SchedulerName value);
std::string_view to_string(DeviceKind value);

struct TensorParallelConfig {
  int size = 1;                                       ///< ranks each layer is split over; 1: none
  TensorParallelMode mode = TensorParallelMode::k1d;  ///< the split; its rule on size is checked at load
  int depth = 1;                                      ///< 2.5d only: the number of stacked q x q grids
  /// Megatron's sequence parallelism (mode "1d", size > 1; GPT-2 and ViT): layer norms, dropout and
  /// residual adds work on each rank's share of the tokens (data.seq_len must divide by size),
  /// all-gathered before each column-parallel layer and reduce-scattered after each row-parallel one.
  bool sequence_parallel = false;
  /// GPT-2 under the built-in policy (mode "1d", no sequence parallelism, no activation
  /// checkpointing): the blocks run each batch as this many chunks, so that one chunk's all-reduces
  /// run under another's GEMMs (Note [Overlapped tensor-parallel blocks] in parallel/tp/gpt2_1d.cpp);
  /// it must divide the batch (per microbatch). 1: the blocks run whole.
  int overlap_chunks = 1;
  /// Without sequence parallelism (mode "1d", size > 1): each row-parallel layer runs its GEMM over
  /// this many blocks of rows and all-reduces each block while the next one's GEMM runs, so that only
  /// the last block's all-reduce waits in forward (Note [Row blocks of a linear's output] in
  /// ops/linalg.cpp). 1: one GEMM, then its all-reduce. The values are the same either way. 0 (the
  /// default): chosen per layer and batch, 2 blocks where the layer's output is 32 MiB or more, else 1
  /// (parallel::tp::kAutoRowBlocksBytes: on 2 H100s with the sums by the copy engines, 2 blocks were
  /// 1.4 ms a step faster than 1 for GPT 1.3B at tp=2, whose row layers make 32 MiB, and 1.1 ms slower
  /// for GPT-2 350M, whose make 16 MiB; docs/benchmarks.md, session 23).
  int row_blocks = 0;
  /// Mode "1d" on GPUs (NCCL): "auto" sums 1 MiB and more by the copy engines over NVLink when the
  /// tensor group is two GPUs of one host, leaving the SMs to the GEMMs beside them, with the same
  /// bits as NCCL's sum; "copy_engines" insists (an error naming why it cannot), "nccl" never.
  TensorAllReduce all_reduce = TensorAllReduce::kAuto;
  /// GPT-2's blocks (mode "1d", no sequence parallelism): each row-parallel c_proj adds
  /// the block's residual and its bias in its GEMM, on each rank's share of the rows, before the
  /// all-reduce, instead of two passes over the activation after it (Note [A row-parallel layer's
  /// residual in its GEMM]). Under fp16.mode = "torch" (autocast) the adds stay apart.
  bool fused_residual = true;
  /// Per-parameter sharding specs (Colossal-AI's "parallelize your training like Megatron"
  /// tutorial): each parameter takes the spec of the first rule whose pattern matches its name;
  /// one no rule matches is replicated, but a bias follows its weight. Empty: the model's built-in
  /// policy (Megatron's). GPT-2 only, mode "1d", no sequence parallelism; a rule that matches no
  /// parameter, or an assignment the layers cannot compute (a row split with no column split
  /// before it, attention split without whole heads), is an error at model build time.
  std::vector<TensorSpecRule> specs;

  friend bool operator==(const TensorParallelConfig&, const TensorParallelConfig&) = default;
};

/// Colossal-AI's `parallel = dict(data=..., pipeline=..., tensor=dict(size, mode, depth))`; ranks are
/// laid out tensor innermost, then pipeline, then data (docs/design.md).
struct ParallelConfig {
  int data = 0;      ///< data-parallel size; 0: the world size / (pipeline * tensor.size)
  int pipeline = 1;  ///< pipeline stages; 1: none
  TensorParallelConfig tensor;
  /// Microbatches each batch is split into under a pipeline (Colossal-AI's NUM_MICRO_BATCHES); the
  /// batch size must divide by it.
  int num_microbatches = 1;
  /// Model chunks per pipeline stage (NUM_CHUNKS); more than 1 selects the interleaved 1F1B
  /// schedule, which needs num_microbatches to be a multiple of pipeline.
  int num_chunks = 1;
  /// How the model's pieces (GPT-2: the embedding, each block, the head; ViT and ResNet alike) are
  /// cut among the pipeline's stages x chunks: "balanced" by parameters, a weight two pieces share
  /// counted in the last one; "uniform" by number of pieces; or "measured" by each piece's forward and
  /// backward time on one microbatch, measured on every rank at start-up (initialize/pipeline_stage.h).
  PipelinePartition partition = PipelinePartition::kBalanced;
  /// Explicit pieces per part instead (Colossal-AI's explicit parts): pipeline x num_chunks counts, in
  /// part order (part k is chunk k / pipeline of stage k % pipeline), adding up to the model's pieces;
  /// `colossal describe` lists the pieces. Empty: `partition` decides.
  std::vector<int64_t> partition_sizes;
  /// Under a pipeline, every this many steps the trainer prints each stage's busy and idle time and the
  /// measured bubble against (p - 1) / (v m) (engine/pipeline_report.h); 0: never.
  int pipeline_report = 0;
  /// On GPUs (NCCL), a pipeline of two stages: "auto" moves the stages' activations and gradients by
  /// the copy engines over NVLink when the two GPUs are of one host, so that a send completes without
  /// waiting for the other stage to post its receive and a waiting receive holds no SM; "copy_engines"
  /// insists (an error naming why it cannot), "nccl" never. Longer pipelines use NCCL.
  PipelineP2P pipeline_p2p = PipelineP2P::kAuto;
  /// Seconds any collective or send/recv may stay outstanding before a rank ends with a message
  /// naming it, rather than hang on a peer that skipped it or died (comm/watchdog.h); the environment
  /// variable COLOSSAL_COLLECTIVE_TIMEOUT overrides it.
  double timeout_s = 300;

  friend bool operator==(const ParallelConfig&, const ParallelConfig&) = default;
};

/// fp16 = dict(mode=AMP_TYPE.TORCH | AMP_TYPE.NAIVE, ...): mixed precision with a dynamic loss scale.
/// The scale options apply to both modes (hysteresis to naive only; naive also never backs off below 1,
/// Colossal-AI's min_scale). amp::MixedPrecisionOptimizer implements both.
struct Fp16Config {
  AmpMode mode = AmpMode::kOff;
  double initial_scale = 65536;  ///< loss scale at the first step (2^16)
  double growth_factor = 2;      ///< scale *= this after growth_interval steps without overflow
  double backoff_factor = 0.5;   ///< scale *= this on overflow (after hysteresis overflows for naive)
  /// Overflow-free steps in a row before the scale grows; 0: the mode's default, 2000 for torch
  /// (torch.amp.GradScaler) and 1000 for naive (Colossal-AI's DynamicGradScaler).
  int growth_interval = 0;
  int hysteresis = 2;             ///< naive: overflowing steps tolerated before backing off
  double max_scale = 4294967296;  ///< the scale never grows past this (2^32)

  friend bool operator==(const Fp16Config&, const Fp16Config&) = default;
};

/// zero = dict(...): ZeRO sharding of optimizer states (stage 1), gradients (2) and parameters (3)
/// over the data-parallel ranks, with Gemini's chunked placement for stage 3.
struct ZeroConfig {
  int stage = 0;                                          ///< 0: off
  ZeroPlacement placement_policy = ZeroPlacement::kCuda;  ///< stage 3 only (anything but cuda needs it)
  /// Stages 1, 2 and 3: this rank's fp32 master weights and optimizer moments live in host memory and
  /// the optimizer steps there, multi-threaded and vectorised (optimizer.name adam, adamw or lamb; at
  /// stage 3 adam or adamw; parallel/zero/host_offload.h), the gradients copied over bucket (stage 3:
  /// chunk) by bucket during backward, the updated parameters copied back (stage 3: written into the
  /// host shards with placement_policy "cpu", no device copy); buckets are stepped during backward
  /// too unless clipping or fp16 loss scaling needs all gradients first. Works at parallel.data = 1
  /// (one GPU plus host memory).
  bool offload_optimizer = false;
  int chunk_size_mb = 32;     ///< stage 3: parameters are managed in chunks of this many MiB
  int reduce_bucket_mb = 25;  ///< stages 1-2: gradients are reduce-scattered in buckets of this many MiB

  friend bool operator==(const ZeroConfig&, const ZeroConfig&) = default;
};

struct ModelConfig {
  ModelName name = ModelName::kMlp;
  /// A named size of the model: gpt2: "gpt2", "gpt2-medium", "gpt2-large", "gpt2-xl"; vit: timm's
  /// "vit_tiny_patch16_224" ... "vit_large_patch16_224", "vit_tiny_patch4_32" (CIFAR),
  /// "vit_tiny_patch4_28" (MNIST); resnet: "resnet18", "resnet34", "resnet50"; mlp has none.
  /// Empty: the model's own default, adjusted by options.
  std::string preset;
  /// Keyword arguments of the model builder (num_classes, dropout, n_layer, ...), checked by the
  /// builder with OptionTable::reject_unknown. Every model takes checkpoint_activations = true:
  /// each transformer block (gpt2, vit) or residual block (resnet) is recomputed in backward
  /// instead of keeping its activations (Hugging Face's gradient_checkpointing, Colossal-AI's
  /// checkpoint=True), with the same losses and gradients.
  OptionTable options{"model.options"};
  /// A safetensors file of weights under Hugging Face (GPT-2) or timm (ViT) names to start from
  /// (nn/hub_weights.h); empty: the model's own initialisation.
  std::string weights;

  friend bool operator==(const ModelConfig&, const ModelConfig&) = default;
};

struct DataConfig {
  /// "synthetic" (generated, no files), "mnist" and "fashion_mnist" (IDX files, .gz or not),
  /// "cifar10" (the binary version), "tokens" (uint16 token files from tokenize_file).
  DatasetName dataset = DatasetName::kSynthetic;
  std::string path;       ///< the dataset's file or folder; required unless synthetic
  std::string test_path;  ///< a held-out split; empty: the dataset's own test split where it has one
  /// Samples each data-parallel rank loads per iteration; under a pipeline it is split into
  /// parallel.num_microbatches microbatches.
  int batch_size = 64;
  int num_workers = 0;     ///< loader threads; 0: load on the training thread
  bool shuffle = true;     ///< reshuffle the training set each epoch (by train.seed and the epoch)
  bool drop_last = true;   ///< skip a last incomplete batch
  bool pin_memory = true;  ///< on a GPU, stage batches in pinned host memory for asynchronous copies (CPU runs: unused)
  int seq_len = 0;         ///< tokens: tokens per sample; 0: the model's context length
  /// Applied in order to training images: "random_crop", "random_flip", "resize", "center_crop",
  /// "normalize", "auto_augment", "mixup"; their parameters (crop padding, normalize mean/std,
  /// mixup_alpha, ...) go in options.
  std::vector<std::string> transforms;
  OptionTable options{"data.options"};  ///< dataset- and transform-specific settings

  friend bool operator==(const DataConfig&, const DataConfig&) = default;
};

struct OptimizerConfig {
  OptimizerName name = OptimizerName::kAdamw;
  double lr = 1e-3;                          ///< peak learning rate (after warmup)
  double weight_decay = 0;                   ///< decoupled for adamw and lamb, L2 for sgd, adam and lars
  std::vector<double> betas = {0.9, 0.999};  ///< adam, adamw, lamb: the two moment decay rates
  double eps = 1e-8;                         ///< adam, adamw, lamb: added to the second moment's root
  double momentum = 0;                       ///< sgd, lars
  bool nesterov = false;                     ///< sgd: Nesterov momentum (needs momentum > 0)
  /// Biases, norm parameters and other 1-D parameters take no weight decay (timm, Megatron-LM);
  /// false decays every parameter, as Colossal-AI's tutorials do with model.parameters().
  bool no_decay_bias_and_norm = true;

  friend bool operator==(const OptimizerConfig&, const OptimizerConfig&) = default;
};

struct LrSchedulerConfig {
  SchedulerName name = SchedulerName::kConstant;
  int64_t warmup_steps = 0;         ///< linear warmup from 0 over this many steps...
  int64_t warmup_epochs = 0;        ///< ...or epochs (at most one of the two)
  int64_t total_steps = 0;          ///< where decays end; 0: the run's length (train.max_steps or epochs)
  double eta_min = 0;               ///< cosine, polynomial: the final learning rate
  std::vector<int64_t> milestones;  ///< multistep: increasing steps at which lr *= gamma
  double gamma = 0.1;               ///< multistep: the factor at each milestone
  double power = 1;                 ///< polynomial: the exponent

  friend bool operator==(const LrSchedulerConfig&, const LrSchedulerConfig&) = default;
};

/// The loop: how long, how often to log, test and checkpoint (Colossal-AI's trainer.fit arguments).
struct TrainLoopConfig {
  int64_t epochs = 1;               ///< passes over the training set; 0: bounded by max_steps alone
  int64_t max_steps = 0;            ///< optimizer steps at most; 0: no bound besides epochs
  int64_t seed = 1024;              ///< seeds initialisation, shuffling and dropout (Colossal-AI's default seed)
  int64_t log_interval = 10;        ///< log every this many steps
  int64_t test_interval = 1;        ///< evaluate every this many epochs; 0: never
  std::string checkpoint_dir;       ///< where checkpoints go; empty: none are written
  int64_t checkpoint_interval = 1;  ///< save every this many epochs (with checkpoint_dir); 0: not by epoch
  int64_t checkpoint_steps = 0;     ///< also save every this many optimizer steps inside epochs; 0: never
  int64_t keep_checkpoints = 0;     ///< keep only the newest this many checkpoints; 0: all
  /// A checkpoint file, or a checkpoint_dir whose newest checkpoint is taken, to continue from;
  /// empty: start fresh.
  std::string resume_from;
  std::string log_dir;         ///< TensorBoard event files (JSON-lines metrics: --metrics FILE); empty: console only
  double label_smoothing = 0;  ///< cross-entropy label smoothing
  DeviceKind device = DeviceKind::kAuto;
  /// f32 matrix products on GPUs with their inputs rounded to TF32 (PyTorch's allow_tf32; about 7x
  /// the f32 rate on H100); false: f32 throughout, as the CPU computes them (for comparing the two).
  bool tf32 = true;
  bool progress = true;  ///< a progress bar per pass on stderr (redrawn on a terminal, every 10% otherwise)

  friend bool operator==(const TrainLoopConfig&, const TrainLoopConfig&) = default;
};

/// The whole run. Top-level keys as in Colossal-AI's config files; sections as TOML tables.
struct TrainConfig {
  ParallelConfig parallel;
  Fp16Config fp16;
  bool bf16 = false;  ///< bf16 model with fp32 master weights, no loss scaling (not with fp16)
  ZeroConfig zero;
  int gradient_accumulation = 1;  ///< iterations whose gradients add up before each optimizer step
  double clip_grad_norm = 0;      ///< clip gradients to this global L2 norm; 0: no clipping
  ModelConfig model;
  DataConfig data;
  OptimizerConfig optimizer;
  LrSchedulerConfig lr_scheduler;
  TrainLoopConfig train;

  friend bool operator==(const TrainConfig&, const TrainConfig&) = default;
};

/// A rule between keys that a layer above config owns (the parallel layer's sizes, say): it reads a
/// bound config and reports each problem through `report(key, message)`, `key` being the dotted key
/// the message is about (its file and line are prefixed, as for config's own rules). Passed to
/// load_config, parse_config and validate, so that a rule has one home and one wording and still
/// runs at load, before anything is built.
using ConfigRule = std::function<void(const struct TrainConfig& config,
                                      const std::function<void(std::string_view key, std::string message)>& report)>;
using ConfigRules = std::vector<ConfigRule>;

/// Reads the TOML file at `path`, applies `overrides` in order and checks the result. Each override
/// is "dotted.key=value" with a TOML value (1, 2.5e-4, true, "text", [0.9, 0.95], {a = 1}); a value
/// that is not TOML is taken as a bare string (--set optimizer.name=lamb). Throws colossal::Error
/// listing every problem: unknown keys (with the nearest valid key), wrong types, values out of
/// range or not among the choices (with the range or the choices), broken rules between keys (tensor
/// size against mode, ...), each naming the full dotted key and the file and line, or the override,
/// it came from.
/// `rules` run after config's own, when those found nothing.
TrainConfig load_config(const std::filesystem::path& path, const std::vector<std::string>& overrides = {},
                        const ConfigRules& rules = {});

/// As load_config, from TOML text; `source_name` stands for the file in messages.
TrainConfig parse_config(std::string_view toml, const std::vector<std::string>& overrides = {},
                         std::string_view source_name = "<config>", const ConfigRules& rules = {});

/// Checks a config built or changed in code by the rules load_config applies (ranges, choices, rules
/// between keys); throws colossal::Error listing every problem.
void validate(const TrainConfig& config, const ConfigRules& rules = {});

/// The effective config as a TOML document with every key (choices noted in comments); parse_config
/// reads it back to an equal TrainConfig.
std::string describe(const TrainConfig& config);

}  // namespace colossal::config
