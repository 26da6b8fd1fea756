// Hub weights: the golden GPT-2 and ViT parameters, packaged as transformers and timm files are
// (a "transformer." prefix, a tied lm_head.weight, old causal-mask buffers), load into our models
// bit for bit; what cannot be mapped fails naming the file and the key; export writes what the
// libraries read (Hub names, {"format": "pt"}).
#include "colossal/nn/hub_weights.h"

#include <gtest/gtest.h>

#include <filesystem>
#include <string>

#include "colossal/autograd/engine.h"  // golden_util.h needs backward
#include "colossal/core/error.h"
#include "colossal/nn/models/gpt2.h"
#include "colossal/nn/models/vit.h"
#include "colossal/nn/safetensors.h"
#include "colossal/ops/elementwise.h"
#include "golden_util.h"

namespace colossal::nn {
namespace {

namespace fs = std::filesystem;
using models::GPT2;
using models::GPT2Config;

fs::path temp_file(const std::string& name) {
  return fs::temp_directory_path() / ("colossal_hub_weights_test_" +
                                      std::to_string(::testing::UnitTest::GetInstance()->random_seed()) + "_" + name);
}

void expect_equal_state(const StateDict& got, const StateDict& expected) {
  ASSERT_EQ(testing::sorted_keys(got), testing::sorted_keys(expected));
  for (const auto& [name, tensor] : expected) {
    EXPECT_EQ(got.at(name).to(DType::f64).to_vector<double>(), tensor.to(DType::f64).to_vector<double>()) << name;
  }
}

std::string error_of(const std::function<void()>& fn) {
  try {
    fn();
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

class Gpt2HubWeights : public ::testing::Test {
 protected:
  void SetUp() override {
    golden_ = testing::load_golden("gpt2_tiny.safetensors");
    config_ = GPT2Config::from_json(golden_.metadata.at("config"));
    params_ = testing::with_prefix(golden_.tensors, "param.", DType::f32);
  }
  SafetensorsFile golden_;
  GPT2Config config_;
  StateDict params_;
};

// GPT2LMHeadModel.save_pretrained's layout: every name under "transformer.", lm_head.weight equal
// to wte.weight, and (transformers < 4.31) the causal mask as h.N.attn.bias / masked_bias.
TEST_F(Gpt2HubWeights, TransformersLayoutLoadsExactly) {
  StateDict hub;
  for (const auto& [name, tensor] : params_) hub.insert("transformer." + name, tensor);
  hub.insert("lm_head.weight", params_.at("wte.weight"));
  for (int layer = 0; layer < config_.n_layer; ++layer) {
    hub.insert(fmt::format("transformer.h.{}.attn.bias", layer), core::ones({1, 1, 64, 64}));
    hub.insert(fmt::format("transformer.h.{}.attn.masked_bias", layer), core::ones({}));
  }
  const fs::path path = temp_file("gpt2.safetensors");
  save_safetensors(path, hub, {{"format", "pt"}});

  GPT2 model(config_);
  const HubImportReport report = import_hub_weights(model, path);
  fs::remove(path);
  EXPECT_TRUE(report.stripped_transformer_prefix);
  EXPECT_EQ(report.dropped.size(), static_cast<size_t>(1 + 2 * config_.n_layer));
  expect_equal_state(model.state_dict(), params_);
}

TEST_F(Gpt2HubWeights, ProblemsNameTheFileAndTheKeyAndLoadNothing) {
  GPT2 model(config_);
  const StateDict before = model.state_dict();
  std::map<std::string, std::vector<double>> snapshot;
  for (const auto& [name, tensor] : before) snapshot[name] = tensor.to(DType::f64).to_vector<double>();

  StateDict untied = params_;
  untied.insert("lm_head.weight", ops::mul(params_.at("wte.weight"), 2.0));
  const fs::path path = temp_file("untied.safetensors");
  save_safetensors(path, untied);
  std::string message = error_of([&] { import_hub_weights(model, path); });
  EXPECT_NE(message.find("lm_head.weight"), std::string::npos) << message;
  EXPECT_NE(message.find(path.filename().string()), std::string::npos) << message;

  StateDict missing = params_;
  missing.erase("h.1.mlp.c_fc.weight");
  save_safetensors(path, missing);
  message = error_of([&] { import_hub_weights(model, path); });
  EXPECT_NE(message.find("h.1.mlp.c_fc.weight"), std::string::npos) << message;
  fs::remove(path);
  for (const auto& [name, tensor] : model.state_dict()) {
    EXPECT_EQ(tensor.to(DType::f64).to_vector<double>(), snapshot.at(name)) << name << " changed by a failed load";
  }
}

TEST(HubWeights, VitTimmNamesRoundTripThroughExport) {
  const SafetensorsFile golden = testing::load_golden("vit_tiny.safetensors");
  const StateDict params = testing::with_prefix(golden.tensors, "param.", DType::f32);
  models::ViTConfig config = models::ViTConfig::vit_tiny_patch4_32(10);
  config.img_size = 32;
  config.patch_size = 8;
  config.embed_dim = 64;
  config.depth = 2;
  config.num_heads = 4;
  config.mlp_ratio = 4.0;
  models::VisionTransformer model(config);
  import_hub_weights(model, [&] {
    const fs::path path = temp_file("vit_in.safetensors");
    save_safetensors(path, params);
    return path;
  }());
  expect_equal_state(model.state_dict(), params);

  const fs::path out = temp_file("vit_out.safetensors");
  export_hub_weights(model.state_dict(), out, DType::bf16);
  const SafetensorsFile exported = load_safetensors(out);
  fs::remove(out);
  EXPECT_EQ(exported.metadata.at("format"), "pt");
  EXPECT_EQ(testing::sorted_keys(exported.tensors), testing::sorted_keys(params));
  EXPECT_EQ(exported.tensors.at("blocks.0.attn.qkv.weight").dtype(), DType::bf16);
  EXPECT_EQ(exported.tensors.at("blocks.0.attn.qkv.weight").shape(), params.at("blocks.0.attn.qkv.weight").shape());
}

}  // namespace
}  // namespace colossal::nn
