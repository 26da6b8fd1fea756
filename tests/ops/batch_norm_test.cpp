// batch_norm2d: gradient checks in training and evaluation (with and without affine parameters),
// hand-derived outputs and running-statistic updates, reduced precision, bad input; batch_norm_relu2d.
#include <gtest/gtest.h>

#include <cmath>

#include "colossal/core/view.h"  // cast_raw
#include "gradcheck.h"

namespace colossal {
namespace {

using testing::check_gradients;
using testing::expect_close;
using testing::expect_values;
using testing::random_leaf;
using testing::random_tensor;

/// Gradient check of batch_norm2d on x [2, 3, 2, 2] (8 values per channel).
void check_batch_norm(bool training, bool affine) {
  check_gradients({.make_inputs =
                       [=] {
                         // Running statistics are plain tensors passed through; variances kept positive.
                         return std::vector<Tensor>{random_leaf({2, 3, 2, 2}, 1),
                                                    affine ? random_leaf({3}, 2) : Tensor(),
                                                    affine ? random_leaf({3}, 3) : Tensor(),
                                                    random_tensor({3}, 4, -0.5, 0.5), random_tensor({3}, 5, 0.5, 2.0)};
                       },
                   .fn =
                       [=](const std::vector<Tensor>& in) {
                         Tensor running_mean = in[3], running_var = in[4];
                         return ops::batch_norm2d(in[0], running_mean, running_var, in[1], in[2], training, 0.1, 1e-3);
                       }});
}

TEST(GradCheck, batch_norm2d) {
  check_batch_norm(true, true);
}
TEST(GradCheck, batch_norm2d_eval) {
  check_batch_norm(false, true);
}
TEST(GradCheck, batch_norm2d_no_affine) {
  check_batch_norm(true, false);
}
TEST(GradCheck, batch_norm2d_eval_no_affine) {
  check_batch_norm(false, false);
}

TEST(BatchNorm2d, TrainingValuesAndRunningStats) {
  // Channel 0 holds 1, 2, 3, 4 (two images, two pixels each): mean 2.5, biased variance
  // (2.25 + 0.25 + 0.25 + 2.25) / 4 = 1.25, unbiased 5 / 3. Channel 1 holds 10, 10, 10, 14:
  // mean 11, biased variance (1 + 1 + 1 + 9) / 4 = 3, unbiased 4.
  Tensor x = core::from_vector<double>({1, 2, 10, 10, 3, 4, 10, 14}, {2, 2, 1, 2});
  Tensor running_mean = core::from_vector<double>({0, 1}, {2});
  Tensor running_var = core::from_vector<double>({1, 2}, {2});
  Tensor weight = core::from_vector<double>({2, -1}, {2});
  Tensor bias = core::from_vector<double>({1, 0.5}, {2});
  const double eps = 1e-5;
  Tensor y = ops::batch_norm2d(x, running_mean, running_var, weight, bias, true, 0.1, eps);
  // y = (x - mean) / sqrt(var + eps) * weight + bias per channel.
  const double s0 = 2.0 / std::sqrt(1.25 + eps), s1 = -1.0 / std::sqrt(3.0 + eps);
  expect_values(y,
                {-1.5 * s0 + 1, -0.5 * s0 + 1, -1 * s1 + 0.5, -1 * s1 + 0.5, 0.5 * s0 + 1, 1.5 * s0 + 1, -1 * s1 + 0.5,
                 3 * s1 + 0.5},
                1e-14);
  // running = 0.9 * running + 0.1 * batch: means 0.9*0 + 0.25 = 0.25 and 0.9*1 + 1.1 = 2.0;
  // variances 0.9*1 + 0.1*5/3 and 0.9*2 + 0.1*4 = 2.2.
  expect_values(running_mean, {0.25, 2.0}, 1e-15);
  expect_values(running_var, {0.9 + 0.5 / 3.0, 2.2}, 1e-15);
}

TEST(BatchNorm2d, EvalUsesRunningStats) {
  // Evaluation: y = (x - running_mean) / sqrt(running_var + eps), eps = 0 aside from the
  // required positivity (1e-12 changes nothing at this precision); the statistics stay unchanged.
  Tensor x = core::from_vector<double>({1, 2, 3, 4}, {1, 2, 1, 2});
  Tensor running_mean = core::from_vector<double>({1, -1}, {2});
  Tensor running_var = core::from_vector<double>({4, 0.25}, {2});
  Tensor y = ops::batch_norm2d(x, running_mean, running_var, Tensor(), Tensor(), false, 0.1, 1e-12);
  // Channel 0: (1 - 1) / 2 = 0, (2 - 1) / 2 = 0.5; channel 1: (3 + 1) / 0.5 = 8, (4 + 1) / 0.5 = 10.
  expect_values(y, {0, 0.5, 8, 10}, 1e-10);
  expect_values(running_mean, {1, -1});
  expect_values(running_var, {4, 0.25});
}

TEST(BatchNorm2d, ReluIsBatchNormThenRelu) {
  // batch_norm_relu2d on the CPU (no fused kernels) is relu(batch_norm2d(...)), in both layouts:
  // the same values and running statistics; and its gradient is checked by finite differences.
  for (const ops::ImageLayout layout : {ops::ImageLayout::nchw, ops::ImageLayout::nhwc}) {
    // [2, 3, 3, 3]: three channels in either layout.
    const Tensor x = random_leaf({2, 3, 3, 3}, 11), weight = random_leaf({3}, 12), bias = random_leaf({3}, 13);
    Tensor mean_a = core::zeros({3}, DType::f64), var_a = core::ones({3}, DType::f64);
    Tensor mean_b = core::zeros({3}, DType::f64), var_b = core::ones({3}, DType::f64);
    const Tensor fused = ops::batch_norm_relu2d(x, mean_a, var_a, weight, bias, true, 0.1, 1e-5, layout);
    const Tensor composed = ops::relu(ops::batch_norm2d(x, mean_b, var_b, weight, bias, true, 0.1, 1e-5, layout));
    expect_close(fused, composed, 0, 0, "batch_norm_relu2d");
    expect_close(mean_a, mean_b, 0, 0, "running mean");
  }
  check_gradients(
      {.make_inputs =
           [] {
             return std::vector<Tensor>{random_leaf({2, 3, 2, 2}, 21), random_leaf({3}, 22), random_leaf({3}, 23)};
           },
       .fn =
           [](const std::vector<Tensor>& in) {
             Tensor running_mean, running_var;
             return ops::batch_norm_relu2d(in[0], running_mean, running_var, in[1], in[2], true, 0.1, 1e-3);
           }});
}

TEST(BatchNorm2d, AddReluIsBatchNormThenAddThenRelu) {
  // batch_norm_add_relu2d on the CPU is relu(batch_norm2d(x) + residual), in both layouts; its
  // gradients (x, weight, bias and the residual's) by finite differences; bad residuals are errors.
  for (const ops::ImageLayout layout : {ops::ImageLayout::nchw, ops::ImageLayout::nhwc}) {
    const Tensor x = random_leaf({2, 3, 3, 3}, 31), weight = random_leaf({3}, 32), bias = random_leaf({3}, 33);
    const Tensor residual = random_leaf({2, 3, 3, 3}, 34);
    Tensor mean_a = core::zeros({3}, DType::f64), var_a = core::ones({3}, DType::f64);
    Tensor mean_b = core::zeros({3}, DType::f64), var_b = core::ones({3}, DType::f64);
    const Tensor fused = ops::batch_norm_add_relu2d(x, residual, mean_a, var_a, weight, bias, true, 0.1, 1e-5, layout);
    const Tensor composed =
        ops::relu(ops::add(ops::batch_norm2d(x, mean_b, var_b, weight, bias, true, 0.1, 1e-5, layout), residual));
    expect_close(fused, composed, 0, 0, "batch_norm_add_relu2d");
    expect_close(var_a, var_b, 0, 0, "running var");
  }
  check_gradients({.make_inputs =
                       [] {
                         return std::vector<Tensor>{random_leaf({2, 3, 2, 2}, 41), random_leaf({3}, 42),
                                                    random_leaf({3}, 43), random_leaf({2, 3, 2, 2}, 44)};
                       },
                   .fn =
                       [](const std::vector<Tensor>& in) {
                         Tensor running_mean, running_var;
                         return ops::batch_norm_add_relu2d(in[0], in[3], running_mean, running_var, in[1], in[2], true,
                                                           0.1, 1e-3);
                       }});
  Tensor mean, var;
  const Tensor x = random_leaf({2, 3, 2, 2}, 51);
  EXPECT_ERROR_CONTAINS(
      ops::batch_norm_add_relu2d(x, random_leaf({2, 3, 2, 1}, 52), mean, var, Tensor(), Tensor(), true),
      "the residual must have x's shape [2, 3, 2, 2], got shape [2, 3, 2, 1]");
  EXPECT_ERROR_CONTAINS(ops::batch_norm_add_relu2d(x, Tensor(), mean, var, Tensor(), Tensor(), true),
                        "the residual must be defined");
}

TEST(BatchNorm2d, TrainingGradientHandDerived) {
  // With weight 1 and dL/dy = 1 everywhere, the output's sum is fixed (zero-mean normalisation),
  // so dL/dx = 0; dL/dbias = count = 4; dL/dweight = sum(xhat) = 0.
  Tensor x = core::from_vector<double>({1, 2, 3, 5}, {2, 1, 1, 2});
  x.set_requires_grad(true);
  Tensor weight = core::ones({1}, DType::f64);
  weight.set_requires_grad(true);
  Tensor bias = core::zeros({1}, DType::f64);
  bias.set_requires_grad(true);
  Tensor running_mean = core::zeros({1}, DType::f64), running_var = core::ones({1}, DType::f64);
  autograd::backward(ops::sum(ops::batch_norm2d(x, running_mean, running_var, weight, bias, true)));
  // Sums of four O(1) terms that cancel: 1e-14 of rounding.
  expect_values(x.grad(), {0, 0, 0, 0}, 1e-14);
  expect_values(weight.grad(), {0}, 1e-14);
  expect_values(bias.grad(), {4});
}

TEST(BatchNorm2d, WithoutRunningStatsInTraining) {
  // Undefined running statistics (track_running_stats=False): batch statistics only.
  Tensor x = random_tensor({2, 2, 3, 3}, 10);
  Tensor none_mean, none_var;
  Tensor y = ops::batch_norm2d(x, none_mean, none_var, Tensor(), Tensor(), true);
  // Each channel of y then has mean 0 and biased variance var / (var + eps) ~ 1 - eps / var;
  // with var ~ 1/3 (uniform [-1, 1]) that is 1 - 3e-5; 1e-4 covers it.
  Tensor mean = ops::mean(y, {0, 2, 3});
  Tensor var = ops::var(y, {0, 2, 3}, 0);
  expect_values(mean, {0, 0}, 1e-14);
  expect_values(var, {1, 1}, 1e-4);
}

TEST(BatchNorm2d, ReducedPrecisionMatchesF64) {
  // f16 x with f32 running statistics (the mixed-precision layout): normalised outputs are O(3)
  // and f16 rounds them by <= 3 * 2^-11 = 1.5e-3; statistics are computed in f64 from the same
  // (f16-exact) inputs, so running stats agree with the f64 path to f32 rounding (1e-6).
  Tensor x16 = random_tensor({2, 3, 4, 4}, 20, -2, 2, DType::f16);
  Tensor x64 = core::cast_raw(x16, DType::f64);
  Tensor w = random_tensor({3}, 21), b = random_tensor({3}, 22);
  Tensor mean32 = core::zeros({3}, DType::f32), var32 = core::ones({3}, DType::f32);
  Tensor mean64 = core::zeros({3}, DType::f64), var64 = core::ones({3}, DType::f64);
  Tensor y16 =
      ops::batch_norm2d(x16, mean32, var32, core::cast_raw(w, DType::f16), core::cast_raw(b, DType::f16), true);
  Tensor y64 = ops::batch_norm2d(x64, mean64, var64, core::cast_raw(core::cast_raw(w, DType::f16), DType::f64),
                                 core::cast_raw(core::cast_raw(b, DType::f16), DType::f64), true);
  EXPECT_EQ(y16.dtype(), DType::f16);
  EXPECT_EQ(mean32.dtype(), DType::f32);
  expect_close(y16, y64, 3e-3, 0.0, "y");
  expect_close(mean32, mean64, 1e-6, 1e-6, "running mean");
  expect_close(var32, var64, 1e-6, 1e-6, "running var");
}

TEST(BatchNorm2d, NonContiguousRunningStatsUpdated) {
  // Running statistics that are strided views must still be updated in place.
  Tensor storage_mean = core::zeros({2, 2}, DType::f64), storage_var = core::ones({2, 2}, DType::f64);
  Tensor running_mean = core::select_raw(storage_mean, 1, 0), running_var = core::select_raw(storage_var, 1, 0);
  Tensor x = core::from_vector<double>({1, 2, 3, 4}, {2, 2, 1, 1});  // channel 0: 1, 3; channel 1: 2, 4
  ops::batch_norm2d(x, running_mean, running_var, Tensor(), Tensor(), true, 0.5);
  // means 2 and 3, unbiased variances 2 and 2: running = 0.5 * old + 0.5 * batch.
  expect_values(storage_mean, {1, 0, 1.5, 0});
  expect_values(storage_var, {1.5, 1, 1.5, 1});
}

TEST(BatchNorm2d, BadInputs) {
  Tensor x = random_tensor({2, 3, 2, 2}, 30);
  Tensor mean = core::zeros({3}, DType::f64), var = core::ones({3}, DType::f64);
  Tensor bad_mean = core::zeros({4}, DType::f64);
  EXPECT_ERROR_CONTAINS(ops::batch_norm2d(random_tensor({2, 3, 4}, 31), mean, var, Tensor(), Tensor(), true),
                        "[2, 3, 4]");
  EXPECT_ERROR_CONTAINS(ops::batch_norm2d(x, bad_mean, var, Tensor(), Tensor(), true),
                        "running_mean of shape [3] (the channels of x, shape [2, 3, 2, 2]), got shape [4]");
  EXPECT_ERROR_CONTAINS(ops::batch_norm2d(x, mean, var, random_tensor({2}, 32), Tensor(), true), "weight of shape [3]");
  EXPECT_ERROR_CONTAINS(ops::batch_norm2d(x, mean, var, Tensor(), random_tensor({3}, 33, -1, 1, DType::f32), true),
                        "bias is f32 but x is f64");
  Tensor single = random_tensor({1, 3, 1, 1}, 34);
  EXPECT_ERROR_CONTAINS(ops::batch_norm2d(single, mean, var, Tensor(), Tensor(), true),
                        "more than one value per channel");
  Tensor none_mean, none_var;
  EXPECT_ERROR_CONTAINS(ops::batch_norm2d(x, none_mean, none_var, Tensor(), Tensor(), false),
                        "evaluation mode needs running_mean");
  EXPECT_ERROR_CONTAINS(ops::batch_norm2d(x, mean, var, Tensor(), Tensor(), true, 0.1, 0.0), "eps must be positive");
}

}  // namespace
}  // namespace colossal
