// PipelineSchedule over NCCL: one process per GPU (started by `colossal run --nproc_per_node N
// --backend processes`, label multigpu), every rank one stage of a world-sized pipeline. Each rank
// trains the serial model on the whole batches and its stage of the pipelined one on its GPU: an MLP of
// 8 pieces in 1F1B and in interleaved 1F1B with 2 chunks per stage (with gradient accumulation), GPT-2's
// pieces with the tied wte summed between the first and last stage, evaluation's broadcast output, a
// batch of another shape, and dp2 x pp2 on 4 GPUs; every step's loss and the stage's parameters after
// 3 steps equal the serial model's. The exchanges are parallel/pp/exchange_plan.h's batches, which
// NCCL runs only if both ends of every direction issue them in the same order (Note [Pipeline
// exchanges]); a hang ends at the collective timeout with the exchange named. Every test runs again
// with the exchanges by the copy engines (Note [Pair sends and receives by the copy engines]) through
// slots far smaller than the messages: over the pipeline group on two GPUs, over a pair group of each
// two neighbouring stages on more.
//
// f32 with TF32 off (ops::Float32MatmulPrecision::highest): 1e-5 relative, the layout harness's f32
// tolerance: the microbatches' GEMMs are of another batch size than the serial run's, and the mean of
// the microbatches' mean losses adds in another order than the batch's mean.
#include <gtest/gtest.h>

#include <cmath>
#include <map>
#include <memory>
#include <vector>

#include "colossal/comm/pair_all_reduce.h"  // use_pair_p2p
#include "colossal/engine/engine.h"
#include "colossal/engine/pipeline_schedule.h"
#include "colossal/nn/activation.h"
#include "colossal/nn/linear.h"
#include "colossal/nn/models/gpt2.h"
#include "colossal/nn/module.h"
#include "colossal/ops/linalg.h"  // set_float32_matmul_precision
#include "colossal/ops/nn_functional.h"
#include "colossal/optim/sgd.h"
#include "colossal/parallel/parallel_context.h"
#include "colossal/parallel/pp/partition.h"
#include "multigpu_main.h"

namespace colossal::engine {
namespace {

constexpr int64_t kPieces = 8, kWidth = 16, kClasses = 5, kBatch = 8;
constexpr double kTolerance = 1e-5;

std::shared_ptr<comm::ProcessGroup> world_group() {
  return std::shared_ptr<comm::ProcessGroup>(&comm::testing::world(), [](comm::ProcessGroup*) {});
}

Device gpu() {
  return comm::testing::gpu();
}

/// The stages' exchanges by NCCL, or by the copy engines (Note [Pair sends and receives by the copy
/// engines]) on two GPUs.
enum class Transport { nccl, copy_engines };
Transport g_transport = Transport::nccl;

/// The copy engines' sends and receives on `group` (a pair) through 2 slots of 256 bytes, so that
/// every message but the smallest goes in pieces and every sender waits for its slots to be freed
/// again and again.
void use_copy_engines(comm::ProcessGroup& group) {
  std::string why;
  EXPECT_TRUE(comm::use_pair_p2p(group, 256, 2, &why)) << why;
}

/// The pipeline's group: the world, or under the copy engines on two GPUs a group of the two ranks
/// whose sends and receives go by the copy engines. Made once, by both ranks in the same test.
std::shared_ptr<comm::ProcessGroup> pipeline_group() {
  if (g_transport == Transport::nccl || comm::testing::world().size() > 2) return world_group();
  static const std::shared_ptr<comm::ProcessGroup> pair = [] {
    std::shared_ptr<comm::ProcessGroup> group = comm::testing::world().new_group({0, 1});
    use_copy_engines(*group);
    // The pair's sums by the copy engines too, as colossal train sets them (GPT-2's tied wte: 8 KB
    // here, in pieces of a 4 KiB window).
    std::string why;
    EXPECT_TRUE(comm::use_pair_all_reduce(*group, 4096, 1, &why)) << why;
    return group;
  }();
  return pair;
}

/// A schedule over pipeline_group(); under the copy engines on more than two GPUs, each pair of
/// neighbouring stages exchanges over a pair group of its own by the copy engines (made once per
/// ring or line, by every rank in the same test).
std::shared_ptr<PipelineSchedule> make_schedule(const std::vector<std::shared_ptr<nn::Module>>& chunks, int64_t m) {
  auto schedule = std::make_shared<PipelineSchedule>(chunks, pipeline_group(), m);
  if (g_transport == Transport::copy_engines && comm::testing::world().size() > 2) {
    static std::map<bool, std::map<int, std::shared_ptr<comm::ProcessGroup>>> pairs;
    const bool ring = chunks.size() > 1;
    if (!pairs.contains(ring)) {
      pairs[ring] = PipelineSchedule::neighbour_pairs(world_group(), ring);
      for (auto& [other, pair] : pairs[ring]) use_copy_engines(*pair);
    }
    for (const auto& [other, pair] : pairs[ring]) schedule->set_neighbour_group(other, pair);
  }
  return schedule;
}

/// TF32 off for the test's duration (the file's head says why); the transport the parameter names.
class PipelineNccl : public ::testing::TestWithParam<Transport> {
 protected:
  void SetUp() override {
    g_transport = GetParam();
    before_ = ops::float32_matmul_precision();
    ops::set_float32_matmul_precision(ops::Float32MatmulPrecision::highest);
  }
  void TearDown() override {
    ops::set_float32_matmul_precision(before_);
    g_transport = Transport::nccl;
  }

 private:
  ops::Float32MatmulPrecision before_ = ops::float32_matmul_precision();
};

/// The model as its pieces (Linear + GELU, the last a Linear to the classes), f32 on this rank's GPU.
std::vector<std::shared_ptr<nn::Module>> make_pieces(uint64_t seed) {
  core::Generator init(seed);
  std::vector<std::shared_ptr<nn::Module>> pieces;
  for (int64_t i = 0; i < kPieces; ++i) {
    const int64_t out = i + 1 == kPieces ? kClasses : kWidth;
    auto linear = std::make_shared<nn::Linear>(kWidth, out, true, &init);
    if (i + 1 == kPieces) {
      pieces.push_back(linear);
    } else {
      pieces.push_back(std::make_shared<nn::Sequential>(
          std::initializer_list<std::shared_ptr<nn::Module>>{linear, std::make_shared<nn::GELU>()}));
    }
    pieces.back()->to(gpu());
  }
  return pieces;
}

std::pair<Tensor, Tensor> batch(int64_t step, int64_t rows = kBatch) {
  std::vector<float> x;
  std::vector<int64_t> y;
  for (int64_t r = 0; r < rows; ++r) {
    for (int64_t c = 0; c < kWidth; ++c) {
      x.push_back(static_cast<float>(std::sin(0.7 * static_cast<double>(r + 3 * c) + 1.3 * step)));
    }
    y.push_back((r + step) % kClasses);
  }
  return {core::from_vector(x, {rows, kWidth}, DType::f32).to(gpu()),
          core::from_vector(y, {rows}, DType::i64).to(gpu())};
}

Tensor ce(const Tensor& out, const Tensor& target) {
  return ops::cross_entropy(out, target);
}

std::unique_ptr<Engine> make_engine(std::shared_ptr<nn::Module> model, EngineOptions options) {
  auto sgd = std::make_shared<optim::Sgd>(model->parameters(), optim::SgdOptions{.lr = 0.1, .momentum = 0.9});
  return std::make_unique<Engine>(std::move(model), sgd, ce, std::move(options));
}

struct Stage {
  std::shared_ptr<nn::ModuleList> module = std::make_shared<nn::ModuleList>();
  std::vector<std::shared_ptr<nn::Module>> chunks;
  std::vector<std::pair<std::string, Tensor>> named;  ///< under the whole model's names
};

Stage stage_of(const std::vector<std::shared_ptr<nn::Module>>& pieces,
               const std::vector<parallel::pp::PieceRange>& ranges) {
  Stage stage;
  for (const parallel::pp::PieceRange& r : ranges) {
    auto chunk = std::make_shared<nn::Sequential>();
    for (int64_t i = r.begin; i < r.end; ++i) {
      chunk->push_back(pieces[static_cast<size_t>(i)]);
      for (const auto& entry : pieces[static_cast<size_t>(i)]->named_parameters()) stage.named.push_back(entry);
    }
    stage.chunks.push_back(chunk);
    stage.module->push_back(chunk);
  }
  return stage;
}

void expect_close(double actual, double expected, const std::string& what) {
  EXPECT_NEAR(actual, expected, kTolerance * std::max(1.0, std::abs(expected))) << what;
}

void expect_tensors_close(const Tensor& actual, const Tensor& expected, const std::string& what) {
  const auto a = actual.to(core::kCpu).to(DType::f64).to_vector<double>();
  const auto b = expected.to(core::kCpu).to(DType::f64).to_vector<double>();
  ASSERT_EQ(a.size(), b.size()) << what;
  for (size_t e = 0; e < a.size(); ++e) expect_close(a[e], b[e], fmt::format("{} [{}]", what, e));
}

void expect_pipeline_equals_serial(int num_chunks, int64_t m, int64_t accumulation) {
  const int p = comm::testing::world().size(), s = comm::testing::world().rank();
  SCOPED_TRACE(
      fmt::format("pp {} stage {}, {} chunks, {} microbatches, accumulation {}", p, s, num_chunks, m, accumulation));
  const auto serial_pieces = make_pieces(11);
  auto serial = std::make_shared<nn::Sequential>();
  for (const auto& piece : serial_pieces) serial->push_back(piece);
  auto serial_engine = make_engine(serial, {.gradient_accumulation = accumulation});
  const auto pieces = make_pieces(11);
  const parallel::pp::StageParts parts = parallel::pp::partition_uniform(kPieces, p, num_chunks);
  const Stage stage = stage_of(pieces, parts[static_cast<size_t>(s)]);
  EngineOptions options{.gradient_accumulation = accumulation};
  options.schedule = make_schedule(stage.chunks, m);
  auto engine = make_engine(stage.module, options);
  for (int step = 0; step < 3; ++step) {
    for (int64_t micro = 0; micro < accumulation; ++micro) {
      const auto [x, y] = batch(step * accumulation + micro);
      expect_close(engine->step(x, y).item<double>(), serial_engine->step(x, y).item<double>(),
                   fmt::format("loss at step {} micro-step {}", step, micro));
    }
  }
  for (const parallel::pp::PieceRange& r : parts[static_cast<size_t>(s)]) {
    for (int64_t i = r.begin; i < r.end; ++i) {
      const auto mine = pieces[static_cast<size_t>(i)]->parameters();
      const auto theirs = serial_pieces[static_cast<size_t>(i)]->parameters();
      for (size_t k = 0; k < mine.size(); ++k) expect_tensors_close(mine[k], theirs[k], fmt::format("piece {}", i));
    }
  }
}

TEST_P(PipelineNccl, OneFOneBEqualsTheSerialModel) {
  expect_pipeline_equals_serial(1, 4, 1);
  expect_pipeline_equals_serial(1, 8, 2);
}

TEST_P(PipelineNccl, InterleavedEqualsTheSerialModel) {
  const int p = comm::testing::world().size();
  expect_pipeline_equals_serial(2, p, 1);      // every forward before the first backward
  expect_pipeline_equals_serial(2, 2 * p, 2);  // warm-up, steady pairs, cool-down
}

TEST_P(PipelineNccl, EvaluationAndABatchOfAnotherShape) {
  const int p = comm::testing::world().size(), s = comm::testing::world().rank();
  for (const int chunks : {1, 2}) {
    SCOPED_TRACE(fmt::format("{} chunk(s)", chunks));
    const auto serial_pieces = make_pieces(11);
    auto serial = std::make_shared<nn::Sequential>();
    for (const auto& piece : serial_pieces) serial->push_back(piece);
    auto serial_engine = make_engine(serial, {});
    const auto pieces = make_pieces(11);
    const Stage stage = stage_of(pieces, parallel::pp::partition_uniform(kPieces, p, chunks)[static_cast<size_t>(s)]);
    EngineOptions options;
    options.schedule = make_schedule(stage.chunks, p);
    auto engine = make_engine(stage.module, options);
    for (const int64_t rows : {kBatch, kBatch / 2, kBatch}) {
      const auto [x, y] = batch(rows, rows);
      expect_close(engine->step(x, y).item<double>(), serial_engine->step(x, y).item<double>(),
                   fmt::format("loss of a batch of {}", rows));
      expect_tensors_close(engine->evaluate(x), serial_engine->evaluate(x), fmt::format("logits of {}", rows));
    }
  }
}

TEST_P(PipelineNccl, Gpt2WithTheTiedEmbeddingEqualsTheSerialModel) {
  const int p = comm::testing::world().size(), s = comm::testing::world().rank();
  auto make_gpt2 = [] {
    nn::models::GPT2Config g;
    g.vocab_size = 64;
    g.n_positions = 16;
    g.n_embd = 32;
    g.n_layer = 2 * comm::testing::world().size() - 2;
    g.n_head = 4;
    g.dropout = 0.0;
    core::Generator init(5);
    auto model = std::make_shared<nn::models::GPT2>(g, &init);
    model->to(gpu());
    return model;
  };
  auto lm_loss = [](const Tensor& logits, const Tensor& target) {
    return ops::cross_entropy(logits.reshape({-1, logits.size(-1)}), target.reshape({-1}));
  };
  // The tied sum after the backwards, and under stage 0's last backward with the rows the embedding
  // read sent after it (Note [Tied sum under the last backward]), where the copies must stay bit-equal.
  for (const auto& [chunks, rows] : {std::pair{1, false}, {2, false}, {1, true}, {2, true}}) {
    SCOPED_TRACE(fmt::format("{} chunk(s){}", chunks, rows ? ", sum under the last backward" : ""));
    auto serial = make_gpt2();
    Engine serial_engine(
        serial, std::make_shared<optim::Sgd>(serial->parameters(), optim::SgdOptions{.lr = 0.1, .momentum = 0.9}),
        lm_loss);
    auto model = make_gpt2();
    const auto pieces = model->layers();  // embed, the blocks, head: 2p pieces
    const Stage stage = stage_of(pieces, parallel::pp::partition_uniform(static_cast<int64_t>(pieces.size()), p,
                                                                         chunks)[static_cast<size_t>(s)]);
    std::vector<Tensor> tied;
    for (const auto& [name, param] : stage.named) {
      if (name == "wte.weight") tied.push_back(param);
    }
    auto schedule = make_schedule(stage.chunks, 2 * p);
    const auto tied_group = PipelineSchedule::tied_group(pipeline_group(), !tied.empty());
    schedule->set_tied_parameters(tied, tied_group);
    if (rows) schedule->set_tied_rows([](const Tensor& ids) { return ids.reshape({-1}); });
    EngineOptions options;
    options.schedule = schedule;
    Engine engine(
        stage.module,
        std::make_shared<optim::Sgd>(stage.module->parameters(), optim::SgdOptions{.lr = 0.1, .momentum = 0.9}),
        lm_loss, options);
    for (int step = 0; step < 3; ++step) {
      std::vector<int64_t> ids, targets;
      for (int64_t i = 0; i < 4 * p * 16; ++i) {
        ids.push_back((7 * i + 3 * step) % 64);
        targets.push_back((5 * i + step + 1) % 64);
      }
      const Tensor x = core::from_vector(ids, {4 * p, 16}, DType::i64).to(gpu());
      const Tensor y = core::from_vector(targets, {4 * p, 16}, DType::i64).to(gpu());
      expect_close(engine.step(x, y).item<double>(), serial_engine.step(x, y).item<double>(),
                   fmt::format("loss at step {}", step));
    }
    const auto want = serial->state_dict();
    for (const auto& [name, param] : stage.named) expect_tensors_close(param, want.at(name), name);
    if (tied_group != nullptr && !tied.empty()) {
      Tensor first_copy = tied[0].detach().clone();
      tied_group->broadcast(first_copy, 0);
      EXPECT_EQ(first_copy.to(core::kCpu).to_vector<float>(), tied[0].to(core::kCpu).to_vector<float>())
          << "wte's copies differ";
    }
  }
}

TEST_P(PipelineNccl, DataTimesPipeline) {
  if (comm::testing::world().size() != 4) GTEST_SKIP() << "dp2 x pp2 needs 4 GPUs";
  config::ParallelConfig pc;
  pc.pipeline = 2;
  const auto context =
      std::make_shared<const parallel::ParallelContext>(parallel::ParallelContext::create(pc, world_group()));
  const int dp = context->rank(parallel::GroupKind::kData), stage = context->rank(parallel::GroupKind::kPipeline);
  const auto serial_pieces = make_pieces(11);
  auto serial = std::make_shared<nn::Sequential>();
  for (const auto& piece : serial_pieces) serial->push_back(piece);
  auto serial_engine = make_engine(serial, {.gradient_accumulation = 2});
  const auto pieces = make_pieces(11);
  const Stage mine = stage_of(pieces, parallel::pp::partition_uniform(kPieces, 2)[static_cast<size_t>(stage)]);
  EngineOptions options{.gradient_accumulation = 2};
  options.context = context;
  if (g_transport == Transport::copy_engines) use_copy_engines(*context->group(parallel::GroupKind::kPipeline));
  options.schedule = std::make_shared<PipelineSchedule>(mine.chunks, context->group(parallel::GroupKind::kPipeline), 2);
  auto engine = make_engine(mine.module, options);
  for (int step = 0; step < 6; ++step) {
    const auto [x, y] = batch(step);
    const double expected = serial_engine->step(x, y).item<double>();
    const double got =
        engine->step(x.narrow(0, dp * kBatch / 2, kBatch / 2), y.narrow(0, dp * kBatch / 2, kBatch / 2)).item<double>();
    expect_close(got, expected, fmt::format("loss at micro-step {}", step));
  }
  const parallel::pp::PieceRange r = parallel::pp::partition_uniform(kPieces, 2)[static_cast<size_t>(stage)][0];
  for (int64_t i = r.begin; i < r.end; ++i) {
    const auto a = pieces[static_cast<size_t>(i)]->parameters(),
               b = serial_pieces[static_cast<size_t>(i)]->parameters();
    for (size_t k = 0; k < a.size(); ++k) expect_tensors_close(a[k], b[k], fmt::format("piece {}", i));
  }
}

INSTANTIATE_TEST_SUITE_P(Transports, PipelineNccl, ::testing::Values(Transport::nccl, Transport::copy_engines),
                         [](const ::testing::TestParamInfo<Transport>& info) {
                           return info.param == Transport::nccl ? "Nccl" : "CopyEngines";
                         });

}  // namespace
}  // namespace colossal::engine

int main(int argc, char** argv) {
  return colossal::comm::testing::run_multigpu_tests(argc, argv);
}
