// Megatron's RNG tracker on MPI ranks (2 and 4): the tensor-parallel generator's seed differs by tensor
// rank and not by data-parallel replica; in a tensor-parallel GPT-2 trained with dropout on, the
// replicated activations and the replicated parameters stay bit-for-bit equal across the tensor ranks
// (their masks come from the data generator), while the attention probabilities' masks (this rank's
// heads) come from the tensor-parallel generator and differ by rank.
#include <gtest/gtest.h>

#include <memory>
#include <set>
#include <string>
#include <vector>

#include "../../comm/mpi_test_main.h"
#include "colossal/autograd/engine.h"
#include "colossal/autograd/grad_mode.h"
#include "colossal/nn/attention.h"  // multihead_attention
#include "colossal/nn/models/gpt2.h"
#include "colossal/ops/elementwise.h"  // add_
#include "colossal/parallel/parallel_context.h"
#include "colossal/parallel/tp/gpt2_1d.h"
#include "colossal/parallel/tp/random.h"
#include "colossal/parallel/tp/shard_spec.h"
#include "tp_test_util.h"

namespace colossal::parallel::tp {
namespace {

using comm::testing::world;
using comm::testing::world_slot;
using testing::tp_group;

/// Every rank's value, in rank order.
std::vector<int64_t> all_values(int64_t value) {
  const Tensor out = core::zeros({world().size()}, TensorOptions(DType::i64));
  world().all_gather(out, core::from_vector<int64_t>({value}, {1}));
  return out.to_vector<int64_t>();
}

/// Whether `t` is bit for bit rank 0's.
bool equals_rank_zero(const Tensor& t) {
  Tensor mine = t.detach().contiguous().clone();
  Tensor zero = mine.clone();
  world().broadcast(zero, 0);
  return mine.to_vector<double>() == zero.to_vector<double>();
}

ParallelContext context_of(int data, int tensor) {
  config::ParallelConfig c;
  c.data = data;
  c.tensor.size = tensor;
  return ParallelContext::create(c, world_slot());
}

TEST(TensorParallelRng, SeedsDifferByTensorRankAndNotByReplica) {
  const int size = world().size();
  const std::vector<int64_t> seeds = all_values(static_cast<int64_t>(tensor_parallel_seed(1234, context_of(1, size))));
  for (int r = 0; r < size; ++r) EXPECT_EQ(seeds[r], 1234 + kTensorParallelSeedOffset + r) << "rank " << r;
  if (size == 4) {
    // dp2 x tp2: ranks 0, 1 are replica 0's tensor ranks 0, 1; ranks 2, 3 replica 1's.
    const std::vector<int64_t> hybrid = all_values(static_cast<int64_t>(tensor_parallel_seed(1234, context_of(2, 2))));
    EXPECT_EQ(hybrid[0], hybrid[2]);
    EXPECT_EQ(hybrid[1], hybrid[3]);
    EXPECT_NE(hybrid[0], hybrid[1]);
  }
}

nn::models::GPT2Config dropout_config() {
  nn::models::GPT2Config config;
  config.vocab_size = 32;
  config.n_positions = 8;
  config.n_embd = 16;
  config.n_layer = 2;
  config.n_head = 4;  // splits over 2 and 4 ranks
  config.dropout = 0.3;
  return config;
}

/// Two SGD steps of `model` (in training mode: dropout on) on a fixed batch; the loss is the same on
/// every rank.
void train_two_steps(ParallelGPT2& model, int64_t vocab) {
  model.train();
  std::vector<int64_t> ids_v, targets_v;
  for (int64_t i = 0; i < 2 * 8; ++i) {
    ids_v.push_back((i * 7 + 3) % vocab);
    targets_v.push_back((i * 11 + 5) % vocab);
  }
  const Tensor ids = core::from_vector<int64_t>(ids_v, {2, 8}), targets = core::from_vector<int64_t>(targets_v, {2, 8});
  for (int step = 0; step < 2; ++step) {
    Tensor loss = model.loss(model.forward(ids), targets);
    EXPECT_TRUE(equals_rank_zero(loss)) << "step " << step << ": the loss";
    autograd::backward(loss);
    autograd::NoGradGuard no_grad;
    for (auto& [name, parameter] : model.named_parameters()) {
      ops::add_(parameter, parameter.grad(), -0.1);
      parameter.set_grad(Tensor());
    }
  }
}

/// A replicated parameter took the same update on every rank: its gradient came through equal
/// activations and equal masks (or, under sequence parallelism, was summed over the shards).
void expect_replicated_parameters_equal(ParallelGPT2& model) {
  int replicated = 0;
  for (const auto& [name, spec] : collect_shard_specs(model)) {
    if (!spec.replicated()) continue;
    ++replicated;
    for (const auto& [n, parameter] : model.named_parameters()) {
      if (n == name) {
        EXPECT_TRUE(equals_rank_zero(parameter)) << name << " differs from rank 0's";
      }
    }
  }
  EXPECT_GT(replicated, 0);
}

TEST(TensorParallelRng, DropoutKeepsReplicatedTensorsEqualAndSplitMasksApart) {
  const nn::models::GPT2Config config = dropout_config();
  core::Generator init(5);
  nn::models::GPT2 serial(config, &init, nullptr);
  // The data generator alike on every rank, the tensor generator seeded per rank (as TrainingRun).
  core::Generator data(100), tensor(100 + kTensorParallelSeedOffset + static_cast<uint64_t>(world().rank()));
  ParallelGPT2 model(serial, tp_group(), ParallelGPT2Options{.dropout = {.data = &data, .tensor = &tensor}});

  const auto block = std::dynamic_pointer_cast<ParallelGPT2Block>((*model.h())[0]);
  ASSERT_NE(block, nullptr);
  EXPECT_EQ(block->attn()->attn_dropout_generator(), &tensor);
  train_two_steps(model, config.vocab_size);
  expect_replicated_parameters_equal(model);

  // A block's output (replicated, after both residual dropouts) is rank 0's on every rank.
  std::vector<double> x_v;
  for (int64_t i = 0; i < 2 * 8 * 16; ++i) x_v.push_back(std::sin(0.37 * static_cast<double>(i)));
  const Tensor x = core::from_vector<double>(x_v, {2, 8, 16}).to(DType::f32);
  EXPECT_TRUE(equals_rank_zero(block->forward(x))) << "a block's output differs from rank 0's";

  // The attention probabilities' masks: the same qkv through the generator the attention uses gives
  // a different result on every rank, through the data generator the same.
  std::vector<double> qkv_v;
  for (int64_t i = 0; i < 2 * 8 * 48; ++i) qkv_v.push_back(std::cos(0.13 * static_cast<double>(i)));
  const Tensor qkv = core::from_vector<double>(qkv_v, {2, 8, 48}).to(DType::f32);
  const Tensor split = nn::multihead_attention(qkv, 4, true, 0.5, true, block->attn()->attn_dropout_generator());
  const Tensor replicated_masks = nn::multihead_attention(qkv, 4, true, 0.5, true, &data);
  const bool same_split = equals_rank_zero(split);
  if (world().rank() != 0) {
    EXPECT_FALSE(same_split) << "the tp-region masks repeat rank 0's";
  }
  EXPECT_TRUE(equals_rank_zero(replicated_masks));
}

// Under sequence parallelism every dropout outside the attention acts on a sequence shard and draws
// from the tensor-parallel generator too; the replicated parameters (layer norms, wpe, row-parallel
// biases), whose gradients each rank computes from its own tokens and masks, still end equal.
TEST(TensorParallelRng, SequenceParallelDropoutKeepsReplicatedParametersEqual) {
  const nn::models::GPT2Config config = dropout_config();
  core::Generator init(7);
  nn::models::GPT2 serial(config, &init, nullptr);
  core::Generator data(200), tensor(200 + kTensorParallelSeedOffset + static_cast<uint64_t>(world().rank()));
  ParallelGPT2 model(serial, tp_group(),
                     ParallelGPT2Options{.dropout = {.data = &data, .tensor = &tensor}, .sequence_parallel = true});
  train_two_steps(model, config.vocab_size);
  expect_replicated_parameters_equal(model);
  // Every mask came from the tensor-parallel generator: the data generator never drew.
  EXPECT_EQ(data.state().offset, 0u);
  EXPECT_GT(tensor.state().offset, 0u);
}

}  // namespace
}  // namespace colossal::parallel::tp

int main(int argc, char** argv) {
  return colossal::comm::testing::run_mpi_tests(argc, argv);
}
