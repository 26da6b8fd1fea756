// Mixup: one-hot and soft targets (rows sum to 1), the in-place roll-by-one blend against hand
// values, and lambda drawn from Beta(alpha, alpha) through the batch's generator.
#include <gtest/gtest.h>

#include <cmath>

#include "colossal/data/mixup.h"
#include "colossal/ops.h"
#include "data_test_util.h"

namespace colossal::data {
namespace {

using testing::expect_error;

Batch make_batch(const std::vector<float>& inputs, const Shape& shape, const std::vector<int64_t>& labels) {
  Batch b;
  b.input = core::from_vector<float>(inputs, shape);
  b.target = core::from_vector<int64_t>(labels, {static_cast<int64_t>(labels.size())});
  return b;
}

TEST(Mixup, OneHotWithAndWithoutLabelSmoothing) {
  Tensor labels = core::from_vector<int64_t>({2, 0}, {2});
  EXPECT_EQ(one_hot(labels, 3).to_vector<float>(), (std::vector<float>{0, 0, 1, 1, 0, 0}));
  const std::vector<float> smooth = one_hot(labels, 4, 0.2).to_vector<float>();
  EXPECT_FLOAT_EQ(smooth[2], 0.85f);  // 1 - 0.2 + 0.2 / 4
  EXPECT_FLOAT_EQ(smooth[0], 0.05f);
  expect_error([&] { one_hot(labels, 2); }, {"sample 0 has class 2", "[0, 2)"});
}

TEST(Mixup, BlendsEachSampleWithThePreviousOneAndSoftTargetsSumToOne) {
  // Three one-value samples 10, 20, 30 with classes 0, 1, 2; lambda 0.75: sample i gets
  // 0.75 x_i + 0.25 x_{i-1}, sample 0 pairs with sample 2 (torchvision's batch.roll(1, 0)).
  Batch batch = make_batch({10, 20, 30}, {3, 1}, {0, 1, 2});
  mixup_batch(batch, 0.75, {.alpha = 1.0, .num_classes = 3});
  EXPECT_EQ(batch.input.to_vector<float>(), (std::vector<float>{15.0f, 17.5f, 27.5f}));
  ASSERT_EQ(batch.target.shape(), (Shape{3, 3}));
  EXPECT_EQ(batch.target.to_vector<float>(), (std::vector<float>{0.75f, 0, 0.25f, 0.25f, 0.75f, 0, 0, 0.25f, 0.75f}));
  // Lambda 1 is the identity with one-hot targets.
  Batch same = make_batch({1, 2, 3, 4}, {2, 2}, {1, 0});
  mixup_batch(same, 1.0, {.alpha = 1.0, .num_classes = 2});
  EXPECT_EQ(same.input.to_vector<float>(), (std::vector<float>{1, 2, 3, 4}));
  EXPECT_EQ(same.target.to_vector<float>(), (std::vector<float>{0, 1, 1, 0}));
}

TEST(Mixup, DrawsLambdaFromTheBatchGeneratorAndKeepsRowsNormalised) {
  Mixup mixup({.alpha = 0.4, .num_classes = 5, .label_smoothing = 0.1});
  std::vector<float> first;
  for (uint64_t seed = 0; seed < 50; ++seed) {
    Batch batch = make_batch({1, 2, 3, 4, 5, 6, 7, 8}, {4, 2}, {0, 4, 2, 2});
    core::Generator g(seed);
    mixup.apply(batch, g, host_empty);
    const std::vector<float> soft = batch.target.to_vector<float>();
    for (int row = 0; row < 4; ++row) {
      float sum = 0;
      for (int k = 0; k < 5; ++k) {
        sum += soft[static_cast<size_t>(row * 5 + k)];
        EXPECT_GE(soft[static_cast<size_t>(row * 5 + k)], 0.0f);
      }
      // Each row is a convex blend of two rows summing to 1, in float32: a few ulps.
      EXPECT_NEAR(sum, 1.0f, 1e-6f) << "seed " << seed << " row " << row;
    }
    if (seed == 0) first = batch.input.to_vector<float>();
  }
  Batch again = make_batch({1, 2, 3, 4, 5, 6, 7, 8}, {4, 2}, {0, 4, 2, 2});
  core::Generator g(0);
  mixup.apply(again, g, host_empty);
  EXPECT_EQ(again.input.to_vector<float>(), first);
  expect_error([] { Mixup({.alpha = 0.0, .num_classes = 3}); }, {"alpha must be positive"});
  Batch u8;
  u8.input = core::zeros({2, 2}, DType::u8);
  u8.target = core::from_vector<int64_t>({0, 1}, {2});
  expect_error([&] { mixup_batch(u8, 0.5, {.num_classes = 2}); }, {"f32 input batch", "ToTensor"});
}

}  // namespace
}  // namespace colossal::data
