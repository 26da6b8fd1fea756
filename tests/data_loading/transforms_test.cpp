// Image transforms against hand-computed values and torchvision's outputs (golden/): conversion,
// padding modes, crop offsets drawn from the sample's generator, flips, bilinear resizing and
// normalisation; TransformDataset's determinism per (seed, epoch, index).
#include <gtest/gtest.h>

#include <cmath>

#include "colossal/data/dataset.h"
#include "colossal/data/random.h"
#include "colossal/data/synthetic.h"
#include "colossal/data/transforms.h"
#include "colossal/ops.h"
#include "data_test_util.h"

namespace colossal::data {
namespace golden {
#include "golden/torchvision_golden.inc"
}  // namespace golden
namespace {

using golden::kResizeGolden;
using golden::ResizeGolden;
using testing::expect_error;

/// [C, H, W] f32 whose element i is i (so crops and flips can be read off).
Tensor arange_image(int64_t c, int64_t h, int64_t w, DType dtype = DType::f32) {
  return core::arange(0, static_cast<double>(c * h * w), 1, dtype).reshape({c, h, w});
}

std::vector<float> values(const Tensor& t) {
  return t.to_vector<float>();
}

TEST(Transforms, ToTensorScalesUint8ToUnitRangeFromChwAndHwc) {
  Tensor chw = core::from_vector<uint8_t>({0, 51, 255, 102}, {1, 2, 2});
  EXPECT_EQ(values(to_float_image(chw)), (std::vector<float>{0.0f, 0.2f, 1.0f, 0.4f}));
  // HWC [1, 2, 3] (one row, two pixels, RGB) -> CHW [3, 1, 2].
  Tensor hwc = core::from_vector<uint8_t>({255, 0, 51, 102, 153, 204}, {1, 2, 3});
  Tensor out = to_float_image(hwc, Layout::hwc);
  EXPECT_EQ(out.shape(), (Shape{3, 1, 2}));
  EXPECT_EQ(values(out), (std::vector<float>{1.0f, 0.4f, 0.0f, 0.6f, 0.2f, 0.8f}));
  EXPECT_EQ(to_float_image(core::from_vector<uint8_t>({1, 2}, {1, 2})).shape(), (Shape{1, 1, 2}));
  expect_error([] { to_float_image(core::zeros({1, 2, 2})); }, {"ToTensor", "uint8"});
}

TEST(Transforms, PadModesMatchTorchvision) {
  Tensor row = core::from_vector<float>({1, 2, 3}, {1, 1, 3});
  EXPECT_EQ(values(pad(row, 2, 0, 2, 0, 9.0)), (std::vector<float>{9, 9, 1, 2, 3, 9, 9}));
  EXPECT_EQ(values(pad(row, 2, 0, 2, 0, 0, PaddingMode::edge)), (std::vector<float>{1, 1, 1, 2, 3, 3, 3}));
  EXPECT_EQ(values(pad(row, 2, 0, 2, 0, 0, PaddingMode::reflect)), (std::vector<float>{3, 2, 1, 2, 3, 2, 1}));
  EXPECT_EQ(values(pad(row, 2, 0, 2, 0, 0, PaddingMode::symmetric)), (std::vector<float>{2, 1, 1, 2, 3, 3, 2}));
  Tensor u8 = core::from_vector<uint8_t>({7}, {1, 1, 1});
  Tensor padded = pad(u8, 1, 1, 0, 0, 200.0);
  EXPECT_EQ(padded.dtype(), DType::u8);
  EXPECT_EQ(padded.to_vector<int64_t>(), (std::vector<int64_t>{200, 200, 200, 7}));
  expect_error([&] { pad(row, 3, 0, 0, 0, 0, PaddingMode::reflect); }, {"reflect padding", "larger than the image"});
}

TEST(Transforms, CropAndFlipMoveTheRightPixels) {
  Tensor img = arange_image(2, 3, 4);
  EXPECT_EQ(values(crop(img, 1, 2, 2, 2)), (std::vector<float>{6, 7, 10, 11, 18, 19, 22, 23}));
  EXPECT_EQ(values(horizontal_flip(core::from_vector<float>({1, 2, 3, 4, 5, 6}, {1, 2, 3}))),
            (std::vector<float>{3, 2, 1, 6, 5, 4}));
  expect_error([&] { crop(img, 2, 0, 2, 2); }, {"rows [2, 4)", "3x4 image"});
  expect_error([&] { horizontal_flip(core::zeros({4, 4})); }, {"CHW image", "[4, 4]"});
}

TEST(Transforms, RandomCropTakesTopThenLeftFromTheGenerator) {
  Tensor img = arange_image(1, 4, 4);
  RandomCrop transform(3, 1);  // pad 1 -> 6x6, crop 3x3: top and left uniform in 0..3
  std::set<std::pair<int64_t, int64_t>> offsets;
  for (uint64_t seed = 0; seed < 200; ++seed) {
    core::Generator g(seed), replay(seed);
    Tensor out = transform.apply(img, g);
    Rng rng(replay);
    const int64_t top = rng.integer(0, 4), left = rng.integer(0, 4);
    offsets.insert({top, left});
    EXPECT_EQ(values(out), values(crop(pad(img, 1, 1, 1, 1, 0.0), top, left, 3, 3))) << "seed " << seed;
    EXPECT_EQ(g.state(), replay.state());
  }
  EXPECT_EQ(offsets.size(), 16u);  // every offset is reachable
  // Hand-checked: offset (0, 0) keeps the zero border on the top and left.
  EXPECT_EQ(values(crop(pad(img, 1, 1, 1, 1, 0.0), 0, 0, 3, 3)), (std::vector<float>{0, 0, 0, 0, 0, 1, 0, 4, 5}));
  // pad_if_needed pads the short side on both ends by the shortfall (torchvision), then crops.
  RandomCrop needed({.height = 3, .width = 5, .pad_if_needed = true, .fill = -1});
  core::Generator g(1);
  Tensor out = needed.apply(arange_image(1, 3, 2), g);
  EXPECT_EQ(out.shape(), (Shape{1, 3, 5}));
  // Width 2 padded by 3 on each side to 8, then a 5-wide window: the padding is visible.
  int fill = 0;
  for (float v : values(out)) fill += v == -1.0f;
  EXPECT_GE(fill, 6);
  // Same size: no draw at all.
  core::Generator untouched(3);
  RandomCrop(4, 0).apply(img, untouched);
  EXPECT_EQ(untouched.state().offset, 0u);
  expect_error([&] { RandomCrop(5, 0).apply(img, untouched); }, {"crop 5x5 is larger", "4x4"});
}

TEST(Transforms, RandomHorizontalFlipFlipsWithProbabilityP) {
  Tensor img = arange_image(1, 1, 3);
  int flipped = 0;
  for (uint64_t seed = 0; seed < 1000; ++seed) {
    core::Generator g(seed);
    flipped += values(RandomHorizontalFlip(0.3).apply(img, g))[0] == 2.0f;
  }
  // Binomial(1000, 0.3): standard deviation 14.5; 75 is over 5 sigma.
  EXPECT_NEAR(flipped, 300, 75);
  core::Generator g(0);
  EXPECT_EQ(values(RandomHorizontalFlip(1.0).apply(img, g)), (std::vector<float>{2, 1, 0}));
  EXPECT_EQ(values(RandomHorizontalFlip(0.0).apply(img, g)), (std::vector<float>{0, 1, 2}));
}

TEST(Transforms, BilinearResizeOf2x2To4x4IsTorchvisionsResult) {
  // Upscaling by 2 with align_corners=False: output x samples input (x + 0.5) / 2 - 0.5, clamped at
  // 0, so columns read 0, 0.25, 0.75, 1 of the way across; rows likewise. For [[0, 1], [2, 3]]:
  const std::vector<float> expected = {0.0f, 0.25f, 0.75f, 1.0f, 0.5f, 0.75f, 1.25f, 1.5f,
                                       1.5f, 1.75f, 2.25f, 2.5f, 2.0f, 2.25f, 2.75f, 3.0f};
  Tensor img = core::from_vector<float>({0, 1, 2, 3}, {1, 2, 2});
  for (bool antialias : {true, false}) {
    const std::vector<float> got = values(resize_bilinear(img, 4, 4, antialias));
    ASSERT_EQ(got.size(), expected.size());
    // Each output is a two-tap blend with weights in quarters: exact in float.
    for (size_t i = 0; i < got.size(); ++i) EXPECT_EQ(got[i], expected[i]) << "antialias " << antialias << " i " << i;
  }
  // Downscaling 4 -> 2 without antialias samples at 0.5 and 2.5: the mean of pixel pairs; with
  // antialias the triangle filter spans 4 inputs: weights 1/4, 3/4, 3/4, 1/4 (normalised over the
  // 3 that fall inside for the edge outputs).
  Tensor wide = core::from_vector<float>({0, 4, 8, 12}, {1, 1, 4});
  EXPECT_EQ(values(resize_bilinear(wide, 1, 2, false)), (std::vector<float>{2, 10}));
  const std::vector<float> aa = values(resize_bilinear(wide, 1, 2, true));
  EXPECT_NEAR(aa[0], (0.75f * 0 + 0.75f * 4 + 0.25f * 8) / 1.75f, 1e-5);
  EXPECT_NEAR(aa[1], (0.25f * 4 + 0.75f * 8 + 0.75f * 12) / 1.75f, 1e-5);
}

TEST(Transforms, ResizeMatchesTorchvisionGolden) {
  const Tensor src = to_float_image(testing::test_image(3, 7, 9, 4242));
  for (const ResizeGolden& g : kResizeGolden) {
    const std::vector<float> got = values(resize_bilinear(src, g.height, g.width, g.antialias));
    ASSERT_EQ(got.size(), g.values.size());
    // Both sides compute in float32 with weights summing to 1 over values in [0, 1]; the order of the
    // taps differs, so allow a few float32 ulps of 1.
    for (size_t i = 0; i < got.size(); ++i) {
      EXPECT_NEAR(got[i], g.values[i], 2e-6)
          << g.height << "x" << g.width << " antialias " << g.antialias << " i " << i;
    }
  }
  // Resize(size): smaller edge to size, the other truncated to keep the aspect (torchvision).
  core::Generator gen(0);
  EXPECT_EQ(Resize::smaller_edge(4).apply(src, gen).shape(), (Shape{3, 4, 5}));  // 9 * 4 / 7 = 5.14
  EXPECT_EQ(Resize(3, 6).apply(src, gen).shape(), (Shape{3, 3, 6}));
}

TEST(Transforms, NormalizeSubtractsMeanAndDividesByStdPerChannel) {
  Tensor img = core::from_vector<float>({0.5f, 1.0f, 0.2f, 0.4f}, {2, 1, 2});
  Tensor out = Normalize({0.5, 0.2}, {0.5, 0.1}).apply(img, *std::make_unique<core::Generator>(0));
  const std::vector<float> got = values(out);
  EXPECT_FLOAT_EQ(got[0], 0.0f);
  EXPECT_FLOAT_EQ(got[1], 1.0f);
  EXPECT_FLOAT_EQ(got[2], 0.0f);
  EXPECT_FLOAT_EQ(got[3], 2.0f);
  expect_error([&] { normalize(img, {0.5, 0.5, 0.5}, {1.0}); }, {"mean has 3 values", "2 channels"});
  expect_error([] { Normalize({0.0}, {0.0}); }, {"std[0] is 0"});
}

TEST(Transforms, TransformDatasetDependsOnSeedEpochAndIndexOnly) {
  auto base = std::make_shared<SyntheticImageDataset>(
      SyntheticImageOptions{.size = 20, .image_shape = {3, 8, 8}, .dtype = DType::u8});
  auto pipeline = std::make_shared<Compose>(std::vector<std::shared_ptr<const Transform>>{
      std::make_shared<ToTensor>(), std::make_shared<RandomCrop>(8, 2), std::make_shared<RandomHorizontalFlip>(),
      std::make_shared<Normalize>(std::vector<double>{0.5}, std::vector<double>{0.25})});
  TransformDataset a(base, pipeline, 17), b(base, pipeline, 17);
  EXPECT_EQ(values(b.get(5).input), values(a.get(5).input));  // regardless of what was drawn before
  b.get(3);
  EXPECT_EQ(values(b.get(5).input), values(a.get(5).input));
  int differ = 0;
  b.set_epoch(1);
  for (int64_t i = 0; i < 20; ++i) differ += values(b.get(i).input) != values(a.get(i).input);
  EXPECT_GT(differ, 10);  // 25 crop offsets x 2 flips: a repeat per sample is unlikely
  EXPECT_NE(pipeline->name().find("RandomCrop"), std::string::npos);
  TransformDataset bad(base, std::make_shared<Normalize>(std::vector<double>{0.5}, std::vector<double>{0.5}), 0);
  expect_error([&] { bad.get(2); }, {"Normalize", "failed on sample 2", "ToTensor"});
}

}  // namespace
}  // namespace colossal::data
