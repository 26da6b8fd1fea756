// The basic layers: Linear, Conv1D, Embedding, LayerNorm, Conv2d, BatchNorm2d, Dropout, DropPath
// and GELU. Each forward against hand values or a hand-written composition, gradient checks in f64
// reaching every parameter, parameter names and shapes as PyTorch/Hugging Face name them, and
// bad arguments.
#include <gtest/gtest.h>

#include <cmath>

#include "colossal/core/view.h"
#include "colossal/nn/activation.h"
#include "colossal/nn/batch_norm.h"
#include "colossal/nn/conv.h"
#include "colossal/nn/dropout.h"
#include "colossal/nn/embedding.h"
#include "colossal/nn/init.h"
#include "colossal/nn/layer_norm.h"
#include "colossal/nn/linear.h"
#include "gradcheck.h"

namespace colossal {
namespace {

using testing::check_gradients;
using testing::expect_close;
using testing::expect_values;
using testing::random_tensor;

std::vector<std::string> parameter_names(const nn::Module& m) {
  std::vector<std::string> out;
  for (const auto& [name, tensor] : m.named_parameters()) out.push_back(name);
  return out;
}

/// Converts a module to f64 and gives every parameter distinct random values (ones and zeros, as
/// LayerNorm starts, would hide a gradient that ignores the weight).
void prepare_for_gradcheck(nn::Module& m, uint64_t seed) {
  m.to(DType::f64);
  core::Generator gen(seed);
  for (Tensor& p : m.parameters()) nn::init::uniform_(p, -1.0, 1.0, &gen);
}

/// A gradient check of module(x) over x and every parameter of the module.
void check_module_gradients(const std::shared_ptr<nn::Module>& module, const Shape& x_shape, uint64_t seed) {
  prepare_for_gradcheck(*module, seed);
  check_gradients({.make_inputs =
                       [&] {
                         std::vector<Tensor> inputs{testing::random_leaf(x_shape, seed + 1)};
                         for (Tensor& p : module->parameters()) {
                           p.set_grad(Tensor());  // each make_inputs starts a fresh accumulation
                           inputs.push_back(p);
                         }
                         return inputs;
                       },
                   .fn = [&](const std::vector<Tensor>& in) { return module->forward(in[0]); }});
}

TEST(Linear, HandValues) {
  nn::Linear layer(3, 2);
  EXPECT_EQ(parameter_names(layer), (std::vector<std::string>{"weight", "bias"}));
  EXPECT_EQ(layer.weight().shape(), (Shape{2, 3}));  // [out, in] as torch
  layer.weight().copy_(core::from_vector<float>({1, 2, 3, -1, 0, 1}, {2, 3}));
  layer.bias().copy_(core::from_vector<float>({0.5, -0.5}, {2}));
  const Tensor x = core::from_vector<float>({1, 1, 1, 2, 0, -1}, {2, 3});
  // rows: [1+2+3+0.5, -1+0+1-0.5] = [6.5, -0.5]; [2+0-3+0.5, -2+0-1-0.5] = [-0.5, -3.5]
  expect_values(layer(x), {6.5, -0.5, -0.5, -3.5});
  nn::Linear no_bias(3, 2, false);
  EXPECT_EQ(parameter_names(no_bias), std::vector<std::string>{"weight"});
  EXPECT_FALSE(no_bias.bias().defined());
  EXPECT_ERROR_CONTAINS(nn::Linear(0, 2), "features must be positive, got in 0 and out 2");
  EXPECT_ERROR_CONTAINS(layer(core::ones({2, 4})), "weight [2, 3] expects 3");
}

TEST(Linear, DefaultInitBounds) {
  core::Generator gen(1);
  nn::Linear layer(64, 32, true, &gen);
  // PyTorch's default: both weight and bias within 1 / sqrt(in_features) = 0.125.
  for (const Tensor& p : layer.parameters()) {
    for (float v : p.to_vector<float>()) EXPECT_LE(std::abs(v), 0.125f);
  }
  core::Generator same(1);
  nn::Linear again(64, 32, true, &same);
  EXPECT_EQ(again.weight().to_vector<float>(), layer.weight().to_vector<float>());  // seeded
}

TEST(GradCheck, Linear) {
  check_module_gradients(std::make_shared<nn::Linear>(4, 3), {2, 2, 4}, 10);
}

TEST(Conv1D, IsXTimesWeightPlusBias) {
  nn::Conv1D layer(3, 2);
  EXPECT_EQ(layer.weight().shape(), (Shape{3, 2}));  // [in, out] as Hugging Face's GPT-2
  EXPECT_EQ(layer.bias().to_vector<float>(), std::vector<float>(2, 0.0f));
  layer.weight().copy_(core::from_vector<float>({1, -1, 2, 0, 3, 1}, {3, 2}));
  layer.bias().copy_(core::from_vector<float>({0.5, -0.5}, {2}));
  // [1, 1, 1] W = [1+2+3, -1+0+1] = [6, 0], plus bias
  expect_values(layer(core::from_vector<float>({1, 1, 1}, {1, 1, 3})), {6.5, -0.5});
}

TEST(GradCheck, Conv1D) {
  check_module_gradients(std::make_shared<nn::Conv1D>(4, 3), {2, 3, 4}, 20);
}

TEST(Embedding, LooksUpRowsAndSkipsPadding) {
  nn::Embedding table(5, 3, /*padding_idx=*/-1);  // -1 wraps to row 4, as torch
  EXPECT_EQ(table.padding_idx(), 4);
  expect_values(core::select_raw(table.weight(), 0, 4), {0, 0, 0});
  table.to(DType::f64);
  const Tensor ids = core::from_vector<int64_t>({2, 4, 2, 0}, {2, 2});
  const Tensor out = table(ids);
  EXPECT_EQ(out.shape(), (Shape{2, 2, 3}));
  expect_close(out.select(0, 0).select(0, 0), table.weight().select(0, 2), 0.0, 0.0);
  autograd::backward(ops::sum(out));
  // Row 2 is used twice, row 0 once, the padding row 4 gets nothing (as torch's padding_idx).
  expect_values(table.weight().grad(), {1, 1, 1, 0, 0, 0, 2, 2, 2, 0, 0, 0, 0, 0, 0});
  EXPECT_ERROR_CONTAINS(nn::Embedding(5, 3, 5), "padding_idx 5 is out of range for 5 embeddings (valid: -5..4)");
}

TEST(GradCheck, Embedding) {
  auto table = std::make_shared<nn::Embedding>(6, 3);
  prepare_for_gradcheck(*table, 30);
  check_gradients({.make_inputs = [&] { return std::vector<Tensor>{table->weight()}; },
                   .fn =
                       [&](const std::vector<Tensor>&) {
                         return table->forward(core::from_vector<int64_t>({1, 5, 1, 3}, {4}));
                       }});
}

TEST(LayerNorm, MatchesTheComposition) {
  nn::LayerNorm norm(Shape{4}, 1e-5);
  EXPECT_EQ(parameter_names(norm), (std::vector<std::string>{"weight", "bias"}));
  prepare_for_gradcheck(norm, 40);
  const Tensor x = random_tensor({3, 4}, 41, -2.0, 2.0);
  const Tensor mean = ops::mean(x, {-1}, true);
  const Tensor var = ops::var(x, {-1}, /*correction=*/0, true);
  const Tensor expected =
      ops::add(ops::mul(ops::div(ops::sub(x, mean), ops::sqrt(ops::add(var, 1e-5))), norm.weight()), norm.bias());
  // f64 throughout: two ways of summing four numbers agree to ~1e-15 relative.
  expect_close(norm(x), expected, 1e-12, 1e-12, "layer norm");

  nn::LayerNorm plain(4, 1e-6, /*elementwise_affine=*/false);
  EXPECT_TRUE(plain.parameters().empty());
  nn::LayerNorm no_bias(4, 1e-6, true, /*bias=*/false);
  EXPECT_EQ(parameter_names(no_bias), std::vector<std::string>{"weight"});
  EXPECT_ERROR_CONTAINS(nn::LayerNorm(Shape{}), "at least one dimension");
}

TEST(GradCheck, LayerNorm) {
  check_module_gradients(std::make_shared<nn::LayerNorm>(Shape{2, 3}), {2, 2, 3}, 50);
}

TEST(Conv2d, HandValues) {
  nn::Conv2d conv(1, 1, 2, nn::Conv2dOptions{.stride = {1, 1}});
  EXPECT_EQ(conv.weight().shape(), (Shape{1, 1, 2, 2}));
  conv.weight().copy_(core::from_vector<float>({1, 0, 0, -1}, {1, 1, 2, 2}));
  conv.bias().fill_(0.5);
  // x = [[1 2 3], [4 5 6], [7 8 9]]; each output is x[i][j] - x[i+1][j+1] + 0.5 = -4 + 0.5.
  const Tensor x = core::from_vector<float>({1, 2, 3, 4, 5, 6, 7, 8, 9}, {1, 1, 3, 3});
  expect_values(conv(x), {-3.5, -3.5, -3.5, -3.5});

  nn::Conv2d grouped(4, 6, {3, 1}, nn::Conv2dOptions{.padding = {1, 0}, .groups = 2, .bias = false});
  EXPECT_EQ(grouped.weight().shape(), (Shape{6, 2, 3, 1}));
  EXPECT_EQ(parameter_names(grouped), std::vector<std::string>{"weight"});
  EXPECT_EQ(grouped(core::ones({1, 4, 5, 5})).shape(), (Shape{1, 6, 5, 5}));
  EXPECT_ERROR_CONTAINS(nn::Conv2d(4, 6, 3, nn::Conv2dOptions{.groups = 3}),
                        "groups 3 must divide both in_channels 4 and out_channels 6");
}

TEST(GradCheck, Conv2d) {
  check_module_gradients(std::make_shared<nn::Conv2d>(2, 2, 2, nn::Conv2dOptions{.stride = {2, 1}, .padding = {1, 0}}),
                         {1, 2, 3, 3}, 60);
}

TEST(BatchNorm2d, TrainingUpdatesRunningStatsAndEvalUsesThem) {
  nn::BatchNorm2d bn(2);
  EXPECT_EQ(parameter_names(bn), (std::vector<std::string>{"weight", "bias"}));
  EXPECT_EQ(bn.state_dict().keys(),
            (std::vector<std::string>{"weight", "bias", "running_mean", "running_var", "num_batches_tracked"}));
  bn.to(DType::f64);
  // Channel 0 holds {1, 2, 3, 4}, channel 1 holds {-1, 1, -1, 1} (N = 2, H = 1, W = 2).
  const Tensor x = core::from_vector<double>({1, 2, -1, 1, 3, 4, -1, 1}, {2, 2, 1, 2});
  const Tensor y = bn(x);
  // Batch statistics: channel 0 mean 2.5, biased var 1.25; y = (x - 2.5) / sqrt(1.25 + 1e-5).
  const double s0 = std::sqrt(1.25 + 1e-5);
  expect_values(y.select(1, 0).flatten(), {-1.5 / s0, -0.5 / s0, 0.5 / s0, 1.5 / s0}, 1e-12);
  // running = 0.9 * initial + 0.1 * batch, the variance unbiased: 1.25 * 4/3 and 1 * 4/3.
  expect_values(bn.running_mean(), {0.25, 0.0}, 1e-15);
  expect_values(bn.running_var(), {0.9 + 0.1 * 5.0 / 3.0, 0.9 + 0.1 * 4.0 / 3.0}, 1e-15);
  EXPECT_EQ(bn.num_batches_tracked().item<int64_t>(), 1);

  bn.eval();
  const Tensor y_eval = bn(x);
  const double rv0 = 0.9 + 0.1 * 5.0 / 3.0;
  expect_values(y_eval.select(1, 0).flatten(),
                {(1 - 0.25) / std::sqrt(rv0 + 1e-5), (2 - 0.25) / std::sqrt(rv0 + 1e-5),
                 (3 - 0.25) / std::sqrt(rv0 + 1e-5), (4 - 0.25) / std::sqrt(rv0 + 1e-5)},
                1e-12);
  EXPECT_EQ(bn.num_batches_tracked().item<int64_t>(), 1);  // evaluation does not count
  expect_values(bn.running_mean(), {0.25, 0.0}, 1e-15);
}

TEST(BatchNorm2d, CumulativeMomentumAveragesBatches) {
  nn::BatchNorm2d bn(1, 1e-5, /*momentum=*/std::nullopt);
  bn.to(DType::f64);
  bn(core::from_vector<double>({1, 3}, {1, 1, 1, 2}));  // batch mean 2
  bn(core::from_vector<double>({5, 7}, {1, 1, 1, 2}));  // batch mean 6
  // momentum 1/1 then 1/2: running_mean = the plain average of batch means, 4.
  expect_values(bn.running_mean(), {4.0}, 1e-15);
  EXPECT_EQ(bn.num_batches_tracked().item<int64_t>(), 2);
}

TEST(BatchNorm2d, WithoutRunningStatsAlwaysUsesTheBatch) {
  nn::BatchNorm2d bn(1, 1e-5, 0.1, /*affine=*/false, /*track_running_stats=*/false);
  EXPECT_TRUE(bn.state_dict().empty());
  bn.to(DType::f64);
  bn.eval();
  const double s = std::sqrt(1.0 + 1e-5);  // {1, 3}: mean 2, biased var 1
  expect_values(bn(core::from_vector<double>({1, 3}, {1, 1, 1, 2})), {-1 / s, 1 / s}, 1e-12);
}

TEST(GradCheck, BatchNorm2d) {
  check_module_gradients(std::make_shared<nn::BatchNorm2d>(2), {2, 2, 2, 2}, 70);
}

TEST(Dropout, IdentityInEvalAndScalesInTraining) {
  core::Generator gen(3);
  nn::Dropout drop(0.5, &gen);
  const Tensor x = core::full({1000}, 2.0, DType::f64);
  drop.eval();
  EXPECT_TRUE(drop(x).is_same(x));
  drop.train();
  const std::vector<double> y = drop(x).to_vector<double>();
  int kept = 0;
  for (double v : y) {
    EXPECT_TRUE(v == 0.0 || v == 4.0) << v;  // dropped, or kept and scaled by 1 / (1 - 0.5)
    kept += v != 0.0;
  }
  // Binomial(1000, 0.5): std 15.8; 100 is over 6 std.
  EXPECT_NEAR(kept, 500, 100);
  EXPECT_TRUE(nn::Dropout(0.0)(x).is_same(x));
  EXPECT_ERROR_CONTAINS(nn::Dropout(1.5), "p must be in [0, 1], got 1.5");
}

TEST(DropPath, DropsWholeSamplesAndScalesSurvivors) {
  core::Generator gen(4);
  nn::DropPath drop_path(0.25, &gen);
  const Tensor x = testing::random_leaf({400, 3, 2}, 5, 1.0, 2.0);  // never zero
  drop_path.eval();
  EXPECT_TRUE(drop_path(x).is_same(x));
  drop_path.train();
  const Tensor y = drop_path(x);
  autograd::backward(ops::sum(y));
  const std::vector<double> xv = x.to_vector<double>(), yv = y.to_vector<double>(), gv = x.grad().to_vector<double>();
  int kept = 0;
  for (int64_t b = 0; b < 400; ++b) {
    const bool sample_kept = yv[b * 6] != 0.0;
    kept += sample_kept;
    for (int64_t i = b * 6; i < b * 6 + 6; ++i) {
      // Every element of a sample shares its fate; survivors are scaled by 1 / 0.75.
      EXPECT_NEAR(yv[i], sample_kept ? xv[i] / 0.75 : 0.0, 1e-15);
      EXPECT_NEAR(gv[i], sample_kept ? 1.0 / 0.75 : 0.0, 1e-15);
    }
  }
  // Binomial(400, 0.75): mean 300, std 8.7; 45 is over 5 std.
  EXPECT_NEAR(kept, 300, 45);
  EXPECT_TRUE(nn::DropPath(0.0)(x).is_same(x));
  nn::DropPath all(1.0);
  expect_values(all(core::ones({2, 2})), {0, 0, 0, 0});
}

TEST(GELU, ExactAndTanhValues) {
  const Tensor x = core::from_vector<double>({-1.0, 0.0, 1.0}, {3});
  // x * Phi(x): Phi(1) = 0.8413447460685429.
  expect_values(nn::GELU()(x), {-0.15865525393145707, 0.0, 0.8413447460685429}, 1e-15);
  // 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3))) at 1: 0.8411919906082768.
  expect_values(nn::GELU(ops::GeluApproximation::tanh)(x), {-0.15880800939172324, 0.0, 0.8411919906082768}, 1e-15);
}

}  // namespace
}  // namespace colossal
