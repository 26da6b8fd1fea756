// layer_norm: gradient checks with and without the affine parameters and over several trailing
// dimensions, values derived by hand, f32/f64 and half-precision agreement, and bad input.
#include <gtest/gtest.h>

#include <cmath>

#include "gradcheck.h"

namespace colossal {
namespace {

using testing::check_gradients;
using testing::expect_close;
using testing::expect_values;
using testing::random_leaf;
using testing::random_tensor;

TEST(GradCheck, layer_norm) {
  check_gradients({.make_inputs =
                       [] {
                         return std::vector<Tensor>{random_leaf({3, 5}, 1, -2, 2), random_leaf({5}, 2, 0.5, 1.5),
                                                    random_leaf({5}, 3)};
                       },
                   .fn = [](const std::vector<Tensor>& in) { return ops::layer_norm(in[0], {5}, in[1], in[2]); }});
}
TEST(GradCheck, layer_norm_two_normalized_dims) {
  check_gradients({.make_inputs =
                       [] {
                         return std::vector<Tensor>{random_leaf({2, 3, 4}, 4, -2, 2), random_leaf({3, 4}, 5, 0.5, 1.5),
                                                    random_leaf({3, 4}, 6)};
                       },
                   .fn =
                       [](const std::vector<Tensor>& in) {
                         return ops::layer_norm(in[0], {3, 4}, in[1], in[2]);
                       }});
}
TEST(GradCheck, layer_norm_without_affine) {
  check_gradients({.make_inputs =
                       [] {
                         return std::vector<Tensor>{random_leaf({4, 6}, 7, -2, 2)};
                       },
                   .fn = [](const std::vector<Tensor>& in) { return ops::layer_norm(in[0], {6}); }});
}
TEST(GradCheck, layer_norm_weight_only) {
  check_gradients({.make_inputs =
                       [] {
                         return std::vector<Tensor>{random_leaf({3, 4}, 8, -2, 2), random_leaf({4}, 9, 0.5, 1.5)};
                       },
                   .fn = [](const std::vector<Tensor>& in) { return ops::layer_norm(in[0], {4}, in[1]); }});
}
TEST(GradCheck, layer_norm_many_rows) {
  // More rows than the kernel's 64 weight-gradient blocks, so partial sums span several rows each.
  check_gradients({.make_inputs =
                       [] {
                         return std::vector<Tensor>{random_leaf({130, 3}, 10, -2, 2), random_leaf({3}, 11, 0.5, 1.5),
                                                    random_leaf({3}, 12)};
                       },
                   .fn = [](const std::vector<Tensor>& in) { return ops::layer_norm(in[0], {3}, in[1], in[2]); }});
}

TEST(LayerNorm, KnownValues) {
  // Row [1, 2, 3, 4]: mean 2.5, population variance (2.25 + 0.25 + 0.25 + 2.25) / 4 = 1.25, so
  // y = (x - 2.5) / sqrt(1.25) = [-1.5, -0.5, 0.5, 1.5] / 1.1180340 = [-1.3416408, -0.4472136, ...].
  // eps = 0 keeps the numbers exact. With weight 2 and bias 1: 2 * y + 1.
  Tensor x = core::from_vector<double>({1, 2, 3, 4}, {1, 4});
  const double s = 1.0 / std::sqrt(1.25);
  // f64 arithmetic on O(1) values: 1e-14 is far above rounding.
  expect_values(ops::layer_norm(x, {4}, Tensor(), Tensor(), 0.0), {-1.5 * s, -0.5 * s, 0.5 * s, 1.5 * s}, 1e-14);
  Tensor w = core::full({4}, 2.0, DType::f64), b = core::ones({4}, DType::f64);
  expect_values(ops::layer_norm(x, {4}, w, b, 0.0), {1 - 3 * s, 1 - s, 1 + s, 1 + 3 * s}, 1e-14);
}

TEST(LayerNorm, KnownParameterGradients) {
  // With dy = ones: dbias = sum of dy over rows = 2 per column, dweight = sum of xhat over rows.
  // Both rows normalise to [-1, 1] (two elements, eps = 0), so dweight = [-2, 2].
  Tensor x = core::from_vector<double>({1, 3, 10, 20}, {2, 2});
  Tensor w = core::ones({2}, DType::f64), b = core::zeros({2}, DType::f64);
  w.set_requires_grad(true);
  b.set_requires_grad(true);
  autograd::backward(ops::sum(ops::layer_norm(x, {2}, w, b, 0.0)));
  expect_values(w.grad(), {-2, 2}, 1e-14);
  expect_values(b.grad(), {2, 2}, 0);
}

TEST(LayerNorm, EpsilonEntersTheVariance) {
  // A constant row has variance 0: y = 0 * rsqrt(eps) = 0 and the output equals the bias.
  Tensor x = core::full({2, 3}, 7.0, DType::f32);
  Tensor b = core::from_vector<float>({1, 2, 3}, {3});
  expect_values(ops::layer_norm(x, {3}, Tensor(), b), {1, 2, 3, 1, 2, 3});
}

TEST(LayerNorm, F32AgreesWithF64AndHalfWithinTolerance) {
  Tensor x = random_tensor({6, 32}, 20, -3, 3);
  Tensor w = random_tensor({32}, 21, 0.5, 1.5), b = random_tensor({32}, 22);
  const Tensor reference = ops::layer_norm(x, {32}, w, b);
  // f32: normalised values are O(1) (|xhat| <= sqrt(32)), each step rounds at 6e-8: 1e-5 is margin.
  expect_close(ops::layer_norm(x.to(DType::f32), {32}, w.to(DType::f32), b.to(DType::f32)), reference, 1e-5, 1e-5,
               "f32");
  for (DType dtype : {DType::f16, DType::bf16}) {
    Tensor xh = x.to(dtype), wh = w.to(dtype), bh = b.to(dtype);
    // Computed in f32 from the rounded inputs; only the output rounding remains: |y| <= 1.5 *
    // sqrt(32) + 1 < 10, times 2^-11 (f16) or 2^-8 (bf16, a whole ulp to be safe).
    const double tolerance = 10 * (dtype == DType::f16 ? std::ldexp(1.0, -11) : std::ldexp(1.0, -8));
    expect_close(ops::layer_norm(xh, {32}, wh, bh),
                 ops::layer_norm(xh.to(DType::f64), {32}, wh.to(DType::f64), bh.to(DType::f64)), tolerance, 0,
                 std::string(core::dtype_name(dtype)));
  }
}

TEST(LayerNorm, ManyRowsSpreadOverThreads) {
  // Enough rows that the kernels split rows (and weight-gradient row blocks) over threads.
  Tensor x = random_tensor({300, 200}, 30, -2, 2), dy = random_tensor({300, 200}, 31);
  Tensor w = random_tensor({200}, 32, 0.5, 1.5), b = random_tensor({200}, 33);
  auto run = [&](DType dtype) {
    std::vector<Tensor> leaves = {x.to(dtype), w.to(dtype), b.to(dtype)};
    for (Tensor& t : leaves) t.set_requires_grad(true);
    Tensor y = ops::layer_norm(leaves[0], {200}, leaves[1], leaves[2]);
    autograd::backward(y, dy.to(dtype));
    return std::vector<Tensor>{y.detach(), leaves[0].grad(), leaves[1].grad(), leaves[2].grad()};
  };
  const auto f32 = run(DType::f32), f64 = run(DType::f64);
  // f32 vs f64: y and dx are O(1) with 200-term row sums (error ~ sqrt(200) * 6e-8 = 1e-6 relative);
  // dweight and dbias sum 300 O(1) terms, so their absolute error is ~300x larger.
  const std::vector<double> tolerances = {1e-5, 1e-5, 1e-4, 1e-4};
  for (size_t i = 0; i < f32.size(); ++i)
    expect_close(f32[i], f64[i], tolerances[i], 1e-5, fmt::format("output {}", i));
}

TEST(LayerNorm, BadInput) {
  EXPECT_ERROR_CONTAINS(ops::layer_norm(core::ones({2, 3}), {4}), "[4]");
  EXPECT_ERROR_CONTAINS(ops::layer_norm(core::ones({2, 3}), {4}), "[2, 3]");
  EXPECT_ERROR_CONTAINS(ops::layer_norm(core::ones({3}), {2, 3}), "[2, 3]");
  EXPECT_ERROR_CONTAINS(ops::layer_norm(core::ones({2, 3}), {3}, core::ones({4})), "weight has shape [4]");
  EXPECT_ERROR_CONTAINS(ops::layer_norm(core::ones({2, 3}), {3}, Tensor(), core::ones({2, 3})),
                        "bias has shape [2, 3]");
  EXPECT_ERROR_CONTAINS(ops::layer_norm(core::ones({2, 3}), {3}, core::ones({3}, DType::f64)), "f64");
  EXPECT_ERROR_CONTAINS(ops::layer_norm(core::ones({2, 3}, DType::i32), {3}), "i32");
}

}  // namespace
}  // namespace colossal
