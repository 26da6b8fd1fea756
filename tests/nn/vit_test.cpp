// ViT's structure: timm's parameter names and shapes, the presets' parameter counts, timm's
// initialisation, a CPU forward and backward reaching every parameter, the pipeline pieces
// composing to the model, config parsing and bad input. (Numerical agreement with timm is
// vit_golden_test.cpp.)
#include <gtest/gtest.h>

#include <set>

#include "colossal/nn/models/vit.h"
#include "colossal/ops.h"
#include "gradcheck.h"
#include "model_test_util.h"

namespace colossal {
namespace {

using nn::models::VisionTransformer;
using nn::models::ViTConfig;

ViTConfig small_config() {
  ViTConfig config = ViTConfig::vit_tiny_patch4_32(10);
  config.img_size = 16;
  config.embed_dim = 32;
  config.depth = 2;
  config.num_heads = 4;
  return config;
}

TEST(ViT, TimmNamesAndShapes) {
  VisionTransformer model(small_config());
  const auto names = testing::parameter_names(model);
  const std::vector<std::string> expected_start = {"cls_token",
                                                   "pos_embed",
                                                   "patch_embed.proj.weight",
                                                   "patch_embed.proj.bias",
                                                   "blocks.0.norm1.weight",
                                                   "blocks.0.norm1.bias",
                                                   "blocks.0.attn.qkv.weight",
                                                   "blocks.0.attn.qkv.bias",
                                                   "blocks.0.attn.proj.weight",
                                                   "blocks.0.attn.proj.bias",
                                                   "blocks.0.norm2.weight",
                                                   "blocks.0.norm2.bias",
                                                   "blocks.0.mlp.fc1.weight",
                                                   "blocks.0.mlp.fc1.bias",
                                                   "blocks.0.mlp.fc2.weight",
                                                   "blocks.0.mlp.fc2.bias"};
  ASSERT_EQ(names.size(), 4 + 2 * 12 + 4u);
  EXPECT_EQ(std::vector<std::string>(names.begin(), names.begin() + 16), expected_start);
  EXPECT_EQ(std::vector<std::string>(names.end() - 4, names.end()),
            (std::vector<std::string>{"norm.weight", "norm.bias", "head.weight", "head.bias"}));
  // 16x16 images in 4x4 patches: 16 patches and the class token.
  EXPECT_EQ(model.cls_token().shape(), (Shape{1, 1, 32}));
  EXPECT_EQ(model.pos_embed().shape(), (Shape{1, 17, 32}));
  EXPECT_EQ(model.parameter("patch_embed.proj.weight").shape(), (Shape{32, 3, 4, 4}));
  EXPECT_EQ(model.parameter("blocks.1.attn.qkv.weight").shape(), (Shape{96, 32}));  // [out, in]
  EXPECT_EQ(model.parameter("head.weight").shape(), (Shape{10, 32}));
  EXPECT_EQ(model.norm()->eps(), 1e-6);
  EXPECT_EQ(model.num_parameters(), small_config().num_parameters());
}

TEST(ViT, PresetParameterCountsMatchTimm) {
  // timm's counts for vit_{tiny,small,base,large}_patch16_224 with 1000 classes.
  EXPECT_EQ(ViTConfig::vit_tiny_patch16_224().num_parameters(), 5'717'416);
  EXPECT_EQ(ViTConfig::vit_small_patch16_224().num_parameters(), 22'050'664);
  EXPECT_EQ(ViTConfig::vit_base_patch16_224().num_parameters(), 86'567'656);
  EXPECT_EQ(ViTConfig::vit_large_patch16_224().num_parameters(), 304'326'632);
  // Building ViT-B/16 agrees with the formula.
  VisionTransformer model(ViTConfig::vit_base_patch16_224());
  EXPECT_EQ(model.num_parameters(), 86'567'656);
}

TEST(ViT, SmallImagePresets) {
  const ViTConfig cifar = ViTConfig::vit_tiny_patch4_32();
  EXPECT_EQ(cifar.num_patches(), 64);
  EXPECT_EQ(cifar.in_chans, 3);
  const ViTConfig mnist = ViTConfig::vit_tiny_patch4_28();
  EXPECT_EQ(mnist.num_patches(), 49);
  EXPECT_EQ(mnist.in_chans, 1);
  EXPECT_EQ(mnist.num_classes, 10);
}

TEST(ViT, InitialisationFollowsTimm) {
  ViTConfig config = small_config();
  config.embed_dim = 128;
  core::Generator gen(2);
  VisionTransformer model(config, &gen);
  // trunc_normal(std 0.02) truncated at +-2, i.e. 100 std: the plain normal's statistics. Sample
  // standard deviations of 2k to 65k draws are within a few percent of the true one.
  EXPECT_NEAR(testing::std_of(model.pos_embed()), 0.02, 0.02 * 0.05);
  EXPECT_NEAR(testing::std_of(model.parameter("blocks.0.attn.qkv.weight")), 0.02, 0.02 * 0.03);
  EXPECT_NEAR(testing::std_of(model.parameter("blocks.1.mlp.fc2.weight")), 0.02, 0.02 * 0.03);
  EXPECT_NEAR(testing::std_of(model.parameter("head.weight")), 0.02, 0.02 * 0.1);
  EXPECT_LT(testing::std_of(model.cls_token()), 1e-5);  // normal(std 1e-6)
  testing::expect_values(model.parameter("blocks.0.attn.qkv.bias"), std::vector<double>(384, 0.0));
  testing::expect_values(model.parameter("head.bias"), std::vector<double>(10, 0.0));
  // The patch projection keeps PyTorch's Conv2d default: U(-1/sqrt(fan_in), 1/sqrt(fan_in)), fan_in = 48.
  for (double w : model.parameter("patch_embed.proj.weight").to_vector<double>())
    EXPECT_LE(std::abs(w), 1 / std::sqrt(48.0));

  config.zero_head_init = true;
  VisionTransformer zero_head(config);
  testing::expect_values(zero_head.parameter("head.weight"), std::vector<double>(10 * 128, 0.0));
}

TEST(ViT, ForwardAndBackwardReachEveryParameter) {
  ViTConfig config = small_config();
  config.drop_rate = config.pos_drop_rate = config.proj_drop_rate = config.attn_drop_rate = 0.1;
  config.drop_path_rate = 0.1;
  core::Generator dropout_gen(5);
  VisionTransformer model(config, nullptr, &dropout_gen);
  const Tensor images = testing::random_tensor({4, 3, 16, 16}, 1, -1.0, 1.0, DType::f32);
  const Tensor logits = model.forward(images);
  ASSERT_EQ(logits.shape(), (Shape{4, 10}));
  const Tensor loss =
      ops::cross_entropy(logits, core::from_vector<int64_t>({0, 3, 7, 9}, {4}), {.label_smoothing = 0.1});
  EXPECT_NEAR(loss.item<double>(), std::log(10.0), 0.5);  // near uniform at initialisation
  autograd::backward(loss);
  testing::expect_finite_nonzero_grads(model);
}

TEST(ViT, PipelineLayersComposeToTheModel) {
  VisionTransformer model(small_config());
  const auto layers = model.layers();
  ASSERT_EQ(layers.size(), 1 + 2 + 1u);
  const Tensor images = testing::random_tensor({2, 3, 16, 16}, 3, -1.0, 1.0, DType::f32);
  Tensor x = images;
  for (const auto& layer : layers) x = layer->forward(x);
  testing::expect_close(x, model.forward(images), 0, 0, "composed pieces");
  EXPECT_EQ(testing::parameter_names(*layers[0]),
            (std::vector<std::string>{"cls_token", "pos_embed", "patch_embed.proj.weight", "patch_embed.proj.bias"}));
  EXPECT_EQ(testing::parameter_names(*layers[2]).back(), "blocks.1.mlp.fc2.bias");
  testing::expect_pieces_cover_the_model(model, layers);
}

TEST(ViT, PiecesLeftOutAreStandInsAndTheOthersTheSerialWeights) {
  // Note [Pieces built]: the embedding with a block, the middle blocks, the head alone.
  ViTConfig config = small_config();
  config.depth = 4;
  testing::expect_pieces_built_alone_equal_the_whole<VisionTransformer>(config, {{0, 1}, {2, 3}, {5}});
}

TEST(ViT, ConfigFromJson) {
  const ViTConfig config = ViTConfig::from_json(
      R"({"img_size": 32, "patch_size": 8, "in_chans": 3, "num_classes": 10, "embed_dim": 64, "depth": 2,
          "num_heads": 4, "mlp_ratio": 4.0, "qkv_bias": false, "drop_path_rate": 0.1})");
  EXPECT_EQ(config.num_patches(), 16);
  EXPECT_FALSE(config.qkv_bias);
  EXPECT_EQ(config.drop_path_rate, 0.1);
  VisionTransformer model(config);
  EXPECT_FALSE(model.parameter("blocks.0.attn.qkv.bias").defined());
  EXPECT_EQ(model.num_parameters(), config.num_parameters());
  EXPECT_ERROR_CONTAINS(ViTConfig::from_json(R"({"qkv_bias": 1})"), "'qkv_bias' must be true or false");
  EXPECT_ERROR_CONTAINS(ViTConfig::from_json(R"({"embed_dim": 1E400})"), "ViTConfig::from_json: not valid JSON");
  EXPECT_ERROR_CONTAINS(ViTConfig::from_json(R"({"depth": 2.5})"), "'depth' must be an integer");
}

TEST(ViT, BadConfigsAndInputs) {
  ViTConfig config = small_config();
  config.patch_size = 5;
  EXPECT_ERROR_CONTAINS(VisionTransformer{config}, "patch_size 5 must divide img_size 16");
  config = small_config();
  config.num_heads = 5;
  EXPECT_ERROR_CONTAINS(VisionTransformer{config}, "num_heads 5 must divide embed_dim 32");
  config = small_config();
  config.drop_path_rate = -0.1;
  EXPECT_ERROR_CONTAINS(VisionTransformer{config}, "drop_path_rate must be in [0, 1], got -0.1");
  VisionTransformer model(small_config());
  EXPECT_ERROR_CONTAINS(model.forward(core::zeros({2, 3, 32, 32})),
                        "expected images [B, 3, 16, 16], got shape [2, 3, 32, 32]");
}

}  // namespace
}  // namespace colossal
