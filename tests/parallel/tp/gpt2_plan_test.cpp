// GPT-2's tensor-parallel plan from per-parameter sharding specs (parallel/tp/gpt2_plan.h): the
// tutorial's table, the MLP only, attention only and the built-in policy resolve to the plans they
// describe, each parameter labelled with its rule; an assignment the layers cannot compute is an
// error naming the parameter, its spec, its rule and what would be valid; so is a rule that
// matches nothing.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "colossal/nn/models/gpt2.h"
#include "colossal/parallel/tp/gpt2_plan.h"
#include "gradcheck.h"  // EXPECT_ERROR_CONTAINS

namespace colossal::parallel::tp {
namespace {

using config::TensorSpecRule;

nn::models::GPT2Config tiny_config(int64_t heads = 4) {
  nn::models::GPT2Config c;
  c.vocab_size = 32;
  c.n_positions = 8;
  c.n_embd = 16;
  c.n_layer = 2;
  c.n_head = heads;
  c.dropout = 0.0;
  return c;
}

std::vector<std::string> names_of(const nn::models::GPT2Config& config) {
  core::Generator g(1);
  nn::models::GPT2 model(config, &g);
  std::vector<std::string> names;
  for (const auto& [name, parameter] : model.named_parameters()) names.push_back(name);
  return names;
}

ResolvedGpt2Plan resolve(const std::vector<TensorSpecRule>& rules, int tp = 2, int64_t heads = 4) {
  const nn::models::GPT2Config config = tiny_config(heads);
  return resolve_gpt2_specs(rules, config, names_of(config), tp);
}

TensorSplit split_of(const ResolvedGpt2Plan& resolved, const std::string& name) {
  for (const ParameterSplit& p : resolved.parameters) {
    if (p.name == name) return p.split;
  }
  ADD_FAILURE() << name << " is not among the resolved parameters";
  return TensorSplit::kVocab;
}

std::string source_of(const ResolvedGpt2Plan& resolved, const std::string& name) {
  for (const ParameterSplit& p : resolved.parameters) {
    if (p.name == name) return p.source;
  }
  return "";
}

const std::vector<TensorSpecRule> kTutorial = {
    {"h.*.mlp.c_fc.*", TensorSplit::kColumn},    {"h.*.mlp.c_proj.weight", TensorSplit::kRow},
    {"wte.weight", TensorSplit::kColumn},        {"wpe.weight", TensorSplit::kColumn},
    {"h.*.attn.c_attn.*", TensorSplit::kColumn}, {"h.*.attn.c_proj.*", TensorSplit::kColumn}};

TEST(Gpt2Plan, TheTutorialsTable) {
  const ResolvedGpt2Plan r = resolve(kTutorial);
  EXPECT_EQ(r.plan.wte, TensorSplit::kColumn);
  EXPECT_EQ(r.plan.wpe, TensorSplit::kColumn);
  ASSERT_EQ(r.plan.blocks.size(), 2u);
  for (const Gpt2BlockPlan& b : r.plan.blocks) {
    EXPECT_EQ(b, (Gpt2BlockPlan{TensorSplit::kColumn, TensorSplit::kColumn, TensorSplit::kColumn, TensorSplit::kRow}));
  }
  EXPECT_TRUE(r.plan.logits_whole());
  EXPECT_FALSE(r.plan.is_megatron());
  // The row layer's bias is replicated and follows its weight; the layer norms have no rule.
  EXPECT_EQ(split_of(r, "h.0.mlp.c_proj.bias"), TensorSplit::kReplicate);
  EXPECT_EQ(source_of(r, "h.0.mlp.c_proj.bias"), "follows h.0.mlp.c_proj.weight");
  EXPECT_EQ(split_of(r, "h.1.mlp.c_fc.bias"), TensorSplit::kColumn);
  EXPECT_EQ(source_of(r, "h.1.mlp.c_fc.bias"), "rule 0");
  EXPECT_EQ(split_of(r, "h.0.ln_1.weight"), TensorSplit::kReplicate);
  EXPECT_EQ(source_of(r, "h.0.ln_1.weight"), "no rule");
  EXPECT_EQ(r.parameters.size(), names_of(tiny_config()).size());
}

TEST(Gpt2Plan, MlpOnlyAttentionOnlyAndTheBuiltInPolicy) {
  const ResolvedGpt2Plan mlp =
      resolve({{"h.*.mlp.c_fc.*", TensorSplit::kColumn}, {"h.*.mlp.c_proj.weight", TensorSplit::kRow}});
  EXPECT_EQ(mlp.plan.blocks[1],
            (Gpt2BlockPlan{TensorSplit::kReplicate, TensorSplit::kReplicate, TensorSplit::kColumn, TensorSplit::kRow}));
  EXPECT_EQ(mlp.plan.wte, TensorSplit::kReplicate);
  const ResolvedGpt2Plan attn =
      resolve({{"h.*.attn.c_attn.*", TensorSplit::kColumn}, {"h.*.attn.c_proj.weight", TensorSplit::kRow}});
  EXPECT_EQ(attn.plan.blocks[0],
            (Gpt2BlockPlan{TensorSplit::kColumn, TensorSplit::kRow, TensorSplit::kReplicate, TensorSplit::kReplicate}));
  const ResolvedGpt2Plan megatron = resolve({{"re:h\\.\\d+\\.(attn\\.c_attn|mlp\\.c_fc)\\..*", TensorSplit::kColumn},
                                             {"h.*.c_proj.*", TensorSplit::kRow},
                                             {"wte.weight", TensorSplit::kVocab}});
  EXPECT_TRUE(megatron.plan.is_megatron());
  EXPECT_FALSE(megatron.plan.logits_whole());
  // The built-in plan labels every parameter so.
  const ResolvedGpt2Plan builtin = builtin_gpt2_plan(tiny_config(), names_of(tiny_config()));
  EXPECT_EQ(builtin.plan, megatron.plan);
  EXPECT_EQ(split_of(builtin, "h.0.attn.c_proj.bias"), TensorSplit::kReplicate);
  EXPECT_EQ(split_of(builtin, "wte.weight"), TensorSplit::kVocab);
}

TEST(Gpt2Plan, TheFirstMatchingRuleWins) {
  const ResolvedGpt2Plan r =
      resolve({{"h.0.mlp.c_fc.*", TensorSplit::kReplicate}, {"h.*.mlp.c_fc.*", TensorSplit::kColumn}});
  EXPECT_EQ(r.plan.blocks[0].c_fc, TensorSplit::kReplicate);
  EXPECT_EQ(r.plan.blocks[1].c_fc, TensorSplit::kColumn);
}

TEST(Gpt2Plan, ARowSplitWithNoColumnSplitBeforeItIsNamed) {
  EXPECT_ERROR_CONTAINS(resolve({{"h.*.mlp.c_proj.weight", TensorSplit::kRow}}),
                        "h.0.mlp.c_proj.weight: spec \"row\" (from parallel.tensor.specs[0] { pattern = "
                        "\"h.*.mlp.c_proj.weight\", spec = \"row\" }) splits its input features, which must come "
                        "split from a \"column\" split before it, but h.0.mlp.c_fc.weight is \"replicate\"");
  EXPECT_ERROR_CONTAINS(resolve({{"h.*.mlp.c_proj.weight", TensorSplit::kRow}}), "or \"column\" for h.0.mlp.c_fc");
  EXPECT_ERROR_CONTAINS(resolve({{"h.1.attn.c_attn.weight", TensorSplit::kRow}}),
                        "h.1.attn.c_attn.weight: spec \"row\"");
  EXPECT_ERROR_CONTAINS(resolve({{"h.1.attn.c_attn.weight", TensorSplit::kRow}}), "h.1.ln_1's whole output");
}

TEST(Gpt2Plan, AttentionSplitWithoutWholeHeadsIsNamed) {
  EXPECT_ERROR_CONTAINS(resolve({{"h.*.attn.c_attn.*", TensorSplit::kColumn}}, /*tp=*/4, /*heads=*/2),
                        "h.0.attn.c_attn.weight: spec \"column\"");
  EXPECT_ERROR_CONTAINS(resolve({{"h.*.attn.c_attn.*", TensorSplit::kColumn}}, /*tp=*/4, /*heads=*/2),
                        "n_head = 2 heads do not split over parallel.tensor.size = 4 ranks");
}

TEST(Gpt2Plan, SpecsALayerDoesNotTakeAreNamed) {
  EXPECT_ERROR_CONTAINS(resolve({{"wte.weight", TensorSplit::kRow}}),
                        "to split the embedding's rows (the vocabulary) "
                        "use \"vocab\"");
  EXPECT_ERROR_CONTAINS(resolve({{"wpe.weight", TensorSplit::kVocab}}), "Valid for wpe: \"column\" or \"replicate\"");
  EXPECT_ERROR_CONTAINS(resolve({{"h.*.mlp.c_fc.weight", TensorSplit::kVocab}}),
                        "\"vocab\" splits a vocabulary embedding's rows only (GPT-2's wte)");
  EXPECT_ERROR_CONTAINS(resolve({{"h.*.ln_2.*", TensorSplit::kColumn}}),
                        "h.0.ln_2.weight: spec \"column\" (from parallel.tensor.specs[0]");
  EXPECT_ERROR_CONTAINS(resolve({{"ln_f.bias", TensorSplit::kRow}}), "Valid: \"replicate\"");
  // A bias that disagrees with its weight.
  EXPECT_ERROR_CONTAINS(
      resolve({{"h.*.mlp.c_fc.weight", TensorSplit::kColumn}, {"h.*.mlp.c_fc.bias", TensorSplit::kReplicate}}),
      "h.0.mlp.c_fc.bias: spec \"replicate\" (from parallel.tensor.specs[1]");
  EXPECT_ERROR_CONTAINS(
      resolve({{"h.*.mlp.c_fc.weight", TensorSplit::kColumn}, {"h.*.mlp.c_fc.bias", TensorSplit::kReplicate}}),
      "Valid for h.0.mlp.c_fc.bias: \"column\"");
  // Features that do not split.
  EXPECT_ERROR_CONTAINS(resolve({{"wpe.weight", TensorSplit::kColumn}}, /*tp=*/3, /*heads=*/4),
                        "splits the embedding dimension (16 of them) over parallel.tensor.size = 3 ranks");
}

TEST(Gpt2Plan, ARuleThatMatchesNothingIsNamed) {
  EXPECT_ERROR_CONTAINS(resolve({{"transformer.h.*.mlp.c_fc.*", TensorSplit::kColumn}}),
                        "parallel.tensor.specs[0] { pattern = \"transformer.h.*.mlp.c_fc.*\", spec = \"column\" } "
                        "matches no parameter of the model");
  EXPECT_ERROR_CONTAINS(resolve({{"transformer.h.*.mlp.c_fc.*", TensorSplit::kColumn}}),
                        "without Hugging Face's \"transformer.\" prefix");
  EXPECT_ERROR_CONTAINS(resolve({{"h.*", TensorSplit::kReplicate}, {"h.0.mlp.c_fc.*", TensorSplit::kColumn}}),
                        "parallel.tensor.specs[1] { pattern = \"h.0.mlp.c_fc.*\", spec = \"column\" } takes no "
                        "parameter");
}

TEST(Gpt2Plan, CheckNamesTheParameterOfAPlanMadeInCode) {
  Gpt2Plan plan = Gpt2Plan::megatron(2);
  plan.blocks[1].c_fc = TensorSplit::kReplicate;
  EXPECT_ERROR_CONTAINS(check_gpt2_plan(plan, tiny_config(), 2),
                        "h.1.mlp.c_proj.weight: spec \"row\" splits its input features");
  EXPECT_NO_THROW(check_gpt2_plan(Gpt2Plan::megatron(2), tiny_config(), 4));
}

}  // namespace
}  // namespace colossal::parallel::tp
