// What the batch-stage tests (CPU and GPU) share: random image batches and the ImageBatchStage
// cases both run (upscaling as the tutorial does, downscaling with and without antialias, u8 and
// f32 inputs, with and without normalize and mixup, a batch of one), and a side-by-side pass of two
// loaders.
#pragma once

#include <gtest/gtest.h>

#include <optional>
#include <vector>

#include "colossal/data/data.h"

namespace colossal::data::testing {

/// Random images [B, C, H, W]: u8 uniform over 0..255, or f32 standard normal.
inline Tensor random_images(const Shape& shape, DType dtype, uint64_t seed) {
  SyntheticImageDataset images(SyntheticImageOptions{.size = shape[0],
                                                     .image_shape = {shape[1], shape[2], shape[3]},
                                                     .num_classes = 10,
                                                     .seed = seed,
                                                     .dtype = dtype});
  std::vector<Tensor> list;
  for (int64_t i = 0; i < shape[0]; ++i) list.push_back(images.get(i).input);
  return stack_tensors(list, host_empty, "input");
}

struct StageCase {
  const char* what;
  DType dtype;
  Shape input;
  ImageBatchStageOptions options;
};

inline std::vector<StageCase> image_stage_cases() {
  const MixupOptions mixup{.alpha = 0.4, .num_classes = 10, .label_smoothing = 0.1};
  return {
      {"the tutorial's tail: 32 -> 224, normalized, mixed",
       DType::u8,
       {4, 3, 32, 32},
       {.height = 224, .width = 224, .mean = {0.4914, 0.4822, 0.4465}, .std = {0.247, 0.2435, 0.2616}, .mixup = mixup}},
      {"u8 downscaled with antialias, wide rows",
       DType::u8,
       {3, 3, 17, 300},
       {.height = 5, .width = 130, .mean = {0.5}, .std = {0.2}}},
      {"u8 downscaled without antialias, mixed",
       DType::u8,
       {4, 1, 17, 13},
       {.height = 6, .width = 9, .antialias = false, .mixup = mixup}},
      {"u8 to float only", DType::u8, {2, 3, 4, 4}, {}},
      {"f32 normalized and mixed", DType::f32, {6, 2, 5, 7}, {.mean = {0.1, -0.2}, .std = {1.5, 0.5}, .mixup = mixup}},
      {"f32 resized, one image", DType::f32, {1, 3, 6, 6}, {.height = 11, .width = 3, .mixup = mixup}},
  };
}

/// Runs both loaders through `epoch` side by side, calling check(batch of a, batch of b) on each
/// pair; returns the number of pairs (and fails the test when one loader ends first).
template <class Check>
int64_t compare_passes(DataLoader& a, DataLoader& b, int64_t epoch, Check&& check) {
  a.set_epoch(epoch);
  b.set_epoch(epoch);
  int64_t batches = 0;
  while (true) {
    std::optional<Batch> x = a.next(), y = b.next();
    if (x.has_value() != y.has_value()) {
      ADD_FAILURE() << "one loader ended after " << batches << " batches, the other did not";
      return batches;
    }
    if (!x) return batches;
    check(*x, *y);
    ++batches;
  }
}

}  // namespace colossal::data::testing
