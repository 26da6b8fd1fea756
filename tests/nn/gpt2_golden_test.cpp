// GPT-2 against Hugging Face transformers' GPT2LMHeadModel (tests/data/golden/gpt2_tiny.safetensors,
// see its README): the file's parameters load by HF's own names, and logits, loss, every gradient
// and three AdamW steps reproduce transformers' float64 run; in float32 the forward and backward
// stay within float32's reach of it.
#include <gtest/gtest.h>

#include "colossal/nn/models/gpt2.h"
#include "colossal/ops.h"
#include "colossal/optim/adam.h"
#include "golden_util.h"

namespace colossal {
namespace {

using nn::models::GPT2;
using nn::models::GPT2Config;
using nn::models::lm_cross_entropy;
using testing::check_golden_f64_training;
using testing::ErrorTracker;
using testing::sorted_keys;
using testing::with_prefix;

// Tolerances. f64: both sides compute the same function in float64 with sums in different orders;
// that leaves errors of ~1e-15 relative per operation, grown by at most a few orders through two
// blocks and three Adam steps (whose update m / sqrt(v) amplifies relative gradient error only
// where v is tiny), so 1e-9 still catches any real difference (a wrong epsilon, mask or init
// formula is off by 1e-6 or more). f32: float32's 6e-8 unit roundoff accumulated over the
// 64-to-1000-wide dot products and two blocks stays around 1e-6; 1e-5 leaves margin.
constexpr double kF64Tolerance = 1e-9;
constexpr double kF32Tolerance = 1e-5;

class GPT2Golden : public ::testing::Test {
 protected:
  void SetUp() override {
    golden_ = testing::load_golden("gpt2_tiny.safetensors");
    config_ = GPT2Config::from_json(golden_.metadata.at("config"));
    ASSERT_EQ(golden_.metadata.at("model"), "gpt2");
  }
  const Tensor& at(const std::string& name) const { return golden_.tensors.at(name); }

  /// The model with the file's parameters, in dtype; the load is strict, so every name must match.
  std::unique_ptr<GPT2> load_model(DType dtype) {
    auto model = std::make_unique<GPT2>(config_);
    model->to(dtype);
    model->load_state_dict(with_prefix(golden_.tensors, "param.", dtype));
    return model;
  }

  nn::SafetensorsFile golden_;
  GPT2Config config_;
};

TEST_F(GPT2Golden, ConfigComesFromTheFile) {
  EXPECT_EQ(config_.vocab_size, 1000);
  EXPECT_EQ(config_.n_positions, 64);
  EXPECT_EQ(config_.n_embd, 64);
  EXPECT_EQ(config_.n_layer, 2);
  EXPECT_EQ(config_.n_head, 4);
  EXPECT_EQ(config_.dropout, 0.0);
  EXPECT_EQ(config_.layer_norm_epsilon, 1e-5);
  // The file holds exactly our parameters (the tied lm_head is wte itself, not a second tensor).
  GPT2 model(config_);
  EXPECT_EQ(sorted_keys(model.state_dict()), sorted_keys(with_prefix(golden_.tensors, "param.", DType::f64)));
}

TEST_F(GPT2Golden, Float64ForwardBackwardAndThreeAdamWStepsMatchTransformers) {
  auto model = load_model(DType::f64);
  const Tensor& ids = at("input.ids");
  const Tensor& targets = at("input.targets");

  check_golden_f64_training(
      *model, golden_, "gpt2", [&](nn::Module& m) { return m.forward(ids); },
      [&](const Tensor& logits) { return lm_cross_entropy(logits, targets); }, kF64Tolerance);
}

TEST_F(GPT2Golden, Float32ForwardAndBackwardStayWithinFloat32Error) {
  auto model = load_model(DType::f32);
  const Tensor logits = model->forward(at("input.ids"));
  EXPECT_EQ(logits.dtype(), DType::f32);
  const Tensor loss = lm_cross_entropy(logits, at("input.targets"));
  ErrorTracker tracker("gpt2 f32 logits, loss, gradients", kF32Tolerance);
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
