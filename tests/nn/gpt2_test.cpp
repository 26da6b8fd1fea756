// GPT-2's structure: Hugging Face's parameter names and shapes, the presets' parameter counts,
// vocabulary padding, HF's initialisation statistics, a CPU forward and backward reaching every
// parameter, the pipeline pieces composing to the model, config parsing and bad input.
// (Numerical agreement with transformers is gpt2_golden_test.cpp.)
#include <gtest/gtest.h>

#include <cmath>
#include <set>

#include "colossal/nn/models/gpt2.h"
#include "colossal/ops.h"
#include "gradcheck.h"
#include "model_test_util.h"

namespace colossal {
namespace {

using nn::models::GPT2;
using nn::models::GPT2Config;
using nn::models::lm_cross_entropy;

GPT2Config small_config() {
  GPT2Config config;
  config.vocab_size = 97;
  config.n_positions = 16;
  config.n_embd = 32;
  config.n_layer = 2;
  config.n_head = 4;
  config.dropout = 0.0;
  return config;
}

Tensor random_ids(const Shape& shape, int64_t vocab, uint64_t seed) {
  core::Generator gen(seed);
  return core::randint(0, vocab, shape, DType::i64, &gen);
}

TEST(GPT2, HuggingFaceNamesAndShapes) {
  GPT2 model(small_config());
  const auto names = testing::parameter_names(model);
  const std::vector<std::string> first_block = {
      "h.0.ln_1.weight",        "h.0.ln_1.bias",        "h.0.attn.c_attn.weight", "h.0.attn.c_attn.bias",
      "h.0.attn.c_proj.weight", "h.0.attn.c_proj.bias", "h.0.ln_2.weight",        "h.0.ln_2.bias",
      "h.0.mlp.c_fc.weight",    "h.0.mlp.c_fc.bias",    "h.0.mlp.c_proj.weight",  "h.0.mlp.c_proj.bias"};
  ASSERT_EQ(names.size(), 2 + 2 * first_block.size() + 2);
  EXPECT_EQ(names[0], "wte.weight");
  EXPECT_EQ(names[1], "wpe.weight");
  EXPECT_EQ(std::vector<std::string>(names.begin() + 2, names.begin() + 14), first_block);
  EXPECT_EQ(names[names.size() - 2], "ln_f.weight");
  EXPECT_EQ(names.back(), "ln_f.bias");
  // Conv1D keeps HF's [in, out] layout; there is no separate lm_head tensor (tied to wte).
  EXPECT_EQ(model.parameter("h.1.attn.c_attn.weight").shape(), (Shape{32, 96}));
  EXPECT_EQ(model.parameter("h.1.mlp.c_fc.weight").shape(), (Shape{32, 128}));
  EXPECT_EQ(model.parameter("h.1.mlp.c_proj.weight").shape(), (Shape{128, 32}));
  EXPECT_EQ(model.parameter("wte.weight").shape(), (Shape{97, 32}));
  EXPECT_EQ(model.parameter("wpe.weight").shape(), (Shape{16, 32}));
  EXPECT_TRUE(model.named_buffers().empty());
  EXPECT_EQ(model.num_parameters(), small_config().num_parameters());
}

TEST(GPT2, PresetParameterCountsMatchTheReleasedModels) {
  // The counts Hugging Face reports for gpt2, gpt2-medium, gpt2-large and gpt2-xl (tied wte once).
  EXPECT_EQ(GPT2Config::gpt2_124m().num_parameters(), 124'439'808);
  EXPECT_EQ(GPT2Config::gpt2_350m().num_parameters(), 354'823'168);
  EXPECT_EQ(GPT2Config::gpt2_774m().num_parameters(), 774'030'080);
  EXPECT_EQ(GPT2Config::gpt2_1558m().num_parameters(), 1'557'611'200);
  // Building the 124M model (500 MB of f32) agrees with the formula.
  GPT2 model(GPT2Config::gpt2_124m());
  EXPECT_EQ(model.num_parameters(), 124'439'808);
}

TEST(GPT2, VocabularyPaddingWidensWteAndTheLogits) {
  GPT2Config config = GPT2Config::gpt2_124m();
  config.vocab_multiple = 64;
  EXPECT_EQ(config.padded_vocab_size(), 50304);  // nanoGPT's padded GPT-2 vocabulary
  EXPECT_EQ(config.num_parameters(), 124'439'808 + (50304 - 50257) * 768);

  GPT2Config small = small_config();
  small.vocab_multiple = 64;
  GPT2 model(small);
  EXPECT_EQ(model.parameter("wte.weight").shape(), (Shape{128, 32}));
  const Tensor logits = model.forward(random_ids({2, 5}, small.vocab_size, 1));
  EXPECT_EQ(logits.shape(), (Shape{2, 5, 128}));
}

TEST(GPT2, InitialisationFollowsHuggingFace) {
  GPT2Config config = small_config();
  config.n_embd = 128;
  config.vocab_size = 1000;
  config.n_layer = 8;
  core::Generator gen(3);
  GPT2 model(config, &gen);
  // Sample standard deviations of 12k to 128k draws are within a few percent of the true one.
  EXPECT_NEAR(testing::std_of(model.parameter("wte.weight")), 0.02, 0.02 * 0.03);
  EXPECT_NEAR(testing::std_of(model.parameter("wpe.weight")), 0.02, 0.02 * 0.05);
  EXPECT_NEAR(testing::std_of(model.parameter("h.3.attn.c_attn.weight")), 0.02, 0.02 * 0.03);
  EXPECT_NEAR(testing::std_of(model.parameter("h.3.mlp.c_fc.weight")), 0.02, 0.02 * 0.03);
  // The residual-stream writers: 0.02 / sqrt(2 n_layer) = 0.005.
  EXPECT_NEAR(testing::std_of(model.parameter("h.3.attn.c_proj.weight")), 0.005, 0.005 * 0.05);
  EXPECT_NEAR(testing::std_of(model.parameter("h.3.mlp.c_proj.weight")), 0.005, 0.005 * 0.03);
  testing::expect_values(model.parameter("h.3.attn.c_attn.bias"), std::vector<double>(384, 0.0));
  testing::expect_values(model.parameter("h.3.ln_1.weight"), std::vector<double>(128, 1.0));
  // Another initializer_range reaches every matrix.
  config.initializer_range = 0.05;
  GPT2 wide(config, &gen);
  EXPECT_NEAR(testing::std_of(wide.parameter("wte.weight")), 0.05, 0.05 * 0.03);
  EXPECT_NEAR(testing::std_of(wide.parameter("h.3.attn.c_attn.weight")), 0.05, 0.05 * 0.03);
  EXPECT_NEAR(testing::std_of(wide.parameter("h.3.mlp.c_proj.weight")), 0.0125, 0.0125 * 0.03);
  config.initializer_range = 0.02;
  // The same seed gives the same model.
  core::Generator again(3);
  GPT2 twin(config, &again);
  testing::expect_close(twin.parameter("h.7.mlp.c_proj.weight"), model.parameter("h.7.mlp.c_proj.weight"), 0, 0);
}

TEST(GPT2, ForwardAndBackwardReachEveryParameter) {
  GPT2Config config = small_config();
  config.dropout = 0.1;  // exercise the dropout paths too
  core::Generator dropout_gen(11);
  GPT2 model(config, nullptr, &dropout_gen);
  const Tensor ids = random_ids({3, 16}, config.vocab_size, 5);
  const Tensor logits = model.forward(ids);
  ASSERT_EQ(logits.shape(), (Shape{3, 16, 97}));
  const Tensor loss = lm_cross_entropy(logits, random_ids({3, 16}, config.vocab_size, 6));
  // An untrained model is near uniform: loss about ln(97) = 4.57.
  EXPECT_NEAR(loss.item<double>(), std::log(97.0), 0.5);
  autograd::backward(loss);
  testing::expect_finite_nonzero_grads(model);
}

TEST(GPT2, CausalityFutureTokensDoNotChangeEarlierLogits) {
  GPT2 model(small_config());
  model.eval();
  const Tensor ids = random_ids({1, 8}, 97, 9);
  std::vector<int64_t> changed = ids.to_vector<int64_t>();
  changed[6] = (changed[6] + 1) % 97;
  const Tensor a = model.forward(ids), b = model.forward(core::from_vector(changed, {1, 8}));
  testing::expect_close(b.narrow(1, 0, 6), a.narrow(1, 0, 6), 0, 0, "positions before the change");
  EXPECT_GT(ops::max(ops::abs(ops::sub(b.narrow(1, 6, 2), a.narrow(1, 6, 2)))).item<double>(), 1e-6);
}

TEST(GPT2, PipelineLayersComposeToTheModel) {
  GPT2 model(small_config());
  const auto layers = model.layers();
  ASSERT_EQ(layers.size(), 1 + 2 + 1u);
  const Tensor ids = random_ids({2, 7}, 97, 4);
  Tensor x = ids;
  for (const auto& layer : layers) x = layer->forward(x);
  testing::expect_close(x, model.forward(ids), 0, 0, "composed pieces");
  // Each piece's names are the model's; the tied wte belongs to the first piece and the last.
  EXPECT_EQ(testing::parameter_names(*layers[0]), (std::vector<std::string>{"wte.weight", "wpe.weight"}));
  EXPECT_EQ(testing::parameter_names(*layers[1]).front(), "h.0.ln_1.weight");
  EXPECT_EQ(testing::parameter_names(*layers[3]), (std::vector<std::string>{"ln_f.weight", "ln_f.bias", "wte.weight"}));
  EXPECT_TRUE(layers[3]->parameter("wte.weight").is_same(model.parameter("wte.weight")));
  testing::expect_pieces_cover_the_model(model, layers, {"wte.weight"});
}

TEST(GPT2, PiecesLeftOutAreStandInsAndTheOthersTheSerialWeights) {
  // Note [Pieces built]: a stage of blocks 1-2 of 4, then the embedding with the head (the tied wte),
  // then the head alone: the pieces built are the full model's bit for bit.
  GPT2Config config = small_config();
  config.n_layer = 4;
  testing::expect_pieces_built_alone_equal_the_whole<GPT2>(config, {{2, 3}, {0, 5}, {5}});
}

TEST(GPT2, ConfigFromHuggingFaceJson) {
  const GPT2Config config = GPT2Config::from_json(
      R"({"vocab_size": 50257, "n_positions": 1024, "n_embd": 1024, "n_layer": 24, "n_head": 16,
          "embd_pdrop": 0.1, "attn_pdrop": 0.1, "resid_pdrop": 0.1, "layer_norm_epsilon": 1e-05,
          "activation_function": "gelu_new", "n_inner": null, "model_type": "gpt2"})");
  EXPECT_EQ(config.num_parameters(), GPT2Config::gpt2_350m().num_parameters());
  EXPECT_EQ(config.dropout, 0.1);
  EXPECT_ERROR_CONTAINS(GPT2Config::from_json(R"({"activation_function": "relu"})"), "activation_function \"relu\"");
  // A number too large for a double is nlohmann's out_of_range, not a parse error: still invalid JSON.
  EXPECT_ERROR_CONTAINS(GPT2Config::from_json(R"({"n_embd": 1E400})"), "GPT2Config::from_json: not valid JSON");
  EXPECT_ERROR_CONTAINS(GPT2Config::from_json(R"({"embd_pdrop": 0.1, "attn_pdrop": 0.0})"), "differ");
  EXPECT_ERROR_CONTAINS(GPT2Config::from_json(R"({"n_layer": "12"})"), "'n_layer' must be an integer");
  EXPECT_ERROR_CONTAINS(GPT2Config::from_json("{not json"), "not valid JSON");
}

TEST(GPT2, BadConfigsAndInputs) {
  GPT2Config config = small_config();
  config.n_head = 5;
  EXPECT_ERROR_CONTAINS(GPT2{config}, "n_head 5 must divide n_embd 32");
  config = small_config();
  config.dropout = 1.5;
  EXPECT_ERROR_CONTAINS(GPT2{config}, "dropout must be in [0, 1], got 1.5");
  GPT2 model(small_config());
  EXPECT_ERROR_CONTAINS(model.forward(random_ids({2, 17}, 97, 1)), "sequences of 17 tokens exceed n_positions = 16");
  EXPECT_ERROR_CONTAINS(model.forward(random_ids({17}, 97, 1)), "expected token ids [B, T], got shape [17]");
  EXPECT_ERROR_CONTAINS(lm_cross_entropy(core::zeros({2, 3, 5}), random_ids({2, 4}, 5, 1)),
                        "expected logits [B, T, V] and targets [B, T], got [2, 3, 5] and [2, 4]");
}

}  // namespace
}  // namespace colossal
