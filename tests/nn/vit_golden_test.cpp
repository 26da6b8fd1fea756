// ViT against timm's VisionTransformer (tests/data/golden/vit_tiny.safetensors, see its README):
// the file's parameters load by timm's own names, and logits, the label-smoothed loss, every
// gradient and three AdamW steps reproduce timm's float64 run; in float32 the forward and backward
// stay within float32's reach of it.
#include <gtest/gtest.h>

#include "colossal/nn/models/vit.h"
#include "colossal/ops.h"
#include "colossal/optim/adam.h"
#include "golden_util.h"

namespace colossal {
namespace {

using nn::models::VisionTransformer;
using nn::models::ViTConfig;
using testing::check_golden_f64_training;
using testing::ErrorTracker;
using testing::sorted_keys;
using testing::with_prefix;

// Tolerances: as in gpt2_golden_test.cpp. f64: the same function in float64 with sums in other
// orders (~1e-15 per operation), grown by two blocks and three Adam steps; 1e-9 still catches any
// real difference. f32: float32's 6e-8 unit roundoff over 64- to 192-wide dot products (the patch
// projection sums 3 * 8 * 8 = 192 terms) and two blocks; 1e-5 leaves margin.
constexpr double kF64Tolerance = 1e-9;
constexpr double kF32Tolerance = 1e-5;

/// The README's loss: cross-entropy with label smoothing 0.1.
Tensor vit_loss(const Tensor& logits, const Tensor& labels) {
  return ops::cross_entropy(logits, labels, {.label_smoothing = 0.1});
}

class ViTGolden : public ::testing::Test {
 protected:
  void SetUp() override {
    golden_ = testing::load_golden("vit_tiny.safetensors");
    config_ = ViTConfig::from_json(golden_.metadata.at("config"));
    ASSERT_EQ(golden_.metadata.at("model"), "vit");
  }
  const Tensor& at(const std::string& name) const { return golden_.tensors.at(name); }

  /// The model with the file's parameters, in dtype; the load is strict, so every name must match.
  std::unique_ptr<VisionTransformer> load_model(DType dtype) {
    auto model = std::make_unique<VisionTransformer>(config_);
    model->to(dtype);
    model->load_state_dict(with_prefix(golden_.tensors, "param.", dtype));
    return model;
  }

  nn::SafetensorsFile golden_;
  ViTConfig config_;
};

TEST_F(ViTGolden, ConfigComesFromTheFile) {
  EXPECT_EQ(config_.img_size, 32);
  EXPECT_EQ(config_.patch_size, 8);
  EXPECT_EQ(config_.in_chans, 3);
  EXPECT_EQ(config_.num_classes, 10);
  EXPECT_EQ(config_.embed_dim, 64);
  EXPECT_EQ(config_.depth, 2);
  EXPECT_EQ(config_.num_heads, 4);
  EXPECT_EQ(config_.mlp_ratio, 4.0);
  EXPECT_TRUE(config_.qkv_bias);
  VisionTransformer model(config_);
  EXPECT_EQ(sorted_keys(model.state_dict()), sorted_keys(with_prefix(golden_.tensors, "param.", DType::f64)));
}

TEST_F(ViTGolden, Float64ForwardBackwardAndThreeAdamWStepsMatchTimm) {
  auto model = load_model(DType::f64);
  const Tensor& images = at("input.images");
  const Tensor& labels = at("input.labels");

  check_golden_f64_training(
      *model, golden_, "vit", [&](nn::Module& m) { return m.forward(images); },
      [&](const Tensor& logits) { return vit_loss(logits, labels); }, kF64Tolerance);
}

TEST_F(ViTGolden, Float32ForwardAndBackwardStayWithinFloat32Error) {
  auto model = load_model(DType::f32);
  const Tensor logits = model->forward(at("input.images").to(DType::f32));
  EXPECT_EQ(logits.dtype(), DType::f32);
  const Tensor loss = vit_loss(logits, at("input.labels"));
  ErrorTracker tracker("vit f32 logits, loss, gradients", kF32Tolerance);
  tracker.check(logits, at("output.logits"), "logits");
  tracker.check(loss.reshape({1}), at("output.loss"), "loss");
  autograd::backward(loss);
  const nn::StateDict expected = with_prefix(golden_.tensors, "grad.", DType::f64);
  for (const auto& [name, param] : model->named_parameters()) {
    EXPECT_EQ(param.grad().dtype(), DType::f32) << name;
    tracker.check(param.grad(), expected.at(name), name);
  }
}

}  // namespace
}  // namespace colossal
