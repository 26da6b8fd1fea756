// This rank's pipeline stage: see pipeline_stage.h.
#include "colossal/initialize/pipeline_stage.h"

#include <fmt/format.h>

#include <algorithm>
#include <map>
#include <set>
#include <vector>

#include "colossal/core/error.h"
#include "colossal/nn/models/gpt2.h"
#include "colossal/nn/models/resnet.h"
#include "colossal/nn/models/vit.h"
#include "colossal/parallel/pp/partition.h"

namespace colossal::initialize {
std::vector<std::shared_ptr<nn::Module>> pipeline_pieces(nn::Module& model) {
  if (auto* gpt2 = dynamic_cast<nn::models::GPT2*>(&model)) return gpt2->layers();
  if (auto* vit = dynamic_cast<nn::models::VisionTransformer*>(&model)) return vit->layers();
  if (auto* resnet = dynamic_cast<nn::models::ResNet*>(&model)) return resnet->layers();
  COLOSSAL_FAIL("parallel.pipeline > 1: the model built ({}) has no pipeline pieces; GPT-2, ViT and ResNet have",
                model.type_name());
}

parallel::pp::StageParts plan_pipeline(const std::vector<std::shared_ptr<nn::Module>>& pieces, int num_stages,
                                       int num_chunks) {
  // A weight two pieces share (GPT-2's tied wte, in the embedding and the head) counts once, in the
  // first: counted twice it would leave the head a stage of its own.
  std::vector<double> weights;
  std::set<const core::TensorImpl*> counted;
  for (const auto& piece : pieces) {
    double n = 0;
    for (const Tensor& param : piece->parameters()) {
      if (counted.insert(param.impl()).second) n += static_cast<double>(param.numel());
    }
    weights.push_back(n);
  }
  COLOSSAL_CHECK(static_cast<int64_t>(pieces.size()) >= int64_t{num_stages} * num_chunks,
                 "parallel.pipeline = {} with parallel.num_chunks = {}: the model has {} pieces, fewer than the {} "
                 "parts the stages need",
                 num_stages, num_chunks, pieces.size(), int64_t{num_stages} * num_chunks);
  return parallel::pp::partition_balanced(weights, num_stages, num_chunks);
}

PipelineStage make_pipeline_stage(nn::Module& model, const parallel::ParallelContext& context,
                                  const config::TrainConfig& c) {
  const std::shared_ptr<comm::ProcessGroup> group = context.group(parallel::GroupKind::kPipeline);
  const int p = group->size(), stage = group->rank(), v = c.parallel.num_chunks;
  const std::vector<std::shared_ptr<nn::Module>> pieces = pipeline_pieces(model);
  const parallel::pp::StageParts parts = plan_pipeline(pieces, p, v);

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

  auto module = std::make_shared<nn::ModuleList>();
  std::vector<std::shared_ptr<nn::Module>> chunks;
  for (const parallel::pp::PieceRange& r : parts[static_cast<size_t>(stage)]) {
    auto chunk = std::make_shared<nn::Sequential>();
    for (int64_t i = r.begin; i < r.end; ++i) chunk->push_back(pieces[static_cast<size_t>(i)]);
    chunks.push_back(chunk);
    module->push_back(chunk);
  }
  auto schedule = std::make_shared<engine::PipelineSchedule>(chunks, group, c.parallel.num_microbatches);
  if (!tied_stages.empty()) {
    schedule->set_tied_parameters(tied, engine::PipelineSchedule::tied_group(*group, tied_stages.contains(stage)));
  }
  std::string description =
      fmt::format("pipeline: {} stages x {} chunk{}, {} pieces balanced by parameters, {} microbatches; {}", p, v,
                  v > 1 ? "s" : "", pieces.size(), c.parallel.num_microbatches, parallel::pp::describe(parts));
  return {module, schedule, std::move(description)};
}

}  // namespace colossal::initialize
