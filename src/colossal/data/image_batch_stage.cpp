// ImageBatchStage: its plan (resize taps, statistics), prepare (mixup's draw and soft targets) and
// the CPU kernel, which is the per-sample transforms applied image by image.
#include "colossal/data/image_batch_stage.h"

#include <cstring>

#include "colossal/core/error.h"
#include "colossal/core/parallel_for.h"
#include "colossal/core/view.h"        // select_raw, contiguous_raw
#include "colossal/data/transforms.h"  // bilinear_taps, to_float_image, resize_bilinear, normalize

namespace colossal::data {

constinit core::DispatchStub<ImageStageKernel> image_stage_stub("image_batch_stage");

namespace {

// The CPU kernel: each image goes through the very functions the per-sample transforms call, so a
// staged batch equals the per-sample pipeline's bit for bit; the batch is then mixed in place.
void image_stage_cpu(const Tensor& input, const Tensor& out, const ImageStagePlan& plan, bool mix, double lambda) {
  const int64_t b = input.size(0);
  const std::vector<double> mean(plan.mean.begin(), plan.mean.end()), std(plan.std.begin(), plan.std.end());
  const size_t image_bytes = static_cast<size_t>(out.numel() / std::max<int64_t>(b, 1)) * sizeof(float);
  core::parallel_for(0, b, 1, [&](int64_t begin, int64_t end) {
    for (int64_t i = begin; i < end; ++i) {
      Tensor image = core::select_raw(input, 0, i);
      if (image.dtype() == DType::u8) image = to_float_image(image);
      if (plan.resize) image = resize_bilinear(image, plan.out_height, plan.out_width, plan.antialias);
      if (!mean.empty()) image = normalize(image, mean, std);
      image = core::contiguous_raw(image);
      std::memcpy(static_cast<char*>(out.raw_data()) + static_cast<size_t>(i) * image_bytes, image.raw_data(),
                  image_bytes);
    }
  });
  if (mix) mix_with_previous_(out, lambda);
}
COLOSSAL_REGISTER_KERNEL(image_stage_stub, core::DeviceType::cpu, image_stage_cpu);

std::string join(const std::vector<double>& v) {
  return fmt::format("[{}]", fmt::join(v, ", "));
}

}  // namespace

std::vector<uint32_t> ImageStagePlan::packed_words() const {
  std::vector<uint32_t> words;
  const auto put_ints = [&](const std::vector<int32_t>& v) {
    for (int32_t x : v) words.push_back(static_cast<uint32_t>(x));
  };
  const auto put_floats = [&](const std::vector<float>& v) {
    for (float x : v) {
      uint32_t bits = 0;
      std::memcpy(&bits, &x, sizeof bits);
      words.push_back(bits);
    }
  };
  put_ints(first_x);
  put_ints(count_x);
  put_ints(first_y);
  put_ints(count_y);
  put_floats(weights_x);
  put_floats(weights_y);
  put_floats(mean);
  put_floats(std);
  return words;
}

ImageBatchStage::ImageBatchStage(ImageBatchStageOptions options) : options_(std::move(options)) {
  const ImageBatchStageOptions& o = options_;
  COLOSSAL_CHECK(o.height >= 0 && o.width >= 0 && (o.height == 0) == (o.width == 0),
                 "ImageBatchStage: resize size must be both positive or both 0 (no resize), got {}x{}", o.height,
                 o.width);
  COLOSSAL_CHECK(o.mean.empty() == o.std.empty(),
                 "ImageBatchStage: normalize needs both mean and std (got {} and {} values)", o.mean.size(),
                 o.std.size());
  for (size_t i = 0; i < o.std.size(); ++i) COLOSSAL_CHECK(o.std[i] != 0.0, "ImageBatchStage: std[{}] is 0", i);
  if (o.mixup) {
    COLOSSAL_CHECK(o.mixup->alpha > 0.0, "ImageBatchStage: mixup alpha must be positive, got {}", o.mixup->alpha);
    COLOSSAL_CHECK(o.mixup->num_classes >= 1, "ImageBatchStage: mixup num_classes must be at least 1, got {}",
                   o.mixup->num_classes);
  }
}

std::shared_ptr<const ImageStagePlan> ImageBatchStage::plan(int64_t channels, int64_t height, int64_t width) const {
  std::lock_guard lock(mutex_);
  const auto key = std::make_tuple(channels, height, width);
  if (auto it = plans_.find(key); it != plans_.end()) return it->second;
  const ImageBatchStageOptions& o = options_;
  for (const auto* v : {&o.mean, &o.std}) {
    COLOSSAL_CHECK(v->size() <= 1 || static_cast<int64_t>(v->size()) == channels,
                   "ImageBatchStage: normalize has {} values but the images have {} channels (give 1 or {})", v->size(),
                   channels, channels);
  }
  auto p = std::make_shared<ImageStagePlan>();
  p->channels = channels;
  p->in_height = height;
  p->in_width = width;
  p->out_height = o.height > 0 ? o.height : height;
  p->out_width = o.width > 0 ? o.width : width;
  p->resize = o.height > 0;
  p->antialias = o.antialias;
  // Without a resize the taps are the identity (one tap of weight 1), which the GPU kernel reads
  // like any other; the CPU kernel skips them.
  const auto fill_axis = [&](int64_t in, int64_t out, std::vector<int32_t>& first, std::vector<int32_t>& count,
                             std::vector<float>& weights) -> int64_t {
    if (o.height == 0) {
      for (int64_t i = 0; i < out; ++i) {
        first.push_back(static_cast<int32_t>(i));
        count.push_back(1);
        weights.push_back(1.0f);
      }
      return 1;
    }
    const BilinearTaps taps = bilinear_taps(in, out, o.antialias);
    for (int64_t i = 0; i < out; ++i) {
      first.push_back(static_cast<int32_t>(taps.first[static_cast<size_t>(i)]));
      count.push_back(static_cast<int32_t>(taps.count[static_cast<size_t>(i)]));
    }
    weights = taps.weights;
    return taps.max_taps;
  };
  p->taps_x = fill_axis(width, p->out_width, p->first_x, p->count_x, p->weights_x);
  p->taps_y = fill_axis(height, p->out_height, p->first_y, p->count_y, p->weights_y);
  if (!o.mean.empty()) {
    for (int64_t c = 0; c < channels; ++c) {
      p->mean.push_back(static_cast<float>(o.mean[o.mean.size() == 1 ? 0 : static_cast<size_t>(c)]));
      p->std.push_back(static_cast<float>(o.std[o.std.size() == 1 ? 0 : static_cast<size_t>(c)]));
    }
  }
  plans_.emplace(key, p);
  return p;
}

void ImageBatchStage::prepare(Batch& batch, core::Generator& generator, const HostAllocator& allocate) const {
  if (!options_.mixup) return;
  const double lambda = draw_mixup_lambda(generator, options_.mixup->alpha);
  batch.draws = {lambda};
  COLOSSAL_CHECK(batch.target.defined() && batch.target.dim() == 1 && batch.input.defined() && batch.input.dim() >= 1 &&
                     batch.target.size(0) == batch.input.size(0),
                 "{}: mixup needs class indices [B] beside the B images, got targets {}", name(),
                 batch.target.defined() ? batch.target.shape() : Shape{});
  batch.target = mixup_targets(batch.target, lambda, *options_.mixup, allocate);
}

Shape ImageBatchStage::output_shape(const Shape& input) const {
  COLOSSAL_CHECK(input.size() == 4, "{}: expected images [B, C, H, W], got {}", name(), input);
  return {input[0], input[1], options_.height > 0 ? options_.height : input[2],
          options_.width > 0 ? options_.width : input[3]};
}

void ImageBatchStage::run(const Batch& batch, const Tensor& out) const {
  const Tensor& input = batch.input;
  COLOSSAL_CHECK(input.defined() && input.dim() == 4 && (input.dtype() == DType::u8 || input.dtype() == DType::f32) &&
                     input.is_contiguous(),
                 "{}: expected contiguous u8 or f32 images [B, C, H, W], got {} {}", name(),
                 input.defined() ? input.dtype() : DType::u8, input.defined() ? input.shape() : Shape{});
  COLOSSAL_CHECK(out.defined() && out.dtype() == DType::f32 && out.is_contiguous() &&
                     out.shape() == output_shape(input.shape()) && out.device() == input.device(),
                 "{}: the output must be contiguous f32 {} on {}, got {} {} on {}", name(), output_shape(input.shape()),
                 input.device(), out.dtype(), out.shape(), out.device());
  const bool mix = options_.mixup.has_value();
  COLOSSAL_CHECK(!mix || batch.draws.size() == 1,
                 "{}: the batch was not prepared (mixup's lambda is missing); call prepare() on the worker first",
                 name());
  if (input.numel() == 0) return;
  const std::shared_ptr<const ImageStagePlan> p = plan(input.size(1), input.size(2), input.size(3));
  image_stage_stub(input.device(), input, out, *p, mix, mix ? batch.draws[0] : 1.0);
}

std::string ImageBatchStage::name() const {
  const ImageBatchStageOptions& o = options_;
  std::vector<std::string> parts{"to f32"};
  if (o.height > 0) parts.push_back(fmt::format("resize {}x{} antialias={}", o.height, o.width, o.antialias));
  if (!o.mean.empty()) parts.push_back(fmt::format("normalize mean={} std={}", join(o.mean), join(o.std)));
  if (o.mixup) parts.push_back(fmt::format("mixup alpha={}", o.mixup->alpha));
  return fmt::format("ImageBatchStage({})", fmt::join(parts, ", "));
}

}  // namespace colossal::data
