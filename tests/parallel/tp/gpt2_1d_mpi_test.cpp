// GPT-2's block split over the tensor-parallel group (parallel/tp/gpt2_1d.h) under MPI, the whole
// world as the group (2 and 4 ranks): built from a serial GPT2Block, it computes the serial block's
// output and input gradient, and each shard's gradient is its part of the serial one (c_attn's in the
// reordered q/k/v columns of this rank's heads); the replicated layer norms get the serial gradients.
// Heads that do not split are named.
//
// Tolerance: f64, 1e-11 relative by norm (sums split into tp partial sums; the attention's softmax
// and the layer norms add no error of their own beyond rounding).
#include <fmt/format.h>
#include <gtest/gtest.h>

#include <memory>
#include <vector>

#include "../../comm/mpi_test_main.h"
#include "colossal/autograd/engine.h"
#include "colossal/nn/models/gpt2.h"
#include "colossal/ops/indexing.h"
#include "colossal/parallel/tp/gpt2_1d.h"
#include "gradcheck.h"  // EXPECT_ERROR_CONTAINS
#include "tp_test_util.h"

namespace colossal::parallel::tp {
namespace {

using comm::testing::world;
using testing::relative_error;
using testing::tp_group;
using testing::weighted_sum;

constexpr double kTolerance = 1e-11;

nn::models::GPT2Config tiny_config() {
  nn::models::GPT2Config c;
  c.vocab_size = 32;
  c.n_positions = 8;
  c.n_embd = 16;
  c.n_layer = 1;
  c.n_head = 4;  // splits over 2 and 4 ranks
  c.dropout = 0.0;
  return c;
}

Tensor input(int64_t b, int64_t t, int64_t c) {
  std::vector<double> v;
  for (int64_t i = 0; i < b * t * c; ++i) v.push_back(std::sin(0.29 * static_cast<double>(i) + 0.1));
  Tensor x = core::from_vector<double>(v, {b, t, c});
  x.set_requires_grad(true);
  return x;
}

/// This rank's 1/size of `t` along `dim`.
Tensor my_slice(const Tensor& t, int dim) {
  const int64_t part = t.shape()[static_cast<size_t>(dim)] / world().size();
  return t.narrow(dim, world().rank() * part, part);
}

TEST(ParallelGpt2Block, EqualsTheSerialBlockWithShardedGradients) {
  const nn::models::GPT2Config config = tiny_config();
  core::Generator g(17);
  nn::models::GPT2Block serial(config, &g, nullptr);
  serial.to(DType::f64);
  Tensor xs = input(2, 6, config.n_embd);
  Tensor ys = serial.forward(xs);
  autograd::backward(weighted_sum(ys));

  ParallelGPT2Block parallel(serial, config, tp_group());
  Tensor xp = input(2, 6, config.n_embd);
  Tensor yp = parallel.forward(xp);
  autograd::backward(weighted_sum(yp));

  EXPECT_LE(relative_error(yp, ys), kTolerance) << "output";
  EXPECT_LE(relative_error(xp.grad(), xs.grad()), kTolerance) << "input gradient";
  // Attention: c_attn's shard holds this rank's heads' q, k and v columns.
  const std::vector<int64_t> columns =
      ParallelGPT2Attention::qkv_columns(config.n_embd, config.n_head, world().rank(), world().size());
  const Tensor index = core::from_vector<int64_t>(columns, {static_cast<int64_t>(columns.size())});
  EXPECT_LE(relative_error(parallel.attn()->c_attn()->weight().grad(),
                           ops::index_select(serial.attn()->c_attn()->weight().grad(), 1, index)),
            kTolerance)
      << "c_attn weight";
  EXPECT_LE(relative_error(parallel.attn()->c_attn()->bias().grad(),
                           ops::index_select(serial.attn()->c_attn()->bias().grad(), 0, index)),
            kTolerance)
      << "c_attn bias";
  EXPECT_LE(
      relative_error(parallel.attn()->c_proj()->weight().grad(), my_slice(serial.attn()->c_proj()->weight().grad(), 0)),
      kTolerance)
      << "attn c_proj weight (rows: this rank's heads' outputs)";
  EXPECT_LE(relative_error(parallel.attn()->c_proj()->bias().grad(), serial.attn()->c_proj()->bias().grad()),
            kTolerance);
  // MLP: c_fc by output columns, c_proj by input rows (Conv1D's [in, out] layout).
  EXPECT_LE(relative_error(parallel.mlp()->c_fc()->weight().grad(), my_slice(serial.mlp()->c_fc()->weight().grad(), 1)),
            kTolerance);
  EXPECT_LE(
      relative_error(parallel.mlp()->c_proj()->weight().grad(), my_slice(serial.mlp()->c_proj()->weight().grad(), 0)),
      kTolerance);
  // The replicated layer norms see the whole gradient on every rank.
  EXPECT_LE(relative_error(parallel.ln_1()->weight().grad(), serial.ln_1()->weight().grad()), kTolerance);
  EXPECT_LE(relative_error(parallel.ln_2()->bias().grad(), serial.ln_2()->bias().grad()), kTolerance);
}

TEST(ParallelGpt2, LossAndGradientsEqualTheSerialModel) {
  nn::models::GPT2Config config = tiny_config();
  config.n_layer = 2;
  core::Generator g(23);
  nn::models::GPT2 serial(config, &g, nullptr);
  serial.to(DType::f64);
  std::vector<int64_t> ids_v, targets_v;
  for (int64_t i = 0; i < 2 * 6; ++i) {
    ids_v.push_back((i * 7 + 3) % config.vocab_size);
    targets_v.push_back((i * 11 + 5) % config.vocab_size);
  }
  const Tensor ids = core::from_vector<int64_t>(ids_v, {2, 6}), targets = core::from_vector<int64_t>(targets_v, {2, 6});
  Tensor loss_s = nn::models::lm_cross_entropy(serial.forward(ids), targets);
  autograd::backward(loss_s);

  ParallelGPT2 parallel(serial, tp_group());
  const Tensor logits = parallel.forward(ids);
  EXPECT_EQ(logits.shape(), (Shape{2, 6, config.vocab_size / world().size()}));
  Tensor loss_p = parallel.loss(logits, targets);
  autograd::backward(loss_p);

  EXPECT_LE(relative_error(loss_p, loss_s), kTolerance) << "loss";
  // The tied wte: this rank's rows of the serial gradient (lookup and head contributions together).
  EXPECT_LE(relative_error(parallel.wte()->weight().grad(), my_slice(serial.wte()->weight().grad(), 0)), kTolerance)
      << "wte";
  EXPECT_LE(relative_error(parallel.wpe()->weight().grad(), serial.wpe()->weight().grad()), kTolerance) << "wpe";
  EXPECT_LE(relative_error(parallel.ln_f()->weight().grad(), serial.ln_f()->weight().grad()), kTolerance) << "ln_f";
  const auto block = std::dynamic_pointer_cast<ParallelGPT2Block>((*parallel.h())[1]);
  const auto serial_block = std::dynamic_pointer_cast<nn::models::GPT2Block>((*serial.h())[1]);
  ASSERT_TRUE(block && serial_block);
  EXPECT_LE(
      relative_error(block->mlp()->c_fc()->weight().grad(), my_slice(serial_block->mlp()->c_fc()->weight().grad(), 1)),
      kTolerance)
      << "h.1.mlp.c_fc";
}

// Sequence parallelism changes where the activations live, not what is computed: the loss and the
// gradients (layer norms and wpe whole on every rank, summed over the sequence shards) are the serial
// model's (f64).
TEST(ParallelGpt2, SequenceParallelLossAndGradientsEqualTheSerialModel) {
  nn::models::GPT2Config config = tiny_config();
  config.n_layer = 2;
  core::Generator g(29);
  nn::models::GPT2 serial(config, &g, nullptr);
  serial.to(DType::f64);
  std::vector<int64_t> ids_v, targets_v;
  for (int64_t i = 0; i < 2 * 8; ++i) {
    ids_v.push_back((i * 5 + 1) % config.vocab_size);
    targets_v.push_back((i * 13 + 2) % config.vocab_size);
  }
  const Tensor ids = core::from_vector<int64_t>(ids_v, {2, 8}), targets = core::from_vector<int64_t>(targets_v, {2, 8});
  Tensor loss_s = nn::models::lm_cross_entropy(serial.forward(ids), targets);
  autograd::backward(loss_s);

  ParallelGPT2 parallel(serial, tp_group(), ParallelGPT2Options{.sequence_parallel = true});
  const Tensor logits = parallel.forward(ids);
  EXPECT_EQ(logits.shape(), (Shape{2, 8, config.vocab_size / world().size()}));
  Tensor loss_p = parallel.loss(logits, targets);
  autograd::backward(loss_p);

  EXPECT_LE(relative_error(loss_p, loss_s), kTolerance) << "loss";
  EXPECT_LE(relative_error(parallel.wte()->weight().grad(), my_slice(serial.wte()->weight().grad(), 0)), kTolerance)
      << "wte";
  EXPECT_LE(relative_error(parallel.wpe()->weight().grad(), serial.wpe()->weight().grad()), kTolerance) << "wpe";
  EXPECT_LE(relative_error(parallel.ln_f()->weight().grad(), serial.ln_f()->weight().grad()), kTolerance) << "ln_f";
  const auto block = std::dynamic_pointer_cast<ParallelGPT2Block>((*parallel.h())[0]);
  const auto serial_block = std::dynamic_pointer_cast<nn::models::GPT2Block>((*serial.h())[0]);
  ASSERT_TRUE(block && serial_block);
  EXPECT_LE(relative_error(block->ln_1()->bias().grad(), serial_block->ln_1()->bias().grad()), kTolerance) << "ln_1";
  EXPECT_LE(relative_error(block->attn()->c_proj()->bias().grad(), serial_block->attn()->c_proj()->bias().grad()),
            kTolerance)
      << "h.0.attn.c_proj.bias";
  EXPECT_LE(
      relative_error(block->mlp()->c_fc()->weight().grad(), my_slice(serial_block->mlp()->c_fc()->weight().grad(), 1)),
      kTolerance)
      << "h.0.mlp.c_fc";
}

// Note [Overlapped tensor-parallel blocks]: the batch of 4 in 2 and 4 chunks, each chunk's all-reduces
// left running under the other chunks' work: the serial model's loss and gradients (f64, 1e-11), for two blocks so the
// last chunk's MLP sum runs under the next block, with dropout off (the chunks draw masks in another order).
TEST(ParallelGpt2, OverlappedChunksEqualTheSerialModel) {
  nn::models::GPT2Config config = tiny_config();
  config.n_layer = 2;
  core::Generator g(37);
  nn::models::GPT2 serial(config, &g, nullptr);
  serial.to(DType::f64);
  const int64_t batch = 4;
  std::vector<int64_t> ids_v, targets_v;
  for (int64_t i = 0; i < batch * 8; ++i) {
    ids_v.push_back((i * 5 + 1) % config.vocab_size);
    targets_v.push_back((i * 13 + 2) % config.vocab_size);
  }
  const Tensor ids = core::from_vector<int64_t>(ids_v, {batch, 8});
  const Tensor targets = core::from_vector<int64_t>(targets_v, {batch, 8});
  Tensor loss_s = nn::models::lm_cross_entropy(serial.forward(ids), targets);
  autograd::backward(loss_s);
  const auto serial_block = std::dynamic_pointer_cast<nn::models::GPT2Block>((*serial.h())[1]);
  ASSERT_TRUE(serial_block);

  for (const int chunks : {2, 4}) {
    SCOPED_TRACE(fmt::format("{} chunks", chunks));
    ParallelGPT2 parallel(serial, tp_group(), ParallelGPT2Options{.overlap_chunks = chunks});
    Tensor loss_p = parallel.loss(parallel.forward(ids), targets);
    autograd::backward(loss_p);
    EXPECT_LE(relative_error(loss_p, loss_s), kTolerance) << "loss";
    EXPECT_LE(relative_error(parallel.wte()->weight().grad(), my_slice(serial.wte()->weight().grad(), 0)), kTolerance)
        << "wte";
    EXPECT_LE(relative_error(parallel.wpe()->weight().grad(), serial.wpe()->weight().grad()), kTolerance) << "wpe";
    const auto block = std::dynamic_pointer_cast<ParallelGPT2Block>((*parallel.h())[1]);
    ASSERT_TRUE(block);
    EXPECT_TRUE(block->splittable());
    EXPECT_LE(relative_error(block->ln_1()->weight().grad(), serial_block->ln_1()->weight().grad()), kTolerance)
        << "h.1.ln_1";
    EXPECT_LE(relative_error(block->attn()->c_proj()->bias().grad(), serial_block->attn()->c_proj()->bias().grad()),
              kTolerance)
        << "h.1.attn.c_proj.bias";
    EXPECT_LE(relative_error(block->mlp()->c_proj()->weight().grad(),
                             my_slice(serial_block->mlp()->c_proj()->weight().grad(), 0)),
              kTolerance)
        << "h.1.mlp.c_proj";
    EXPECT_LE(relative_error(block->mlp()->c_fc()->weight().grad(),
                             my_slice(serial_block->mlp()->c_fc()->weight().grad(), 1)),
              kTolerance)
        << "h.1.mlp.c_fc";
  }
}

TEST(ParallelGpt2, OverlappedChunksNameABatchThatDoesNotSplit) {
  nn::models::GPT2Config config = tiny_config();
  core::Generator g(41);
  nn::models::GPT2 serial(config, &g, nullptr);
  ParallelGPT2 parallel(serial, tp_group(), ParallelGPT2Options{.overlap_chunks = 2});
  const Tensor ids = core::from_vector<int64_t>({1, 2, 3, 4, 5, 6}, {3, 2});
  if (world().size() == 1) GTEST_SKIP() << "one rank runs the blocks whole";
  EXPECT_ERROR_CONTAINS(parallel.forward(ids),
                        "parallel.tensor.overlap_chunks = 2 does not divide the batch of 3 sequences");
  EXPECT_ERROR_CONTAINS(ParallelGPT2(serial, tp_group(), ParallelGPT2Options{.overlap_chunks = 0}),
                        "overlap_chunks must be at least 1");
}

TEST(ParallelGpt2, SequenceParallelNamesABatchAndSequenceThatDoNotSplit) {
  // Neither one sequence nor 5 tokens split over 2 or 4 ranks (Note [Token shards]).
  nn::models::GPT2Config config = tiny_config();
  core::Generator g(31);
  nn::models::GPT2 serial(config, &g, nullptr);
  ParallelGPT2 parallel(serial, tp_group(), ParallelGPT2Options{.sequence_parallel = true});
  if (world().size() == 1) GTEST_SKIP() << "everything splits over one rank";
  const Tensor ids = core::from_vector<int64_t>({1, 2, 3, 4, 5}, {1, 5});
  EXPECT_ERROR_CONTAINS(parallel.forward(ids),
                        "neither the batch (B = 1) nor the sequences (T = 5 tokens) split over "
                        "parallel.tensor.size = " +
                            std::to_string(world().size()) + " ranks");
}

// A vocabulary that does not split (31 entries over 2 or 4 ranks) is padded to the next multiple of
// tp with rows no id looks up and no target names; loss() leaves their logits out, so the loss and
// the gradients are the serial model's over its 31 entries, and the gathered wte is its table.
TEST(ParallelGpt2, AVocabularyThatDoesNotSplitIsPaddedAndNeverATarget) {
  nn::models::GPT2Config config = tiny_config();
  config.vocab_size = 31;
  core::Generator g(37);
  nn::models::GPT2 serial(config, &g, nullptr);
  serial.to(DType::f64);
  std::vector<int64_t> ids_v, targets_v;
  for (int64_t i = 0; i < 2 * 8; ++i) {
    ids_v.push_back((i * 5 + 3) % config.vocab_size);
    targets_v.push_back((i * 13 + 30) % config.vocab_size);  // 30, the last real entry, among them
  }
  const Tensor ids = core::from_vector<int64_t>(ids_v, {2, 8}), targets = core::from_vector<int64_t>(targets_v, {2, 8});
  Tensor loss_s = nn::models::lm_cross_entropy(serial.forward(ids), targets);
  autograd::backward(loss_s);

  ParallelGPT2 parallel(serial, tp_group());
  const int64_t padded = ShardSpec::padded_size(31, world().size());
  EXPECT_EQ(parallel.wte()->padding(), padded - 31);
  const Tensor logits = parallel.forward(ids);
  EXPECT_EQ(logits.shape(), (Shape{2, 8, padded / world().size()}));
  Tensor loss_p = parallel.loss(logits, targets);
  autograd::backward(loss_p);
  EXPECT_LE(relative_error(loss_p, loss_s), kTolerance) << "loss";
  const ShardSpec spec = parallel.wte()->shard_specs().at("weight");
  EXPECT_LE(
      relative_error(gather_shard(parallel.wte()->weight().grad(), spec, *tp_group()), serial.wte()->weight().grad()),
      kTolerance)
      << "wte's gradient, gathered";
  EXPECT_LE(relative_error(gather_shard(parallel.wte()->weight(), spec, *tp_group()), serial.wte()->weight()), 0.0);
  EXPECT_LE(relative_error(parallel.ln_f()->weight().grad(), serial.ln_f()->weight().grad()), kTolerance) << "ln_f";
}

TEST(ParallelGpt2Block, HeadsThatDoNotSplitAreNamed) {
  nn::models::GPT2Config config = tiny_config();
  config.n_head = 1;  // n_embd 16 in one head: never splits over 2 or more ranks
  core::Generator g(3);
  nn::models::GPT2Block serial(config, &g, nullptr);
  EXPECT_ERROR_CONTAINS(ParallelGPT2Block(serial, config, tp_group()),
                        "n_head = 1 heads do not split over parallel.tensor.size = " + std::to_string(world().size()));
}

}  // namespace
}  // namespace colossal::parallel::tp

int main(int argc, char** argv) {
  return colossal::comm::testing::run_mpi_tests(argc, argv);
}
