// Synthetic images and labels, a pure function of (seed, index): for benchmarks and tests that need
// a dataset of a given size and shape without files.
#pragma once

#include <cstdint>

#include "colossal/data/dataset.h"

namespace colossal::data {

struct SyntheticImageOptions {
  int64_t size = 1024;              ///< number of samples
  Shape image_shape = {3, 32, 32};  ///< CHW
  int64_t num_classes = 10;         ///< labels uniform in [0, num_classes)
  uint64_t seed = 0;
  /// f32: standard normal pixels; u8: uniform in 0..255 (to feed ToTensor / AutoAugment).
  DType dtype = DType::f32;
};

class SyntheticImageDataset final : public Dataset {
 public:
  explicit SyntheticImageDataset(SyntheticImageOptions options);
  int64_t size() const override { return options_.size; }
  Example get(int64_t index) const override;

 private:
  SyntheticImageOptions options_;
};

}  // namespace colossal::data
