// The run assembly: see training_run.h.
#include "colossal/initialize/training_run.h"

#include <fmt/format.h>
#include <fmt/ranges.h>
#include <unistd.h>  // getpid

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <set>
#include <string>
#include <utility>

#include "colossal/amp/mixed_precision_optimizer.h"
#include "colossal/comm/bootstrap.h"
#include "colossal/comm/init.h"
#include "colossal/comm/pair_all_reduce.h"
#include "colossal/comm/single_process_group.h"
#include "colossal/comm/watchdog.h"   // stop_transports
#include "colossal/core/allocator.h"  // empty_cache
#include "colossal/core/error.h"
#include "colossal/core/profiler.h"  // configure
#include "colossal/data/sampler.h"
#include "colossal/engine/checkpoint.h"
#include "colossal/engine/hooks.h"
#include "colossal/engine/log_hooks.h"
#include "colossal/engine/pipeline_report.h"
#include "colossal/initialize/pipeline_stage.h"
#include "colossal/nn/hub_weights.h"
#include "colossal/nn/safetensors.h"         // read_safetensors_header
#include "colossal/ops/linalg.h"             // set_float32_matmul_precision
#include "colossal/parallel/env_override.h"  // env_switch
#include "colossal/parallel/layout.h"        // ParallelLayout
#include "colossal/parallel/layout_rules.h"
#include "colossal/parallel/tp/gpt2_1d.h"
#include "colossal/parallel/tp/gpt2_plan.h"  // resolve_gpt2_specs
#include "colossal/parallel/tp/random.h"     // DropoutGenerators, tensor_parallel_seed
#include "colossal/parallel/tp/vit_1d.h"
#include "colossal/parallel/tp/vit_plan.h"  // resolve_vit_specs

namespace colossal::initialize {
namespace {

namespace fs = std::filesystem;
using config::TrainConfig;

/// Note [ZeRO over one data rank]
/// Stages 1 and 2 shard the optimizer's states and the gradients over the data-parallel group. With a
/// group of one there is nothing to shard, and the handler's buckets, shard gradient and gathers only
/// cost time (GPT-2 124M, bf16, B16 T1024 on one H100: 32.70 ms a step with zero.stage = 1 against
/// 31.73-31.91 without, session 20). So such a run trains without ZeRO, to the same numbers, and a
/// config can set zero.stage = 1 for its data-parallel runs without slowing its one-GPU runs or its
/// pipelines of one data rank. Optimizer offload (host states) and stage 3 (parameters in chunks,
/// their placement) do something at any size.
bool zero_has_nothing_to_shard(const TrainConfig& c, int64_t data_size) {
  return (c.zero.stage == 1 || c.zero.stage == 2) && !c.zero.offload_optimizer && data_size == 1;
}

/// What the config asks for that this assembly cannot build yet, named by key. `data_size`: the
/// layout's data-parallel size for the run's processes (0: not known).
void reject_unsupported(const TrainConfig& c, int64_t data_size) {
  if (c.parallel.pipeline > 1) {
    // The pipeline schedule runs a stage's chunks (initialize/pipeline_stage.h); what it does not
    // combine with yet is refused here, by key.
    // A pipeline of tensor-parallel stages (Note [Pipeline of tensor-parallel stages]) splits the blocks
    // by the built-in policy, with whole activations between them.
    if (c.parallel.tensor.size > 1 && c.parallel.tensor.sequence_parallel) {
      unsupported(
          fmt::format("parallel.pipeline = {} with parallel.tensor.sequence_parallel = true: the stages exchange "
                      "whole activations, sequence parallelism is not built into the pipeline yet; set it to false",
                      c.parallel.pipeline));
    }
    if (c.parallel.tensor.size > 1 && !c.parallel.tensor.specs.empty()) {
      unsupported(
          fmt::format("parallel.pipeline = {} with parallel.tensor.specs: a pipeline's stages split their blocks by "
                      "the built-in policy only; remove parallel.tensor.specs",
                      c.parallel.pipeline));
    }
    if (c.fp16.mode == config::AmpMode::kTorch) {
      unsupported(
          fmt::format("parallel.pipeline = {} with fp16.mode = \"torch\": autocast does not reach the stages' "
                      "passes yet; use fp16.mode = \"naive\" or bf16 = true",
                      c.parallel.pipeline));
    }
    if (c.data.batch_size % c.parallel.num_microbatches != 0) {
      unsupported(
          fmt::format("data.batch_size = {} does not split into parallel.num_microbatches = {} microbatches; "
                      "use a batch size that is a multiple of it",
                      c.data.batch_size, c.parallel.num_microbatches));
    }
  }
  if (c.parallel.tensor.size > 1) {
    // Tensor parallelism (1D) reaches GPT-2 and ViT so far: parallel/tp/gpt2_1d.h, vit_1d.h.
    const bool model_ok = c.model.name == config::ModelName::kGpt2 || c.model.name == config::ModelName::kVit;
    if (!model_ok || c.parallel.tensor.mode != config::TensorParallelMode::k1d) {
      unsupported(fmt::format(
          "parallel.tensor.size = {} with model.name = \"{}\" and parallel.tensor.mode = \"{}\": tensor "
          "parallelism is built for model.name = \"gpt2\" and \"vit\" in mode \"1d\" so far",
          c.parallel.tensor.size, config::to_string(c.model.name), config::to_string(c.parallel.tensor.mode)));
    }
  }
  if (c.zero.stage > 0 && !zero_has_nothing_to_shard(c, data_size)) {
    // ZeRO stages 1 and 2 (parallel/zero/low_level_zero.h) and 3 (parallel/zero/zero3.h), over the
    // data group, of each tensor rank's parameters under tensor parallelism.
    if (c.parallel.pipeline > 1) {
      unsupported(
          fmt::format("zero.stage = {} with parallel.pipeline = {}: ZeRO shards over a layout without a "
                      "pipeline so far; set parallel.pipeline = 1 or zero.stage = 0",
                      c.zero.stage, c.parallel.pipeline));
    }
    // ZeRO-3 gathers a block's chunks in the block's forward hooks; the chunked blocks
    // (Note [Overlapped tensor-parallel blocks]) run the blocks' halves directly, past those hooks.
    if (c.zero.stage == 3 && c.parallel.tensor.size > 1 && c.parallel.tensor.overlap_chunks > 1) {
      unsupported(
          fmt::format("zero.stage = 3 with parallel.tensor.overlap_chunks = {}: ZeRO-3 gathers each "
                      "block's parameters as the block runs whole; set parallel.tensor.overlap_chunks = 1 "
                      "or zero.stage = 1 or 2",
                      c.parallel.tensor.overlap_chunks));
    }
  }
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

// Note [Output paths at start]
// A run that trains for an hour and then cannot write its first checkpoint has wasted the hour. So
// every place a run writes (train.checkpoint_dir, train.log_dir, the metrics file) is created and
// written to once before anything is built, and any failure names the key, the path and the
// system's reason. A folder is probed with a file of our own (created, then removed); the metrics
// file is opened for appending, which changes nothing in an existing file.

[[noreturn]] void bad_output(std::string_view key, const fs::path& path, const std::string& why) {
  throw Error(fmt::format("{} = \"{}\" cannot be written: {}; choose a writable path", key, path.string(), why));
}

void check_writable_dir(std::string_view key, const fs::path& dir) {
  std::error_code error;
  if (fs::exists(dir, error) && !fs::is_directory(dir, error)) bad_output(key, dir, "it exists and is not a folder");
  fs::create_directories(dir, error);
  if (error) bad_output(key, dir, error.message());
  const fs::path probe = dir / fmt::format(".colossal-write-probe-{}", ::getpid());
  std::FILE* file = std::fopen(probe.c_str(), "wb");
  if (file == nullptr) bad_output(key, dir, std::strerror(errno));
  std::fclose(file);
  fs::remove(probe, error);
}

void check_writable_file(std::string_view key, const fs::path& file) {
  std::error_code error;
  if (fs::is_directory(file, error)) bad_output(key, file, "it is a folder");
  if (file.has_parent_path()) {
    fs::create_directories(file.parent_path(), error);
    if (error) bad_output(key, file, fmt::format("its folder cannot be made: {}", error.message()));
  }
  std::FILE* f = std::fopen(file.c_str(), "ab");
  if (f == nullptr) bad_output(key, file, std::strerror(errno));
  std::fclose(f);
}

/// The world of this run: the one given, the launcher's processes, or this process alone.
std::shared_ptr<comm::ProcessGroup> make_world(const TrainConfig& c, const RunOptions& options) {
  if (options.world) return options.world;
  const comm::DistEnv env = comm::read_dist_env();
  if (env.world_size == 1) return comm::single_process_group(pick_device(c));
  comm::InitOptions init;
  if (c.train.device == config::DeviceKind::kCpu) init.backend = comm::Backend::mpi;
  init.timeout = comm::collective_timeout_from_seconds(c.parallel.timeout_s, "parallel.timeout_s");
  return comm::init_process_group(init, env);
}

/// parallel.tensor.all_reduce: the tensor group's sums of 1 MiB and more (the row layers' outputs,
/// the column layers' input gradients, the vocabulary-parallel embedding's output) moved by the copy
/// engines between its two GPUs instead of by NCCL's kernels (Note [Pair all-reduce by the copy
/// engines]), through a 32 MiB window on each GPU. Collective over the tensor group; says on the
/// writer's console which way the sums go.
void choose_tensor_all_reduce(const config::TensorParallelConfig& tensor, const parallel::ParallelContext& context,
                              bool writer) {
  if (tensor.size != 2 || tensor.all_reduce == config::TensorAllReduce::kNccl) return;
  const std::shared_ptr<comm::ProcessGroup> group = context.group(parallel::GroupKind::kTensor);
  std::string why;
  const bool on = comm::use_pair_all_reduce(*group, int64_t{32} << 20, int64_t{1} << 20, &why);
  COLOSSAL_CHECK(on || tensor.all_reduce != config::TensorAllReduce::kCopyEngines,
                 "parallel.tensor.all_reduce = \"copy_engines\" needs a tensor group of two GPUs of one host that can "
                 "map each other's memory, but {}; use \"auto\" (the copy engines where they can, else NCCL) or "
                 "\"nccl\"",
                 why);
  if (writer && group->device().is_cuda()) {
    fmt::print("parallel.tensor.all_reduce = \"{}\": {}\n", config::to_string(tensor.all_reduce),
               on ? "the tensor group's sums by the copy engines" : fmt::format("NCCL ({})", why));
  }
}

/// parallel.pipeline_p2p: a pipeline on GPUs of one host sends its activations and gradients by the
/// copy engines (Note [Pair sends and receives by the copy engines]) through 16 slots of 4 MiB on each
/// GPU of each pair of neighbouring stages (GPT-2 350M's activation of a microbatch of 2 x 1024 tokens
/// fills one; a larger message goes in pieces): two stages over the pipeline group itself, more over a
/// group of each pair (PipelineSchedule::neighbour_pairs, the ring's closing pair too with several
/// chunks). Collective over the pipeline group. Returns the pairs for the schedule (none for two
/// stages, whose group is the pair); says on the writer's console which way the exchanges go.
std::map<int, std::shared_ptr<comm::ProcessGroup>> choose_pipeline_p2p(const config::ParallelConfig& parallel,
                                                                       const parallel::ParallelContext& context,
                                                                       bool writer) {
  std::map<int, std::shared_ptr<comm::ProcessGroup>> pairs;
  if (context.layout().pipeline_size() == 1 || parallel.pipeline_p2p == config::PipelineP2P::kNccl) return pairs;
  const std::shared_ptr<comm::ProcessGroup> group = context.group(parallel::GroupKind::kPipeline);
  if (!group->device().is_cuda()) return pairs;
  constexpr int64_t kSlotBytes = int64_t{4} << 20, kSlots = 16;
  std::string why;
  bool on = true;
  if (group->size() == 2) {
    on = comm::use_pair_p2p(*group, kSlotBytes, kSlots, &why);
    // The pair's large sums too: GPT-2's tied wte (Note [Tied sum under the last backward]) is summed
    // while stage 0's last backward runs, where NCCL's kernels would take SMs from it (its backward
    // measured 5.43 ms against a median of 4.59 beside NCCL's sum). COLOSSAL_PIPELINE_PAIR_SUM=0
    // leaves them to NCCL (set alike on both stages).
    if (on && parallel::env_switch("COLOSSAL_PIPELINE_PAIR_SUM").value_or(true)) {
      (void)comm::use_pair_all_reduce(*group, int64_t{32} << 20, int64_t{1} << 20);
    }
  } else {
    // A pair the copy engines cannot serve (its GPUs on two hosts) stays on NCCL; both of its stages
    // see that alike.
    for (auto& [stage, pair] : engine::PipelineSchedule::neighbour_pairs(group, parallel.num_chunks > 1)) {
      std::string why_pair;
      if (comm::use_pair_p2p(*pair, kSlotBytes, kSlots, &why_pair)) {
        pairs[stage] = pair;
      } else if (why.empty()) {
        why = fmt::format("stages {} and {}: {}", group->rank(), stage, why_pair);
      }
    }
    // Whether every pair is on, agreed over the pipeline, so that "copy_engines" fails on every stage.
    Tensor all_on = core::full({1}, why.empty() ? 1.0 : 0.0, TensorOptions(DType::i32, group->device()));
    group->all_reduce(all_on, comm::ReduceOp::min);
    on = all_on.item<int32_t>() == 1;
    if (!on && why.empty()) why = "another pair of neighbouring stages cannot";
  }
  COLOSSAL_CHECK(on || parallel.pipeline_p2p != config::PipelineP2P::kCopyEngines,
                 "parallel.pipeline_p2p = \"copy_engines\" needs the pipeline's neighbouring stages on GPUs of one "
                 "host that can map each other's memory, but {}; use \"auto\" (the copy engines where they can, "
                 "else NCCL) or \"nccl\"",
                 why);
  if (writer) {
    fmt::print("parallel.pipeline_p2p = \"{}\": {}\n", config::to_string(parallel.pipeline_p2p),
               on ? "the stages' exchanges by the copy engines" : fmt::format("NCCL ({})", why));
  }
  return pairs;
}

}  // namespace

config::TrainConfig load_run_config(const fs::path& path, const std::vector<std::string>& overrides) {
  return config::load_config(path, overrides, {parallel::layout_config_rule()});
}

TrainingRun::TrainingRun(config::TrainConfig config, RunOptions options)
    : config_(std::move(config)), options_(std::move(options)) {
  try {
    assemble();
  } catch (...) {
    // Leaving on an error: stop the transports before the groups are torn down, which would
    // otherwise wait for peers that went on (comm::stop_transports).
    comm::stop_transports();
    throw;
  }
}

void TrainingRun::assemble() {
  const TrainConfig& c = config_;
  const comm::DistEnv env = comm::read_dist_env();
  // The data-parallel size as the layout derives it; 0 where the layout breaks its rules, which
  // require_layout reports below, after the unsupported combinations.
  const int world_size = options_.world ? options_.world->size() : env.world_size;
  const bool layout_ok = parallel::check_layout(c.parallel, 0, world_size).empty();
  reject_unsupported(c, layout_ok ? parallel::ParallelLayout(c.parallel, world_size).data_size() : 0);
  // The writer is the world's rank 0, known from the environment before any group exists: check
  // its outputs before the processes wait on each other.
  writer_ = options_.world ? options_.world->rank() == 0 : env.rank == 0;
  if (writer_) check_outputs();

  std::shared_ptr<comm::ProcessGroup> world = make_world(c, options_);
  parallel::require_layout(c.parallel, world->size(), c.data.batch_size);
  context_ = std::make_shared<const parallel::ParallelContext>(parallel::ParallelContext::create(c.parallel, world));
  // Each rank works where its groups' tensors live: its GPU under NCCL, the CPU under MPI, and
  // train.device for a single process (make_world).
  device_ = world->device();
  ops::set_float32_matmul_precision(c.train.tf32 ? ops::Float32MatmulPrecision::high
                                                 : ops::Float32MatmulPrecision::highest);
  build_data_and_model();
  build_engine();
  resume();
  build_hooks();
}

TrainingRun::~TrainingRun() = default;

engine::NamedGenerators TrainingRun::named_generators() const {
  // The generators that draw after initialisation; checkpoints carry their states (the writer's:
  // resume() gives each tensor rank its own tensor_parallel seed back).
  return {{"dropout", dropout_generator_.get()},
          {"tensor_parallel", tensor_generator_.get()},
          {"default", &core::default_generator()}};
}

void TrainingRun::check_outputs() const {
  const TrainConfig& c = config_;
  if (!c.train.checkpoint_dir.empty()) check_writable_dir("train.checkpoint_dir", c.train.checkpoint_dir);
  if (!c.train.log_dir.empty()) check_writable_dir("train.log_dir", c.train.log_dir);
  if (!options_.metrics_path.empty()) check_writable_file("--metrics", options_.metrics_path);
}

void TrainingRun::build_data_and_model() {
  const TrainConfig& c = config_;
  datasets_ = make_datasets(c);
  const auto seed = static_cast<uint64_t>(c.train.seed);
  // Every data-parallel replica draws the same initial weights and dropout masks as the serial
  // run (the data seed: parallel/layout.h's SeedMode::kData); DataParallel also broadcasts rank 0's.
  init_generator_ = std::make_unique<core::Generator>(seed);
  dropout_generator_ = std::make_unique<core::Generator>(seed + 7);
  // Megatron's RNG tracker: inside the tensor-parallel region each tensor rank draws its own masks.
  tensor_generator_ = std::make_unique<core::Generator>(parallel::tp::tensor_parallel_seed(seed + 7, *context_));
  // Under a pipeline a GPT-2, ViT or ResNet is cut before it is built, and this rank builds its own
  // stage's pieces only, the others as stand-ins (Note [Stage pieces built alone] in pipeline_stage.h).
  // A measured cut times a probe of the model here (on this rank's device; a GPT-2's or ViT's block in
  // its tensor-parallel form where the blocks split).
  if (context_->layout().pipeline_size() > 1) {
    const MeasuredCutSetup measure{
        .context = context_.get(),
        .device = device_,
        .dropout = {.data = dropout_generator_.get(), .tensor = tensor_generator_.get()},
        .first_example = datasets_.train->size() > 0 ? datasets_.train->get(0).input : Tensor()};
    planned_cut_ = plan_before_building(c, datasets_, &measure, &planned_times_);
  }
  ModelBuild build;
  if (planned_cut_) build.pieces = stage_pieces(*planned_cut_, context_->group(parallel::GroupKind::kPipeline)->rank());
  model_ = make_model(c, datasets_, *init_generator_, *dropout_generator_, build);
  if (!c.model.weights.empty()) {
    // A stage built alone reads its own pieces' weights only (Note [Weights of the pieces held] in
    // nn/hub_weights.h).
    nn::HeldTensors held;
    if (planned_cut_) {
      std::set<std::string> names;
      const std::vector<std::shared_ptr<nn::Module>> pieces = pipeline_pieces(*model_);
      for (size_t i = 0; i < pieces.size(); ++i) {
        if (!build.pieces(i)) continue;
        for (const auto& [name, tensor] : pieces[i]->state_dict()) names.insert(name);
      }
      held = [names = std::move(names)](const std::string& name) { return names.contains(name); };
    }
    const nn::HubImportReport report = nn::import_hub_weights(*model_, c.model.weights, held);
    if (writer_) {
      fmt::print("model.weights: loaded {}{}{}{}\n", c.model.weights,
                 report.stripped_transformer_prefix ? " (names without \"transformer.\")" : "",
                 report.dropped.empty() ? "" : fmt::format("; left out {}", fmt::join(report.dropped, ", ")),
                 report.cast.empty() ? "" : fmt::format("; widened {}", fmt::join(report.cast, ", ")));
    }
  }
  model_->to(device_);
  choose_tensor_all_reduce(c.parallel.tensor, *context_, writer_);
  const std::map<int, std::shared_ptr<comm::ProcessGroup>> neighbour_pairs =
      choose_pipeline_p2p(c.parallel, *context_, writer_);
  // Under a pipeline the stage splits its own blocks (make_pipeline_stage below).
  if (context_->layout().tensor_size() > 1 && context_->layout().pipeline_size() == 1) {
    // The serial model split over the tensor group (reject_unsupported let GPT-2 and ViT through).
    // Dropout inside the split region draws from the tensor generator, different on every tensor
    // rank; outside it every rank draws the same masks from the data's (parallel/tp/random.h).
    const parallel::tp::DropoutGenerators dropout{.data = dropout_generator_.get(), .tensor = tensor_generator_.get()};
    const std::shared_ptr<comm::ProcessGroup> tensor_group = context_->group(parallel::GroupKind::kTensor);
    // parallel.tensor.specs in place of the built-in policy (parallel/tp/gpt2_plan.h, vit_plan.h):
    // resolved against the serial model's parameter names, an assignment the layers cannot compute
    // an error naming the parameter before anything is split.
    const auto names = [](nn::Module& model) {
      std::vector<std::string> out;
      for (const auto& [name, parameter] : model.named_parameters()) out.push_back(name);
      return out;
    };
    if (auto* vit = dynamic_cast<nn::models::VisionTransformer*>(model_.get())) {
      parallel::tp::ParallelViTOptions options{.dropout = dropout,
                                               .sequence_parallel = c.parallel.tensor.sequence_parallel};
      if (!c.parallel.tensor.specs.empty()) {
        options.plan =
            parallel::tp::resolve_vit_specs(c.parallel.tensor.specs, vit->config(), names(*vit), tensor_group->size())
                .plan;
      }
      model_ = std::make_shared<parallel::tp::ParallelViT>(*vit, tensor_group, options);
    } else {
      auto* gpt2 = dynamic_cast<nn::models::GPT2*>(model_.get());
      COLOSSAL_CHECK(gpt2 != nullptr, "parallel.tensor.size > 1: the model built is neither a GPT-2 nor a ViT");
      parallel::tp::ParallelGPT2Options options{.dropout = dropout,
                                                .sequence_parallel = c.parallel.tensor.sequence_parallel,
                                                .overlap_chunks = c.parallel.tensor.overlap_chunks,
                                                .fused_residual = c.parallel.tensor.fused_residual};
      if (!c.parallel.tensor.specs.empty()) {
        options.plan = parallel::tp::resolve_gpt2_specs(c.parallel.tensor.specs, gpt2->config(), names(*gpt2),
                                                        tensor_group->size())
                           .plan;
      }
      model_ = std::make_shared<parallel::tp::ParallelGPT2>(*gpt2, tensor_group, options);
    }
    model_->to(device_);  // anything the split made anew sits where the serial model did
  }
  if (context_->layout().pipeline_size() > 1) {
    // This rank's stage: the whole model is cut into pieces and the stage keeps its chunks
    // (initialize/pipeline_stage.h; a model cut as planned before it was built holds only this
    // stage's pieces whole, one under a measured cut or with imported weights the whole model).
    // With tensor parallelism its blocks become tensor-parallel (Note [Pipeline of tensor-parallel
    // stages]), their dropout drawing as ParallelGPT2's and ParallelViT's do.
    const parallel::tp::DropoutGenerators dropout{.data = dropout_generator_.get(), .tensor = tensor_generator_.get()};
    Tensor sample;  // parallel.partition = "measured" not planned before building: a microbatch to time the pieces on
    if (measures_pipeline_partition(c.parallel) && !planned_cut_) {
      const Tensor first = datasets_.train->size() > 0 ? datasets_.train->get(0).input : Tensor();
      sample = pipeline_sample_microbatch(*model_, c, first, device_);
    }
    PipelineStage stage = make_pipeline_stage(*model_, *context_, c, dropout, sample, planned_cut_, planned_times_);
    if (writer_ && options_.verbose) fmt::print("{}\n", stage.description);
    model_ = stage.module;
    model_->to(device_);  // the tensor-parallel blocks made anew sit where the serial model did
    pipeline_schedule_ = stage.schedule;
    for (const auto& [other, pair] : neighbour_pairs) pipeline_schedule_->set_neighbour_group(other, pair);
    serial_names_ = stage.serial_names;  // checkpoints hold the serial model's tensors
  }
  // The row-parallel layers of either split (parallel.tensor.row_blocks; none without one).
  parallel::tp::set_row_blocks(*model_, c.parallel.tensor.row_blocks);

  // The global batch of iteration k is the serial run's batch k (data.batch_size x dp samples of
  // one shared order), split among the data-parallel ranks: each takes every dp-th sample.
  const int64_t n = datasets_.train->size();
  const int dp_rank = context_->rank(parallel::GroupKind::kData);
  const int dp_size = context_->size(parallel::GroupKind::kData);
  const auto seed_u = static_cast<uint64_t>(c.train.seed);
  if (dp_size > 1) {
    sampler_ =
        std::make_shared<data::DistributedSampler>(n, data::DistributedSamplerOptions{.rank = dp_rank,
                                                                                      .world_size = dp_size,
                                                                                      .shuffle = c.data.shuffle,
                                                                                      .seed = seed_u,
                                                                                      .drop_last = c.data.drop_last});
  } else if (c.data.shuffle) {
    sampler_ = std::make_shared<data::RandomSampler>(n, seed_u);
  } else {
    sampler_ = std::make_shared<data::SequentialSampler>(n);
  }
  plan_ = plan_run(sampler_->size(), c.data.batch_size, c.data.drop_last, c.gradient_accumulation, c.train.epochs,
                   c.train.max_steps);

  data::DataLoaderOptions lo;
  lo.batch_size = c.data.batch_size;
  lo.drop_last = c.data.drop_last;
  lo.shuffle = c.data.shuffle;
  lo.seed = seed_u;
  lo.num_workers = c.data.num_workers;
  if (device_.is_cuda()) {
    lo.device = device_;  // side-stream copies to the GPU, from pinned staging when data.pin_memory
    lo.pin_memory = c.data.pin_memory;
  }
  // Staged images (Note [Batch stages]): the workers stop after the last uint8 transform and the
  // loader runs the rest (ToTensor, resize, normalize, mixup; synthetic pixels) on the GPU after
  // its copy, or on the worker for a CPU run: the same batches as the per-sample pipeline.
  const std::optional<Datasets::Staged>& staged = datasets_.staged;
  lo.batch_transform = staged ? nullptr : datasets_.batch_transform;
  if (staged) lo.batch_stage = staged->train_stage;
  train_loader_ = std::make_unique<data::DataLoader>(staged ? staged->train : datasets_.train, lo, sampler_);
  if (datasets_.test && datasets_.test->size() > 0 && c.train.test_interval > 0) {
    data::DataLoaderOptions to = lo;
    to.shuffle = false;
    to.drop_last = false;
    to.batch_transform = nullptr;
    to.batch_stage = staged ? staged->test_stage : nullptr;
    test_loader_ = std::make_unique<data::DataLoader>(staged ? staged->test : datasets_.test, to);
  }
}

void TrainingRun::build_engine() {
  const TrainConfig& c = config_;
  std::shared_ptr<optim::Optimizer> optimizer = make_optimizer(c, model_->named_parameters());
  std::shared_ptr<optim::LRScheduler> scheduler =
      make_scheduler(c, *optimizer, std::max<int64_t>(1, plan_.total_updates), plan_.updates_per_epoch);
  engine::EngineOptions eo;
  eo.context = context_;
  if (pipeline_schedule_) eo.schedule = pipeline_schedule_;
  eo.serial_names = serial_names_;
  eo.gradient_accumulation = c.gradient_accumulation;
  if (c.clip_grad_norm > 0) eo.clip_grad_norm = c.clip_grad_norm;
  eo.amp = make_amp_options(c);
  // Note [ZeRO over one data rank]
  const bool nothing_to_shard = zero_has_nothing_to_shard(c, context_->layout().data_size());
  if (nothing_to_shard && writer_) {
    fmt::print(
        "zero.stage = {} over a data-parallel group of one: nothing to shard, trained without ZeRO "
        "(the same numbers)\n",
        c.zero.stage);
  }
  if (c.zero.stage > 0 && !nothing_to_shard) {
    eo.zero = parallel::zero::ZeroOptions{.stage = c.zero.stage,
                                          .reduce_bucket_bytes = int64_t{c.zero.reduce_bucket_mb} << 20};
    eo.zero->offload_optimizer = c.zero.offload_optimizer;       // Note [Optimizer offload]
    eo.zero->chunk_bytes = int64_t{c.zero.chunk_size_mb} << 20;  // stage 3's chunks and placement
    eo.zero->placement = c.zero.placement_policy == config::ZeroPlacement::kCpu    ? parallel::zero::Placement::cpu
                         : c.zero.placement_policy == config::ZeroPlacement::kAuto ? parallel::zero::Placement::auto_
                                                                                   : parallel::zero::Placement::cuda;
  }
  // The class-target cross-entropies make_criterion builds compute in f32 from 16-bit logits and
  // return an f32 loss: the f32 copy of the logits would change nothing. Soft (mixup) targets must
  // share the logits' dtype, so those keep the f32 output.
  if (eo.amp && !datasets_.batch_transform) eo.amp->output_to_f32 = false;
  engine::Criterion criterion = make_criterion(c, datasets_);
  if (auto gpt2 = std::dynamic_pointer_cast<parallel::tp::ParallelGPT2>(model_)) {
    // Under the built-in policy the logits are this rank's vocabulary slice: the loss of the whole
    // vocabulary without gathering (its padding to a multiple of the tensor size left out); under
    // specs that keep them whole, the serial loss. ParallelViT's logits are whole on every rank: the
    // serial criterion stays.
    criterion = [gpt2](const Tensor& logits, const Tensor& target) { return gpt2->loss(logits, target); };
  }
  // The tied weights' names in the stage, to find them again once mixed precision has converted it.
  std::vector<std::string> tied_names;
  if (pipeline_schedule_) {
    for (const Tensor& tied : pipeline_schedule_->tied_parameters()) {
      for (const auto& [name, param] : model_->named_parameters()) {
        if (param.impl() == tied.impl()) tied_names.push_back(name);
      }
    }
  }
  engine_ = std::make_unique<engine::Engine>(model_, optimizer, criterion, eo, scheduler);
  // The model was built in f32 on the host, then moved to the device, converted (its f32 masters to
  // the host again under ZeRO-3's offload) and sharded: what that freed stays in the host heap
  // (core/allocator.cpp keeps freed blocks for reuse), and the optimizer's moments, made later on the
  // offload's worker thread in another arena, cannot reuse it. A 10B model left 56 GB of it.
  core::empty_cache(core::kCpu);
  if (pipeline_schedule_) {
    std::vector<Tensor> fresh;
    for (const std::string& name : tied_names) fresh.push_back(model_->parameter(name));
    pipeline_schedule_->rebind_tied_parameters(std::move(fresh));
  }
  if (pipeline_schedule_ && !pipeline_schedule_->counts_tied_parameters()) {
    // A tied weight's copies carry the same summed gradient: the first stage holding it counts it
    // in the clipping norm, the others leave theirs out (their fp32 masters under mixed precision).
    std::vector<Tensor> elsewhere;
    for (const Tensor& tied : pipeline_schedule_->tied_parameters()) {
      if (amp::MixedPrecisionOptimizer* amp = engine_->amp()) {
        for (size_t k = 0; k < amp->model_params().size(); ++k) {
          if (amp->model_params()[k].impl() == tied.impl()) elsewhere.push_back(amp->master_params()[k]);
        }
      } else {
        elsewhere.push_back(tied);
      }
    }
    engine_->gradient_statistics().set_counted_elsewhere(std::move(elsewhere));
  }
  trainer_ = std::make_unique<engine::Trainer>(*engine_);
}

void TrainingRun::resume() {
  const TrainConfig& c = config_;
  // What must agree between a checkpoint and the run resuming from it for the data position to mean
  // the same batches. train.max_steps and train.epochs are not among them: a run may be extended;
  // nor are the tensor-parallel size and the pipeline's cut: a checkpoint holds the serial model's
  // tensors (Notes [Checkpoints of a sharded model] and [Checkpoints of a pipeline] in
  // engine/checkpoint_sharding.cpp).
  invariants_ = {{"data.batch_size", std::to_string(c.data.batch_size)},
                 {"data.shuffle", c.data.shuffle ? "true" : "false"},
                 {"train.seed", std::to_string(c.train.seed)},
                 {"gradient_accumulation", std::to_string(c.gradient_accumulation)},
                 {"data-parallel ranks", std::to_string(context_->size(parallel::GroupKind::kData))},
                 {"training set size", std::to_string(datasets_.train->size())},
                 {"steps per epoch", std::to_string(plan_.batches_per_epoch)}};
  if (c.train.resume_from.empty()) return;
  engine::NamedGenerators generators = named_generators();
  const fs::path file = engine::find_checkpoint(c.train.resume_from);
  // Checkpoints from before the tensor-parallel generator existed have no state for it; it then
  // starts afresh (at another layout its draws could not repeat the writer's anyway).
  if (!nn::read_safetensors_header(file).metadata.contains("rng.tensor_parallel")) generators.erase("tensor_parallel");
  const engine::CheckpointInfo info = engine::load_checkpoint(file, *engine_, generators);
  // The file has the writer's (tensor rank 0's) seed; each tensor rank goes on with its own, from
  // the same offset (the ranks draw equally many values per step).
  tensor_generator_->set_state({parallel::tp::tensor_parallel_seed(static_cast<uint64_t>(c.train.seed) + 7, *context_),
                                tensor_generator_->state().offset});
  for (const auto& [key, value] : invariants_) {
    auto it = info.extra.find(key);
    if (it != info.extra.end() && it->second != value) {
      unsupported(
          fmt::format("train.resume_from {}: the checkpoint was written with {} = {}, this run has {}; resume with "
                      "the checkpoint's config",
                      file.string(), key, it->second, value));
    }
  }
  start_ = info.position;
  trainer_->resume_at(info.position);
  resumed_ = true;
  if (writer_) {
    fmt::print("resume: {} (epoch {}, batch {} of it, step {}, {} optimizer updates)\n", file.string(),
               info.position.epoch + 1, info.position.iter, info.position.step, info.num_updates);
    if (plan_.max_updates > 0 && info.num_updates >= plan_.max_updates) {
      fmt::print("resume: the checkpoint has already made {} of train.max_steps = {} updates: nothing left to train\n",
                 info.num_updates, plan_.max_updates);
    } else if (info.position.epoch >= plan_.epochs) {
      fmt::print("resume: the checkpoint is at epoch {} of {}: nothing left to train\n", info.position.epoch + 1,
                 plan_.epochs);
    }
  }
}

void TrainingRun::build_hooks() {
  const TrainConfig& c = config_;
  // Every rank computes the metrics (the loss each reports is the data group's mean) and checks the
  // loss; rank 0 alone logs, writes files and checkpoints (the replicas are equal). Every rank
  // evaluates the whole test set, so rank 0's test metrics are the full ones.
  hooks_ = {std::make_shared<engine::LossHook>(), std::make_shared<engine::ThroughputHook>(),
            std::make_shared<engine::NonFiniteLossHook>(c.train.log_interval)};
  // Accuracy takes the argmax over the classes: it needs the logits whole on every rank, which the
  // tensor-parallel GPT-2 under the built-in policy (each rank its vocabulary slice) does not give;
  // ParallelViT and GPT-2 under specs that keep wte's rows whole do.
  const auto split_gpt2 = std::dynamic_pointer_cast<parallel::tp::ParallelGPT2>(model_);
  // Under a pipeline the logits are the last stage's alone.
  if ((!split_gpt2 || split_gpt2->logits_whole()) && context_->layout().pipeline_size() == 1)
    hooks_.insert(hooks_.begin() + 1, std::make_shared<engine::AccuracyHook>());
  // The bubble report (parallel.pipeline_report) is a collective over each pipeline: on every rank.
  if (pipeline_schedule_ && c.parallel.pipeline_report > 0) {
    hooks_.push_back(
        std::make_shared<engine::PipelineReportHook>(pipeline_schedule_, c.parallel.pipeline_report, writer_));
  }
  if (!writer_) {
    // Under tensor parallelism the writer's tensor group (data and pipeline rank 0, as the writer)
    // takes part in each save: the shards are gathered there; under a pipeline every stage of the
    // writer's replica (data rank 0) sends its tensors to the first. Other replicas hold the same state.
    // Under ZeRO every data rank holds a shard of the optimizer: the whole data group gathers.
    const parallel::RankCoords coords = context_->coords();
    const bool in_writers_replica =
        coords.dp == 0 && (context_->layout().pipeline_size() > 1 || context_->layout().tensor_size() > 1);
    if (in_writers_replica || c.zero.stage > 0) add_checkpoint_hook();
    return;
  }
  hooks_.push_back(std::make_shared<engine::LogMetricByEpochHook>());
  hooks_.push_back(std::make_shared<engine::LogTimingHook>());
  hooks_.push_back(std::make_shared<engine::LogMemoryHook>());
  // With a progress bar the bar shows the running loss; without one, a line every log_interval steps.
  if (!c.train.progress) hooks_.push_back(std::make_shared<engine::LogMetricByStepHook>(nullptr, c.train.log_interval));
  if (!options_.metrics_path.empty()) {
    hooks_.push_back(std::make_shared<engine::MetricsJsonlHook>(options_.metrics_path, c.train.log_interval, resumed_));
  }
  if (!c.train.log_dir.empty()) {
    hooks_.push_back(std::make_shared<engine::TensorboardHook>(c.train.log_dir, c.train.log_interval));
  }
  add_checkpoint_hook();
}

void TrainingRun::add_checkpoint_hook() {
  const TrainConfig& c = config_;
  if (c.train.checkpoint_dir.empty()) return;
  std::map<std::string, std::string> invariants = invariants_;
  invariants["config"] = config::describe(c);
  const engine::NamedGenerators generators = named_generators();
  hooks_.push_back(std::make_shared<engine::SaveCheckpointHook>(c.train.checkpoint_dir, generators,
                                                                c.train.checkpoint_interval, c.train.checkpoint_steps,
                                                                invariants, c.train.keep_checkpoints));
}

RunResult TrainingRun::fit() {
  const TrainConfig& c = config_;
  const int dp_size = context_->size(parallel::GroupKind::kData);
  if (writer_ && options_.verbose) {
    fmt::print(
        "train: {} samples ({} steps/epoch of {}{}), {} epoch(s), {} optimizer updates{}; {} lr {}, scheduler {}, "
        "workers {}, device {}{}{}\n",
        datasets_.train->size(), plan_.batches_per_epoch, c.data.batch_size, dp_size > 1 ? " per rank" : "",
        plan_.epochs, plan_.total_updates,
        plan_.max_updates > 0 ? fmt::format(" (train.max_steps = {})", plan_.max_updates) : "",
        config::to_string(c.optimizer.name), c.optimizer.lr, config::to_string(c.lr_scheduler.name), c.data.num_workers,
        device_,
        dp_size > 1 ? fmt::format(", data parallel: {} ranks ({})", dp_size,
                                  context_->group(parallel::GroupKind::kData)->backend_name())
                    : "",
        context_->layout().tensor_size() > 1
            ? fmt::format(", tensor parallel: {} ranks ({})", context_->layout().tensor_size(),
                          c.parallel.tensor.specs.empty()
                              ? std::string("built-in policy")
                              : fmt::format("{} rules of parallel.tensor.specs", c.parallel.tensor.specs.size()))
            : "");
    std::fflush(stdout);
  }
  core::profiler::Options profile =
      options_.profile.path.empty() ? core::profiler::options_from_env() : options_.profile;
  profile.host_samples = profile.host_samples || options_.profile.host_samples;  // --profile-host with the env's path
  if (!profile.path.empty() && context_->world().size() > 1) {
    std::filesystem::path path(profile.path);
    const std::string extension = path.extension().string();
    path.replace_extension();
    profile.path = fmt::format("{}.rank{}{}", path.string(), context_->world().rank(), extension);
  }
  core::profiler::configure(profile);
  const auto begin = std::chrono::steady_clock::now();
  engine::FitLimits limits;
  limits.max_updates = plan_.max_updates;
  limits.test_cut_epoch = c.train.epochs == 0;
  try {
    trainer_->fit(*train_loader_, plan_.epochs, test_loader_.get(), std::max<int64_t>(1, c.train.test_interval), hooks_,
                  c.train.progress && writer_, limits);
  } catch (...) {
    comm::stop_transports();  // as in the constructor: no teardown waiting on peers
    throw;
  }
  RunResult result;
  result.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - begin).count();
  result.steps = trainer_->cur_step();
  result.updates = engine_->num_updates();
  if (writer_ && options_.verbose) {
    if (trainer_->epoch_cut() && test_loader_ && !limits.test_cut_epoch &&
        trainer_->cur_epoch() % std::max<int64_t>(1, c.train.test_interval) == 0) {
      fmt::print(
          "test: not run after epoch {}, which train.max_steps = {} cut short (test passes follow whole "
          "epochs)\n",
          trainer_->cur_epoch() + 1, plan_.max_updates);
    }
    const int64_t ran = result.steps - start_.step;
    fmt::print("done: {} steps in {:.1f} s ({:.3f} s/step incl. evaluation)\n", ran, result.seconds,
               result.seconds / static_cast<double>(std::max<int64_t>(1, ran)));
  }
  return result;
}

}  // namespace colossal::initialize
