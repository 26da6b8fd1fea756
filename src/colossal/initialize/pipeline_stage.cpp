// This rank's pipeline stage: see pipeline_stage.h.
#include "colossal/initialize/pipeline_stage.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <chrono>
#include <functional>
#include <map>
#include <numeric>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "colossal/autograd/engine.h"   // backward
#include "colossal/core/cuda_device.h"  // synchronize, current_stream
#include "colossal/core/error.h"
#include "colossal/initialize/builders.h"  // make_optimizer
#include "colossal/nn/models/gpt2.h"
#include "colossal/nn/models/layer_view.h"
#include "colossal/nn/models/resnet.h"
#include "colossal/nn/models/vit.h"
#include "colossal/nn/transformer_block.h"
#include "colossal/ops/nn_functional.h"  // cross_entropy
#include "colossal/parallel/pp/partition.h"
#include "colossal/parallel/tp/gpt2_1d.h"  // ParallelGPT2Block
#include "colossal/parallel/tp/vit_1d.h"   // ParallelViTBlock

namespace colossal::initialize {
std::vector<std::shared_ptr<nn::Module>> pipeline_pieces(nn::Module& model) {
  if (auto* gpt2 = dynamic_cast<nn::models::GPT2*>(&model)) return gpt2->layers();
  if (auto* vit = dynamic_cast<nn::models::VisionTransformer*>(&model)) return vit->layers();
  if (auto* resnet = dynamic_cast<nn::models::ResNet*>(&model)) return resnet->layers();
  COLOSSAL_FAIL("parallel.pipeline > 1: the model built ({}) has no pipeline pieces; GPT-2, ViT and ResNet have",
                model.type_name());
}

namespace {

std::vector<double> parameter_weights(const std::vector<std::shared_ptr<nn::Module>>& pieces) {
  // The pieces are weighed by their parameters, a stand-in for their compute (a GEMM's FLOPs per token
  // are twice its weight's size). A weight two pieces share (GPT-2's tied wte, in the embedding and
  // the head) counts once, in the last piece that holds it: there it is the head's GEMM over the
  // whole vocabulary, while in the embedding it is only looked up. Counted in the embedding instead,
  // the head's stage got as many blocks as the others plus the head: GPT-2 350M at pp=2 measured
  // stage 1 busy 66.7 ms of a micro-step against stage 0's 44.9 (docs/benchmarks.md, session 9).
  std::map<const core::TensorImpl*, size_t> last_holder;
  for (size_t i = 0; i < pieces.size(); ++i) {
    for (const Tensor& param : pieces[i]->parameters()) last_holder[param.impl()] = i;
  }
  std::vector<double> weights;
  for (size_t i = 0; i < pieces.size(); ++i) {
    double n = 0;
    std::set<const core::TensorImpl*> seen;  // a weight a piece holds twice counts once there too
    for (const Tensor& param : pieces[i]->parameters()) {
      if (last_holder.at(param.impl()) == i && seen.insert(param.impl()).second) {
        n += static_cast<double>(param.numel());
      }
    }
    weights.push_back(n);
  }
  return weights;
}

}  // namespace

std::string describe_partition(const config::ParallelConfig& parallel) {
  if (!parallel.partition_sizes.empty()) {
    return fmt::format("cut as parallel.partition_sizes = [{}]", fmt::join(parallel.partition_sizes, ", "));
  }
  switch (parallel.partition) {
    case config::PipelinePartition::kUniform:
      return "uniform by pieces";
    case config::PipelinePartition::kMeasured:
      return "balanced by measured times";
    case config::PipelinePartition::kBalanced:
      break;
  }
  return "balanced by parameters";
}

namespace {

/// plan_pipeline's cut of `n` pieces; `parameters` gives the pieces' parameter weights when the cut is
/// balanced by them (called only then).
parallel::pp::StageParts plan_cut(int64_t n, const config::ParallelConfig& parallel,
                                  const std::vector<double>& measured,
                                  const std::function<std::vector<double>()>& parameters) {
  const int num_stages = parallel.pipeline, num_chunks = parallel.num_chunks;
  COLOSSAL_CHECK(n >= int64_t{num_stages} * num_chunks,
                 "parallel.pipeline = {} with parallel.num_chunks = {}: the model has {} pieces, fewer than the {} "
                 "parts the stages need",
                 num_stages, num_chunks, n, int64_t{num_stages} * num_chunks);
  if (!parallel.partition_sizes.empty()) {
    const int64_t total = std::accumulate(parallel.partition_sizes.begin(), parallel.partition_sizes.end(), int64_t{0});
    COLOSSAL_CHECK(
        parallel.partition_sizes.size() == static_cast<size_t>(num_stages) * static_cast<size_t>(num_chunks) &&
            total == n,
        "parallel.partition_sizes = [{}]: needs parallel.pipeline x parallel.num_chunks = {} x {} = {} "
        "counts adding up to the model's {} pieces (`colossal describe` lists them); got {} adding up to {}",
        fmt::join(parallel.partition_sizes, ", "), num_stages, num_chunks, num_stages * num_chunks, n,
        parallel.partition_sizes.size(), total);
    return parallel::pp::partition_explicit(parallel.partition_sizes, n, num_stages, num_chunks);
  }
  if (parallel.partition == config::PipelinePartition::kUniform) {
    COLOSSAL_CHECK(n % num_chunks == 0,
                   "parallel.partition = \"uniform\" with parallel.num_chunks = {}: the model's {} pieces do not "
                   "divide into {} equal chunks; use parallel.partition = \"balanced\" or parallel.partition_sizes",
                   num_chunks, n, num_chunks);
    return parallel::pp::partition_uniform(n, num_stages, num_chunks);
  }
  if (parallel.partition == config::PipelinePartition::kMeasured) {
    COLOSSAL_CHECK(static_cast<int64_t>(measured.size()) == n,
                   "parallel.partition = \"measured\": {} measured times for the model's {} pieces", measured.size(),
                   n);
    return parallel::pp::partition_balanced(measured, num_stages, num_chunks);
  }
  const std::vector<double> weights = parameters();
  COLOSSAL_CHECK(static_cast<int64_t>(weights.size()) == n, "plan_pipeline: {} parameter weights for {} pieces",
                 weights.size(), n);
  return parallel::pp::partition_balanced(weights, num_stages, num_chunks);
}

}  // namespace

parallel::pp::StageParts plan_pipeline(const std::vector<std::shared_ptr<nn::Module>>& pieces,
                                       const config::ParallelConfig& parallel, const std::vector<double>& measured,
                                       const std::vector<double>& parameters) {
  return plan_cut(static_cast<int64_t>(pieces.size()), parallel, measured,
                  [&] { return parameters.empty() ? parameter_weights(pieces) : parameters; });
}

namespace {

/// Note [Stage pieces built alone]: for each piece of the model, the piece that stands for it in a
/// probe. A GPT-2's or ViT's blocks are alike: every block is block 0 (piece 1). A ResNet's differ from
/// stage to stage, but within a stage every block after the first takes and gives the same shapes with
/// the same weights' shapes: each stage's later blocks are its second. Empty for another model.
std::vector<size_t> probe_representatives(const config::TrainConfig& c, const Datasets& d) {
  if (c.model.name == config::ModelName::kGpt2 || c.model.name == config::ModelName::kVit) {
    const auto blocks =
        static_cast<size_t>(c.model.name == config::ModelName::kGpt2 ? gpt2_config(c).n_layer : vit_config(c, d).depth);
    std::vector<size_t> reps(blocks + 2, 1);  // the embedding, the blocks, the head
    reps.front() = 0;
    reps.back() = blocks + 1;
    return reps;
  }
  if (c.model.name != config::ModelName::kResnet) return {};
  std::vector<size_t> reps{0};  // the stem, each stage's blocks in order, the head
  for (const int64_t blocks : resnet_config(c, d).layers) {
    const size_t first = reps.size();
    for (int64_t b = 0; b < blocks; ++b) reps.push_back(b < 2 ? first + static_cast<size_t>(b) : first + 1);
  }
  reps.push_back(reps.size());
  return reps;
}

/// The model with the representatives whole and the other pieces stand-ins (Note [Pieces built]), on
/// generators of its own: a probe to weigh or time the pieces before the model is built.
std::shared_ptr<nn::Module> build_probe(const config::TrainConfig& c, const Datasets& d,
                                        const std::vector<size_t>& reps) {
  core::Generator init(0), dropout(0);
  return make_model(
      c, d, init, dropout,
      ModelBuild{.pieces = [&reps](size_t piece) { return std::find(reps.begin(), reps.end(), piece) != reps.end(); },
                 .quiet = true});
}

std::vector<double> time_probe(const config::TrainConfig& c, const Datasets& d, const MeasuredCutSetup& setup,
                               const std::vector<size_t>& reps);

}  // namespace

std::optional<parallel::pp::StageParts> plan_before_building(const config::TrainConfig& c, const Datasets& d,
                                                             const MeasuredCutSetup* measure,
                                                             std::vector<double>* measured) {
  if (c.parallel.pipeline <= 1) return std::nullopt;
  const bool measured_cut = measures_pipeline_partition(c.parallel);
  if (measured_cut && measure == nullptr) return std::nullopt;
  const std::vector<size_t> reps = probe_representatives(c, d);
  if (reps.empty()) return std::nullopt;
  const auto n = static_cast<int64_t>(reps.size());
  if (measured_cut) {
    std::vector<double> times = time_probe(c, d, *measure, reps);
    parallel::pp::StageParts parts = plan_cut(n, c.parallel, times, {});
    if (measured != nullptr) *measured = std::move(times);
    return parts;
  }
  // Balanced by parameters (only then are the pieces weighed): a ResNet's counted from its config, a
  // GPT-2's or ViT's read off the probe.
  return plan_cut(n, c.parallel, {}, [&]() -> std::vector<double> {
    if (c.model.name == config::ModelName::kResnet) {
      const std::vector<int64_t> counts = resnet_config(c, d).piece_parameters();
      return {counts.begin(), counts.end()};
    }
    const std::vector<double> probe_weights = parameter_weights(pipeline_pieces(*build_probe(c, d, reps)));
    std::vector<double> weights;
    for (const size_t r : reps) weights.push_back(probe_weights.at(r));
    return weights;
  });
}

nn::models::PieceFilter stage_pieces(const parallel::pp::StageParts& parts, int stage) {
  return [chunks = parts.at(static_cast<size_t>(stage))](size_t piece) {
    for (const parallel::pp::PieceRange& r : chunks) {
      if (static_cast<int64_t>(piece) >= r.begin && static_cast<int64_t>(piece) < r.end) return true;
    }
    return false;
  };
}

bool measures_pipeline_partition(const config::ParallelConfig& parallel) {
  return parallel.partition == config::PipelinePartition::kMeasured && parallel.partition_sizes.empty();
}

Tensor pipeline_sample_microbatch(nn::Module& model, const config::TrainConfig& c, const Tensor& first_example_input,
                                  Device device) {
  const int64_t m = std::max<int64_t>(1, c.data.batch_size / std::max(1, c.parallel.num_microbatches));
  if (auto* gpt2 = dynamic_cast<nn::models::GPT2*>(&model)) {
    const int64_t tokens = c.data.seq_len > 0 ? c.data.seq_len : gpt2->config().n_positions;
    return core::zeros({m, tokens}, TensorOptions(DType::i64, device));
  }
  if (auto* vit = dynamic_cast<nn::models::VisionTransformer*>(&model)) {
    const nn::models::ViTConfig& v = vit->config();
    return core::zeros({m, v.in_chans, v.img_size, v.img_size}, TensorOptions(DType::f32, device));
  }
  const auto* resnet = dynamic_cast<nn::models::ResNet*>(&model);
  COLOSSAL_CHECK(resnet != nullptr,
                 "parallel.partition = \"measured\": the model built ({}) is none of GPT-2, ViT and ResNet",
                 model.type_name());
  const bool resizes =
      std::find(c.data.transforms.begin(), c.data.transforms.end(), "resize") != c.data.transforms.end();
  int64_t size = 224;
  if (resizes) {
    size = c.data.options.get_int("resize", 224, 1);
  } else if (first_example_input.defined() && first_example_input.dim() >= 2) {
    size = first_example_input.size(first_example_input.dim() - 2);
  }
  return core::zeros({m, resnet->config().in_chans, size, size}, TensorOptions(DType::f32, device));
}

std::optional<DType> pipeline_compute_dtype(const config::TrainConfig& c) {
  if (c.bf16) return DType::bf16;
  if (c.fp16.mode != config::AmpMode::kOff) return DType::f16;
  return std::nullopt;
}

namespace {

/// A piece's parameters and buffers converted to the run's compute dtype for as long as it lives, as
/// mixed precision converts the stage for training (Module::to puts converted tensors into the slots);
/// then the f32 tensors put back into their slots, untouched.
class InComputeDtype {
 public:
  InComputeDtype(nn::Module& piece, std::optional<DType> dtype) : piece_(piece) {
    if (!dtype) return;
    parameters_ = piece.named_parameters();
    buffers_ = piece.named_buffers();
    piece.to(*dtype);
  }
  ~InComputeDtype() {
    for (const auto& [name, t] : parameters_) piece_.parameter(name) = t;
    for (const auto& [name, t] : buffers_) piece_.buffer(name) = t;
  }
  InComputeDtype(const InComputeDtype&) = delete;
  InComputeDtype& operator=(const InComputeDtype&) = delete;

 private:
  nn::Module& piece_;
  std::vector<std::pair<std::string, Tensor>> parameters_, buffers_;
};

}  // namespace

std::vector<double> measure_pipeline_pieces(const std::vector<std::shared_ptr<nn::Module>>& pieces,
                                            const Tensor& microbatch, int repeats, std::optional<DType> compute_dtype) {
  COLOSSAL_CHECK(repeats >= 1, "measure_pipeline_pieces: repeats must be >= 1, got {}", repeats);
  const Device device = microbatch.device();
  // The stream the pieces run on, waited for around each run (not the whole device: a communicator's
  // kernel may be spinning there).
  const auto wait = [device] {
    if (device.is_cuda()) core::cuda::synchronize(core::cuda::current_stream(device));
  };
  std::vector<double> seconds;
  // A floating input enters the stages in the compute dtype, as MixedPrecisionOptimizer::cast_input
  // hands it to the model.
  Tensor x = compute_dtype && core::is_floating(microbatch.dtype()) ? microbatch.to(*compute_dtype) : microbatch;
  for (const std::shared_ptr<nn::Module>& piece : pieces) {
    const InComputeDtype converted(*piece, compute_dtype);
    const Tensor input = core::is_floating(x.dtype()) ? x.detach().set_requires_grad(true) : x;
    std::vector<double> runs;
    Tensor output;
    double launch_ms = 0;                 // the host's time to queue the piece's kernels, from the last run
    for (int r = 0; r <= repeats; ++r) {  // run 0 warms up (cuBLAS and cuDNN plans, the allocator)
      wait();
      // On a GPU the device's time between two events, with the stream held (cuda::hold) while the host
      // queues the piece's kernels, as the host runs ahead of the device in training; on the CPU the
      // host's. (Counted on the host around a synchronisation, every piece looked alike.)
      std::optional<core::cuda::Event> begin, end;
      if (device.is_cuda()) {
        begin.emplace(/*enable_timing=*/true);
        end.emplace(/*enable_timing=*/true);
        if (r > 0) core::cuda::hold(core::cuda::current_stream(device), std::min(2 * launch_ms + 1, 100.0));
        begin->record(core::cuda::current_stream(device));
      }
      const auto start = std::chrono::steady_clock::now();
      output = (*piece)(input);
      if (&piece == &pieces.back() && core::is_floating(output.dtype()) && output.dim() >= 2) {
        // The last stage also computes the loss: the cross-entropy of the logits (in f32 from 16-bit
        // logits, as the run's criterion) over every row, against class 0.
        const Tensor rows = output.reshape({-1, output.size(-1)});
        autograd::backward(ops::cross_entropy(rows, core::zeros({rows.size(0)}, TensorOptions(DType::i64, device))));
      } else {
        autograd::backward(output, core::ones_like(output));
      }
      if (end) end->record(core::cuda::current_stream(device));
      launch_ms = 1e3 * std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
      wait();
      const double host_seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
      if (r > 0) runs.push_back(begin ? 1e-3 * static_cast<double>(begin->elapsed_ms(*end)) : host_seconds);
    }
    std::sort(runs.begin(), runs.end());
    seconds.push_back(runs[runs.size() / 2]);
    for (const Tensor& param : piece->parameters()) {
      if (param.grad().defined()) Tensor(param).set_grad(Tensor());
    }
    x = output.detach();
  }
  return seconds;
}

namespace {

/// Every rank's times made one: averaged over the pipeline (its stages measured the same pieces on
/// their own GPUs), then data rank 0's and tensor rank 0's copies broadcast, so that every rank cuts
/// from the same bits (averages over different groups need not round alike).
std::vector<double> agree_on_times(const std::vector<double>& local, const parallel::ParallelContext& context) {
  const std::shared_ptr<comm::ProcessGroup> pipeline = context.group(parallel::GroupKind::kPipeline);
  Tensor times = core::from_vector<double>(local, {static_cast<int64_t>(local.size())}).to(pipeline->device());
  pipeline->all_reduce(times, comm::ReduceOp::avg);
  for (parallel::GroupKind kind : {parallel::GroupKind::kData, parallel::GroupKind::kTensor}) {
    if (!context.has_group(kind)) continue;
    const std::shared_ptr<comm::ProcessGroup> group = context.group(kind);
    if (group != nullptr && group->size() > 1) group->broadcast(times, 0);
  }
  return times.to(Device{}).to_vector<double>();
}

}  // namespace

namespace {

/// Piece `index` of `model`'s layers() for a tensor-parallel stage (Note [Pipeline of tensor-parallel
/// stages]): a transformer block becomes its 1D tensor-parallel block under the same name; the other
/// pieces stay as they are.
std::shared_ptr<nn::Module> tensor_parallel_piece(nn::Module& model, const std::shared_ptr<nn::Module>& piece,
                                                  size_t index, std::shared_ptr<comm::ProcessGroup> group,
                                                  const parallel::tp::DropoutGenerators& dropout,
                                                  const config::TensorParallelConfig& tensor) {
  if (auto* gpt2 = dynamic_cast<nn::models::GPT2*>(&model)) {
    const size_t blocks = gpt2->h()->size();
    if (index == 0 || index > blocks) return piece;  // embed, head
    const size_t b = index - 1;
    const auto serial = std::dynamic_pointer_cast<nn::models::GPT2Block>((*gpt2->h())[b]);
    COLOSSAL_CHECK(serial != nullptr, "pipeline x tensor parallelism: h.{} of the GPT-2 is not a GPT2Block", b);
    auto block = std::make_shared<parallel::tp::ParallelGPT2Block>(
        *serial, gpt2->config(), std::move(group),
        parallel::tp::ParallelGPT2Options{.dropout = dropout, .fused_residual = tensor.fused_residual});
    auto view = std::make_shared<nn::models::LayerView>(
        "ParallelGPT2Block", [block](nn::models::LayerView&, const Tensor& x) { return block->forward(x); });
    view->share_module("h." + std::to_string(b), block);
    return view;
  }
  if (auto* vit = dynamic_cast<nn::models::VisionTransformer*>(&model)) {
    const size_t blocks = vit->blocks()->size();
    if (index == 0 || index > blocks) return piece;  // embed, head
    const size_t b = index - 1;
    const auto serial = std::dynamic_pointer_cast<nn::TransformerBlock>((*vit->blocks())[b]);
    COLOSSAL_CHECK(serial != nullptr, "pipeline x tensor parallelism: blocks.{} of the ViT is not a TransformerBlock",
                   b);
    const nn::models::ViTConfig& v = vit->config();
    // The serial model's stochastic depth rule (as ParallelViT).
    const double drop_path =
        v.depth > 1 ? v.drop_path_rate * static_cast<double>(b) / static_cast<double>(v.depth - 1) : 0.0;
    auto block = std::make_shared<parallel::tp::ParallelViTBlock>(*serial, v, drop_path, std::move(group),
                                                                  parallel::tp::ParallelViTOptions{.dropout = dropout});
    auto view = std::make_shared<nn::models::LayerView>(
        "ParallelViTBlock", [block](nn::models::LayerView&, const Tensor& x) { return block->forward(x); });
    view->share_module("blocks." + std::to_string(b), block);
    return view;
  }
  COLOSSAL_FAIL(
      "parallel.pipeline with parallel.tensor.size > 1: the model built ({}) has no tensor-parallel "
      "blocks; GPT-2 and ViT have",
      model.type_name());
}

}  // namespace

namespace {

/// measure_pipeline_pieces over `timed`, the times agreed over the context's groups (agree_on_times),
/// with the generators the pieces' dropout drew from put back, so that the training run draws the
/// masks it would draw under any other cut.
std::vector<double> measure_and_agree(const std::vector<std::shared_ptr<nn::Module>>& timed, const Tensor& sample,
                                      const config::TrainConfig& c, const parallel::ParallelContext& context,
                                      const parallel::tp::DropoutGenerators& dropout) {
  std::vector<std::pair<core::Generator*, core::GeneratorState>> saved{
      {&core::default_generator(), core::default_generator().state()}};
  for (core::Generator* g : {dropout.data, dropout.tensor}) {
    if (g != nullptr) saved.emplace_back(g, g->state());
  }
  std::vector<double> times =
      agree_on_times(measure_pipeline_pieces(timed, sample, 3, pipeline_compute_dtype(c)), context);
  for (auto& [g, state] : saved) g->set_state(state);
  return times;
}

/// plan_before_building's measured cut (Note [Stage pieces built alone]): the probe's whole pieces
/// timed in a row on the setup's device (under tensor parallelism in their tensor-parallel forms, as
/// make_pipeline_stage times them), each piece charged its representative's time.
std::vector<double> time_probe(const config::TrainConfig& c, const Datasets& d, const MeasuredCutSetup& setup,
                               const std::vector<size_t>& reps) {
  COLOSSAL_CHECK(setup.context != nullptr, "plan_before_building: a measured cut needs the run's ParallelContext");
  const std::shared_ptr<nn::Module> probe = build_probe(c, d, reps);
  probe->to(setup.device);
  const std::vector<std::shared_ptr<nn::Module>> pieces = pipeline_pieces(*probe);
  COLOSSAL_CHECK(pieces.size() == reps.size(), "plan_before_building: the model has {} pieces, its config says {}",
                 pieces.size(), reps.size());
  std::vector<size_t> whole = reps;  // the pieces timed, in order (a stage's second block feeds the next's first)
  std::sort(whole.begin(), whole.end());
  whole.erase(std::unique(whole.begin(), whole.end()), whole.end());
  const std::shared_ptr<comm::ProcessGroup> tensor_group = setup.context->group(parallel::GroupKind::kTensor);
  const bool tensor_parallel = tensor_group != nullptr && tensor_group->size() > 1;
  std::vector<std::shared_ptr<nn::Module>> timed;
  for (const size_t i : whole) {
    timed.push_back(tensor_parallel
                        ? tensor_parallel_piece(*probe, pieces[i], i, tensor_group, setup.dropout, c.parallel.tensor)
                        : pieces[i]);
  }
  const Tensor sample = pipeline_sample_microbatch(*probe, c, setup.first_example, setup.device);
  const std::vector<double> measured = measure_and_agree(timed, sample, c, *setup.context, setup.dropout);
  std::vector<double> times;
  for (const size_t r : reps) {
    times.push_back(measured[static_cast<size_t>(std::lower_bound(whole.begin(), whole.end(), r) - whole.begin())]);
  }
  return times;
}

}  // namespace

PipelineStage make_pipeline_stage(nn::Module& model, const parallel::ParallelContext& context,
                                  const config::TrainConfig& c, const parallel::tp::DropoutGenerators& dropout,
                                  const Tensor& sample, const std::optional<parallel::pp::StageParts>& planned,
                                  const std::vector<double>& planned_times) {
  const std::shared_ptr<comm::ProcessGroup> group = context.group(parallel::GroupKind::kPipeline);
  const int p = group->size(), stage = group->rank(), v = c.parallel.num_chunks;
  const std::vector<std::shared_ptr<nn::Module>> pieces = pipeline_pieces(model);
  const std::shared_ptr<comm::ProcessGroup> tensor_group = context.group(parallel::GroupKind::kTensor);
  const bool tensor_parallel = tensor_group != nullptr && tensor_group->size() > 1;
  std::vector<double> measured;
  if (!planned && measures_pipeline_partition(c.parallel)) {
    COLOSSAL_CHECK(sample.defined(),
                   "parallel.partition = \"measured\": make_pipeline_stage needs a sample microbatch");
    // Under tensor parallelism the stages run the blocks' tensor-parallel forms: those are timed (each
    // tensor rank its part, its all-reduces included), made for the measurement and dropped after it.
    // Timed as serial blocks, a pp2 x tp2 GPT-2 350M cut gave the head's stage, whose head stays whole
    // on both tensor ranks, 26 ms per step more busy time than the other's.
    std::vector<std::shared_ptr<nn::Module>> timed = pieces;
    if (tensor_parallel) {
      for (size_t i = 0; i < timed.size(); ++i)
        timed[i] = tensor_parallel_piece(model, pieces[i], i, tensor_group, dropout, c.parallel.tensor);
    }
    measured = measure_and_agree(timed, sample, c, context, dropout);
  }
  if (planned) measured = planned_times;
  const parallel::pp::StageParts parts = planned ? *planned : plan_pipeline(pieces, c.parallel, measured);

  // Which stages hold each parameter: one held by several is tied between them.
  std::map<const core::TensorImpl*, std::set<int>> holders;
  std::map<const core::TensorImpl*, Tensor> by_impl;
  for (int s = 0; s < p; ++s) {
    for (const parallel::pp::PieceRange& r : parts[static_cast<size_t>(s)]) {
      for (int64_t i = r.begin; i < r.end; ++i) {
        for (const Tensor& param : pieces[static_cast<size_t>(i)]->parameters()) {
          holders[param.impl()].insert(s);
          by_impl.emplace(param.impl(), param);
        }
      }
    }
  }
  std::vector<Tensor> tied;
  std::set<int> tied_stages;
  for (const auto& [impl, stages] : holders) {
    if (stages.size() < 2) continue;
    COLOSSAL_CHECK(tied_stages.empty() || tied_stages == stages,
                   "parallel.pipeline: weights are shared between different sets of stages; one set is supported");
    tied_stages = stages;
    if (stages.contains(stage)) tied.push_back(by_impl.at(impl));
  }

  // The serial names of what the stage holds: piece j of chunk k keeps the model's names under
  // "k.j." (Note [Pipeline layers]), and the serial optimizer groups the serial model's parameters
  // as make_optimizer does (Note [Checkpoints of a pipeline] in engine/checkpoint_sharding.cpp).
  auto serial_names = std::make_shared<engine::SerialNames>();
  for (const auto& [name, tensor] : model.state_dict()) serial_names->model_order.push_back(name);
  {
    std::map<const core::TensorImpl*, std::string> parameter_names;
    for (const auto& [name, param] : model.named_parameters()) parameter_names.emplace(param.impl(), name);
    const std::shared_ptr<optim::Optimizer> serial_optimizer = make_optimizer(c, model.named_parameters());
    for (const optim::ParamGroup& group : serial_optimizer->param_groups()) {
      std::vector<std::string> names;
      for (const Tensor& param : group.params) names.push_back(parameter_names.at(param.impl()));
      serial_names->optimizer_groups.push_back(std::move(names));
    }
  }

  auto module = std::make_shared<nn::ModuleList>();
  std::vector<std::shared_ptr<nn::Module>> chunks;
  for (const parallel::pp::PieceRange& r : parts[static_cast<size_t>(stage)]) {
    auto chunk = std::make_shared<nn::Sequential>();
    for (int64_t i = r.begin; i < r.end; ++i) {
      const std::shared_ptr<nn::Module>& piece = pieces[static_cast<size_t>(i)];
      chunk->push_back(tensor_parallel ? tensor_parallel_piece(model, piece, static_cast<size_t>(i), tensor_group,
                                                               dropout, c.parallel.tensor)
                                       : piece);
    }
    chunks.push_back(chunk);
    module->push_back(chunk);
  }
  const std::set<std::string> serial(serial_names->model_order.begin(), serial_names->model_order.end());
  for (size_t k = 0; k < chunks.size(); ++k) {
    const std::vector<std::shared_ptr<nn::Module>> chunk_pieces = chunks[k]->children();
    for (size_t j = 0; j < chunk_pieces.size(); ++j) {
      for (const auto& [name, tensor] : chunk_pieces[j]->state_dict()) {
        COLOSSAL_CHECK(serial.contains(name),
                       "parallel.pipeline: stage {}'s piece holds \"{}\", which is none of the {}'s tensors", stage,
                       name, model.type_name());
        serial_names->model.emplace(fmt::format("{}.{}.{}", k, j, name), name);
      }
    }
  }
  for (const auto& [name, tensor] : module->state_dict()) {
    COLOSSAL_CHECK(serial_names->model.contains(name),
                   "parallel.pipeline: stage {}'s tensor \"{}\" is not named chunk.piece.<the model's name>", stage,
                   name);
  }
  auto schedule = std::make_shared<engine::PipelineSchedule>(chunks, group, c.parallel.num_microbatches);
  if (!tied_stages.empty()) {
    schedule->set_tied_parameters(tied, engine::PipelineSchedule::tied_group(group, tied_stages.contains(stage)));
    // GPT-2's wte is the first stage's embedding table: a microbatch's backward there adds to the rows
    // of its token ids alone (Note [Tied sum under the last backward]). Under tensor parallelism too:
    // the embedding and head pieces stay whole on every tensor rank (tensor_parallel_piece).
    if (dynamic_cast<nn::models::GPT2*>(&model) != nullptr) {
      schedule->set_tied_rows([](const Tensor& ids) { return ids.reshape({-1}); });
    }
  }
  std::string description =
      fmt::format("pipeline: {} stages x {} chunk{}, {} pieces {}, {} microbatches{}; {}", p, v, v > 1 ? "s" : "",
                  pieces.size(), describe_partition(c.parallel), c.parallel.num_microbatches,
                  tensor_parallel ? fmt::format(", blocks {}-way tensor-parallel", tensor_group->size()) : "",
                  parallel::pp::describe(parts));
  if (!measured.empty()) {
    std::vector<std::string> ms;
    for (double t : measured) ms.push_back(fmt::format("{:.2f}", 1e3 * t));
    description +=
        fmt::format("; measured ms per piece (forward and backward of one microbatch): [{}]", fmt::join(ms, ", "));
  }
  if (planned) {
    // Note [Stage pieces built alone]: what this rank built, beside the stand-ins.
    const int64_t mine = module->num_parameters();
    description +=
        fmt::format("; stage {} built alone: its {} parameters, stand-ins of {} for the other stages' pieces", stage,
                    mine, model.num_parameters() - mine);
  }
  return {module, schedule, std::move(description), std::move(serial_names)};
}

}  // namespace colossal::initialize
