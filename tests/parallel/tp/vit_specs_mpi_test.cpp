// The ViT split by per-parameter sharding specs (ParallelViTOptions::plan from resolve_vit_specs)
// under MPI, the whole world as the tensor group (2 and 4 ranks): the model holds each parameter as
// the plan says (qkv by whole heads, proj by columns and gathered, fc1 whole before a column-split
// fc2, or the MLP column then row), every shard its part of the serial tensor, and it computes the
// serial logits on every rank; sequence parallelism with such a plan, and a plan the layers cannot
// compute, are errors at build time. Tolerance: f64, 1e-11 relative by norm (sums split into tp
// partial sums).
#include <gtest/gtest.h>

#include <map>
#include <memory>
#include <string>
#include <vector>

#include "../../comm/mpi_test_main.h"
#include "colossal/autograd/engine.h"  // backward
#include "colossal/nn/models/vit.h"
#include "colossal/parallel/tp/shard_spec.h"
#include "colossal/parallel/tp/vit_1d.h"
#include "colossal/parallel/tp/vit_plan.h"
#include "gradcheck.h"  // EXPECT_ERROR_CONTAINS
#include "tp_test_util.h"

namespace colossal::parallel::tp {
namespace {

using comm::testing::world;
using config::TensorSpecRule;
using testing::relative_error;
using testing::tp_group;
using testing::weighted_sum;

nn::models::ViTConfig tiny_config() {
  nn::models::ViTConfig v;
  v.img_size = 8;
  v.patch_size = 4;
  v.in_chans = 1;
  v.num_classes = 4;
  v.embed_dim = 16;
  v.depth = 2;
  v.num_heads = 4;  // splits over 2 and 4 ranks
  v.mlp_ratio = 2.0;
  return v;
}

VitPlan plan_of(nn::models::VisionTransformer& serial, const std::vector<TensorSpecRule>& rules) {
  std::vector<std::string> names;
  for (const auto& [name, parameter] : serial.named_parameters()) names.push_back(name);
  return resolve_vit_specs(rules, serial.config(), names, world().size()).plan;
}

/// Block 0: heads split, gathered before a column-split proj; a replicated fc1 before a column-split
/// fc2. Block 1: heads split before a replicated proj; the MLP column then row.
const std::vector<TensorSpecRule> kMixed = {{"blocks.0.attn.*", TensorSplit::kColumn},
                                            {"blocks.0.mlp.fc2.*", TensorSplit::kColumn},
                                            {"blocks.1.attn.qkv.*", TensorSplit::kColumn},
                                            {"blocks.1.mlp.fc1.*", TensorSplit::kColumn},
                                            {"blocks.1.mlp.fc2.weight", TensorSplit::kRow}};

Tensor images() {
  std::vector<double> x;
  for (int64_t i = 0; i < 3 * 64; ++i) x.push_back(std::sin(0.13 * static_cast<double>(i)));
  return core::from_vector<double>(x, {3, 1, 8, 8});
}

TEST(ParallelVitSpecs, HoldsThePlansLayoutAndComputesTheSerialLogitsAndGradients) {
  core::Generator g(5);
  nn::models::VisionTransformer serial(tiny_config(), &g);
  serial.to(DType::f64);
  ParallelViTOptions options;
  options.plan = plan_of(serial, kMixed);
  ParallelViT parallel(serial, tp_group(), options);
  EXPECT_EQ(parallel.plan(), *options.plan);

  const std::map<std::string, ShardSpec> specs = collect_shard_specs(parallel);
  EXPECT_EQ(specs.at("blocks.0.attn.qkv.weight").dim, 0);            // [out, in]: output features
  EXPECT_FALSE(specs.at("blocks.0.attn.qkv.weight").order.empty());  // whole heads
  EXPECT_EQ(specs.at("blocks.0.attn.proj.weight").dim, 0);
  EXPECT_EQ(specs.at("blocks.0.attn.proj.bias").dim, 0);
  EXPECT_TRUE(specs.at("blocks.0.mlp.fc1.weight").replicated());
  EXPECT_EQ(specs.at("blocks.0.mlp.fc2.weight").dim, 0);
  EXPECT_TRUE(specs.at("blocks.1.attn.proj.weight").replicated());
  EXPECT_EQ(specs.at("blocks.1.mlp.fc1.bias").dim, 0);
  EXPECT_EQ(specs.at("blocks.1.mlp.fc2.weight").dim, 1);  // input features
  EXPECT_TRUE(specs.at("blocks.1.mlp.fc2.bias").replicated());
  EXPECT_TRUE(specs.at("head.weight").replicated());
  EXPECT_EQ(parallel.blocks()->at<ParallelViTBlock>(0)->attn()->proj(), nullptr);  // not a row layer
  EXPECT_NE(parallel.blocks()->at<ParallelViTBlock>(1)->mlp()->fc2(), nullptr);

  std::map<std::string, Tensor> serial_parameters;
  for (const auto& [name, parameter] : serial.named_parameters()) serial_parameters.emplace(name, parameter);
  for (const auto& [name, parameter] : parallel.named_parameters()) {
    EXPECT_EQ(relative_error(gather_shard(parameter, specs.at(name), *tp_group()), serial_parameters.at(name)), 0.0)
        << name;
  }

  const Tensor want = serial.forward(images());
  const Tensor got = parallel.forward(images());
  ASSERT_EQ(got.shape(), want.shape());
  EXPECT_LE(relative_error(got, want), 1e-11);
  autograd::backward(weighted_sum(want));
  autograd::backward(weighted_sum(got));
  for (const auto& [name, parameter] : parallel.named_parameters()) {
    ASSERT_TRUE(parameter.grad().defined()) << name;
    EXPECT_LE(
        relative_error(gather_shard(parameter.grad(), specs.at(name), *tp_group()), serial_parameters.at(name).grad()),
        1e-11)
        << name;
  }
}

TEST(ParallelVitSpecs, SequenceParallelismTakesTheBuiltInPlanOnly) {
  core::Generator g(5);
  nn::models::VisionTransformer serial(tiny_config(), &g);
  ParallelViTOptions options;
  options.plan = plan_of(serial, kMixed);
  options.sequence_parallel = true;
  EXPECT_ERROR_CONTAINS(ParallelViT(serial, tp_group(), options),
                        "sequence parallelism is built for the built-in plan");
}

TEST(ParallelVitSpecs, APlanTheLayersCannotComputeIsAnErrorAtBuildTime) {
  core::Generator g(5);
  nn::models::VisionTransformer serial(tiny_config(), &g);
  ParallelViTOptions options;
  options.plan = VitPlan::megatron(2);
  options.plan->blocks[0].attn_in = TensorSplit::kReplicate;
  EXPECT_ERROR_CONTAINS(ParallelViT(serial, tp_group(), options),
                        "blocks.0.attn.proj.weight: spec \"row\" splits its input features");
}

}  // namespace
}  // namespace colossal::parallel::tp

int main(int argc, char** argv) {
  return colossal::comm::testing::run_mpi_tests(argc, argv);
}
