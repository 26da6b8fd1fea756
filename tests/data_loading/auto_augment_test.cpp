// AutoAugment's ops against torchvision's outputs (golden/torchvision_golden.inc, made by
// golden/make_torchvision_golden.py with torchvision 0.26) for every (op, magnitude bin, sign) of the
// CIFAR-10 policy, plus hand-checked small cases and the policy's sampling.
#include <gtest/gtest.h>

#include <cmath>
#include <map>

#include "colossal/core/view.h"  // contiguous_raw
#include "colossal/data/auto_augment.h"
#include "colossal/ops.h"
#include "data_test_util.h"

namespace colossal::data {
namespace golden {
#include "golden/torchvision_golden.inc"
}  // namespace golden
namespace {

using testing::expect_error;
using testing::from_hex;
using testing::test_image;

std::vector<uint8_t> bytes_of(const Tensor& t) {
  std::vector<uint8_t> out(static_cast<size_t>(t.numel()));
  std::memcpy(out.data(), core::contiguous_raw(t).raw_data(), out.size());
  return out;
}

AugmentOp op_from_name(const std::string& name) {
  for (int i = 0; i <= static_cast<int>(AugmentOp::invert); ++i) {
    if (name == augment_op_name(static_cast<AugmentOp>(i))) return static_cast<AugmentOp>(i);
  }
  ADD_FAILURE() << "unknown op " << name;
  return AugmentOp::invert;
}

/// Number of differing bytes, with the first few listed.
int count_mismatches(const std::vector<uint8_t>& got, const std::vector<uint8_t>& expected, std::string* detail) {
  int mismatches = 0;
  for (size_t i = 0; i < got.size() && i < expected.size(); ++i) {
    if (got[i] == expected[i]) continue;
    if (++mismatches <= 5) *detail += fmt::format(" [{}] {} vs {}", i, got[i], expected[i]);
  }
  return mismatches;
}

TEST(AutoAugmentOps, MatchTorchvisionForEveryCifar10PolicyEntry) {
  const Tensor image = test_image(3, 16, 18, 12345);
  int cases = 0;
  for (const golden::AugmentGolden& g : golden::kAugmentGolden) {
    const AugmentOp op = op_from_name(g.op);
    // The magnitude as torchvision computed it from its float32 linspace.
    const double magnitude = g.bin >= 0 ? augment_magnitude(op, g.bin, 16, 18) * g.sign : 0.0;
    EXPECT_EQ(magnitude, g.magnitude) << g.op << " bin " << g.bin;
    const std::vector<uint8_t> expected = from_hex(g.hex);
    const Tensor out = apply_augment_op(image, op, g.magnitude);
    ASSERT_EQ(out.dtype(), DType::u8);
    ASSERT_EQ(out.shape(), image.shape());
    std::string detail;
    // Exact: every op follows torchvision's float32 arithmetic and truncation step by step.
    EXPECT_EQ(count_mismatches(bytes_of(out), expected, &detail), 0)
        << g.op << " bin " << g.bin << " magnitude " << g.magnitude << ":" << detail;
    ++cases;
  }
  EXPECT_EQ(cases, 54);
}

TEST(AutoAugmentOps, FlatChannelsLargeImagesAndFillMatchTorchvision) {
  Tensor flat = test_image(3, 16, 18, 777);
  flat.select(0, 1).fill_(42);
  std::string detail;
  EXPECT_EQ(count_mismatches(bytes_of(autocontrast(flat)), from_hex(golden::kAutocontrastFlatHex), &detail), 0)
      << detail;
  EXPECT_EQ(count_mismatches(bytes_of(equalize(flat)), from_hex(golden::kEqualizeFlatHex), &detail), 0) << detail;
  EXPECT_EQ(count_mismatches(bytes_of(equalize(test_image(3, 40, 36, 99))), from_hex(golden::kEqualizeBigHex), &detail),
            0)
      << detail;
  EXPECT_EQ(count_mismatches(bytes_of(rotate(test_image(3, 16, 18, 12345), 30.0, {10.0, 20.0, 30.0})),
                             from_hex(golden::kRotate30FillHex), &detail),
            0)
      << detail;
}

TEST(AutoAugmentOps, HandCheckedSmallCases) {
  Tensor img = core::from_vector<uint8_t>({0, 100, 200, 255}, {1, 2, 2});
  EXPECT_EQ(bytes_of(invert(img)), (std::vector<uint8_t>{255, 155, 55, 0}));
  EXPECT_EQ(bytes_of(posterize(img, 2)), (std::vector<uint8_t>{0, 64, 192, 192}));
  EXPECT_EQ(bytes_of(solarize(img, 150.0)), (std::vector<uint8_t>{0, 100, 55, 0}));
  // Brightness 1.5: 150 and 300 -> clamped to 255.
  EXPECT_EQ(bytes_of(adjust_brightness(img, 1.5)), (std::vector<uint8_t>{0, 150, 255, 255}));
  // Autocontrast of 50..150 stretches by 255 / 100: 100 -> 127.5 truncated to 127.
  EXPECT_EQ(bytes_of(autocontrast(core::from_vector<uint8_t>({50, 100, 150, 150}, {1, 2, 2}))),
            (std::vector<uint8_t>{0, 127, 255, 255}));
  // Contrast 0 is the (grayscale) mean everywhere: (0 + 100 + 200 + 255) / 4 = 138.75 -> 138.
  EXPECT_EQ(bytes_of(adjust_contrast(img, 0.0)), (std::vector<uint8_t>{138, 138, 138, 138}));
  // Translate by +1 column moves pixels right and fills the first column with 0.
  Tensor row = core::from_vector<uint8_t>({1, 2, 3, 4, 5, 6}, {1, 2, 3});
  EXPECT_EQ(bytes_of(apply_augment_op(row, AugmentOp::translate_x, 1.9)), (std::vector<uint8_t>{0, 1, 2, 0, 4, 5}));
  EXPECT_EQ(bytes_of(apply_augment_op(row, AugmentOp::translate_y, -1.0)), (std::vector<uint8_t>{4, 5, 6, 0, 0, 0}));
  // A 90-degree rotation of a square image is exact: counter-clockwise, as torchvision.
  Tensor square = core::from_vector<uint8_t>({1, 2, 3, 4}, {1, 2, 2});
  EXPECT_EQ(bytes_of(rotate(square, 90.0)), (std::vector<uint8_t>{2, 4, 1, 3}));
  // Saturation leaves a one-channel image alone; sharpness leaves images of 2 rows alone.
  EXPECT_EQ(bytes_of(adjust_saturation(img, 0.0)), bytes_of(img));
  EXPECT_EQ(bytes_of(adjust_sharpness(img, 2.0)), bytes_of(img));
  expect_error([&] { posterize(img, 9); }, {"bits must be in 0..8"});
  expect_error([&] { invert(core::zeros({1, 2, 2})); }, {"uint8"});
  expect_error([&] { invert(core::zeros({2, 2, 2}, DType::u8)); }, {"1 or 3 channels"});
}

TEST(AutoAugmentPolicyTable, IsTorchvisionsCifar10Policy) {
  const auto& policy = auto_augment_policy(AutoAugmentPolicy::cifar10);
  ASSERT_EQ(policy.size(), 25u);
  EXPECT_EQ(policy[0][0].op, AugmentOp::invert);
  EXPECT_EQ(policy[0][1].op, AugmentOp::contrast);
  EXPECT_EQ(policy[0][1].bin, 6);
  EXPECT_EQ(policy[22][1].op, AugmentOp::solarize);
  EXPECT_DOUBLE_EQ(policy[22][1].probability, 0.8);
  EXPECT_EQ(policy[24][0].op, AugmentOp::translate_y);
  // Magnitude spaces (torchvision's _augmentation_space(10, (32, 32))).
  EXPECT_EQ(augment_magnitude(AugmentOp::posterize, 7, 32, 32), 5.0);
  EXPECT_EQ(augment_magnitude(AugmentOp::posterize, 0, 32, 32), 8.0);
  EXPECT_NEAR(augment_magnitude(AugmentOp::translate_x, 9, 32, 32), 150.0 / 331.0 * 32, 1e-5);
  EXPECT_NEAR(augment_magnitude(AugmentOp::rotate, 2, 32, 32), 20.0 / 3.0, 1e-5);
  EXPECT_EQ(augment_magnitude(AugmentOp::solarize, 0, 32, 32), 255.0);
  EXPECT_FALSE(augment_op_signed(AugmentOp::solarize));
  EXPECT_TRUE(augment_op_signed(AugmentOp::shear_x));
}

TEST(AutoAugmentTransform, IsDeterministicPerGeneratorAndAppliesOpsAtTheirRates) {
  const Tensor image = test_image(3, 32, 32, 5);
  AutoAugment augment;
  int unchanged = 0;
  std::map<std::vector<uint8_t>, int> distinct;
  for (uint64_t seed = 0; seed < 400; ++seed) {
    core::Generator g(seed), again(seed);
    const Tensor a = augment.apply(image, g);
    const Tensor b = augment.apply(image, again);
    ASSERT_EQ(bytes_of(a), bytes_of(b));
    ASSERT_EQ(a.shape(), image.shape());
    ASSERT_EQ(a.dtype(), DType::u8);
    unchanged += bytes_of(a) == bytes_of(image);
    ++distinct[bytes_of(a)];
  }
  // The chance that neither op of the drawn sub-policy fires, averaged over the 25 sub-policies, is
  // 0.2232 (plus rare no-op draws such as Color bin 0), so about 89 of 400 images come out
  // unchanged: the Binomial standard deviation is 8.3, so 50..140 is a loose band.
  EXPECT_GT(unchanged, 50);
  EXPECT_LT(unchanged, 140);
  // 25 sub-policies x which ops fire x signs give a few hundred possible outcomes, most of them
  // rare; 400 draws reach about 70 of them.
  EXPECT_GT(distinct.size(), 40u);
  expect_error(
      [&] {
        core::Generator g(0);
        augment.apply(core::zeros({3, 4, 4}), g);
      },
      {"AutoAugment", "uint8"});
}

}  // namespace
}  // namespace colossal::data
