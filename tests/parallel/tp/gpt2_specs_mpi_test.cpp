// GPT-2 split by per-parameter sharding specs (ParallelGPT2Options::plan from resolve_gpt2_specs)
// under MPI, the whole world as the tensor group (2 and 4 ranks): the model holds each parameter as
// the tutorial's table says (wte and wpe along the embedding dimension, c_attn by whole heads,
// attn.c_proj column, mlp.c_proj's weight by rows and its bias whole), returns the serial logits
// whole on every rank and the serial loss; sequence parallelism with such a plan is an error.
// Tolerance: f64, 1e-11 relative by norm (sums split into tp partial sums).
#include <gtest/gtest.h>

#include <memory>
#include <string>
#include <vector>

#include "../../comm/mpi_test_main.h"
#include "colossal/nn/models/gpt2.h"
#include "colossal/parallel/tp/gpt2_1d.h"
#include "colossal/parallel/tp/gpt2_plan.h"
#include "colossal/parallel/tp/shard_spec.h"
#include "gradcheck.h"  // EXPECT_ERROR_CONTAINS
#include "tp_test_util.h"

namespace colossal::parallel::tp {
namespace {

using comm::testing::world;
using config::TensorSpecRule;
using testing::relative_error;
using testing::tp_group;

nn::models::GPT2Config tiny_config() {
  nn::models::GPT2Config c;
  c.vocab_size = 32;
  c.n_positions = 8;
  c.n_embd = 16;
  c.n_layer = 2;
  c.n_head = 4;  // splits over 2 and 4 ranks
  c.dropout = 0.0;
  return c;
}

Gpt2Plan tutorial_plan(nn::models::GPT2& serial) {
  std::vector<std::string> names;
  for (const auto& [name, parameter] : serial.named_parameters()) names.push_back(name);
  const std::vector<TensorSpecRule> rules = {
      {"h.*.mlp.c_fc.*", TensorSplit::kColumn},    {"h.*.mlp.c_proj.weight", TensorSplit::kRow},
      {"wte.weight", TensorSplit::kColumn},        {"wpe.weight", TensorSplit::kColumn},
      {"h.*.attn.c_attn.*", TensorSplit::kColumn}, {"h.*.attn.c_proj.*", TensorSplit::kColumn}};
  return resolve_gpt2_specs(rules, serial.config(), names, world().size()).plan;
}

TEST(ParallelGpt2Specs, HoldsTheTutorialsLayoutAndComputesTheSerialLogits) {
  core::Generator g(3);
  nn::models::GPT2 serial(tiny_config(), &g);
  serial.to(DType::f64);
  ParallelGPT2Options options;
  options.plan = tutorial_plan(serial);
  ParallelGPT2 parallel(serial, tp_group(), options);
  EXPECT_TRUE(parallel.logits_whole());
  EXPECT_EQ(parallel.wte(), nullptr);  // not the vocabulary-parallel embedding

  const std::map<std::string, ShardSpec> specs = collect_shard_specs(parallel);
  EXPECT_EQ(specs.at("wte.weight").dim, 1);
  EXPECT_EQ(specs.at("wpe.weight").dim, 1);
  EXPECT_EQ(specs.at("h.0.attn.c_attn.weight").dim, 1);
  EXPECT_FALSE(specs.at("h.0.attn.c_attn.weight").order.empty());  // whole heads: q, k, v of this rank's
  EXPECT_EQ(specs.at("h.1.attn.c_proj.weight").dim, 1);
  EXPECT_EQ(specs.at("h.1.attn.c_proj.bias").dim, 0);
  EXPECT_EQ(specs.at("h.0.mlp.c_fc.bias").dim, 0);
  EXPECT_EQ(specs.at("h.0.mlp.c_proj.weight").dim, 0);
  EXPECT_TRUE(specs.at("h.0.mlp.c_proj.bias").replicated());
  EXPECT_TRUE(specs.at("h.0.ln_1.weight").replicated());
  EXPECT_TRUE(specs.at("ln_f.bias").replicated());
  // Every shard is its part of the serial tensor.
  for (const auto& [name, parameter] : parallel.named_parameters()) {
    for (const auto& [serial_name, serial_parameter] : serial.named_parameters()) {
      if (serial_name != name) continue;
      EXPECT_EQ(relative_error(gather_shard(parameter, specs.at(name), *tp_group()), serial_parameter), 0.0) << name;
    }
  }

  std::vector<int64_t> ids_v;
  for (int64_t i = 0; i < 2 * 6; ++i) ids_v.push_back((5 * i + 3) % 32);
  const Tensor ids = core::from_vector<int64_t>(ids_v, {2, 6});
  std::vector<int64_t> targets_v(ids_v.begin() + 1, ids_v.end());
  targets_v.push_back(7);
  const Tensor targets = core::from_vector<int64_t>(targets_v, {2, 6});
  const Tensor want = serial.forward(ids);
  const Tensor got = parallel.forward(ids);
  ASSERT_EQ(got.shape(), want.shape());
  EXPECT_LE(relative_error(got, want), 1e-11);
  EXPECT_LE(relative_error(parallel.loss(got, targets), nn::models::lm_cross_entropy(want, targets)), 1e-11);
}

TEST(ParallelGpt2Specs, SequenceParallelismTakesTheBuiltInPlanOnly) {
  core::Generator g(3);
  nn::models::GPT2 serial(tiny_config(), &g);
  ParallelGPT2Options options;
  options.plan = tutorial_plan(serial);
  options.sequence_parallel = true;
  EXPECT_ERROR_CONTAINS(ParallelGPT2(serial, tp_group(), options),
                        "sequence parallelism is built for the built-in plan");
}

TEST(ParallelGpt2Specs, APlanTheLayersCannotComputeIsAnErrorAtBuildTime) {
  core::Generator g(3);
  nn::models::GPT2 serial(tiny_config(), &g);
  ParallelGPT2Options options;
  options.plan = Gpt2Plan::megatron(2);
  options.plan->blocks[0].c_attn = TensorSplit::kReplicate;
  EXPECT_ERROR_CONTAINS(ParallelGPT2(serial, tp_group(), options),
                        "h.0.attn.c_proj.weight: spec \"row\" splits its input features");
}

}  // namespace
}  // namespace colossal::parallel::tp

int main(int argc, char** argv) {
  return colossal::comm::testing::run_mpi_tests(argc, argv);
}
