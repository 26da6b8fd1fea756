// make_datasets' staged form (Datasets::staged, Note [Batch stages]): for each image pipeline a
// loader over the staged datasets with their batch stages gives the batches of the per-sample
// pipeline with its batch transform, bit for bit on the CPU (the stages' CPU kernels are the
// per-sample transforms), for the tutorial configs on stand-in CIFAR-10 files and for synthetic
// images; pipelines whose float transforms cannot move are left unstaged.
#include <fmt/format.h>
#include <gtest/gtest.h>
#include <unistd.h>  // getpid

#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "colossal/config/train_config.h"
#include "colossal/data/data_loader.h"
#include "colossal/data/synthetic.h"
#include "colossal/initialize/builders.h"

namespace colossal::initialize {
namespace {

namespace fs = std::filesystem;
const fs::path kConfigsDir = fs::path(COLOSSAL_TEST_DATA_DIR) / ".." / ".." / "configs";

/// CIFAR-10's binary files with `records` random-looking images each (label byte, 3072 pixels), in a
/// folder of the running test and process alone (ctest runs this file's tests side by side).
std::string stand_in_cifar10(int records) {
  const fs::path dir = fs::temp_directory_path() /
                       fmt::format("colossal_staged_datasets_test_{}_{}",
                                   ::testing::UnitTest::GetInstance()->current_test_info()->name(), ::getpid());
  fs::remove_all(dir);
  fs::create_directories(dir);
  int image = 0;
  for (const char* name : {"data_batch_1.bin", "data_batch_2.bin", "data_batch_3.bin", "data_batch_4.bin",
                           "data_batch_5.bin", "test_batch.bin"}) {
    std::ofstream out(dir / name, std::ios::binary);
    for (int r = 0; r < records; ++r, ++image) {
      out.put(static_cast<char>(image % 10));
      for (int j = 0; j < 3072; ++j) out.put(static_cast<char>((image * 131 + j * 17 + (j * j) / 7) % 256));
    }
  }
  return "data.path=" + dir.string();
}

/// The first `batches` batches of `dataset` in a loader of batch 3 (shuffled by seed 7) with the
/// given batch transform or stage, two workers.
std::vector<data::Batch> load(std::shared_ptr<data::Dataset> dataset,
                              std::shared_ptr<const data::BatchTransform> transform,
                              std::shared_ptr<const data::BatchStage> stage, int batches) {
  data::DataLoader loader(std::move(dataset), {.batch_size = 3,
                                               .drop_last = true,
                                               .shuffle = true,
                                               .seed = 7,
                                               .num_workers = 2,
                                               .batch_transform = std::move(transform),
                                               .batch_stage = std::move(stage)});
  std::vector<data::Batch> out;
  for (int b = 0; b < batches; ++b) out.push_back(*loader.next());
  return out;
}

void expect_same(const std::vector<data::Batch>& staged, const std::vector<data::Batch>& reference) {
  ASSERT_EQ(staged.size(), reference.size());
  for (size_t b = 0; b < staged.size(); ++b) {
    SCOPED_TRACE(fmt::format("batch {}", b));
    ASSERT_EQ(staged[b].input.shape(), reference[b].input.shape());
    ASSERT_EQ(staged[b].input.dtype(), DType::f32);
    EXPECT_EQ(staged[b].input.to_vector<float>(), reference[b].input.to_vector<float>());
    ASSERT_EQ(staged[b].target.dtype(), reference[b].target.dtype());
    if (reference[b].target.dtype() == DType::f32) {
      EXPECT_EQ(staged[b].target.to_vector<float>(), reference[b].target.to_vector<float>());
    } else {
      EXPECT_EQ(staged[b].target.to_vector<int64_t>(), reference[b].target.to_vector<int64_t>());
    }
  }
}

/// Staged and per-sample loaders of `c` agree on the training and the test set.
void expect_staged_equals_per_sample(const config::TrainConfig& c) {
  const Datasets d = make_datasets(c);
  ASSERT_TRUE(d.staged.has_value());
  const Datasets::Staged& s = *d.staged;
  ASSERT_NE(s.train_stage, nullptr);
  expect_same(load(s.train, nullptr, s.train_stage, 2), load(d.train, d.batch_transform, nullptr, 2));
  if (d.test) expect_same(load(s.test, nullptr, s.test_stage, 1), load(d.test, nullptr, nullptr, 1));
}

TEST(StagedDatasets, VitB16Cifar10TutorialEqualsThePerSamplePipeline) {
  // crop, flip and AutoAugment per sample; ToTensor, resize to 224, normalize and mixup staged.
  const config::TrainConfig c =
      config::load_config(kConfigsDir / "vit_b16_cifar10.toml", {stand_in_cifar10(4), "data.num_workers=0"});
  const Datasets d = make_datasets(c);
  ASSERT_TRUE(d.staged.has_value());
  EXPECT_NE(d.staged->train_stage->name().find("resize 224x224"), std::string::npos);
  EXPECT_NE(d.staged->train_stage->name().find("mixup"), std::string::npos);
  EXPECT_EQ(d.staged->test_stage->name().find("mixup"), std::string::npos);
  // The staged training samples are the uint8 32 x 32 images.
  const data::Example sample = d.staged->train->get(0);
  EXPECT_EQ(sample.input.dtype(), DType::u8);
  EXPECT_EQ(sample.input.shape(), (Shape{3, 32, 32}));
  expect_staged_equals_per_sample(c);
}

TEST(StagedDatasets, Resnet50Cifar10EqualsThePerSamplePipeline) {
  expect_staged_equals_per_sample(
      config::load_config(kConfigsDir / "resnet50_cifar10.toml", {stand_in_cifar10(4), "data.num_workers=0"}));
}

config::TrainConfig synthetic(const std::string& dtype, const std::string& transforms, const std::string& options) {
  return config::parse_config(fmt::format(R"(
[data]
dataset = "synthetic"
transforms = [{}]
options = {{ size = 12, test_size = 6, image_size = 10, channels = 3, num_classes = 5, dtype = "{}"{} }}
)",
                                          transforms, dtype, options),
                              {}, "test.toml");
}

TEST(StagedDatasets, SyntheticImagesStageTheirPixelsOrTheirTail) {
  // f32 without transforms: only pixel keys travel, the pixels are drawn by the stage.
  const config::TrainConfig plain = synthetic("f32", "", "");
  const Datasets d = make_datasets(plain);
  ASSERT_TRUE(d.staged.has_value());
  EXPECT_NE(dynamic_cast<const data::SyntheticPixelStage*>(d.staged->train_stage.get()), nullptr);
  EXPECT_EQ(d.staged->train->get(3).input.shape(), (Shape{2}));
  expect_staged_equals_per_sample(plain);
  // u8 with per-sample augmentation and a staged tail; u8 with nothing but ToTensor; f32 mixed.
  expect_staged_equals_per_sample(synthetic("u8", R"("random_crop", "random_flip", "resize", "normalize", "mixup")",
                                            ", crop_padding = 2, resize = 14, normalize_mean = [0.5], "
                                            "normalize_std = [0.25], mixup_alpha = 0.3"));
  expect_staged_equals_per_sample(synthetic("u8", "", ""));
  expect_staged_equals_per_sample(synthetic("f32", R"("mixup", "center_crop")", ", center_crop = 8"));
}

TEST(StagedDatasets, PipelinesWithoutAMovableTailStayPerSample) {
  // A crop of float pixels after the resize must run per sample, and f32 images that only get
  // cropped leave a stage nothing to do.
  EXPECT_FALSE(make_datasets(synthetic("u8", R"("resize", "center_crop")", ", resize = 12, center_crop = 8"))
                   .staged.has_value());
  EXPECT_FALSE(make_datasets(synthetic("f32", R"("center_crop")", ", center_crop = 8")).staged.has_value());
}

}  // namespace
}  // namespace colossal::initialize
