// max_pool2d, avg_pool2d and adaptive_avg_pool2d: gradient checks, hand-derived windows (padding,
// count_include_pad, non-divisible adaptive sizes), gradient routing, reduced precision, bad input.
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

/// A leaf whose values are a permutation of evenly spaced numbers in [-1, 1): no two are closer
/// than 2 / numel, far more than the finite-difference step, so a window's maximum never flips.
Tensor distinct_leaf(const Shape& shape) {
  const int64_t n = core::shape_numel(shape);
  std::vector<double> values(static_cast<size_t>(n));
  // 37 is coprime with the sizes used here, so i * 37 mod n visits every residue once.
  for (int64_t i = 0; i < n; ++i) values[i] = -1.0 + 2.0 * static_cast<double>((i * 37) % n) / static_cast<double>(n);
  Tensor t = core::from_vector(values, shape);
  t.set_requires_grad(true);
  return t;
}

TEST(GradCheck, max_pool2d) {
  // 2 * 2 * 5 * 5 = 100 values spaced 0.02 apart; overlapping 3x3 windows, stride 2, padding 1.
  check_gradients({.make_inputs =
                       [] {
                         return std::vector<Tensor>{distinct_leaf({2, 2, 5, 5})};
                       },
                   .fn =
                       [](const std::vector<Tensor>& in) {
                         return ops::max_pool2d(in[0], {3, 3}, {2, 2}, {1, 1});
                       }});
}

TEST(GradCheck, max_pool2d_default_stride) {
  check_gradients({.make_inputs =
                       [] {
                         return std::vector<Tensor>{distinct_leaf({1, 3, 4, 5})};
                       },
                   .fn =
                       [](const std::vector<Tensor>& in) {
                         return ops::max_pool2d(in[0], {2, 2});
                       }});
}

void check_avg_pool(bool count_include_pad) {
  check_gradients({.make_inputs =
                       [] {
                         return std::vector<Tensor>{random_leaf({2, 2, 5, 4}, 1)};
                       },
                   .fn =
                       [=](const std::vector<Tensor>& in) {
                         return ops::avg_pool2d(in[0], {3, 2}, {2, 1}, {1, 1}, count_include_pad);
                       }});
}

TEST(GradCheck, avg_pool2d) {
  check_avg_pool(true);
}
TEST(GradCheck, avg_pool2d_exclude_pad) {
  check_avg_pool(false);
}

TEST(GradCheck, adaptive_avg_pool2d) {
  // 5 -> 3 rows (overlapping windows [0, 2), [1, 4), [3, 5)) and 4 -> 3 columns.
  check_gradients({.make_inputs =
                       [] {
                         return std::vector<Tensor>{random_leaf({2, 2, 5, 4}, 2)};
                       },
                   .fn =
                       [](const std::vector<Tensor>& in) {
                         return ops::adaptive_avg_pool2d(in[0], {3, 3});
                       }});
}

TEST(GradCheck, adaptive_avg_pool2d_upsample) {
  // An output larger than the input: windows of one or two pixels, some pixels in two windows.
  check_gradients({.make_inputs =
                       [] {
                         return std::vector<Tensor>{random_leaf({1, 2, 2, 3}, 3)};
                       },
                   .fn =
                       [](const std::vector<Tensor>& in) {
                         return ops::adaptive_avg_pool2d(in[0], {3, 4});
                       }});
}

// A 4x4 plane whose maxima are not where a monotone ramp would put them:
//   3 9 2 0
//   1 4 8 7
//   6 5 11 10
//   15 12 13 14
const std::vector<double> kPlane = {3, 9, 2, 0, 1, 4, 8, 7, 6, 5, 11, 10, 15, 12, 13, 14};

TEST(MaxPool2d, HandDerivedValuesAndGradient) {
  Tensor x = core::from_vector(kPlane, {1, 1, 4, 4});
  x.set_requires_grad(true);
  // 2x2 windows, stride 2: max(3, 9, 1, 4) = 9, max(2, 0, 8, 7) = 8, max(6, 5, 15, 12) = 15, 14.
  Tensor out = ops::max_pool2d(x, {2, 2});
  expect_values(out, {9, 8, 15, 14});
  autograd::backward(ops::sum(out));
  expect_values(x.grad(), {0, 1, 0, 0, 0, 0, 1, 0, 0, 0, 0, 0, 1, 0, 0, 1});

  // 3x3 windows, stride 2, padding 1 (padding is -inf): the windows cover rows/cols [0, 2) and
  // [1, 4): max of {3, 9, 1, 4} = 9, of {9, 2, 0, 4, 8, 7} = 9, of {1, 4, 6, 5, 15, 12} = 15,
  // of {4, 8, 7, 5, 11, 10, 12, 13, 14} = 14. The 9 wins two windows, so its gradient is 2.
  Tensor y = core::from_vector(kPlane, {1, 1, 4, 4});
  y.set_requires_grad(true);
  Tensor padded = ops::max_pool2d(y, {3, 3}, {2, 2}, {1, 1});
  expect_values(padded, {9, 9, 15, 14});
  autograd::backward(ops::sum(padded));
  expect_values(y.grad(), {0, 2, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 1, 0, 0, 1});
}

TEST(MaxPool2d, AllNegativeWithPadding) {
  // The padding must never win: all-negative inputs still yield input values.
  Tensor x = core::from_vector<double>({-5, -3, -4, -1}, {1, 1, 2, 2});
  expect_values(ops::max_pool2d(x, {2, 2}, {1, 1}, {1, 1}), {-5, -3, -3, -4, -1, -1, -4, -1, -1});
}

TEST(AvgPool2d, HandDerivedValues) {
  Tensor x = core::from_vector<double>({1, 2, 3, 4, 5, 6, 7, 8, 9}, {1, 1, 3, 3});
  // 3x3 windows, stride 1, padding 1. Corners sum 1+2+4+5 = 12 (and 16, 24, 28), edges 21, 27,
  // 33, 39, the centre 45. count_include_pad divides all by 9; otherwise by the 4 (corner),
  // 6 (edge) or 9 (centre) real pixels: 3, 3.5, 4, 4.5, 5, 5.5, 6, 6.5, 7.
  expect_values(ops::avg_pool2d(x, {3, 3}, {1, 1}, {1, 1}, true),
                {12 / 9.0, 21 / 9.0, 16 / 9.0, 27 / 9.0, 5, 33 / 9.0, 24 / 9.0, 39 / 9.0, 28 / 9.0}, 1e-15);
  expect_values(ops::avg_pool2d(x, {3, 3}, {1, 1}, {1, 1}, false), {3, 3.5, 4, 4.5, 5, 5.5, 6, 6.5, 7}, 1e-15);
  // Default stride = kernel; 2x2 windows over the top-left 2x2 of the 3x3: (1+2+4+5)/4 = 3.
  expect_values(ops::avg_pool2d(x, {2, 2}), {3});
}

TEST(AvgPool2d, HandDerivedGradient) {
  // 2x2 windows with stride 1 on a 3x3 plane: each pixel receives 1/4 per window covering it
  // (corners 1, edges 2, centre 4 windows).
  Tensor x = random_leaf({1, 1, 3, 3}, 5);
  autograd::backward(ops::sum(ops::avg_pool2d(x, {2, 2}, {1, 1})));
  expect_values(x.grad(), {0.25, 0.5, 0.25, 0.5, 1, 0.5, 0.25, 0.5, 0.25});
}

TEST(AdaptiveAvgPool2d, HandDerivedValues) {
  // x[r][c] = 5r + c on 5x5. Windows 5 -> 3: [0, 2), [1, 4), [3, 5) with mean indices 0.5, 2,
  // 3.5, so out[i][j] = 5 * m[i] + m[j].
  std::vector<double> values;
  for (int r = 0; r < 5; ++r) {
    for (int c = 0; c < 5; ++c) values.push_back(5 * r + c);
  }
  Tensor x = core::from_vector(values, {1, 1, 5, 5});
  const double m[] = {0.5, 2, 3.5};
  std::vector<double> expected;
  for (double mi : m) {
    for (double mj : m) expected.push_back(5 * mi + mj);
  }
  expect_values(ops::adaptive_avg_pool2d(x, {3, 3}), expected, 1e-14);
  // Output 1x1 is the global mean: 12; a divisible size equals avg_pool2d.
  expect_values(ops::adaptive_avg_pool2d(x, {1, 1}), {12}, 1e-14);
  Tensor even = random_tensor({2, 3, 6, 4}, 6);
  expect_close(ops::adaptive_avg_pool2d(even, {3, 2}), ops::avg_pool2d(even, {2, 2}), 1e-15, 0.0);
}

TEST(Pooling, ReducedPrecisionMatchesF64) {
  // Inputs are exact in bf16; max pooling is then exact, averages of <= 9 values round once
  // to bf16 (|out| < 1, so <= 2^-9 = 2e-3).
  Tensor x16 = random_tensor({2, 3, 7, 6}, 7, -1, 1, DType::bf16);
  Tensor x64 = core::cast_raw(x16, DType::f64);
  expect_close(ops::max_pool2d(x16, {3, 3}, {2, 2}, {1, 1}), ops::max_pool2d(x64, {3, 3}, {2, 2}, {1, 1}), 0.0, 0.0);
  expect_close(ops::avg_pool2d(x16, {3, 3}, {2, 1}, {1, 1}, false), ops::avg_pool2d(x64, {3, 3}, {2, 1}, {1, 1}, false),
               2e-3, 0.0);
  expect_close(ops::adaptive_avg_pool2d(x16, {3, 4}), ops::adaptive_avg_pool2d(x64, {3, 4}), 2e-3, 0.0);
  Tensor x32 = core::cast_raw(x16, DType::f32);
  expect_close(ops::max_pool2d(x32, {2, 3}), ops::max_pool2d(x64, {2, 3}), 0.0, 0.0);
}

TEST(Pooling, BadInputs) {
  Tensor x = random_tensor({1, 2, 5, 5}, 8);
  EXPECT_ERROR_CONTAINS(ops::max_pool2d(random_tensor({2, 5, 5}, 9), {2, 2}), "[2, 5, 5]");
  EXPECT_ERROR_CONTAINS(ops::max_pool2d(x, {3, 3}, {1, 1}, {2, 1}),
                        "padding [2, 1] must be at most half the kernel [3, 3]");
  EXPECT_ERROR_CONTAINS(ops::avg_pool2d(x, {2, 4}, {1, 1}, {0, 3}), "padding [0, 3] must be at most half the kernel");
  EXPECT_ERROR_CONTAINS(ops::max_pool2d(x, {6, 2}), "kernel [6, 2] is larger than the padded input");
  EXPECT_ERROR_CONTAINS(ops::avg_pool2d(x, {0, 2}), "kernel must be positive");
  EXPECT_ERROR_CONTAINS(ops::max_pool2d(x, {2, 2}, {0, 1}), "stride must be positive");
  EXPECT_ERROR_CONTAINS(ops::adaptive_avg_pool2d(x, {0, 3}), "output_size must be positive, got [0, 3]");
  EXPECT_ERROR_CONTAINS(ops::adaptive_avg_pool2d(core::zeros({1, 1, 2, 2}, DType::i32), {1, 1}), "floating");
}

}  // namespace
}  // namespace colossal
