// Synthetic images drawn from Philox with the sample's own generator.
#include "colossal/data/synthetic.h"

#include <cmath>
#include <numbers>

#include "colossal/core/error.h"
#include "colossal/core/philox.h"
#include "colossal/data/random.h"

namespace colossal::data {

SyntheticImageDataset::SyntheticImageDataset(SyntheticImageOptions options) : options_(std::move(options)) {
  COLOSSAL_CHECK(options_.size >= 0, "SyntheticImageDataset: size must be non-negative, got {}", options_.size);
  COLOSSAL_CHECK(options_.num_classes >= 1, "SyntheticImageDataset: num_classes must be at least 1, got {}",
                 options_.num_classes);
  core::check_shape(options_.image_shape, "SyntheticImageDataset image_shape");
  COLOSSAL_CHECK(options_.dtype == DType::f32 || options_.dtype == DType::u8,
                 "SyntheticImageDataset: dtype must be f32 or u8, got {}", options_.dtype);
}

Example SyntheticImageDataset::get(int64_t index) const {
  check_index(index, size(), "SyntheticImageDataset");
  core::Generator generator = derive_generator(options_.seed, RandomStream::synthetic, 0, index);
  Rng rng(generator);
  const int64_t label = rng.integer(0, options_.num_classes);
  Tensor image = core::empty(options_.image_shape, options_.dtype);
  const int64_t n = image.numel();
  // One offset for the pixels; element i uses word i % 4 of Philox block i / 4, as core's fills do.
  const uint64_t seed = generator.seed();
  const uint64_t offset = generator.next_offset(1);
  if (options_.dtype == DType::u8) {
    auto* p = image.data<uint8_t>();
    for (int64_t i = 0; i < n; i += 4) {
      const core::PhiloxBlock b = core::philox_block(seed, offset, static_cast<uint64_t>(i / 4));
      for (int64_t w = 0; w < 4 && i + w < n; ++w) p[i + w] = static_cast<uint8_t>(b.x[w] >> 24);
    }
  } else {
    auto* p = image.data<float>();
    for (int64_t i = 0; i < n; i += 4) {
      const core::PhiloxBlock b = core::philox_block(seed, offset, static_cast<uint64_t>(i / 4));
      float u[4];
      for (int w = 0; w < 4; ++w) u[w] = core::uniform_float(b.x[w]);
      for (int w = 0; w < 4; w += 2) {
        // Box-Muller, as core's normal_ does.
        const float radius = std::sqrt(-2.0f * std::log(1.0f - u[w]));
        const float angle = 2.0f * std::numbers::pi_v<float> * u[w + 1];
        if (i + w < n) p[i + w] = radius * std::cos(angle);
        if (i + w + 1 < n) p[i + w + 1] = radius * std::sin(angle);
      }
    }
  }
  return {image, label_tensor(label)};
}

}  // namespace colossal::data
