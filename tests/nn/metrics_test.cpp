// Top-k accuracy: hand-counted batches, ties, ignored rows, NaN logits, sequence-shaped logits,
// reduced-precision dtypes, and bad labels.
#include <gtest/gtest.h>

#include <cmath>
#include <limits>

#include "colossal/nn/metrics.h"
#include "colossal/ops.h"
#include "gradcheck.h"

namespace colossal {
namespace {

using nn::accuracy;
using nn::topk_correct;

TEST(Accuracy, TopOneAndTopKByHand) {
  // Row ranks of the label: row 0 label 2 is the largest (rank 0); row 1 label 0 is third (rank 2);
  // row 2 label 3 is the smallest (rank 3); row 3 label 1 is second (rank 1).
  const Tensor logits = core::from_vector<float>({0.1f, 0.2f, 0.9f, 0.0f,  //
                                                  0.3f, 0.5f, 0.1f, 0.4f,  //
                                                  0.9f, 0.8f, 0.7f, 0.6f,  //
                                                  0.2f, 0.3f, 0.4f, 0.1f},
                                                 {4, 4});
  const Tensor labels = core::from_vector<int64_t>({2, 0, 3, 1}, {4});
  const auto counts = topk_correct(logits, labels, {1, 2, 3, 4, 5});
  const std::vector<int64_t> expected_correct = {1, 2, 3, 4, 4};  // k >= C counts every row
  for (size_t i = 0; i < counts.size(); ++i) {
    EXPECT_EQ(counts[i].correct, expected_correct[i]) << "k = " << i + 1;
    EXPECT_EQ(counts[i].total, 4);
  }
  EXPECT_DOUBLE_EQ(accuracy(logits, labels), 0.25);
  EXPECT_DOUBLE_EQ(accuracy(logits, labels.to(DType::i32), 3), 0.75);
}

TEST(Accuracy, TopFiveOverManyClasses) {
  // 100 classes, scores = class index, so class c ranks 99 - c: labels 95..99 are in the top 5.
  std::vector<double> scores;
  for (int row = 0; row < 3; ++row) {
    for (int c = 0; c < 100; ++c) scores.push_back(c);
  }
  const Tensor logits = core::from_vector(scores, {3, 100});
  const auto counts = topk_correct(logits, core::from_vector<int64_t>({99, 95, 94}, {3}), {1, 5});
  EXPECT_EQ(counts[0].correct, 1);
  EXPECT_EQ(counts[1].correct, 2);
}

TEST(Accuracy, TiesRankTheLowerClassFirst) {
  const Tensor logits = core::from_vector<float>({1, 1, 1, 0}, {1, 4});
  EXPECT_EQ(accuracy(logits, core::from_vector<int64_t>({0}, {1})), 1.0);
  EXPECT_EQ(accuracy(logits, core::from_vector<int64_t>({1}, {1})), 0.0);
  EXPECT_EQ(accuracy(logits, core::from_vector<int64_t>({1}, {1}), 2), 1.0);
  EXPECT_EQ(accuracy(logits, core::from_vector<int64_t>({2}, {1}), 2), 0.0);
}

TEST(Accuracy, IgnoredRowsNaNAndSequences) {
  const float nan = std::numeric_limits<float>::quiet_NaN();
  // [B = 2, T = 2, C = 3] token logits with one ignored position and one NaN label logit.
  const Tensor logits = core::from_vector<float>({0, 1, 2, /**/ 2, 1, 0, /**/ nan, 0, 0, /**/ 5, 0, 0}, {2, 2, 3});
  const Tensor labels = core::from_vector<int64_t>({2, -100, 0, 0}, {2, 2});
  const auto counts = topk_correct(logits, labels, {1, 3});
  EXPECT_EQ(counts[0].total, 3);
  EXPECT_EQ(counts[0].correct, 2);  // the NaN row is never correct
  EXPECT_EQ(counts[1].correct, 2);
  EXPECT_NEAR(counts[0].accuracy(), 2.0 / 3.0, 1e-15);
  EXPECT_EQ(nn::AccuracyCounts{}.accuracy(), 0.0);
}

TEST(Accuracy, ReducedPrecisionLogits) {
  const Tensor logits = testing::random_tensor({64, 10}, 3, -1, 1, DType::bf16);
  const Tensor labels = ops::argmax(logits.to(DType::f32), 1);
  EXPECT_EQ(accuracy(logits, labels), 1.0);
}

TEST(Accuracy, BadInput) {
  const Tensor logits = core::zeros({2, 3});
  EXPECT_ERROR_CONTAINS(accuracy(logits, core::from_vector<int64_t>({0, 3}, {2})),
                        "label 3 of row 1 is outside [0, 3)");
  EXPECT_ERROR_CONTAINS(accuracy(logits, core::from_vector<int64_t>({0, 1, 2}, {3})),
                        "labels must be i32/i64 of shape [2] for logits [2, 3], got i64 of shape [3]");
  EXPECT_ERROR_CONTAINS(accuracy(logits, core::from_vector<int64_t>({0, 1}, {2}), 0), "k must be at least 1, got 0");
  EXPECT_ERROR_CONTAINS(accuracy(core::zeros({2, 3}, DType::i64), core::from_vector<int64_t>({0, 1}, {2})),
                        "expected floating logits");
}

}  // namespace
}  // namespace colossal
