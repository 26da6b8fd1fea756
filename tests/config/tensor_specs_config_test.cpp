// parallel.tensor.specs: per-parameter sharding rules { pattern, spec } read from TOML and --set,
// shown by describe() (and read back), each rule's problems named by its index and key with what is
// valid, and refused where they cannot apply (not mode "1d", with sequence parallelism, not GPT-2).
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "colossal/config/train_config.h"
#include "gradcheck.h"  // EXPECT_ERROR_CONTAINS

namespace colossal::config {
namespace {

TrainConfig parse(const std::string& toml, const std::vector<std::string>& overrides = {}) {
  return parse_config(toml, overrides, "test.toml");
}

constexpr const char* kGpt2 = "[model]\nname = \"gpt2\"\n";

TEST(TensorSpecsConfig, ReadFromTomlAndOverridesAndDescribed) {
  EXPECT_TRUE(parse("").parallel.tensor.specs.empty());
  const TrainConfig c = parse(std::string(kGpt2) +
                              "[parallel.tensor]\nsize = 2\nspecs = [\n"
                              "  { pattern = \"h.*.mlp.c_fc.*\", spec = \"column\" },\n"
                              "  { pattern = \"h.*.mlp.c_proj.weight\", spec = \"row\" },\n"
                              "  { pattern = \"re:wte\\\\.weight\", spec = \"vocab\" },\n"
                              "]\n");
  ASSERT_EQ(c.parallel.tensor.specs.size(), 3u);
  EXPECT_EQ(c.parallel.tensor.specs[0], (TensorSpecRule{"h.*.mlp.c_fc.*", TensorSplit::kColumn}));
  EXPECT_EQ(c.parallel.tensor.specs[1].spec, TensorSplit::kRow);
  EXPECT_EQ(c.parallel.tensor.specs[2], (TensorSpecRule{"re:wte\\.weight", TensorSplit::kVocab}));
  const std::string text = describe(c);
  EXPECT_NE(text.find("specs = [{ pattern = \"h.*.mlp.c_fc.*\", spec = \"column\" }, "), std::string::npos) << text;
  EXPECT_EQ(parse(text), c) << text;  // describe() reads back
  const TrainConfig o = parse(std::string(kGpt2), {"parallel.tensor.specs=[{ pattern = \"wpe.weight\", spec = "
                                                   "\"replicate\" }]"});
  ASSERT_EQ(o.parallel.tensor.specs.size(), 1u);
  EXPECT_EQ(o.parallel.tensor.specs[0].spec, TensorSplit::kReplicate);
}

TEST(TensorSpecsConfig, PatternsMatchAsGlobsOrRegularExpressions) {
  const TensorSpecRule glob{"h.*.mlp.c_?c.*", TensorSplit::kColumn};
  EXPECT_TRUE(glob.matches("h.0.mlp.c_fc.weight"));
  EXPECT_TRUE(glob.matches("h.11.mlp.c_fc.bias"));
  EXPECT_FALSE(glob.matches("h.0.mlp.c_proj.weight"));
  EXPECT_FALSE(glob.matches("transformer.h.0.mlp.c_fc.weight"));  // whole names
  const TensorSpecRule regex{"re:h\\.[0-9]+\\.attn\\.c_(attn|proj)\\.weight", TensorSplit::kColumn};
  EXPECT_TRUE(regex.matches("h.3.attn.c_proj.weight"));
  EXPECT_FALSE(regex.matches("h.3.attn.c_proj.bias"));
}

TEST(TensorSpecsConfig, EachRulesProblemIsNamed) {
  const std::string head = std::string(kGpt2) + "[parallel.tensor]\nsize = 2\n";
  EXPECT_ERROR_CONTAINS(parse(head + "specs = [{ pattern = \"wte.weight\", spec = \"colum\" }]\n"),
                        "parallel.tensor.specs[0].spec = \"colum\" is not one of \"column\", \"row\", \"replicate\", "
                        "\"vocab\"; did you mean \"column\"?");
  EXPECT_ERROR_CONTAINS(parse(head + "specs = [{ pattern = \"wte.weight\", spec = \"vocab\", sepc = 1 }]\n"),
                        "parallel.tensor.specs[0]: key \"sepc\" is not one of \"pattern\", \"spec\"; did you mean "
                        "\"spec\"?");
  EXPECT_ERROR_CONTAINS(parse(head + "specs = [{ spec = \"row\" }]\n"), "parallel.tensor.specs[0] has no pattern");
  EXPECT_ERROR_CONTAINS(parse(head + "specs = [{ pattern = \"wte.weight\" }]\n"),
                        "parallel.tensor.specs[0] has no spec: one of \"column\", \"row\", \"replicate\", \"vocab\"");
  EXPECT_ERROR_CONTAINS(parse(head + "specs = [{ pattern = \"\", spec = \"row\" }]\n"),
                        "parallel.tensor.specs[0].pattern = \"\": an empty pattern matches no parameter");
  EXPECT_ERROR_CONTAINS(parse(head + "specs = [{ pattern = \"re:h.(\", spec = \"row\" }]\n"),
                        "parallel.tensor.specs[0].pattern = \"re:h.(\": the regular expression after \"re:\" does "
                        "not compile");
  EXPECT_ERROR_CONTAINS(parse(head + "specs = [\"h.*\"]\n"), "parallel.tensor.specs[0] = \"h.*\": expected a rule");
  EXPECT_ERROR_CONTAINS(parse(head + "specs = \"h.*\"\n"),
                        "parallel.tensor.specs = \"h.*\": expected an array of rules");
  // The file and line of the rule.
  EXPECT_ERROR_CONTAINS(parse(head + "specs = [{ pattern = 3, spec = \"row\" }]\n"), "test.toml:5:");
}

TEST(TensorSpecsConfig, RefusedWhereTheyCannotApply) {
  const std::string rules = "specs = [{ pattern = \"h.*.mlp.c_fc.*\", spec = \"column\" }]\n";
  EXPECT_ERROR_CONTAINS(parse(std::string(kGpt2) + "[parallel.tensor]\nmode = \"2d\"\nsize = 4\n" + rules),
                        "parallel.tensor.specs split parameters over the 1D tensor-parallel group, but "
                        "parallel.tensor.mode = \"2d\"");
  EXPECT_ERROR_CONTAINS(
      parse(std::string(kGpt2) + "[parallel.tensor]\nsize = 2\nsequence_parallel = true\n" + rules),
      "parallel.tensor.specs and parallel.tensor.sequence_parallel = true: sequence parallelism is built for the "
      "built-in policy only");
  EXPECT_ERROR_CONTAINS(parse("[model]\nname = \"resnet\"\n[parallel.tensor]\nsize = 2\n" + rules),
                        "parallel.tensor.specs split the linear layers of model.name = \"gpt2\" or \"vit\", and "
                        "model.name = \"resnet\" has no tensor-parallel form");
  // The ViT takes them (resolved against timm's names when the model is built).
  EXPECT_NO_THROW(
      parse("[model]\nname = \"vit\"\n[parallel.tensor]\nsize = 2\nspecs = [{ pattern = "
            "\"blocks.*.mlp.fc1.*\", spec = \"column\" }]\n"));
}

}  // namespace
}  // namespace colossal::config
