// Batch stages on the CPU (Note [Batch stages]): ImageBatchStage equals the per-sample transforms
// (ToTensor, resize_bilinear, normalize) followed by Mixup with the same draw, bit for bit, on
// random images; SyntheticPixelStage equals SyntheticImageDataset's own pixels; a DataLoader with a
// stage gives the per-sample pipeline's batches at any worker count; and bad batches or options
// are refused naming what is wrong.
#include <gtest/gtest.h>

#include "batch_stage_cases.h"
#include "colossal/core/view.h"  // select_raw
#include "colossal/data/data.h"
#include "data_test_util.h"

namespace colossal::data {
namespace {

using testing::expect_error;
using testing::image_stage_cases;
using testing::random_images;
using testing::StageCase;

Tensor random_labels(int64_t b, int64_t classes) {
  std::vector<int64_t> v;
  for (int64_t i = 0; i < b; ++i) v.push_back((i * 7 + 3) % classes);
  return core::from_vector<int64_t>(v, {b});
}

/// The per-sample reference: each image through to_float_image (u8), resize_bilinear, normalize,
/// stacked; then Mixup drawing from `generator`.
Batch reference(const Tensor& images, const Tensor& labels, const ImageBatchStageOptions& o,
                core::Generator generator) {
  std::vector<Tensor> out;
  for (int64_t i = 0; i < images.size(0); ++i) {
    Tensor image = core::contiguous_raw(core::select_raw(images, 0, i));
    if (image.dtype() == DType::u8) image = to_float_image(image);
    if (o.height > 0) image = resize_bilinear(image, o.height, o.width, o.antialias);
    if (!o.mean.empty()) image = normalize(image, o.mean, o.std);
    out.push_back(image);
  }
  Batch batch{.input = stack_tensors(out, host_empty, "input"), .target = labels};
  if (o.mixup) Mixup(*o.mixup).apply(batch, generator, host_empty);
  return batch;
}

Batch staged(const Tensor& images, const Tensor& labels, const ImageBatchStage& stage, core::Generator generator) {
  Batch batch{.input = images, .target = labels};
  stage.prepare(batch, generator, host_empty);
  run_batch_stage_on_host(stage, batch, host_empty);
  return batch;
}

TEST(ImageBatchStage, EqualsThePerSampleTransformsAndMixupBitForBit) {
  for (const StageCase& c : image_stage_cases()) {
    SCOPED_TRACE(c.what);
    const Tensor images = random_images(c.input, c.dtype, 17);
    const Tensor labels = random_labels(c.input[0], 10);
    const ImageBatchStage stage(c.options);
    const Batch want = reference(images, labels, c.options, core::Generator(23));
    const Batch got = staged(images, labels, stage, core::Generator(23));
    EXPECT_EQ(got.input.shape(), want.input.shape());
    EXPECT_EQ(got.input.to_vector<float>(), want.input.to_vector<float>());
    EXPECT_EQ(got.target.shape(), want.target.shape());
    if (c.options.mixup) {
      EXPECT_EQ(got.target.to_vector<float>(), want.target.to_vector<float>());
      ASSERT_EQ(got.draws.size(), 1u);
      core::Generator g(23);
      EXPECT_EQ(got.draws[0], draw_mixup_lambda(g, c.options.mixup->alpha));
    } else {
      EXPECT_EQ(got.target.to_vector<int64_t>(), labels.to_vector<int64_t>());
      EXPECT_TRUE(got.draws.empty());
    }
  }
}

TEST(ImageBatchStage, PlanTapsAreResizeBilinearsAndIdentityWithoutResize) {
  const ImageBatchStage resize(ImageBatchStageOptions{.height = 7, .width = 5, .antialias = false});
  const auto plan = resize.plan(3, 4, 9);
  const BilinearTaps x = bilinear_taps(9, 5, false);
  EXPECT_EQ(plan->taps_x, x.max_taps);
  EXPECT_EQ(plan->weights_x, x.weights);
  EXPECT_EQ(plan->first_x, (std::vector<int32_t>(x.first.begin(), x.first.end())));
  EXPECT_EQ(plan->out_height, 7);
  EXPECT_EQ(resize.plan(3, 4, 9), plan) << "plans are cached per geometry";

  const ImageBatchStage plain(ImageBatchStageOptions{});
  const auto identity = plain.plan(1, 3, 2);
  EXPECT_FALSE(identity->resize);
  EXPECT_EQ(identity->first_y, (std::vector<int32_t>{0, 1, 2}));
  EXPECT_EQ(identity->count_y, (std::vector<int32_t>{1, 1, 1}));
  EXPECT_EQ(identity->weights_y, (std::vector<float>{1, 1, 1}));
}

TEST(ImageBatchStage, RefusesBadOptionsAndUnpreparedOrMisshapenBatches) {
  expect_error([] { ImageBatchStage({.height = 4}); }, {"both positive or both 0"});
  expect_error([] { ImageBatchStage({.mean = {0.5}}); }, {"both mean and std"});
  expect_error([] { ImageBatchStage({.mean = {0.5}, .std = {0.0}}); }, {"std[0] is 0"});
  expect_error([] { ImageBatchStage({.mixup = MixupOptions{.alpha = 0, .num_classes = 10}}); }, {"alpha"});
  const ImageBatchStage mixing({.mixup = MixupOptions{.alpha = 0.2, .num_classes = 10}});
  Batch unprepared{.input = random_images({2, 3, 4, 4}, DType::u8, 1), .target = random_labels(2, 10)};
  expect_error([&] { run_batch_stage_on_host(mixing, unprepared, host_empty); }, {"call prepare()"});
  const ImageBatchStage normalizing({.mean = {0.1, 0.2}, .std = {1, 1}});
  Batch three_channels{.input = random_images({2, 3, 4, 4}, DType::u8, 1)};
  expect_error([&] { run_batch_stage_on_host(normalizing, three_channels, host_empty); },
               {"normalize has 2 values but the images have 3 channels"});
  Batch flat{.input = core::empty({2, 12}, DType::u8)};
  expect_error([&] { run_batch_stage_on_host(normalizing, flat, host_empty); }, {"expected images [B, C, H, W]"});
  Batch ints{.input = core::empty({2, 3, 4, 4}, DType::i32)};
  expect_error([&] { run_batch_stage_on_host(mixing, ints, host_empty); }, {"u8 or f32 images", "i32"});
  Batch no_targets{.input = random_images({2, 3, 4, 4}, DType::u8, 1)};
  core::Generator g(1);
  expect_error([&] { mixing.prepare(no_targets, g, host_empty); }, {"class indices [B]"});
}

TEST(SyntheticPixelStage, ExpandsKeysIntoTheDatasetsOwnPixels) {
  for (DType dtype : {DType::f32, DType::u8}) {
    SCOPED_TRACE(fmt::format("{}", dtype));
    const SyntheticImageOptions eager{.size = 9, .image_shape = {3, 5, 7}, .num_classes = 4, .seed = 3, .dtype = dtype};
    SyntheticImageOptions keyed = eager;
    keyed.pixel_keys = true;
    const SyntheticImageDataset pixels(eager), keys(keyed);
    std::vector<Example> key_examples, pixel_examples;
    for (int64_t i : {4, 0, 8, 5}) {
      key_examples.push_back(keys.get(i));
      pixel_examples.push_back(pixels.get(i));
      EXPECT_EQ(key_examples.back().input.shape(), (Shape{2}));
      EXPECT_EQ(key_examples.back().target.item<int64_t>(), pixel_examples.back().target.item<int64_t>());
    }
    Batch batch = stack_collate(key_examples, host_empty);
    const SyntheticPixelStage stage({3, 5, 7}, dtype);
    core::Generator unused(0);
    stage.prepare(batch, unused, host_empty);
    run_batch_stage_on_host(stage, batch, host_empty);
    const Batch want = stack_collate(pixel_examples, host_empty);
    ASSERT_EQ(batch.input.shape(), want.input.shape());
    ASSERT_EQ(batch.input.dtype(), dtype);
    if (dtype == DType::f32) {
      EXPECT_EQ(batch.input.to_vector<float>(), want.input.to_vector<float>());
    } else {
      EXPECT_EQ(batch.input.to_vector<uint8_t>(), want.input.to_vector<uint8_t>());
    }
  }
  const SyntheticPixelStage stage({3, 5, 7}, DType::f32);
  Batch pixels_not_keys{.input = core::empty({2, 3, 5, 7}, DType::f32)};
  expect_error([&] { run_batch_stage_on_host(stage, pixels_not_keys, host_empty); }, {"expected pixel keys [B, 2]"});
}

/// The per-sample crop and flip of uint8 images, as the staged datasets keep them.
std::shared_ptr<const Transform> uint8_augmentation() {
  return std::make_shared<Compose>(std::vector<std::shared_ptr<const Transform>>{
      std::make_shared<RandomCrop>(10, 2), std::make_shared<RandomHorizontalFlip>(), std::make_shared<AutoAugment>()});
}

TEST(DataLoaderWithStage, GivesThePerSamplePipelinesBatchesAtAnyWorkerCount) {
  auto base = std::make_shared<SyntheticImageDataset>(
      SyntheticImageOptions{.size = 29, .image_shape = {3, 10, 10}, .num_classes = 10, .seed = 8, .dtype = DType::u8});
  const ImageBatchStageOptions tail{.height = 16, .width = 16, .mean = {0.49, 0.48, 0.45}, .std = {0.25, 0.24, 0.26}};
  const MixupOptions mixup{.alpha = 0.2, .num_classes = 10};
  // The reference: every transform per sample, then Mixup as the batch transform.
  auto full = std::make_shared<Compose>(std::vector<std::shared_ptr<const Transform>>{
      uint8_augmentation(), std::make_shared<ToTensor>(), std::make_shared<Resize>(16, 16),
      std::make_shared<Normalize>(tail.mean, tail.std)});
  DataLoader per_sample(
      std::make_shared<TransformDataset>(base, full, 77),
      {.batch_size = 4, .shuffle = true, .seed = 5, .batch_transform = std::make_shared<Mixup>(mixup)});
  ImageBatchStageOptions with_mixup = tail;
  with_mixup.mixup = mixup;
  auto staged_dataset = std::make_shared<TransformDataset>(base, uint8_augmentation(), 77);
  for (int64_t workers : {0, 3}) {
    SCOPED_TRACE(fmt::format("{} workers", workers));
    DataLoader staged(staged_dataset, {.batch_size = 4,
                                       .shuffle = true,
                                       .seed = 5,
                                       .num_workers = workers,
                                       .batch_stage = std::make_shared<ImageBatchStage>(with_mixup)});
    for (int64_t epoch : {0, 1}) {
      const int64_t batches =
          testing::compare_passes(staged, per_sample, epoch, [](const Batch& got, const Batch& want) {
            EXPECT_EQ(got.sample_indices, want.sample_indices);
            EXPECT_EQ(got.input.shape(), (Shape{static_cast<int64_t>(want.sample_indices.size()), 3, 16, 16}));
            EXPECT_EQ(got.input.to_vector<float>(), want.input.to_vector<float>());
            EXPECT_EQ(got.target.to_vector<float>(), want.target.to_vector<float>());
          });
      EXPECT_EQ(batches, 8);  // ceil(29 / 4)
    }
  }
}

TEST(DataLoaderWithStage, AStageErrorArrivesAtItsBatch) {
  // Samples 4..7 have no labels: batch 0 mixes, and batch 1's error names the stage and the batch.
  class Unlabelled : public Dataset {
   public:
    int64_t size() const override { return 8; }
    Example get(int64_t index) const override {
      Tensor image = core::empty({1, 2, 2}, DType::u8);
      image.fill_(1.0);
      return {image, index >= 4 ? Tensor() : label_tensor(index)};
    }
  };
  DataLoader loader(std::make_shared<Unlabelled>(),
                    {.batch_size = 4,
                     .batch_stage = std::make_shared<ImageBatchStage>(
                         ImageBatchStageOptions{.mixup = MixupOptions{.alpha = 0.2, .num_classes = 4}})});
  ASSERT_TRUE(loader.next().has_value());
  expect_error([&] { loader.next(); }, {"ImageBatchStage(to f32, mixup alpha=0.2) failed on batch 1 of epoch 0"});
}

}  // namespace
}  // namespace colossal::data
