// cross_entropy: gradient checks for hard targets (with label smoothing, ignore_index, every
// reduction) and soft targets (gradients of logits and targets), hand-derived losses and
// gradients, the mean divisor with ignored targets, half precision, and bad input.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

#include "colossal/core/view.h"  // cast_raw
#include "gradcheck.h"

namespace colossal {
namespace {

using ops::CrossEntropyOptions;
using ops::Reduction;
using testing::check_gradients;
using testing::expect_close;
using testing::expect_values;
using testing::random_leaf;
using testing::random_tensor;

// log(e^1 + e^2 + e^3), the logsumexp of the row [1, 2, 3] used by the hand-derived values.
constexpr double kLse123 = 3.40760596444438013;
// Double rounding of a handful of O(1) operations; far below any formula error.
constexpr double kTightAtol = 1e-12;

const char* name_of(Reduction r) {
  return r == Reduction::none ? "none" : r == Reduction::mean ? "mean" : "sum";
}

TEST(GradCheck, cross_entropy) {
  // Five rows of four classes; row 3's target is ignored by the ignore_index variants (-100 and 2
  // both occur so that an in-range ignore_index is covered too).
  const Tensor targets_with_ignored = core::from_vector<int64_t>({1, 3, 0, -100, 2}, {5});
  const Tensor targets = core::from_vector<int32_t>({1, 3, 0, 2, 2}, {5});
  for (Reduction reduction : {Reduction::mean, Reduction::sum, Reduction::none}) {
    for (const auto& [target, smoothing, ignore_index] :
         {std::tuple{targets, 0.0, int64_t{-100}}, std::tuple{targets, 0.25, int64_t{-100}},
          std::tuple{targets_with_ignored, 0.0, int64_t{-100}}, std::tuple{targets_with_ignored, 0.1, int64_t{-100}},
          std::tuple{targets, 0.1, int64_t{2}}}) {
      SCOPED_TRACE(fmt::format("reduction {}, label_smoothing {}, ignore_index {}, target {}", name_of(reduction),
                               smoothing, ignore_index, core::to_string(target)));
      const CrossEntropyOptions options{
          .ignore_index = ignore_index, .label_smoothing = smoothing, .reduction = reduction};
      check_gradients({.make_inputs =
                           [&] {
                             return std::vector<Tensor>{random_leaf({5, 4}, 21, -2, 2), target};
                           },
                       .fn = [&](const std::vector<Tensor>& in) { return ops::cross_entropy(in[0], in[1], options); }});
    }
  }
}

TEST(GradCheck, cross_entropy_soft_targets) {
  // Both the logits and the (unnormalised, positive) target probabilities receive gradients.
  for (Reduction reduction : {Reduction::mean, Reduction::sum, Reduction::none}) {
    for (double smoothing : {0.0, 0.2}) {
      SCOPED_TRACE(fmt::format("reduction {}, label_smoothing {}", name_of(reduction), smoothing));
      const CrossEntropyOptions options{.label_smoothing = smoothing, .reduction = reduction};
      check_gradients(
          {.make_inputs =
               [] {
                 return std::vector<Tensor>{random_leaf({3, 4}, 22, -2, 2), random_leaf({3, 4}, 23, 0.1, 1)};
               },
           .fn = [&](const std::vector<Tensor>& in) { return ops::cross_entropy(in[0], in[1], options); }});
    }
  }
}

TEST(GradCheck, cross_entropy_unbatched) {
  // [C] logits with a 0-d class index, and with [C] probabilities.
  check_gradients({.make_inputs = [] { return std::vector<Tensor>{random_leaf({4}, 24, -2, 2)}; },
                   .fn =
                       [](const std::vector<Tensor>& in) {
                         return ops::cross_entropy(in[0], core::from_vector<int64_t>({2}, {}),
                                                   {.label_smoothing = 0.1});
                       }});
  check_gradients({.make_inputs =
                       [] {
                         return std::vector<Tensor>{random_leaf({4}, 25, -2, 2), random_leaf({4}, 26, 0, 1)};
                       },
                   .fn = [](const std::vector<Tensor>& in) { return ops::cross_entropy(in[0], in[1]); }});
}

TEST(CrossEntropyTest, HandComputedLoss) {
  const Tensor logits = core::from_vector<double>({1, 2, 3}, {1, 3});
  // -log softmax([1, 2, 3])[2] = log(e^1 + e^2 + e^3) - 3.
  expect_values(ops::cross_entropy(logits, core::from_vector<int64_t>({2}, {1})), {0.40760596444438013}, kTightAtol);
  // Smoothing 0.1 over 3 classes, target 0: q = [0.9 + 0.1/3, 0.1/3, 0.1/3], and
  // sum_c q_c (lse - x_c) = lse - (0.9 * 1 + 0.1 * mean(1, 2, 3)) = lse - 1.1.
  expect_values(ops::cross_entropy(logits, core::from_vector<int64_t>({0}, {1}), {.label_smoothing = 0.1}),
                {kLse123 - 1.1}, kTightAtol);
  // Unbatched: a 0-d result.
  const Tensor loss = ops::cross_entropy(core::from_vector<double>({1, 2, 3}, {3}), core::from_vector<int64_t>({2}, {}),
                                         {.reduction = Reduction::none});
  EXPECT_EQ(loss.shape(), Shape{});
  expect_values(loss, {kLse123 - 3}, kTightAtol);
}

TEST(CrossEntropyTest, IgnoreIndexAndReductions) {
  // Row 1 is ignored: none gives it 0, sum skips it, mean divides by the 2 rows that count.
  const Tensor logits = core::from_vector<double>({1, 2, 3, 7, -1, 4, 1, 2, 3}, {3, 3});
  const Tensor target = core::from_vector<int64_t>({2, -100, 0}, {3});
  expect_values(ops::cross_entropy(logits, target, {.reduction = Reduction::none}), {kLse123 - 3, 0, kLse123 - 1},
                kTightAtol);
  expect_values(ops::cross_entropy(logits, target, {.reduction = Reduction::sum}), {2 * kLse123 - 4}, kTightAtol);
  expect_values(ops::cross_entropy(logits, target), {(2 * kLse123 - 4) / 2}, kTightAtol);
  // With smoothing the ignored row still contributes nothing and the divisor stays 2:
  // rows 0 and 2 give lse - (0.8 * 3 + 0.2 * 2) and lse - (0.8 * 1 + 0.2 * 2).
  expect_values(ops::cross_entropy(logits, target, {.label_smoothing = 0.2}), {kLse123 - (2.8 + 1.2) / 2}, kTightAtol);
}

TEST(CrossEntropyTest, EveryTargetIgnoredGivesNanMeanAndZeroGradient) {
  // As torch: mean over no counted targets is 0 / 0; ignored rows still get an exact zero gradient.
  Tensor logits = random_leaf({2, 3}, 27);
  const Tensor loss = ops::cross_entropy(logits, core::from_vector<int64_t>({-100, -100}, {2}));
  EXPECT_TRUE(std::isnan(loss.item<double>()));
  autograd::backward(loss);
  expect_values(logits.grad(), {0, 0, 0, 0, 0, 0});
  EXPECT_EQ(ops::cross_entropy(logits, core::from_vector<int64_t>({-100, -100}, {2}), {.reduction = Reduction::sum})
                .item<double>(),
            0.0);
}

TEST(CrossEntropyTest, HandComputedGradient) {
  // d loss / d x = softmax(x) - onehot(2); softmax([1, 2, 3]) = e^x / e^lse.
  Tensor logits = core::from_vector<double>({1, 2, 3}, {1, 3});
  logits.set_requires_grad(true);
  autograd::backward(ops::cross_entropy(logits, core::from_vector<int64_t>({2}, {1})));
  expect_values(logits.grad(), {0.09003057317038046, 0.24472847105479767, 0.66524095577481770 - 1}, kTightAtol);
}

TEST(CrossEntropyTest, SoftTargets) {
  const Tensor logits = core::from_vector<double>({1, 2, 3}, {1, 3});
  const Tensor probs = core::from_vector<double>({0.2, 0.3, 0.5}, {1, 3});
  // -sum_c t_c log p_c = lse - sum_c t_c x_c = lse - 2.3.
  expect_values(ops::cross_entropy(logits, probs), {kLse123 - 2.3}, kTightAtol);
  // Smoothing 0.3: t' = 0.7 t + 0.1 = [0.24, 0.31, 0.45], so lse - (0.24 + 0.62 + 1.35).
  expect_values(ops::cross_entropy(logits, probs, {.label_smoothing = 0.3}), {kLse123 - 2.21}, kTightAtol);
  // One-hot probabilities equal the class-index loss; ignore_index has no meaning for soft targets.
  const Tensor batch = random_tensor({4, 5}, 28, -3, 3);
  const Tensor onehot = core::from_vector<double>({0, 1, 0, 0, 0, 0, 0, 0, 0, 1, 1, 0, 0, 0, 0, 0, 0, 1, 0, 0}, {4, 5});
  expect_close(ops::cross_entropy(batch, onehot, {.ignore_index = 1, .label_smoothing = 0.1}),
               ops::cross_entropy(batch, core::from_vector<int64_t>({1, 4, 0, 2}, {4}), {.label_smoothing = 0.1}),
               kTightAtol, 0.0);
}

TEST(CrossEntropyTest, ManyRowsMatchReference) {
  // 20000 rows of 4 classes span several threads' chunks (kParallelGrain / C = 8192 rows each).
  // Reference: the smoothed loss per row in double, written out here. Both sides round O(10)
  // operations of O(1) values in double, so 1e-12 per row (and relative for the mean) is ample.
  constexpr int64_t kRows = 20000, kClasses = 4;
  const Tensor logits = random_tensor({kRows, kClasses}, 34, -3, 3);
  const Tensor target = core::randint(0, kClasses, {kRows}, DType::i64, nullptr);
  const double s = 0.1;
  const auto x = logits.to_vector<double>();
  const auto y = target.to_vector<int64_t>();
  std::vector<double> expected(kRows);
  double total = 0;
  for (int64_t i = 0; i < kRows; ++i) {
    double max_value = -1e300, sum_exp = 0, sum_x = 0;
    for (int64_t c = 0; c < kClasses; ++c) max_value = std::max(max_value, x[i * kClasses + c]);
    for (int64_t c = 0; c < kClasses; ++c) sum_exp += std::exp(x[i * kClasses + c] - max_value);
    for (int64_t c = 0; c < kClasses; ++c) sum_x += x[i * kClasses + c];
    const double lse = max_value + std::log(sum_exp);
    expected[i] = (1 - s) * (lse - x[i * kClasses + y[i]]) + s * (lse - sum_x / kClasses);
    total += expected[i];
  }
  expect_close(ops::cross_entropy(logits, target, {.label_smoothing = s, .reduction = Reduction::none}),
               core::from_vector<double>(expected, {kRows}), 1e-12, 0.0, "none");
  expect_close(ops::cross_entropy(logits, target, {.label_smoothing = s}),
               core::scalar_tensor(total / kRows, DType::f64), 0.0, 1e-12, "mean");
}

TEST(CrossEntropyTest, LargeLogitsStayFinite) {
  // The row max is subtracted before exponentiating: e^1000 overflows, the loss is 1000 + log(1 + e^-1000).
  const Tensor logits = core::from_vector<float>({1000.0f, 0.0f, -1000.0f, 0.0f}, {2, 2});
  expect_values(ops::cross_entropy(logits, core::from_vector<int64_t>({1, 0}, {2}), {.reduction = Reduction::none}),
                {1000.0, 1000.0}, 0.0);
}

TEST(CrossEntropyTest, ReducedPrecisionMatchesDouble) {
  // f32 rounding of O(1) values over 7 classes: ~1e-6 relative, so 1e-5. f16 and bf16 logits are
  // first rounded; the reference uses the same rounded logits in f64. The loss of 16-bit logits
  // comes out in f32 (computed in f32, never rounded to 16 bits), so it meets the f32 bound; the
  // gradients keep the logits' dtype, so what is left there is their rounding (half an ulp: 2^-11
  // relative for f16, 2^-8 for bf16) of values below 1: ~1e-3 for f16 and ~8e-3 for bf16, given
  // twice that as margin.
  const Tensor logits64 = random_tensor({6, 7}, 29, -3, 3);
  const Tensor target = core::from_vector<int64_t>({0, 6, 3, -100, 2, 5}, {6});
  for (const auto& [dtype, atol] :
       {std::pair{DType::f32, 1e-5}, std::pair{DType::f16, 2e-3}, std::pair{DType::bf16, 1.6e-2}}) {
    SCOPED_TRACE(core::dtype_name(dtype));
    Tensor low = core::cast_raw(logits64, dtype);
    low.set_requires_grad(true);
    Tensor reference = core::cast_raw(low.detach(), DType::f64);
    reference.set_requires_grad(true);
    const CrossEntropyOptions options{.label_smoothing = 0.1};
    const Tensor loss = ops::cross_entropy(low, target, options);
    const Tensor expected = ops::cross_entropy(reference, target, options);
    EXPECT_EQ(loss.dtype(), DType::f32);
    expect_close(core::cast_raw(loss, DType::f64), expected, 1e-5, 0.0, "loss");
    autograd::backward(loss);
    autograd::backward(expected);
    EXPECT_EQ(low.grad().dtype(), dtype);
    expect_close(core::cast_raw(low.grad(), DType::f64), reference.grad(), atol, 0.0, "gradient");
  }
}

TEST(CrossEntropyTest, BadInputs) {
  const Tensor logits = random_tensor({2, 3}, 30);
  EXPECT_ERROR_CONTAINS(ops::cross_entropy(logits, core::from_vector<int64_t>({0, 3}, {2})),
                        "target 3 at row 1 is out of range for 3 classes");
  EXPECT_ERROR_CONTAINS(ops::cross_entropy(logits, core::from_vector<int32_t>({-1, 0}, {2})),
                        "target -1 at row 0 is out of range for 3 classes");
  EXPECT_ERROR_CONTAINS(ops::cross_entropy(logits, core::from_vector<int64_t>({0, 1, 2}, {3})),
                        "class-index target must have shape [2] for logits of shape [2, 3], got [3]");
  EXPECT_ERROR_CONTAINS(ops::cross_entropy(logits, random_tensor({2, 4}, 31)),
                        "soft (probability) targets must have the logits' shape [2, 3], got [2, 4]");
  EXPECT_ERROR_CONTAINS(ops::cross_entropy(logits, random_tensor({2, 3}, 32, 0, 1, DType::f32)),
                        "soft targets must have the logits' dtype f64, got f32");
  EXPECT_ERROR_CONTAINS(ops::cross_entropy(random_tensor({2, 3, 4}, 33), core::zeros({2}, DType::i64)),
                        "logits must be [N, C] or [C], got shape [2, 3, 4]");
  EXPECT_ERROR_CONTAINS(ops::cross_entropy(logits, core::zeros({2}, DType::u8)),
                        "target must be class indices (i32, i64) or probabilities of the logits' dtype, got u8");
  EXPECT_ERROR_CONTAINS(ops::cross_entropy(logits, core::zeros({2}, DType::i64), {.label_smoothing = 1.5}),
                        "label_smoothing must be in [0, 1], got 1.5");
  EXPECT_ERROR_CONTAINS(ops::cross_entropy(core::ones({2, 3}, DType::i64), core::zeros({2}, DType::i64)),
                        "logits must be floating");
}

}  // namespace
}  // namespace colossal
