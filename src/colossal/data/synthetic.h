// Synthetic images and labels, a pure function of (seed, index): for benchmarks and tests that need
// a dataset of a given size and shape without files. The pixels can also be made where a batch is
// consumed (SyntheticPixelStage, on the GPU for GPU runs) from a 16-byte key per sample, with the
// values the dataset would have returned.
#pragma once

#include <cmath>
#include <cstdint>
#include <numbers>
#include <string>

#include "colossal/core/dispatch.h"
#include "colossal/core/half.h"    // COLOSSAL_HOST_DEVICE
#include "colossal/core/philox.h"  // philox_block, uniform_float
#include "colossal/data/batch_stage.h"
#include "colossal/data/dataset.h"

namespace colossal::data {

struct SyntheticImageOptions {
  int64_t size = 1024;              ///< number of samples
  Shape image_shape = {3, 32, 32};  ///< CHW
  int64_t num_classes = 10;         ///< labels uniform in [0, num_classes)
  uint64_t seed = 0;
  /// f32: standard normal pixels; u8: uniform in 0..255 (to feed ToTensor / AutoAugment).
  DType dtype = DType::f32;
  /// get() returns the pixels' Philox key (i64 [2]: seed and offset) instead of the image, for a
  /// SyntheticPixelStage to expand where the batch goes; the label is the same either way.
  bool pixel_keys = false;
};

class SyntheticImageDataset final : public Dataset {
 public:
  explicit SyntheticImageDataset(SyntheticImageOptions options);
  int64_t size() const override { return options_.size; }
  Example get(int64_t index) const override;
  const SyntheticImageOptions& options() const { return options_; }

 private:
  SyntheticImageOptions options_;
};

/// Pixels of a key: element i uses word i % 4 of Philox block i / 4 of (seed, offset), as core's
/// fills do. u8: the word's top byte; f32: Box-Muller on the uniforms of words 2j and 2j + 1 of a
/// block, in float. One function for the CPU and CUDA, so both evaluate the same expression (the
/// float log, cos and sin of the two libraries differ by an ulp or two).
template <class T>
COLOSSAL_HOST_DEVICE inline void synthetic_pixel_block(uint64_t seed, uint64_t offset, uint64_t block, T out[4]) {
  const core::PhiloxBlock b = core::philox_block(seed, offset, block);
  if constexpr (sizeof(T) == 1) {
    for (int w = 0; w < 4; ++w) out[w] = static_cast<T>(b.x[w] >> 24);
  } else {
    for (int w = 0; w < 4; w += 2) {
      const float u0 = core::uniform_float(b.x[w]), u1 = core::uniform_float(b.x[w + 1]);
      // 1 - u0 lies in (0, 1], so the log is finite.
      const float radius = sqrtf(-2.0f * logf(1.0f - u0));
      const float angle = 2.0f * std::numbers::pi_v<float> * u1;
      out[w] = radius * cosf(angle);
      out[w + 1] = radius * sinf(angle);
    }
  }
}

/// The kernel of SyntheticPixelStage for one device: keys [B, 2] i64 (seed, offset) -> out [B, ...]
/// (u8 or f32, contiguous, on the keys' device).
using SyntheticPixelKernel = void(const Tensor& keys, const Tensor& out);
extern core::DispatchStub<SyntheticPixelKernel> synthetic_pixels_stub;

/// Expands a batch of SyntheticImageDataset pixel keys (options.pixel_keys) into its images, equal
/// to what the dataset returns without pixel_keys (bit for bit on the CPU, to an ulp or two of the
/// float log/cos/sin on a GPU).
class SyntheticPixelStage final : public BatchStage {
 public:
  /// `image_shape` and `dtype` as the dataset's options.
  SyntheticPixelStage(Shape image_shape, DType dtype);
  void prepare(Batch&, core::Generator&, const HostAllocator&) const override {}
  Shape output_shape(const Shape& input) const override;
  DType output_dtype() const override { return dtype_; }
  void run(const Batch& batch, const Tensor& out) const override;
  std::string name() const override;

 private:
  Shape image_shape_;
  DType dtype_;
};

}  // namespace colossal::data
