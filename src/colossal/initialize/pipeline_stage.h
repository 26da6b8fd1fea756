// This rank's stage of a pipeline-parallel run (parallel.pipeline > 1): the model's pieces
// (nn/models' layers(), Note [Pipeline layers]) cut among the stages, balanced by parameter count as
// Colossal-AI's default does (parallel/pp/partition.h), into parallel.num_chunks chunks per stage,
// and the PipelineSchedule that runs them with parallel.num_microbatches microbatches, the weights
// two stages share (GPT-2's tied wte) summed between them.
#pragma once

#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "colossal/config/train_config.h"
#include "colossal/engine/engine.h"  // SerialNames
#include "colossal/engine/pipeline_schedule.h"
#include "colossal/initialize/builders.h"   // Datasets
#include "colossal/nn/models/layer_view.h"  // PieceFilter
#include "colossal/nn/module.h"
#include "colossal/parallel/parallel_context.h"
#include "colossal/parallel/pp/partition.h"
#include "colossal/parallel/tp/random.h"  // DropoutGenerators

namespace colossal::initialize {

struct PipelineStage {
  /// This stage's chunks under one module (the Engine's model: its parameters are the stage's).
  std::shared_ptr<nn::Module> module;
  std::shared_ptr<engine::PipelineSchedule> schedule;
  /// "pipeline: 4 stages x 1 chunk, 14 pieces balanced by parameters; stage 0: [0, 4)": for the log.
  std::string description;
  /// The serial model's names of the stage's tensors and the serial optimizer's parameter groups, for
  /// checkpoints that hold the serial model's state (EngineOptions::serial_names).
  std::shared_ptr<const engine::SerialNames> serial_names;
};

/// The model's pieces for a pipeline (nn/models' layers()); throws naming the model when it has none.
std::vector<std::shared_ptr<nn::Module>> pipeline_pieces(nn::Module& model);

/// How `pieces` are cut among parallel.pipeline stages of parallel.num_chunks chunks, as
/// parallel.partition says (balanced by parameter count, a weight shared by two pieces counted once, in
/// the last; uniform by pieces; or, "measured", balanced by `measured`: each piece's seconds, from
/// measure_pipeline_pieces) or parallel.partition_sizes lists. Throws naming the keys and numbers
/// when there are fewer pieces than parts or the sizes do not fit, and when "measured" comes without
/// one time per piece.
/// `parameters`, when given, are the pieces' parameter weights in place of their own (a model of
/// stand-ins: plan_before_building).
parallel::pp::StageParts plan_pipeline(const std::vector<std::shared_ptr<nn::Module>>& pieces,
                                       const config::ParallelConfig& parallel, const std::vector<double>& measured = {},
                                       const std::vector<double>& parameters = {});

/// Note [Stage pieces built alone]
/// The cut of a GPT-2, ViT or ResNet made before the model is built, so that each rank builds its own
/// stage's pieces only and the others as stand-ins (Note [Pieces built]). Balanced by parameters, it
/// weighs the pieces without building the whole model: a GPT-2's or ViT's from a probe built with the
/// embedding, the first block and the head at full size (every block of these models weighs the same),
/// on a generator of its own; a ResNet's, whose blocks differ from stage to stage (the widths double,
/// each stage's first block downsamples), counted from its config (ResNetConfig::piece_parameters).
/// A uniform or listed (parallel.partition_sizes) cut needs only the number of pieces. The cut is the
/// one plan_pipeline makes of the whole model's pieces; model.weights are then read for the stage's
/// own pieces only (Note [Weights of the pieces held] in nn/hub_weights.h). None (build the whole
/// model, cut afterwards) for a measured cut when no `measure` is given. `stage_pieces` is the filter
/// that builds stage `stage`'s pieces.
///
/// A measured cut is made before building too when `measure` is given: a probe is built on
/// measure->device and its full pieces are timed in a row as measure_pipeline_pieces times them, the
/// times agreed over the groups as make_pipeline_stage agrees them; `measured`, when given, receives
/// them. A GPT-2's or ViT's probe holds the embedding, block 0 (timed in its tensor-parallel form
/// under tensor parallelism) and the head, every block charged block 0's time (the blocks are alike);
/// a ResNet's the stem, each stage's first two blocks and the head, every later block of a stage
/// charged its second block's time. Collective over every group then. Without `measure` a measured
/// cut is left to make_pipeline_stage (None).
struct MeasuredCutSetup {
  const parallel::ParallelContext* context = nullptr;
  Device device;
  /// The generators the timed pieces' dropout draws from (a tensor-parallel block's too); put back.
  parallel::tp::DropoutGenerators dropout;
  /// The training set's first input (pipeline_sample_microbatch).
  Tensor first_example;
};
std::optional<parallel::pp::StageParts> plan_before_building(const config::TrainConfig& c, const Datasets& d,
                                                             const MeasuredCutSetup* measure = nullptr,
                                                             std::vector<double>* measured = nullptr);
nn::models::PieceFilter stage_pieces(const parallel::pp::StageParts& parts, int stage);

/// True when the cut is measured (parallel.partition = "measured" and no parallel.partition_sizes).
bool measures_pipeline_partition(const config::ParallelConfig& parallel);

/// A microbatch of zeros the model's first piece takes, for measure_pipeline_pieces: GPT-2's
/// [m, T] token ids (T = data.seq_len, else the model's context), ViT's [m, in_chans, img_size,
/// img_size] and ResNet's [m, in_chans, S, S] images (S = data.options.resize where the transforms resize,
/// else the training set's first image's height), m = data.batch_size / parallel.num_microbatches.
Tensor pipeline_sample_microbatch(nn::Module& model, const config::TrainConfig& c, const Tensor& first_example_input,
                                  Device device);

/// Note [Measured pipeline partition]
/// Each piece's forward and backward time on this rank's device (seconds, the median of `repeats`
/// runs after one warm-up; on a GPU the device's time between CUDA events around the run, the stream
/// held while the host queues it; on the CPU the host's), the pieces run in order on `microbatch`
/// (each on the previous one's output, its gradient all ones; the last one's output, the logits,
/// through a cross-entropy as the last stage computes the loss), in training mode, each
/// converted to `compute_dtype` when given and put back after. The pieces' parameter gradients are dropped
/// afterwards. The caller restores the random generators the pieces' dropout drew from.
///
/// The model is still f32 when its stage is cut (mixed precision converts the stage afterwards), and
/// its times are not the run's. In f32, on an H100, a GPT-2 350M block took 6.9 ms and the LM head
/// with the loss 2.3 ms; under autocast to bf16 (f32 weights cast for each product, f32 activations
/// between them) 0.93 and 1.33 ms; in training, converted to bf16, a block takes ~0.59 ms of a stage's
/// busy time. The head's large GEMMs take about the same either way while the blocks' many
/// memory-bound kernels halve their bytes in bf16, so times under autocast gave the head's stage a
/// block too many. Converted, each piece runs as it will in training: a block 0.58 ms, the head 1.00
/// (GPT-2 350M, microbatches of 2 x 1024 tokens). The head's stage was still ~0.7 ms per microbatch busier
/// than those times said, which is about its loss over the 2048 x 50304 logits: the last piece is timed
/// with it.
std::vector<double> measure_pipeline_pieces(const std::vector<std::shared_ptr<nn::Module>>& pieces,
                                            const Tensor& microbatch, int repeats = 3,
                                            std::optional<DType> compute_dtype = std::nullopt);

/// The dtype mixed precision runs the model's matrix products in under `c` (bf16 = true: bf16;
/// fp16.mode "naive" or "torch": f16), or none for an f32 run.
std::optional<DType> pipeline_compute_dtype(const config::TrainConfig& c);

/// "balanced by parameters", "uniform by pieces" or "cut as parallel.partition_sizes = [...]": for logs.
std::string describe_partition(const config::ParallelConfig& parallel);

/// Cuts `model` (serial; a GPT-2, ViT or ResNet) for this rank's pipeline stage.
/// Every rank of the pipeline group must call it (it splits the group for tied weights). Throws naming
/// model.name when the model has no pieces, or the numbers when they do not fill the stages.
///
/// Note [Pipeline of tensor-parallel stages]
/// With a tensor group of more than one rank (GPT-2 and ViT), the stage's transformer blocks become
/// the 1D tensor-parallel blocks (parallel/tp: ParallelGPT2Block, ParallelViTBlock, built from the
/// serial ones, their dropout drawing from `dropout`), each tensor rank holding its part; the embedding
/// and head pieces stay whole on every tensor rank (replicated, as ParallelViT keeps them; for GPT-2 the
/// tied wte whole too, so the logits are whole and the loss is the serial one). The activations between
/// the blocks are whole on every tensor rank, so each tensor rank of stage s exchanges them with the
/// same tensor rank of stage s + 1 over its own pipeline group, and the tied wte's copies are summed
/// per tensor rank. Not with sequence parallelism or parallel.tensor.specs (refused by the run).
/// With parallel.partition = "measured", `sample` is a microbatch for measure_pipeline_pieces
/// (pipeline_sample_microbatch); every rank measures, the pipeline averages, and data rank 0's and then
/// tensor rank 0's average goes to every rank, so that all cut alike. Collective over every group.
/// With `planned` (plan_before_building), the model holds this stage's pieces whole and the others
/// as stand-ins, and the stage is cut as planned; `planned_times`, the times a measured plan came
/// from, for the description.
PipelineStage make_pipeline_stage(nn::Module& model, const parallel::ParallelContext& context,
                                  const config::TrainConfig& c, const parallel::tp::DropoutGenerators& dropout = {},
                                  const Tensor& sample = Tensor(),
                                  const std::optional<parallel::pp::StageParts>& planned = std::nullopt,
                                  const std::vector<double>& planned_times = {});

}  // namespace colossal::initialize
