// PipelineSchedule on MPI ranks (every rank one stage of a world-sized pipeline, at 2 and 4 ranks):
// an MLP of 8 pieces (Linear + GELU) cut uniformly among the stages (parallel/pp/partition.h) trains 3 steps of
// 1F1B and of interleaved 1F1B with 2 chunks per stage, and every step's loss and every piece's
// parameters after the steps equal the serial model's trained on the whole batches (f64; the
// microbatches' mean of means and the batch's mean differ only in the order of the additions:
// relative 1e-12). With gradient accumulation too; GPT-2's pieces with the tied wte; ViT's pieces in
// 1F1B and interleaved; dp2 x pp2 at 4 ranks. Every case under NCCL's rules for point-to-point
// (the strict group), so the exchanges that pass here pass over NCCL too.
#include <gtest/gtest.h>

#include <cmath>
#include <memory>
#include <set>
#include <vector>

#include "../comm/mpi_test_main.h"
#include "colossal/comm/strict_p2p_process_group.h"
#include "colossal/engine/engine.h"
#include "colossal/engine/pipeline_report.h"
#include "colossal/engine/pipeline_schedule.h"
#include "colossal/nn/activation.h"
#include "colossal/nn/linear.h"
#include "colossal/nn/models/gpt2.h"
#include "colossal/nn/models/vit.h"
#include "colossal/nn/module.h"
#include "colossal/ops/nn_functional.h"
#include "colossal/optim/sgd.h"
#include "colossal/parallel/parallel_context.h"
#include "colossal/parallel/pp/partition.h"
#include "gradcheck.h"  // EXPECT_ERROR_CONTAINS

namespace colossal::engine {
namespace {

using comm::testing::world;

constexpr int64_t kPieces = 8, kWidth = 6, kClasses = 3, kBatch = 8;
constexpr double kTolerance = 1e-12;

/// Every test runs under NCCL's rules for point-to-point (comm/strict_p2p_process_group.h): a schedule
/// whose exchanges would hang over NCCL hangs here until the watchdog ends it, naming the exchange, and
/// one whose neighbours issue their messages in different orders fails on both.
std::shared_ptr<comm::ProcessGroup> world_group() {
  static const std::shared_ptr<comm::ProcessGroup> strict =
      std::make_shared<comm::StrictP2PProcessGroup>(world().split(0, world().rank()));
  return strict;
}

/// The model as its pieces: Linear + GELU each, the last a Linear to the classes. f64.
std::vector<std::shared_ptr<nn::Module>> make_pieces(uint64_t seed) {
  core::Generator init(seed);
  std::vector<std::shared_ptr<nn::Module>> pieces;
  for (int64_t i = 0; i < kPieces; ++i) {
    const int64_t out = i + 1 == kPieces ? kClasses : kWidth;
    auto linear = std::make_shared<nn::Linear>(kWidth, out, true, &init);
    linear->to(DType::f64);
    if (i + 1 == kPieces) {
      pieces.push_back(linear);
    } else {
      pieces.push_back(std::make_shared<nn::Sequential>(
          std::initializer_list<std::shared_ptr<nn::Module>>{linear, std::make_shared<nn::GELU>()}));
    }
  }
  return pieces;
}

std::pair<Tensor, Tensor> batch(int64_t step) {
  std::vector<double> x;
  std::vector<int64_t> y;
  for (int64_t r = 0; r < kBatch; ++r) {
    for (int64_t c = 0; c < kWidth; ++c) x.push_back(std::sin(0.7 * static_cast<double>(r + 3 * c) + 1.3 * step));
    y.push_back((r + step) % kClasses);
  }
  return {core::from_vector(x, {kBatch, kWidth}, DType::f64), core::from_vector(y, {kBatch}, DType::i64)};
}

Tensor ce(const Tensor& out, const Tensor& target) {
  return ops::cross_entropy(out, target);
}

std::unique_ptr<Engine> make_engine(std::shared_ptr<nn::Module> model, EngineOptions options) {
  auto sgd = std::make_shared<optim::Sgd>(model->parameters(), optim::SgdOptions{.lr = 0.1, .momentum = 0.9});
  return std::make_unique<Engine>(std::move(model), sgd, ce, std::move(options));
}

/// A stage built from `pieces`: one Sequential chunk per range, all under one ModuleList (the Engine's
/// model), and the pieces' parameters under the whole model's names (Note [Pipeline layers]).
struct Stage {
  std::shared_ptr<nn::ModuleList> module = std::make_shared<nn::ModuleList>();
  std::vector<std::shared_ptr<nn::Module>> chunks;
  std::vector<std::pair<std::string, Tensor>> named;
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

/// Trains `steps` steps serially and through the pipeline (num_chunks per stage, m microbatches,
/// `accumulation` micro-steps per update), comparing losses and then every piece this stage holds.
/// How the stages' messages travel: over the (strict) pipeline group, or over a group of plain MPI
/// ranks for each pair of neighbouring stages (PipelineSchedule::neighbour_pairs; sends that do not
/// wait for their receives, as the copy engines', and receives posted one op ahead, Note [Receives
/// posted one op ahead]).
enum class Route { pipeline, plain_pairs };

void expect_pipeline_equals_serial(int num_chunks, int64_t m, int64_t accumulation = 1, int steps = 3,
                                   Route route = Route::pipeline) {
  const int p = world().size(), s = world().rank();
  SCOPED_TRACE(fmt::format("pp {} stage {}, {} chunks, {} microbatches, accumulation {}, route {}", p, s, num_chunks, m,
                           accumulation, static_cast<int>(route)));
  // Serial: the whole model on this rank.
  const auto serial_pieces = make_pieces(11);
  auto serial = std::make_shared<nn::Sequential>();
  for (size_t i = 0; i < serial_pieces.size(); ++i) serial->push_back(serial_pieces[i]);
  auto serial_engine = make_engine(serial, {.gradient_accumulation = accumulation});

  // Pipelined: this stage's chunks, each a Sequential of its pieces.
  const auto pieces = make_pieces(11);
  const parallel::pp::StageParts parts = parallel::pp::partition_uniform(kPieces, p, num_chunks);
  const Stage stage = stage_of(pieces, parts[static_cast<size_t>(s)]);
  EngineOptions options{.gradient_accumulation = accumulation};
  auto schedule = std::make_shared<PipelineSchedule>(stage.chunks, world_group(), m);
  if (route != Route::pipeline) {
    const std::shared_ptr<comm::ProcessGroup> over(&world(), [](comm::ProcessGroup*) {});
    const auto pairs = PipelineSchedule::neighbour_pairs(over, /*ring=*/num_chunks > 1);
    // Stage s's pairs: with s - 1 and s + 1, the ring's closing pair too with several chunks.
    std::set<int> others;
    for (const auto& [other, pair] : pairs) {
      others.insert(other);
      EXPECT_EQ(pair->size(), 2);
      EXPECT_EQ(pair->rank(), s < other ? 0 : 1) << "a pair is ordered by stage";
      EXPECT_TRUE(pair->receives_post_early());
      schedule->set_neighbour_group(other, pair);
    }
    std::set<int> want;
    if (s > 0 || num_chunks > 1) want.insert((s + p - 1) % p);
    if (s < p - 1 || num_chunks > 1) want.insert((s + 1) % p);
    EXPECT_EQ(others, want);
  }
  options.schedule = schedule;
  auto engine = make_engine(stage.module, options);

  for (int step = 0; step < steps; ++step) {
    for (int64_t micro = 0; micro < accumulation; ++micro) {
      const auto [x, y] = batch(step * accumulation + micro);
      const double expected = serial_engine->step(x, y).item<double>();
      const double got = engine->step(x, y).item<double>();
      expect_close(got, expected, fmt::format("loss at step {} micro-step {}", step, micro));
    }
  }
  for (const parallel::pp::PieceRange& r : parts[static_cast<size_t>(s)]) {
    for (int64_t i = r.begin; i < r.end; ++i) {
      const auto mine = pieces[static_cast<size_t>(i)]->named_parameters();
      const auto want = serial_pieces[static_cast<size_t>(i)]->named_parameters();
      ASSERT_EQ(mine.size(), want.size());
      for (size_t k = 0; k < mine.size(); ++k) {
        const auto a = mine[k].second.to_vector<double>(), b = want[k].second.to_vector<double>();
        for (size_t e = 0; e < a.size(); ++e) {
          expect_close(a[e], b[e], fmt::format("piece {} {} [{}]", i, mine[k].first, e));
        }
      }
    }
  }
}

TEST(PipelineSchedule, OneFOneBEqualsTheSerialModel) {
  expect_pipeline_equals_serial(1, 4);
  expect_pipeline_equals_serial(1, 8);
  expect_pipeline_equals_serial(1, 1);
}

TEST(PipelineSchedule, NeighbourPairsCarryTheExchanges) {
  // A pipeline longer than two stages over a group of each pair of neighbours, as the copy engines'
  // pairs carry them on GPUs: sends that do not wait for their receives (MPI's), the receives posted
  // one op ahead.
  if (world().size() <= 2) GTEST_SKIP() << "two stages are their own pair";
  expect_pipeline_equals_serial(1, 8, 1, 3, Route::plain_pairs);
  expect_pipeline_equals_serial(2, 2 * world().size(), 2, 2, Route::plain_pairs);
  // A pair must be of the two stages, and neighbours.
  const auto pieces = make_pieces(11);
  const Stage stage = stage_of(pieces, parallel::pp::partition_uniform(kPieces, world().size())[0]);
  PipelineSchedule schedule(stage.chunks, world_group(), 4);
  const int s = world().rank(), p = world().size();
  EXPECT_ERROR_CONTAINS(schedule.set_neighbour_group((s + 2) % p, world_group()->split(0, s)), "must be a pair");
  if (s == 0) {
    EXPECT_ERROR_CONTAINS(schedule.set_neighbour_group(2, world_group()), "must be a pair of the two stages");
  }
  // Pairs under NCCL's rules would wait on each other across the pairs: not taken.
  const auto strict = PipelineSchedule::neighbour_pairs(world_group(), /*ring=*/false);
  for (const auto& [other, pair] : strict) {
    EXPECT_ERROR_CONTAINS(schedule.set_neighbour_group(other, pair), "whose sends wait for their receives");
  }
}

TEST(PipelineSchedule, NeighbourPairsOfAnOddRing) {
  // Three stages (ranks 0-2 of 4): the ring's closing pair (2, 0) shares a stage with both other
  // edges, so it is split off in a round of its own; without the ring, stages 0 and 2 are not paired.
  if (world().size() != 4) GTEST_SKIP() << "three stages out of four ranks";
  const int r = world().rank();
  const std::shared_ptr<comm::ProcessGroup> three = world().split(r < 3 ? 0 : comm::kNoColor, r);
  if (three == nullptr) {
    // Rank 3 joins the splits the others make (every rank of the world calls split).
    return;
  }
  for (const bool ring : {true, false}) {
    SCOPED_TRACE(ring ? "ring" : "line");
    const auto pairs = PipelineSchedule::neighbour_pairs(three, ring);
    std::set<int> others;
    for (const auto& [other, pair] : pairs) {
      others.insert(other);
      ASSERT_EQ(pair->size(), 2);
      EXPECT_EQ(pair->rank(), r < other ? 0 : 1);
      // The pair joins the two stages: a sum over it is theirs alone.
      Tensor x = core::full({1}, static_cast<double>(1 << r), TensorOptions(DType::f64, core::kCpu));
      pair->all_reduce(x, comm::ReduceOp::sum);
      EXPECT_EQ(x.item<double>(), static_cast<double>((1 << r) + (1 << other)));
    }
    std::set<int> want{(r + 1) % 3, (r + 2) % 3};
    if (!ring) want = r == 0 ? std::set<int>{1} : r == 1 ? std::set<int>{0, 2} : std::set<int>{1};
    EXPECT_EQ(others, want);
  }
}

TEST(PipelineSchedule, EvaluationGivesEveryStageTheSerialOutput) {
  // Engine::evaluate through the pipeline (one microbatch forward, the last stage's output broadcast):
  // every stage gets the serial model's logits, with 1 and 2 chunks per stage.
  const int p = world().size(), s = world().rank();
  const auto serial_pieces = make_pieces(11);
  auto serial = std::make_shared<nn::Sequential>();
  for (const auto& piece : serial_pieces) serial->push_back(piece);
  const auto [x, y] = batch(0);
  const auto expected = serial->forward(x).to_vector<double>();
  for (const int chunks : {1, 2}) {
    const auto pieces = make_pieces(11);
    const parallel::pp::StageParts parts = parallel::pp::partition_uniform(kPieces, p, chunks);
    const Stage stage = stage_of(pieces, parts[static_cast<size_t>(s)]);
    EngineOptions options;
    options.schedule = std::make_shared<PipelineSchedule>(stage.chunks, world_group(), chunks == 1 ? 1 : p);
    auto engine = make_engine(stage.module, options);
    const Tensor out = engine->evaluate(x);
    ASSERT_EQ(out.shape(), (Shape{kBatch, kClasses})) << chunks << " chunk(s)";
    const auto got = out.to_vector<double>();
    for (size_t e = 0; e < got.size(); ++e) expect_close(got[e], expected[e], fmt::format("logit {}", e));
  }
}

TEST(PipelineSchedule, InterleavedEqualsTheSerialModel) {
  expect_pipeline_equals_serial(2, 4);
}

TEST(PipelineSchedule, ABatchOfAnotherShapeLearnsItsShapesAgain) {
  // Note [Pipeline messages]: the first batch of a shape sends microbatch 0's headers, the next ones
  // reuse the shapes; a shorter batch (an epoch's last) is a new shape, and the first one is still known.
  const int p = world().size(), s = world().rank();
  for (const int chunks : {1, 2}) {
    const auto serial_pieces = make_pieces(11);
    auto serial = std::make_shared<nn::Sequential>();
    for (const auto& piece : serial_pieces) serial->push_back(piece);
    auto serial_engine = make_engine(serial, {});
    const auto pieces = make_pieces(11);
    const parallel::pp::StageParts parts = parallel::pp::partition_uniform(kPieces, p, chunks);
    const Stage stage = stage_of(pieces, parts[static_cast<size_t>(s)]);
    EngineOptions options;
    options.schedule = std::make_shared<PipelineSchedule>(stage.chunks, world_group(), p);
    auto engine = make_engine(stage.module, options);
    for (const int64_t rows : {kBatch, kBatch / 2, kBatch, kBatch / 2}) {
      if (rows % p != 0) continue;
      const auto [x, y] = batch(rows);
      const Tensor xs = x.narrow(0, 0, rows), ys = y.narrow(0, 0, rows);
      expect_close(engine->step(xs, ys).item<double>(), serial_engine->step(xs, ys).item<double>(),
                   fmt::format("{} chunk(s), a batch of {}", chunks, rows));
    }
  }
}

TEST(PipelineSchedule, TimingGivesEveryStageItsBusyAndIdleTime) {
  // Note [Pipeline bubble]: with timing on, each stage's span holds its busy time, and the report
  // gathers every stage's at every stage; off, the last measurement stays.
  const int p = world().size(), s = world().rank();
  const auto pieces = make_pieces(11);
  const Stage stage = stage_of(pieces, parallel::pp::partition_uniform(kPieces, p)[static_cast<size_t>(s)]);
  EngineOptions options;
  auto schedule = std::make_shared<PipelineSchedule>(stage.chunks, world_group(), 4);
  options.schedule = schedule;
  auto engine = make_engine(stage.module, options);
  const auto [x, y] = batch(0);
  schedule->set_timing(true);
  engine->step(x, y);
  schedule->set_timing(false);
  const StageTiming mine = schedule->last_timing();
  EXPECT_GT(mine.busy_ms, 0.0);
  EXPECT_GE(mine.span_ms, mine.busy_ms);
  engine->step(x, y);
  EXPECT_EQ(schedule->last_timing().span_ms, mine.span_ms);
  const BubbleReport report = gather_bubble_report(*schedule);
  ASSERT_EQ(report.stages.size(), static_cast<size_t>(p));
  EXPECT_EQ(report.stages[static_cast<size_t>(s)].busy_ms, mine.busy_ms);
  EXPECT_EQ(report.stages[static_cast<size_t>(s)].lead_ms, mine.lead_ms);
  for (const StageTiming& t : report.stages) {
    EXPECT_GE(t.idle_ms(), 0.0);
    // The idle splits into before the first op, between ops and after the last, each >= 0, and the
    // median gap is one of the between-op gaps (8 ops: 4 forwards, 4 backwards).
    EXPECT_GE(t.lead_ms, 0.0);
    EXPECT_GE(t.tail_ms, 0.0);
    EXPECT_GE(t.between_ms(), -1e-9);
    EXPECT_GE(t.median_gap_ms, 0.0);
    EXPECT_LE(t.median_gap_ms, t.between_ms() + 1e-9);
    // The longest of the 8 ops, no shorter than the median one, within the busy time.
    EXPECT_GE(t.longest_op, 0);
    EXPECT_LT(t.longest_op, 8);
    EXPECT_GE(t.longest_op_ms, t.median_op_ms);
    EXPECT_LE(t.longest_op_ms, t.busy_ms + 1e-9);
    EXPECT_GE(t.longest_op_host_ms, 0.0);
  }
  // The last stage waits for the first's forward of microbatch 0 before its first op: the pipeline's
  // fill (p > 1), over the host clock and the exchange.
  if (p > 1) {
    EXPECT_GT(report.stages.back().lead_ms, 0.0);
  }
  EXPECT_DOUBLE_EQ(report.expected(), (p - 1) / 4.0);
  EXPECT_NE(
      report.describe().find(fmt::format("pipeline bubble: {} stages x 1 chunk, 4 microbatches; stage 0 busy", p)),
      std::string::npos)
      << report.describe();
  EXPECT_NE(report.describe().find("(before the first op "), std::string::npos) << report.describe();
  EXPECT_NE(report.describe().find(", between ops "), std::string::npos) << report.describe();
  EXPECT_NE(report.describe().find(" [longest op "), std::string::npos) << report.describe();
  EXPECT_NE(report.describe().find(" of microbatch "), std::string::npos) << report.describe();
}

TEST(PipelineSchedule, WithGradientAccumulation) {
  expect_pipeline_equals_serial(1, 2, /*accumulation=*/2);
}

std::shared_ptr<nn::models::GPT2> tiny_gpt2() {
  // Two blocks on a 32-token vocabulary, 8-token windows, 16 wide, f64: pieces embed, h.0, h.1, head.
  nn::models::GPT2Config g;
  g.vocab_size = 32;
  g.n_positions = 8;
  g.n_embd = 16;
  g.n_layer = 2;
  g.n_head = 2;
  g.dropout = 0.0;
  core::Generator init(5);
  auto model = std::make_shared<nn::models::GPT2>(g, &init);
  model->to(DType::f64);
  return model;
}

Tensor lm_loss(const Tensor& logits, const Tensor& target) {
  return ops::cross_entropy(logits.reshape({-1, logits.size(-1)}), target.reshape({-1}));
}

/// A chunk that calls its pieces' forward() directly, as a model's own code does, so that no forward
/// hook of a piece runs: the tied sum is then waited for at the start of stage 0's last backward (Note
/// [Tied sum under the last backward]'s fallback) instead of at the embedding.
class DirectChunk : public nn::Module {
 public:
  explicit DirectChunk(std::vector<std::shared_ptr<nn::Module>> pieces)
      : Module("DirectChunk"), pieces_(std::move(pieces)) {
    for (size_t i = 0; i < pieces_.size(); ++i) register_module(std::to_string(i), pieces_[i]);
  }
  Tensor forward(const Tensor& x) override {
    Tensor y = x;
    for (const auto& piece : pieces_) y = piece->forward(y);
    return y;
  }

 private:
  std::vector<std::shared_ptr<nn::Module>> pieces_;
};

TEST(PipelineSchedule, Gpt2PiecesWithTheTiedEmbeddingEqualTheSerialModel) {
  // The tied wte lives on the first stage (embed) and the last (head); its two copies' gradients are
  // summed between them (Note [Tied parameters across stages]), so both take the serial update:
  // after the backwards, and with the rows the embedding reads (set_tied_rows) under stage 0's last
  // backward (Note [Tied sum under the last backward]), where the copies must also stay bit-equal.
  // With accumulation over 2 micro-steps too (the sum once per window).
  const int p = world().size(), s = world().rank();
  enum class Sum { after_backwards, under_last_backward, at_last_backwards_start };
  for (const Sum sum : {Sum::after_backwards, Sum::under_last_backward, Sum::at_last_backwards_start}) {
    const bool rows = sum != Sum::after_backwards;
    for (const int accumulation : {1, 2}) {
      SCOPED_TRACE(fmt::format("{}, accumulation {}",
                               sum == Sum::after_backwards       ? "sum after the backwards"
                               : sum == Sum::under_last_backward ? "sum under the last backward"
                                                                 : "sum waited for at the last backward's start",
                               accumulation));
      auto serial = tiny_gpt2();
      auto serial_sgd =
          std::make_shared<optim::Sgd>(serial->parameters(), optim::SgdOptions{.lr = 0.1, .momentum = 0.9});
      Engine serial_engine(serial, serial_sgd, lm_loss, {.gradient_accumulation = accumulation});

      auto model = tiny_gpt2();
      const auto pieces = model->layers();
      ASSERT_EQ(pieces.size(), 4u);
      const parallel::pp::StageParts parts = parallel::pp::partition_uniform(4, p);
      std::vector<std::shared_ptr<nn::Module>> mine;
      for (int64_t i = parts[static_cast<size_t>(s)][0].begin; i < parts[static_cast<size_t>(s)][0].end; ++i) {
        mine.push_back(pieces[static_cast<size_t>(i)]);
      }
      std::shared_ptr<nn::Module> chunk;
      if (sum == Sum::at_last_backwards_start) {
        chunk = std::make_shared<DirectChunk>(mine);
      } else {
        auto sequential = std::make_shared<nn::Sequential>();
        for (const auto& piece : mine) sequential->push_back(piece);
        chunk = sequential;
      }
      // A piece keeps the whole model's names (Note [Pipeline layers]); the chunk would prefix them.
      std::vector<std::pair<std::string, Tensor>> named;
      for (int64_t i = parts[static_cast<size_t>(s)][0].begin; i < parts[static_cast<size_t>(s)][0].end; ++i) {
        for (const auto& entry : pieces[static_cast<size_t>(i)]->named_parameters()) named.push_back(entry);
      }
      std::vector<Tensor> tied;
      for (const auto& [name, param] : named) {
        if (name == "wte.weight") tied.push_back(param);
      }
      ASSERT_EQ(tied.size(), s == 0 || s == p - 1 ? 1u : 0u);
      auto schedule =
          std::make_shared<PipelineSchedule>(std::vector<std::shared_ptr<nn::Module>>{chunk}, world_group(), 2);
      const auto tied_group = PipelineSchedule::tied_group(world_group(), !tied.empty());
      schedule->set_tied_parameters(tied, tied_group);
      if (rows) schedule->set_tied_rows([](const Tensor& ids) { return ids.reshape({-1}); });
      auto sgd = std::make_shared<optim::Sgd>(chunk->parameters(), optim::SgdOptions{.lr = 0.1, .momentum = 0.9});
      EngineOptions options;
      options.schedule = schedule;
      options.gradient_accumulation = accumulation;
      Engine engine(chunk, sgd, lm_loss, options);

      for (int step = 0; step < 3 * accumulation; ++step) {
        std::vector<int64_t> ids, targets;
        for (int64_t i = 0; i < 4 * 8; ++i) {
          ids.push_back((7 * i + 3 * step) % 32);
          targets.push_back((5 * i + step + 1) % 32);
        }
        const Tensor x = core::from_vector(ids, {4, 8}, DType::i64), y = core::from_vector(targets, {4, 8}, DType::i64);
        expect_close(engine.step(x, y).item<double>(), serial_engine.step(x, y).item<double>(),
                     fmt::format("loss at step {}", step));
      }
      const auto want = serial->state_dict();
      for (const auto& [name, param] : named) {
        const auto a = param.to_vector<double>(), b = want.at(name).to_vector<double>();
        for (size_t e = 0; e < a.size(); ++e) expect_close(a[e], b[e], fmt::format("{} [{}]", name, e));
      }
      if (tied_group != nullptr && !tied.empty()) {
        // The copies are one weight: the first stage's, broadcast, equals every other's bit for bit.
        Tensor first_copy = tied[0].detach().clone();
        tied_group->broadcast(first_copy, 0);
        EXPECT_EQ(first_copy.to_vector<double>(), tied[0].to_vector<double>()) << "wte's copies differ";
      }
    }
  }
}

TEST(PipelineSchedule, VitPiecesEqualTheSerialModelIn1F1BAndInterleaved) {
  // ViT's pieces (embed: patches, cls token and positions; one per block; head), f64, 4 microbatches:
  // 1F1B at any world size, and 2 chunks per stage where the 4 pieces fill 2 stages x 2 chunks.
  auto make_vit = [] {
    nn::models::ViTConfig v;
    v.img_size = 8;
    v.patch_size = 4;
    v.in_chans = 1;
    v.num_classes = 3;
    v.embed_dim = 8;
    v.depth = 2;
    v.num_heads = 2;
    core::Generator init(9);
    auto model = std::make_shared<nn::models::VisionTransformer>(v, &init);
    model->to(DType::f64);
    return model;
  };
  const int p = world().size(), s = world().rank();
  for (const int chunks : {1, 2}) {
    if (4 < p * chunks) continue;
    SCOPED_TRACE(fmt::format("{} chunk(s) per stage", chunks));
    auto serial = make_vit();
    Engine serial_engine(
        serial, std::make_shared<optim::Sgd>(serial->parameters(), optim::SgdOptions{.lr = 0.1, .momentum = 0.9}), ce);
    auto model = make_vit();
    const auto pieces = model->layers();
    ASSERT_EQ(pieces.size(), 4u);
    const parallel::pp::StageParts parts = parallel::pp::partition_uniform(4, p, chunks);
    const Stage stage = stage_of(pieces, parts[static_cast<size_t>(s)]);
    EngineOptions options;
    options.schedule = std::make_shared<PipelineSchedule>(stage.chunks, world_group(), 4);
    Engine engine(
        stage.module,
        std::make_shared<optim::Sgd>(stage.module->parameters(), optim::SgdOptions{.lr = 0.1, .momentum = 0.9}), ce,
        options);
    for (int step = 0; step < 3; ++step) {
      std::vector<double> pixels;
      std::vector<int64_t> labels;
      for (int64_t i = 0; i < 8 * 64; ++i) pixels.push_back(std::sin(0.37 * static_cast<double>(i) + step));
      for (int64_t i = 0; i < 8; ++i) labels.push_back((i + step) % 3);
      const Tensor x = core::from_vector(pixels, {8, 1, 8, 8}, DType::f64),
                   y = core::from_vector(labels, {8}, DType::i64);
      expect_close(engine.step(x, y).item<double>(), serial_engine.step(x, y).item<double>(),
                   fmt::format("loss at step {}", step));
    }
    const auto want = serial->state_dict();
    for (const auto& [name, param] : stage.named) {
      const auto a = param.to_vector<double>(), b = want.at(name).to_vector<double>();
      for (size_t e = 0; e < a.size(); ++e) expect_close(a[e], b[e], fmt::format("{} [{}]", name, e));
    }
  }
}

TEST(PipelineSchedule, DataTimesPipelineReducesEachGradientOnceAfterItsLastMicrobatch) {
  // dp2 x pp2 at 4 ranks (Note [Gradient reduction under a pipeline]): each data replica takes half
  // of every batch through a 2-stage pipeline with 2 microbatches, and data parallelism averages each
  // stage's gradients over the replicas once per window; the result is the serial model's.
  const int world_size = world().size();
  if (world_size != 4) GTEST_SKIP() << "needs 4 ranks";
  config::ParallelConfig pc;
  pc.pipeline = 2;
  const auto context =
      std::make_shared<const parallel::ParallelContext>(parallel::ParallelContext::create(pc, world_group()));
  const int dp = context->rank(parallel::GroupKind::kData), stage = context->rank(parallel::GroupKind::kPipeline);
  ASSERT_EQ(context->size(parallel::GroupKind::kData), 2);

  const auto serial_pieces = make_pieces(11);
  auto serial = std::make_shared<nn::Sequential>();
  for (const auto& piece : serial_pieces) serial->push_back(piece);
  auto serial_engine = make_engine(serial, {.gradient_accumulation = 2});

  const auto pieces = make_pieces(11);
  const parallel::pp::StageParts parts = parallel::pp::partition_uniform(kPieces, 2);
  auto chunk = std::make_shared<nn::Sequential>();
  for (int64_t i = parts[static_cast<size_t>(stage)][0].begin; i < parts[static_cast<size_t>(stage)][0].end; ++i) {
    chunk->push_back(pieces[static_cast<size_t>(i)]);
  }
  EngineOptions options{.gradient_accumulation = 2};
  options.context = context;
  options.schedule = std::make_shared<PipelineSchedule>(std::vector<std::shared_ptr<nn::Module>>{chunk},
                                                        context->group(parallel::GroupKind::kPipeline), 2);
  auto engine = make_engine(chunk, options);
  ASSERT_NE(engine->gradient_handler(), nullptr);

  for (int step = 0; step < 6; ++step) {
    const auto [x, y] = batch(step);
    const double expected = serial_engine->step(x, y).item<double>();
    // This replica's half of the batch; the Engine reports the mean over the data group.
    const double got =
        engine->step(x.narrow(0, dp * kBatch / 2, kBatch / 2), y.narrow(0, dp * kBatch / 2, kBatch / 2)).item<double>();
    expect_close(got, expected, fmt::format("loss at micro-step {}", step));
  }
  for (int64_t i = parts[static_cast<size_t>(stage)][0].begin; i < parts[static_cast<size_t>(stage)][0].end; ++i) {
    const auto mine = pieces[static_cast<size_t>(i)]->named_parameters();
    const auto want = serial_pieces[static_cast<size_t>(i)]->named_parameters();
    for (size_t k = 0; k < mine.size(); ++k) {
      const auto a = mine[k].second.to_vector<double>(), b = want[k].second.to_vector<double>();
      for (size_t e = 0; e < a.size(); ++e)
        expect_close(a[e], b[e], fmt::format("piece {} {} [{}]", i, mine[k].first, e));
    }
  }
}

TEST(PipelineSchedule, RefusesMicrobatchesThatDoNotInterleave) {
  const int p = world().size();
  auto chunk = std::make_shared<nn::Sequential>();
  for (const auto& piece : make_pieces(3)) chunk->push_back(piece);
  // Checked when the schedule is built, on every rank alike (a batch that does not split is refused
  // by the first and last stages at the step; the config's rules refuse it before any step).
  if (p > 1) {
    EXPECT_ERROR_CONTAINS(PipelineSchedule({chunk, chunk}, world_group(), 3), "3 microbatches do not divide by the");
  }
}

}  // namespace
}  // namespace colossal::engine

int main(int argc, char** argv) {
  return colossal::comm::testing::run_mpi_tests(argc, argv);
}
