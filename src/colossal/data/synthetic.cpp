// Synthetic images drawn from Philox with the sample's own generator, and the stage that draws them
// from keys where the batch goes.
#include "colossal/data/synthetic.h"

#include "colossal/core/error.h"
#include "colossal/core/parallel_for.h"
#include "colossal/core/view.h"  // select_raw
#include "colossal/data/random.h"

namespace colossal::data {

constinit core::DispatchStub<SyntheticPixelKernel> synthetic_pixels_stub("synthetic_pixels");

namespace {

template <class T>
void fill_pixels(uint64_t seed, uint64_t offset, T* p, int64_t n) {
  for (int64_t i = 0; i < n; i += 4) {
    T block[4];
    synthetic_pixel_block<T>(seed, offset, static_cast<uint64_t>(i / 4), block);
    for (int64_t w = 0; w < 4 && i + w < n; ++w) p[i + w] = block[w];
  }
}

void fill_image(uint64_t seed, uint64_t offset, const Tensor& image) {
  if (image.dtype() == DType::u8) {
    fill_pixels(seed, offset, image.data<uint8_t>(), image.numel());
  } else {
    fill_pixels(seed, offset, image.data<float>(), image.numel());
  }
}

void synthetic_pixels_cpu(const Tensor& keys, const Tensor& out) {
  const int64_t b = keys.size(0);
  const auto* k = keys.data<int64_t>();
  core::parallel_for(0, b, 1, [&](int64_t begin, int64_t end) {
    for (int64_t i = begin; i < end; ++i) {
      fill_image(static_cast<uint64_t>(k[2 * i]), static_cast<uint64_t>(k[2 * i + 1]), core::select_raw(out, 0, i));
    }
  });
}
COLOSSAL_REGISTER_KERNEL(synthetic_pixels_stub, core::DeviceType::cpu, synthetic_pixels_cpu);

}  // namespace

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
  // One offset for the pixels.
  const uint64_t seed = generator.seed();
  const uint64_t offset = generator.next_offset(1);
  if (options_.pixel_keys) {
    Tensor key = core::empty({2}, DType::i64);
    key.data<int64_t>()[0] = static_cast<int64_t>(seed);
    key.data<int64_t>()[1] = static_cast<int64_t>(offset);
    return {key, label_tensor(label)};
  }
  Tensor image = core::empty(options_.image_shape, options_.dtype);
  fill_image(seed, offset, image);
  return {image, label_tensor(label)};
}

SyntheticPixelStage::SyntheticPixelStage(Shape image_shape, DType dtype)
    : image_shape_(std::move(image_shape)), dtype_(dtype) {
  core::check_shape(image_shape_, "SyntheticPixelStage image_shape");
  COLOSSAL_CHECK(dtype_ == DType::f32 || dtype_ == DType::u8, "SyntheticPixelStage: dtype must be f32 or u8, got {}",
                 dtype_);
}

Shape SyntheticPixelStage::output_shape(const Shape& input) const {
  COLOSSAL_CHECK(input.size() == 2 && input[1] == 2,
                 "{}: expected pixel keys [B, 2] (a SyntheticImageDataset with pixel_keys), got {}", name(), input);
  Shape out = image_shape_;
  out.insert(out.begin(), input[0]);
  return out;
}

void SyntheticPixelStage::run(const Batch& batch, const Tensor& out) const {
  const Tensor& keys = batch.input;
  COLOSSAL_CHECK(keys.defined() && keys.dtype() == DType::i64 && keys.is_contiguous(),
                 "{}: expected contiguous i64 pixel keys [B, 2], got {} {}", name(),
                 keys.defined() ? keys.dtype() : DType::i64, keys.defined() ? keys.shape() : Shape{});
  const Shape shape = output_shape(keys.shape());
  COLOSSAL_CHECK(out.defined() && out.dtype() == dtype_ && out.is_contiguous() && out.shape() == shape &&
                     out.device() == keys.device(),
                 "{}: the output must be contiguous {} {} on {}, got {} {} on {}", name(), dtype_, shape, keys.device(),
                 out.dtype(), out.shape(), out.device());
  if (out.numel() == 0) return;
  synthetic_pixels_stub(keys.device(), keys, out);
}

std::string SyntheticPixelStage::name() const {
  return fmt::format("SyntheticPixelStage({} {})", dtype_, image_shape_);
}

}  // namespace colossal::data
