// Engine::step against a hand-written training loop (same bits), gradient accumulation against one
// large-batch step, and evaluate() without autograd.
#include "colossal/engine/engine.h"

#include <gtest/gtest.h>

#include <memory>
#include <vector>

#include "colossal/amp/mixed_precision_optimizer.h"  // AmpOptions
#include "colossal/autograd/engine.h"                // backward
#include "colossal/ops/nn_functional.h"              // cross_entropy
#include "colossal/optim/adam.h"
#include "colossal/optim/clip_grad.h"  // clip_grad_norm
#include "colossal/optim/lr_scheduler.h"
#include "colossal/optim/sgd.h"
#include "engine_test_util.h"

namespace colossal::engine {
namespace {

using testing::make_linear;
using testing::mse;
using testing::pattern;
using testing::rows_of;

optim::SgdOptions sgd_options() {
  optim::SgdOptions options;
  options.lr = 0.1;
  options.momentum = 0.9;
  options.weight_decay = 0.01;
  return options;
}

void expect_same_bits(const nn::Module& a, const nn::Module& b) {
  auto pa = a.named_parameters();
  auto pb = b.named_parameters();
  ASSERT_EQ(pa.size(), pb.size());
  for (size_t i = 0; i < pa.size(); ++i) {
    EXPECT_EQ(pa[i].second.to_vector<double>(), pb[i].second.to_vector<double>()) << pa[i].first;
  }
}

TEST(Engine, StepMatchesHandWrittenLoopBitwise) {
  constexpr int kSteps = 5;
  constexpr double kMaxNorm = 0.05;  // small enough that some steps clip
  auto reference = make_linear(4, 3, 7);
  auto reference_opt = std::make_shared<optim::Sgd>(reference->parameters(), sgd_options());
  optim::LinearWarmupLR reference_sched(*reference_opt, kSteps, 2);

  auto model = make_linear(4, 3, 7);
  auto opt = std::make_shared<optim::Sgd>(model->parameters(), sgd_options());
  auto sched = std::make_shared<optim::LinearWarmupLR>(*opt, kSteps, 2);
  EngineOptions options;
  options.clip_grad_norm = kMaxNorm;
  Engine engine(model, opt, mse, options, sched);
  engine.train();
  engine.zero_grad();

  bool clipped = false;
  for (int step = 0; step < kSteps; ++step) {
    Tensor x = core::from_vector(pattern(6, 4, 0.05 * step), {6, 4}, DType::f64);
    Tensor y = core::from_vector(pattern(6, 3, -0.1 * step), {6, 3}, DType::f64);

    Tensor reference_loss = mse(reference->forward(x), y);
    autograd::backward(reference_loss);
    const double reference_norm = optim::clip_grad_norm(reference->parameters(), kMaxNorm);
    reference_opt->step();
    reference_opt->zero_grad();
    reference_sched.step();

    Tensor loss = engine.step(x, y);
    EXPECT_TRUE(engine.last_step_updated());
    EXPECT_EQ(loss.item<double>(), reference_loss.item<double>()) << "step " << step;
    ASSERT_TRUE(engine.last_grad_norm().has_value());
    EXPECT_EQ(*engine.last_grad_norm(), reference_norm) << "step " << step;
    clipped = clipped || reference_norm > kMaxNorm;
    expect_same_bits(*model, *reference);
    EXPECT_EQ(opt->param_groups()[0].lr(), reference_opt->param_groups()[0].lr());
  }
  EXPECT_TRUE(clipped) << "the test should exercise clipping";
  EXPECT_EQ(engine.num_updates(), kSteps);
  EXPECT_EQ(sched->last_step(), kSteps);
}

TEST(Engine, Bf16CrossEntropyWithoutTheF32OutputCopyTrainsTheSame) {
  // AmpOptions::output_to_f32 = false hands the bf16 logits to cross_entropy, which computes in f32
  // and returns an f32 loss: the conversion it skips is exact, so losses and parameters match the
  // f32-output run bit for bit (the CPU kernel visits each row in the same order for both dtypes).
  auto run = [](bool output_to_f32) {
    core::Generator init(11);
    auto model = std::make_shared<nn::Linear>(6, 5, true, &init);
    optim::AdamOptions adam;
    adam.lr = 0.05;
    auto opt = std::make_shared<optim::AdamW>(model->parameters(), adam);
    EngineOptions options;
    options.amp = amp::AmpOptions::for_mode(amp::AmpMode::bf16);
    options.amp->output_to_f32 = output_to_f32;
    Engine engine(
        model, opt, [](const Tensor& out, const Tensor& y) { return ops::cross_entropy(out, y); }, options);
    engine.train();
    std::vector<double> losses;
    for (int step = 0; step < 4; ++step) {
      const Tensor x = core::from_vector(pattern(8, 6, 0.07 * step), {8, 6}).to(DType::f32);
      const Tensor y = core::from_vector<int64_t>({0, 4, 2, 1, 3, 3, 0, 2}, {8});
      const Tensor loss = engine.step(x, y);
      EXPECT_EQ(loss.dtype(), DType::f32);
      losses.push_back(loss.item<double>());
    }
    std::vector<std::vector<double>> params;
    for (const Tensor& p : engine.amp()->master_params()) params.push_back(p.to_vector<double>());
    for (const Tensor& p : model->parameters()) params.push_back(p.to_vector<double>());
    return std::pair{losses, params};
  };
  const auto [losses, params] = run(false);
  const auto [reference_losses, reference_params] = run(true);
  EXPECT_EQ(losses, reference_losses);
  EXPECT_EQ(params, reference_params);
  EXPECT_NE(losses.front(), losses.back()) << "the steps should train";
}

TEST(Engine, AccumulatingFourMicroBatchesOfTwoEqualsOneBatchOfEight) {
  const std::vector<double> inputs = pattern(8, 4, 0.2);
  const std::vector<double> targets = pattern(8, 3, -0.3);

  auto big = make_linear(4, 3, 11);
  auto big_opt = std::make_shared<optim::Sgd>(big->parameters(), sgd_options());
  Engine big_engine(big, big_opt, mse);
  big_engine.zero_grad();

  auto accumulated = make_linear(4, 3, 11);
  auto opt = std::make_shared<optim::Sgd>(accumulated->parameters(), sgd_options());
  EngineOptions options;
  options.gradient_accumulation = 4;
  Engine engine(accumulated, opt, mse, options);
  engine.zero_grad();

  const std::vector<double> initial = accumulated->parameters()[0].to_vector<double>();
  // Two updates, so the momentum buffer built from accumulated gradients is checked as well.
  for (int update = 0; update < 2; ++update) {
    big_engine.step(rows_of(inputs, 4, 0, 8), rows_of(targets, 3, 0, 8));
    for (int64_t micro = 0; micro < 4; ++micro) {
      engine.step(rows_of(inputs, 4, 2 * micro, 2 * micro + 2), rows_of(targets, 3, 2 * micro, 2 * micro + 2));
      EXPECT_EQ(engine.last_step_updated(), micro == 3);
      if (update == 0 && micro < 3) {
        EXPECT_EQ(accumulated->parameters()[0].to_vector<double>(), initial) << "updated inside the window";
      }
    }
    // The mean over 8 rows equals the mean of four means over 2 rows up to rounding: a few ulps of
    // values of order 1, far inside 1e-12.
    auto pb = big->parameters();
    auto pa = accumulated->parameters();
    for (size_t i = 0; i < pa.size(); ++i) {
      const auto a = pa[i].to_vector<double>();
      const auto b = pb[i].to_vector<double>();
      ASSERT_EQ(a.size(), b.size());
      for (size_t j = 0; j < a.size(); ++j) EXPECT_NEAR(a[j], b[j], 1e-12) << "update " << update;
    }
  }
  EXPECT_EQ(engine.num_updates(), 2);
}

TEST(Engine, EvaluateRecordsNoGraph) {
  auto model = make_linear(4, 3, 3);
  auto opt = std::make_shared<optim::Sgd>(model->parameters(), sgd_options());
  Engine engine(model, opt, mse);
  engine.eval();
  EXPECT_FALSE(model->is_training());
  Tensor out = engine.evaluate(core::from_vector(pattern(2, 4, 0.0), {2, 4}, DType::f64));
  EXPECT_FALSE(out.requires_grad());
  EXPECT_EQ(out.shape(), (Shape{2, 3}));
  engine.train();
  EXPECT_TRUE(model->is_training());
}

TEST(Engine, RejectsBadOptions) {
  auto model = make_linear(4, 3, 3);
  auto opt = std::make_shared<optim::Sgd>(model->parameters(), sgd_options());
  EngineOptions options;
  options.gradient_accumulation = 0;
  EXPECT_ANY_THROW(Engine(model, opt, mse, options));
  EXPECT_ANY_THROW(Engine(model, opt, Criterion{}));
}

}  // namespace
}  // namespace colossal::engine
