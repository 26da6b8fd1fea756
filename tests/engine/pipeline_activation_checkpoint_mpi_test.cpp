// Activation checkpointing through the pipeline on MPI ranks (every rank one stage of a
// world-sized pipeline, at 2 and 4 ranks): GPT-2's pieces (embed, six blocks, head; Note [Pipeline
// layers]) with dropout 0.2, cut among the stages, trained 3 steps in 1F1B and in interleaved 1F1B
// with 2 chunks per stage, give the same losses and the same parameters of every piece a stage
// holds with checkpoint_activations on as with it off, bit for bit. The switch lives in the blocks,
// so the pipeline's pieces carry it with no change to the schedule; interleaving runs several
// microbatches' forwards before their backwards, so this also shows each recompute rewinding the
// dropout generator to its own forward's draws and putting it back after.
#include <gtest/gtest.h>

#include <fmt/format.h>

#include <memory>
#include <string>
#include <vector>

#include "../comm/mpi_test_main.h"
#include "colossal/engine/engine.h"
#include "colossal/engine/pipeline_schedule.h"
#include "colossal/nn/models/gpt2.h"
#include "colossal/nn/module.h"
#include "colossal/ops/nn_functional.h"
#include "colossal/optim/sgd.h"
#include "colossal/parallel/pp/partition.h"

namespace colossal::engine {
namespace {

using comm::testing::world;

std::shared_ptr<comm::ProcessGroup> world_group() {
  return std::shared_ptr<comm::ProcessGroup>(&world(), [](comm::ProcessGroup*) {});
}

Tensor lm_loss(const Tensor& logits, const Tensor& target) {
  return ops::cross_entropy(logits.reshape({-1, logits.size(-1)}), target.reshape({-1}));
}

struct PipelineRun {
  std::vector<double> losses;
  std::vector<std::pair<std::string, Tensor>> params;  ///< this stage's, after the last step
};

/// GPT-2 (6 blocks, 16 wide, f64, dropout 0.2 from its own generator seeded `dropout_seed`) as 8
/// pieces cut among the world's stages into `chunks` chunks each, 3 steps of SGD, 4 microbatches.
PipelineRun train_pipelined(bool checkpoint, int chunks, uint64_t dropout_seed = 41) {
  nn::models::GPT2Config g;
  g.vocab_size = 32;
  g.n_positions = 8;
  g.n_embd = 16;
  g.n_layer = 6;
  g.n_head = 2;
  g.dropout = 0.2;
  g.checkpoint_activations = checkpoint;
  core::Generator init(5), dropout(dropout_seed);
  nn::models::GPT2 model(g, &init, &dropout);
  model.to(DType::f64);
  const auto pieces = model.layers();
  const int p = world().size(), s = world().rank();
  const parallel::pp::StageParts parts =
      parallel::pp::partition_uniform(static_cast<int64_t>(pieces.size()), p, chunks);
  auto stage = std::make_shared<nn::ModuleList>();
  std::vector<std::shared_ptr<nn::Module>> stage_chunks;
  PipelineRun run;
  std::vector<Tensor> tied;
  for (const parallel::pp::PieceRange& r : parts[static_cast<size_t>(s)]) {
    auto chunk = std::make_shared<nn::Sequential>();
    for (int64_t i = r.begin; i < r.end; ++i) {
      chunk->push_back(pieces[static_cast<size_t>(i)]);
      for (const auto& [name, param] : pieces[static_cast<size_t>(i)]->named_parameters()) {
        run.params.emplace_back(name, param);
        if (name == "wte.weight") tied.push_back(param);
      }
    }
    stage_chunks.push_back(chunk);
    stage->push_back(chunk);
  }
  auto schedule = std::make_shared<PipelineSchedule>(stage_chunks, world_group(), 4);
  schedule->set_tied_parameters(tied, PipelineSchedule::tied_group(world_group(), !tied.empty()));
  auto sgd = std::make_shared<optim::Sgd>(stage->parameters(), optim::SgdOptions{.lr = 0.1, .momentum = 0.9});
  EngineOptions options;
  options.schedule = schedule;
  Engine engine(stage, sgd, lm_loss, options);
  engine.train();
  // The Engine's train() reaches the blocks through the chunks and pieces: a block checkpoints only
  // while training.
  for (size_t i = 0; i < model.h()->size(); ++i) {
    const auto block = model.h()->at<nn::models::GPT2Block>(i);
    EXPECT_EQ(block->checkpoint_activations(), checkpoint);
    bool held = false;
    for (const auto& [name, param] : run.params) held = held || name.starts_with("h." + std::to_string(i) + ".");
    if (held) {
      EXPECT_TRUE(block->is_training()) << "h." << i;
    }
  }
  for (int step = 0; step < 3; ++step) {
    std::vector<int64_t> ids, targets;
    for (int64_t i = 0; i < 8 * 8; ++i) {
      ids.push_back((7 * i + 3 * step) % 32);
      targets.push_back((5 * i + step + 1) % 32);
    }
    run.losses.push_back(
        engine.step(core::from_vector(ids, {8, 8}, DType::i64), core::from_vector(targets, {8, 8}, DType::i64))
            .item<double>());
  }
  for (auto& [name, param] : run.params) param = param.detach().clone();
  run.params.emplace_back("dropout generator offset",
                          core::full({}, static_cast<double>(dropout.state().offset), DType::f64));
  return run;
}

/// The largest difference between two runs' parameters.
double largest_difference(const PipelineRun& a, const PipelineRun& b) {
  double largest = 0.0;
  for (size_t k = 0; k < a.params.size(); ++k) {
    const auto x = a.params[k].second.to_vector<double>(), y = b.params[k].second.to_vector<double>();
    for (size_t e = 0; e < x.size(); ++e) largest = std::max(largest, std::abs(x[e] - y[e]));
  }
  return largest;
}

TEST(PipelineActivationCheckpoint, GPT2PiecesWithDropoutEqualTheRunWithoutIt) {
  for (const int chunks : {1, 2}) {
    SCOPED_TRACE(fmt::format("pp {} stage {}, {} chunk(s) per stage", world().size(), world().rank(), chunks));
    const PipelineRun without = train_pipelined(false, chunks), with = train_pipelined(true, chunks);
    ASSERT_EQ(with.losses.size(), without.losses.size());
    for (size_t i = 0; i < with.losses.size(); ++i) EXPECT_EQ(with.losses[i], without.losses[i]) << "loss " << i;
    ASSERT_EQ(with.params.size(), without.params.size());
    for (size_t k = 0; k < with.params.size(); ++k) {
      ASSERT_EQ(with.params[k].first, without.params[k].first);
      EXPECT_EQ(with.params[k].second.to_vector<double>(), without.params[k].second.to_vector<double>())
          << with.params[k].first << " differs";
    }
    // Sensitivity: other dropout masks give other parameters.
    EXPECT_GT(largest_difference(train_pipelined(false, chunks, 42), without), 1e-6);
  }
}

}  // namespace
}  // namespace colossal::engine

int main(int argc, char** argv) {
  return colossal::comm::testing::run_mpi_tests(argc, argv);
}
