// Reductions: gradient checks, values by hand, layouts (leading, middle, trailing and scattered
// dims), precision of long sums and bad input.
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

void check_reduction(const std::function<Tensor(const Tensor&)>& op) {
  check_gradients({.make_inputs = [] { return std::vector<Tensor>{random_leaf({2, 3, 4}, 31)}; },
                   .fn = [=](const std::vector<Tensor>& in) { return op(in[0]); }});
}

TEST(GradCheck, sum) { check_reduction([](const Tensor& x) { return ops::sum(x, {0, 2}); }); }
TEST(GradCheck, sum_all) { check_reduction([](const Tensor& x) { return ops::sum(x); }); }
TEST(GradCheck, sum_keepdim) { check_reduction([](const Tensor& x) { return ops::sum(x, {1}, true); }); }
TEST(GradCheck, mean) { check_reduction([](const Tensor& x) { return ops::mean(x, {-1}); }); }
TEST(GradCheck, var) { check_reduction([](const Tensor& x) { return ops::var(x, {1, 2}); }); }
TEST(GradCheck, var_population) { check_reduction([](const Tensor& x) { return ops::var(x, {0}, 0, true); }); }
// Random draws have no ties, so the maximum is unique and differentiable.
TEST(GradCheck, max) { check_reduction([](const Tensor& x) { return ops::max(x, 1).values; }); }
TEST(GradCheck, max_all) { check_reduction([](const Tensor& x) { return ops::max(x); }); }
TEST(GradCheck, sum_to) {
  check_gradients({.make_inputs = [] { return std::vector<Tensor>{random_leaf({2, 3, 4}, 32)}; },
                   .fn = [](const std::vector<Tensor>& in) { return ops::sum_to(in[0], {3, 1}); }});
}

TEST(Reduction, ValuesByHand) {
  Tensor x = core::from_vector<double>({1, 2, 3, 4, 5, 6}, {2, 3});
  expect_values(ops::sum(x), {21});
  expect_values(ops::sum(x, {0}), {5, 7, 9});
  expect_values(ops::sum(x, {1}), {6, 15});
  expect_values(ops::mean(x, {1}), {2, 5});
  // Rows {1,2,3} and {4,5,6}: unbiased variance 1 each; population variance 2/3.
  expect_values(ops::var(x, {1}), {1, 1});
  expect_values(ops::var(x, {1}, 0), {2.0 / 3, 2.0 / 3}, 1e-15);
  auto [values, indices] = ops::max(x, 0);
  expect_values(values, {4, 5, 6});
  expect_values(indices, {1, 1, 1});
  expect_values(ops::argmax(x, 1), {2, 2});
  EXPECT_EQ(ops::sum(x, {1}, true).shape(), (Shape{2, 1}));
}

TEST(Reduction, ScatteredDimsMatchSequential) {
  Tensor x = random_tensor({3, 4, 5, 6}, 7);
  expect_close(ops::sum(x, {0, 2}), ops::sum(ops::sum(x, {2}), {0}), 1e-14, 0, "sum over dims 0 and 2");
  expect_close(ops::sum(x.permute({3, 1, 0, 2}), {1}), ops::sum(x, {1}).permute({2, 0, 1}), 1e-14, 0, "permuted input");
}

TEST(Reduction, LongFloatSumIsAccurate) {
  // 2^20 copies of 0.1f: a naive f32 running sum drifts by ~1e-2 relative; we accumulate in f64,
  // so the result is the f32 rounding of 104857.6 * (0.1f / 0.1).
  const int64_t n = int64_t{1} << 20;
  Tensor x = core::full({n}, 0.1, DType::f32);
  const double exact = static_cast<double>(n) * static_cast<double>(0.1f);
  EXPECT_EQ(ops::sum(x).item<float>(), static_cast<float>(exact));
}

TEST(Reduction, IntegerSumCountsInI64) {
  Tensor flags = core::from_vector<bool>({true, false, true, true}, {4});
  Tensor count = ops::sum(flags);
  EXPECT_EQ(count.dtype(), DType::i64);
  EXPECT_EQ(count.item<int64_t>(), 3);
}

TEST(Reduction, BadInput) {
  Tensor x = core::zeros({2, 3});
  EXPECT_ERROR_CONTAINS(ops::sum(x, {2}), "dimension 2 out of range for a tensor of shape [2, 3]");
  EXPECT_ERROR_CONTAINS(ops::sum(x, {1, -1}), "listed twice");
  EXPECT_ERROR_CONTAINS(ops::var(core::zeros({1, 1}), {1}), "no degrees of freedom");
  EXPECT_ERROR_CONTAINS(ops::mean(core::zeros({2}, DType::i64)), "expected a floating tensor");
}

}  // namespace
}  // namespace colossal
