// softmax and log_softmax: gradient checks over several dimensions, values derived by hand,
// stability on large logits, f32/f64 and half-precision agreement, and bad input.
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

void check_softmax(bool log, const Shape& shape, int64_t dim) {
  SCOPED_TRACE(fmt::format("{} over dim {} of {}", log ? "log_softmax" : "softmax", dim, shape));
  check_gradients({.make_inputs = [=] { return std::vector<Tensor>{random_leaf(shape, 3, -2, 2)}; },
                   .fn =
                       [=](const std::vector<Tensor>& in) {
                         return log ? ops::log_softmax(in[0], dim) : ops::softmax(in[0], dim);
                       }});
}

TEST(GradCheck, softmax) {
  check_softmax(false, {3, 5}, -1);
  check_softmax(false, {3, 4, 2}, 1);  // rows strided by the inner dimension
  check_softmax(false, {3, 4}, 0);
}
TEST(GradCheck, log_softmax) {
  check_softmax(true, {3, 5}, -1);
  check_softmax(true, {3, 4, 2}, 1);
  check_softmax(true, {3, 4}, 0);
}
TEST(GradCheck, softmax_of_transposed_input) {
  check_gradients({.make_inputs =
                       [] {
                         return std::vector<Tensor>{random_leaf({4, 3}, 4, -2, 2)};
                       },
                   .fn = [](const std::vector<Tensor>& in) { return ops::softmax(in[0].t(), 1); }});
}

TEST(Softmax, KnownValues) {
  // softmax([0, ln 2, ln 5]) = [1, 2, 5] / 8; log_softmax = log of that = [-ln 8, ln 2 - ln 8, ln 5 - ln 8].
  Tensor x = core::from_vector<double>({0, std::log(2.0), std::log(5.0)}, {3});
  // f64 exp/log of O(1) values: a few ulp (1e-16); 1e-14 is margin.
  expect_values(ops::softmax(x, 0), {0.125, 0.25, 0.625}, 1e-14);
  expect_values(ops::log_softmax(x, -1), {-std::log(8.0), std::log(0.25), std::log(0.625)}, 1e-14);
}

TEST(Softmax, RowsSumToOne) {
  Tensor x = random_tensor({4, 6, 5}, 10, -3, 3, DType::f32);
  for (int64_t dim : {0, 1, 2}) {
    // f32 sums of <= 6 probabilities: each rounding 6e-8, well below 1e-6.
    expect_close(ops::sum(ops::softmax(x, dim), {dim}), core::ones({dim == 0 ? 6 : 4, dim == 2 ? 6 : 5}), 1e-6, 0,
                 fmt::format("dim {}", dim));
  }
}

TEST(Softmax, StableOnLargeLogits) {
  // exp(1000) overflows; with the max subtracted, softmax([1000, 1000 + ln 3]) = [1/4, 3/4] and
  // log_softmax of [-1000, -1000] is [-ln 2, -ln 2].
  Tensor big = core::from_vector<float>({1000.0f, 1000.0f + std::log(3.0f)}, {2});
  // f32: 1000 + ln 3 is stored with spacing 6e-5, which shifts the ratio by that much: 1e-4.
  expect_values(ops::softmax(big, 0), {0.25, 0.75}, 1e-4);
  expect_values(ops::log_softmax(core::from_vector<float>({-1000.0f, -1000.0f}, {2}), 0),
                {-std::log(2.0), -std::log(2.0)}, 1e-6);  // f32 rounding of ln 2 (4e-8), with margin
}

TEST(Softmax, KnownGradient) {
  // y = softmax([0, ln 3]) = [1/4, 3/4]. With dy = [1, 0]: dx = y * (dy - y . dy) = y * (dy - 1/4)
  // = [1/4 * 3/4, 3/4 * (-1/4)] = [3/16, -3/16].
  Tensor x = core::from_vector<double>({0, std::log(3.0)}, {2});
  x.set_requires_grad(true);
  autograd::backward(ops::softmax(x, 0), core::from_vector<double>({1, 0}, {2}));
  expect_values(x.grad(), {3.0 / 16, -3.0 / 16}, 1e-15);  // f64 rounding of O(1) values
  // log_softmax: dx = dy - y * sum(dy) = [1 - 1/4, -3/4].
  Tensor x2 = core::from_vector<double>({0, std::log(3.0)}, {2});
  x2.set_requires_grad(true);
  autograd::backward(ops::log_softmax(x2, 0), core::from_vector<double>({1, 0}, {2}));
  expect_values(x2.grad(), {0.75, -0.75}, 1e-15);
}

TEST(Softmax, F32AgreesWithF64AndHalfWithinTolerance) {
  Tensor x = random_tensor({5, 17}, 20, -4, 4);
  const Tensor soft = ops::softmax(x, 1), log_soft = ops::log_softmax(x, 1);
  // f32: relative rounding 6e-8 per exp and sum over 17 terms; probabilities <= 1 so 1e-6 covers it,
  // and log_softmax values up to ~10 in magnitude lose at most 10 * 6e-8 per step: 1e-5.
  expect_close(ops::softmax(x.to(DType::f32), 1), soft, 1e-6, 0, "f32 softmax");
  expect_close(ops::log_softmax(x.to(DType::f32), 1), log_soft, 1e-5, 0, "f32 log_softmax");
  for (DType dtype : {DType::f16, DType::bf16}) {
    const Tensor xh = x.to(dtype);
    // Computed in f32 from the rounded input; the error left is the output rounding: relative 2^-11
    // (f16) or 2^-8 (bf16, conservatively a whole ulp) of values <= 1, and of |log_softmax| <= 10.
    const double unit = dtype == DType::f16 ? std::ldexp(1.0, -11) : std::ldexp(1.0, -8);
    expect_close(ops::softmax(xh, 1), ops::softmax(xh.to(DType::f64), 1), unit, 0, "half softmax");
    expect_close(ops::log_softmax(xh, 1), ops::log_softmax(xh.to(DType::f64), 1), 10 * unit, 0, "half log_softmax");
  }
}

TEST(Softmax, ManyRowsSpreadOverThreads) {
  // Enough rows for the kernels to split them over threads; along dim 1 rows are contiguous, along
  // dim 0 strided. f32 against f64: probabilities <= 1 rounded at 6e-8 per step, 1e-6 is margin.
  Tensor x = random_tensor({300, 200}, 40, -4, 4);
  Tensor dy = random_tensor({300, 200}, 41);
  for (int64_t dim : {0, 1}) {
    Tensor x32 = x.to(DType::f32);
    x32.set_requires_grad(true);
    Tensor x64 = x.detach();
    x64.set_requires_grad(true);
    Tensor y32 = ops::softmax(x32, dim), y64 = ops::softmax(x64, dim);
    expect_close(y32, y64, 1e-6, 0, fmt::format("forward, dim {}", dim));
    autograd::backward(y32, dy.to(DType::f32));
    autograd::backward(y64, dy);
    // dx = y * (dy - y . dy): |y . dy| <= 1, so the f32 error stays near 1e-7 * |y|.
    expect_close(x32.grad(), x64.grad(), 1e-6, 0, fmt::format("backward, dim {}", dim));
  }
}

TEST(Softmax, HalfBackwardWithinTolerance) {
  Tensor x = random_tensor({3, 8}, 30, -2, 2, DType::bf16);
  Tensor dy = random_tensor({3, 8}, 31, -1, 1, DType::bf16);
  Tensor x64 = x.to(DType::f64);
  x.set_requires_grad(true);
  x64.set_requires_grad(true);
  autograd::backward(ops::softmax(x, 1), dy);
  autograd::backward(ops::softmax(x64, 1), dy.to(DType::f64));
  // bf16 keeps 8 bits: y is rounded (relative 2^-8), which perturbs y * (dy - y . dy) by about
  // 2^-8 * |dx| plus 2^-8 * |y . dy|; both terms are below 2, so 3 * 2^-8 = 0.012 bounds it.
  expect_close(x.grad(), x64.grad(), 0.012, 0, "bf16 softmax backward");
}

TEST(Softmax, BadInput) {
  EXPECT_ERROR_CONTAINS(ops::softmax(core::ones({2, 3}), 2), "out of range");
  EXPECT_ERROR_CONTAINS(ops::softmax(core::ones({2, 3}), 2), "[2, 3]");
  EXPECT_ERROR_CONTAINS(ops::log_softmax(core::ones({2, 3}, DType::i64), 1), "i64");
  EXPECT_ERROR_CONTAINS(ops::log_softmax(core::ones({2, 3}, DType::i64), 1), "log_softmax");
}

}  // namespace
}  // namespace colossal
