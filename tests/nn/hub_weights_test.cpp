// Hub weights: the golden GPT-2 and ViT parameters, packaged as transformers and timm files are
// (a "transformer." prefix, a tied lm_head.weight, old causal-mask buffers), load into our models
// bit for bit; what cannot be mapped fails naming the file and the key; export writes what the
// libraries read (Hub names, {"format": "pt"}); f16/bf16 files widen into an f32 model exactly and
// are reported, other dtypes and training checkpoints are refused with the reason.
#include "colossal/nn/hub_weights.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <filesystem>
#include <map>
#include <set>
#include <string>
#include <tuple>
#include <vector>

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

// Note [Weights of the pieces held]: a pipeline stage built with stand-ins for the other stages'
// pieces reads its own pieces' weights from a transformers-layout file and leaves the stand-ins as
// they are; the file must still hold every tensor of the model (by name), and a held tensor of the
// wrong shape is named.
TEST_F(Gpt2HubWeights, AStageBuiltAloneReadsItsOwnPiecesOnly) {
  ASSERT_GE(config_.n_layer, 2);
  // The embedding and block 0 whole; the other blocks and the head (ln_f) stand-ins.
  const auto built = [](size_t piece) { return piece <= 1; };
  GPT2 model(config_, nullptr, nullptr, built);
  std::set<std::string> held_names;
  const auto pieces = model.layers();
  for (size_t i = 0; i < pieces.size(); ++i) {
    if (!built(i)) continue;
    for (const auto& [name, tensor] : pieces[i]->state_dict()) held_names.insert(name);
  }
  ASSERT_TRUE(held_names.contains("wte.weight") && held_names.contains("h.0.attn.c_attn.weight"));
  ASSERT_FALSE(held_names.contains("h.1.attn.c_attn.weight"));
  const HeldTensors held = [&held_names](const std::string& name) { return held_names.contains(name); };
  std::map<std::string, std::vector<double>> stand_ins;
  for (const auto& [name, tensor] : model.state_dict()) {
    if (!held_names.contains(name)) stand_ins[name] = tensor.to(DType::f64).to_vector<double>();
  }

  StateDict hub;
  for (const auto& [name, tensor] : params_) hub.insert("transformer." + name, tensor);
  hub.insert("lm_head.weight", params_.at("wte.weight"));
  const fs::path path = temp_file("stage.safetensors");
  save_safetensors(path, hub, {{"format", "pt"}});
  const HubImportReport report = import_hub_weights(model, path, held);
  EXPECT_TRUE(report.stripped_transformer_prefix);
  EXPECT_NE(std::find(report.dropped.begin(), report.dropped.end(), "lm_head.weight (tied to wte.weight)"),
            report.dropped.end());
  for (const auto& [name, tensor] : model.state_dict()) {
    if (held_names.contains(name)) {
      EXPECT_EQ(tensor.to(DType::f64).to_vector<double>(), params_.at(name).to(DType::f64).to_vector<double>())
          << name << " not read";
    } else {
      EXPECT_EQ(tensor.to(DType::f64).to_vector<double>(), stand_ins.at(name)) << name << " (a stand-in) changed";
    }
  }

  // A tensor the stage does not hold is still required by name.
  StateDict missing = hub;
  missing.erase("transformer.h.1.mlp.c_fc.weight");
  save_safetensors(path, missing);
  std::string message = error_of([&] { import_hub_weights(model, path, held); });
  EXPECT_NE(message.find("h.1.mlp.c_fc.weight"), std::string::npos) << message;
  // One the model does not have is named too.
  StateDict extra = hub;
  extra.insert("transformer.h.9.mlp.c_fc.weight", core::ones({2, 2}));
  save_safetensors(path, extra);
  message = error_of([&] { import_hub_weights(model, path, held); });
  EXPECT_NE(message.find("h.9.mlp.c_fc.weight"), std::string::npos) << message;
  // A held tensor of another shape is named.
  StateDict misshapen = hub;
  misshapen.erase("transformer.h.0.mlp.c_fc.weight");
  misshapen.insert("transformer.h.0.mlp.c_fc.weight", core::ones({3, 5}));
  save_safetensors(path, misshapen);
  message = error_of([&] { import_hub_weights(model, path, held); });
  EXPECT_NE(message.find("h.0.mlp.c_fc.weight"), std::string::npos) << message;
  EXPECT_NE(message.find(path.filename().string()), std::string::npos) << message;
  fs::remove(path);
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

models::ViTConfig tiny_vit_config() {
  models::ViTConfig config = models::ViTConfig::vit_tiny_patch4_32(10);
  config.img_size = 32;
  config.patch_size = 8;
  config.embed_dim = 64;
  config.depth = 2;
  config.num_heads = 4;
  config.mlp_ratio = 4.0;
  return config;
}

// The Hub ships fp16 and bf16 weights for some models: into an f32 model they widen exactly, and
// the report lists each cast. A narrowing or kind-changing dtype (F64 or I32 where the model holds
// F32) is an error naming the tensor, the file and both dtypes, and loads nothing.
TEST(HubWeights, SixteenBitWidensExactlyOtherDtypesFailNamingBoth) {
  const SafetensorsFile golden = testing::load_golden("vit_tiny.safetensors");
  const StateDict params = testing::with_prefix(golden.tensors, "param.", DType::f32);
  const fs::path path = temp_file("vit_dtypes.safetensors");
  for (const DType half : {DType::f16, DType::bf16}) {
    SCOPED_TRACE(safetensors_dtype_name(half));
    StateDict stored;
    for (const auto& [name, tensor] : params) stored.insert(name, tensor.to(half));
    save_safetensors(path, stored, {{"format", "pt"}});
    models::VisionTransformer model(tiny_vit_config());
    const HubImportReport report = import_hub_weights(model, path);
    EXPECT_EQ(report.cast.size(), params.size());
    const std::string expected_cast = "cls_token " + safetensors_dtype_name(half) + " -> F32";
    EXPECT_NE(std::find(report.cast.begin(), report.cast.end(), expected_cast), report.cast.end())
        << "no \"" << expected_cast << "\" in the report";
    expect_equal_state(model.state_dict(), stored);  // every 16-bit value is an f32 value
    EXPECT_EQ(model.state_dict().at("cls_token").dtype(), DType::f32);
  }

  models::VisionTransformer model(tiny_vit_config());
  std::map<std::string, std::vector<double>> before;
  for (const auto& [name, tensor] : model.state_dict()) before[name] = tensor.to(DType::f64).to_vector<double>();
  const Tensor& qkv = params.at("blocks.0.attn.qkv.weight");
  std::vector<int32_t> bits(static_cast<size_t>(qkv.numel()), 1065353216);  // 1.0f read as an integer
  for (const auto& [name, value, stored_as] : std::vector<std::tuple<std::string, Tensor, std::string>>{
           {"blocks.0.attn.qkv.weight", core::from_vector(bits, qkv.shape()), "I32"},
           {"head.bias", params.at("head.bias").to(DType::f64), "F64"}}) {
    SCOPED_TRACE(name);
    StateDict stored = params;
    stored.insert_or_assign(name, value);
    save_safetensors(path, stored);
    const std::string message = error_of([&] { import_hub_weights(model, path); });
    EXPECT_NE(message.find(path.filename().string()), std::string::npos) << message;
    EXPECT_NE(message.find("'" + name + "' is stored as " + stored_as + " but the model holds F32"), std::string::npos)
        << message;
  }
  fs::remove(path);
  for (const auto& [name, tensor] : model.state_dict()) {
    EXPECT_EQ(tensor.to(DType::f64).to_vector<double>(), before.at(name)) << name << " changed by a failed load";
  }
}

// model.weights given a training checkpoint says what it is and how to get weights out of it.
TEST(HubWeights, TrainingCheckpointIsNamedWithExportAsTheWayOut) {
  const SafetensorsFile golden = testing::load_golden("vit_tiny.safetensors");
  StateDict checkpoint;
  for (const auto& [name, tensor] : testing::with_prefix(golden.tensors, "param.", DType::f32)) {
    checkpoint.insert("model." + name, tensor);
  }
  const fs::path path = temp_file("epoch4-step100.safetensors");
  save_safetensors(path, checkpoint, {{"format", kCheckpointFormat}, {"format_version", "1"}});
  models::VisionTransformer model(tiny_vit_config());
  const std::string message = error_of([&] { import_hub_weights(model, path); });
  fs::remove(path);
  EXPECT_NE(message.find("is a colossal training checkpoint"), std::string::npos) << message;
  EXPECT_NE(message.find("colossal export " + path.string() + " -o model.safetensors"), std::string::npos) << message;
  EXPECT_NE(message.find("--resume"), std::string::npos) << message;
}

}  // namespace
}  // namespace colossal::nn
