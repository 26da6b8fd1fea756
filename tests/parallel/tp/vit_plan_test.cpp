// The ViT's tensor-parallel plan from per-parameter sharding specs (parallel/tp/vit_plan.h): the MLP
// only, attention only and the built-in policy as rules resolve to the plans they describe, each
// parameter labelled with its rule; an assignment the layers cannot compute is an error naming the
// parameter, its spec, its rule and what would be valid; so is a split of a layer that stays whole,
// and a rule that matches nothing.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "colossal/nn/models/vit.h"
#include "colossal/parallel/tp/vit_plan.h"
#include "gradcheck.h"  // EXPECT_ERROR_CONTAINS

namespace colossal::parallel::tp {
namespace {

using config::TensorSpecRule;

nn::models::ViTConfig tiny_config(int64_t heads = 4) {
  nn::models::ViTConfig v;
  v.img_size = 8;
  v.patch_size = 4;
  v.in_chans = 1;
  v.num_classes = 4;
  v.embed_dim = 16;
  v.depth = 2;
  v.num_heads = heads;
  v.mlp_ratio = 1.5;  // 24 hidden features: split over 2 and 3 ranks, not over 5
  return v;
}

std::vector<std::string> names_of(const nn::models::ViTConfig& config) {
  core::Generator g(1);
  nn::models::VisionTransformer model(config, &g);
  std::vector<std::string> names;
  for (const auto& [name, parameter] : model.named_parameters()) names.push_back(name);
  return names;
}

ResolvedVitPlan resolve(const std::vector<TensorSpecRule>& rules, int tp = 2, int64_t heads = 4) {
  const nn::models::ViTConfig config = tiny_config(heads);
  return resolve_vit_specs(rules, config, names_of(config), tp);
}

const ParameterSplit& parameter(const ResolvedVitPlan& resolved, const std::string& name) {
  for (const ParameterSplit& p : resolved.parameters) {
    if (p.name == name) return p;
  }
  static const ParameterSplit none{"", TensorSplit::kVocab, "absent"};
  ADD_FAILURE() << name << " is not among the resolved parameters";
  return none;
}

constexpr TensorSplit kC = TensorSplit::kColumn, kR = TensorSplit::kRow, kW = TensorSplit::kReplicate;

TEST(VitPlan, TheMlpOnly) {
  const ResolvedVitPlan r = resolve({{"blocks.*.mlp.fc1.*", kC}, {"blocks.*.mlp.fc2.weight", kR}});
  for (const VitBlockPlan& b : r.plan.blocks) EXPECT_EQ(b, (VitBlockPlan{kW, kW, kC, kR}));
  EXPECT_EQ(parameter(r, "blocks.1.mlp.fc1.bias").split, kC);
  EXPECT_EQ(parameter(r, "blocks.1.mlp.fc1.bias").source, "rule 0");
  EXPECT_EQ(parameter(r, "blocks.0.mlp.fc2.bias").split, kW);  // whole, added after the sum
  EXPECT_EQ(parameter(r, "blocks.0.mlp.fc2.bias").source, "follows blocks.0.mlp.fc2.weight");
  EXPECT_EQ(parameter(r, "blocks.0.attn.qkv.weight").split, kW);
  EXPECT_EQ(parameter(r, "blocks.0.attn.qkv.weight").source, "no rule");
  EXPECT_EQ(parameter(r, "cls_token").split, kW);
  EXPECT_EQ(r.parameters.size(), names_of(tiny_config()).size());
}

TEST(VitPlan, AttentionOnlyAndTheBuiltInPolicyAsRules) {
  const ResolvedVitPlan attention = resolve({{"blocks.*.attn.qkv.*", kC}, {"blocks.*.attn.proj.weight", kR}});
  for (const VitBlockPlan& b : attention.plan.blocks) EXPECT_EQ(b, (VitBlockPlan{kC, kR, kW, kW}));
  const ResolvedVitPlan builtin = resolve({{"re:blocks\\.[0-9]+\\.(attn\\.qkv|mlp\\.fc1)\\..*", kC},
                                           {"blocks.*.attn.proj.*", kR},
                                           {"blocks.*.mlp.fc2.*", kR}});
  EXPECT_TRUE(builtin.plan.is_megatron());
  EXPECT_EQ(parameter(builtin, "blocks.0.attn.proj.bias").split, kW);
  // The built-in policy itself, labelled so.
  const ResolvedVitPlan policy = builtin_vit_plan(tiny_config(), names_of(tiny_config()));
  EXPECT_TRUE(policy.plan.is_megatron());
  EXPECT_EQ(parameter(policy, "blocks.1.attn.qkv.bias").split, kC);
  EXPECT_EQ(parameter(policy, "blocks.1.mlp.fc2.weight").split, kR);
  EXPECT_EQ(parameter(policy, "blocks.1.mlp.fc2.bias").split, kW);
  EXPECT_EQ(parameter(policy, "head.weight").split, kW);
  EXPECT_EQ(parameter(policy, "head.weight").source, "built-in policy");
}

TEST(VitPlan, ARowSplitWithNoColumnSplitBeforeItIsNamed) {
  EXPECT_ERROR_CONTAINS(resolve({{"blocks.*.mlp.fc2.weight", kR}}),
                        "blocks.0.mlp.fc2.weight: spec \"row\" (from parallel.tensor.specs[0] { pattern = "
                        "\"blocks.*.mlp.fc2.weight\", spec = \"row\" }) splits its input features, which must come "
                        "split from a \"column\" split before it, but blocks.0.mlp.fc1.weight is \"replicate\"");
  EXPECT_ERROR_CONTAINS(resolve({{"blocks.1.attn.qkv.weight", kR}}), "blocks.1.norm1's whole output");
}

TEST(VitPlan, HeadsAndFeaturesThatDoNotSplitAreNamed) {
  EXPECT_ERROR_CONTAINS(resolve({{"blocks.*.attn.qkv.*", kC}}, /*tp=*/4, /*heads=*/2),
                        "blocks.0.attn.qkv.weight: spec \"column\"");
  EXPECT_ERROR_CONTAINS(resolve({{"blocks.*.attn.qkv.*", kC}}, /*tp=*/4, /*heads=*/2),
                        "the ViT's num_heads = 2 heads do not split over parallel.tensor.size = 4 ranks");
  EXPECT_ERROR_CONTAINS(resolve({{"blocks.*.mlp.fc1.*", kC}}, /*tp=*/5, /*heads=*/1),
                        "blocks.0.mlp.fc1.weight: spec \"column\" (from parallel.tensor.specs[0] { pattern = "
                        "\"blocks.*.mlp.fc1.*\", spec = \"column\" }) splits the output features (24 of them) over "
                        "parallel.tensor.size = 5 ranks");
  EXPECT_NO_THROW(resolve({{"blocks.*.mlp.fc1.*", kC}}, /*tp=*/3, /*heads=*/1));
}

TEST(VitPlan, LayersThatStayWholeAreNamed) {
  EXPECT_ERROR_CONTAINS(resolve({{"head.weight", kC}}), "head.weight: spec \"column\"");
  EXPECT_ERROR_CONTAINS(resolve({{"head.weight", kC}}), "the classifier head stays whole");
  EXPECT_ERROR_CONTAINS(resolve({{"pos_embed", kC}}), "pos_embed stays whole");
  EXPECT_ERROR_CONTAINS(resolve({{"patch_embed.*", kR}}), "the patch embedding stays whole");
  EXPECT_ERROR_CONTAINS(resolve({{"blocks.0.norm2.weight", kC}}), "blocks.0.norm2 stays whole");
  EXPECT_ERROR_CONTAINS(resolve({{"blocks.0.norm2.weight", kC}}), "Valid: \"replicate\"");
  EXPECT_ERROR_CONTAINS(resolve({{"blocks.*.mlp.fc1.weight", TensorSplit::kVocab}}),
                        "\"vocab\" splits a vocabulary embedding's rows only");
  // A bias that disagrees with its weight.
  EXPECT_ERROR_CONTAINS(resolve({{"blocks.*.attn.qkv.weight", kC}, {"blocks.*.attn.qkv.bias", kW}}),
                        "Valid for blocks.0.attn.qkv.bias: \"column\"");
}

TEST(VitPlan, ARuleThatMatchesNothingIsNamed) {
  EXPECT_ERROR_CONTAINS(resolve({{"h.*.mlp.c_fc.*", kC}}),
                        "parallel.tensor.specs[0] { pattern = \"h.*.mlp.c_fc.*\", spec = \"column\" } matches no "
                        "parameter of the model. The ViT's parameters are named as timm's");
  EXPECT_ERROR_CONTAINS(resolve({{"blocks.*", kW}, {"blocks.0.mlp.fc1.*", kC}}), "takes no parameter");
}

TEST(VitPlan, CheckNamesTheParameterOfAPlanMadeInCode) {
  VitPlan plan = VitPlan::megatron(2);
  plan.blocks[1].mlp_in = kW;
  EXPECT_ERROR_CONTAINS(check_vit_plan(plan, tiny_config(), 2),
                        "blocks.1.mlp.fc2.weight: spec \"row\" splits its input features");
  EXPECT_ERROR_CONTAINS(check_vit_plan(VitPlan::megatron(3), tiny_config(), 2), "a plan for 3 blocks");
  EXPECT_NO_THROW(check_vit_plan(VitPlan::megatron(2), tiny_config(), 4));
}

}  // namespace
}  // namespace colossal::parallel::tp
