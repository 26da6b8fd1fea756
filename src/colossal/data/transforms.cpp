// Geometry and colour transforms on CHW images.
#include "colossal/data/transforms.h"

#include <algorithm>
#include <cmath>
#include <cstring>

#include "colossal/core/error.h"
#include "colossal/core/view.h"  // contiguous_raw
#include "colossal/data/random.h"

namespace colossal::data {
namespace {

/// The image as a contiguous CPU CHW tensor; throws naming `op` otherwise.
Tensor checked_chw(const Tensor& image, const char* op) {
  COLOSSAL_CHECK(image.defined(), "{}: the image is undefined", op);
  COLOSSAL_CHECK(image.device().is_cpu(), "{}: images are transformed on the CPU, got one on {}", op, image.device());
  COLOSSAL_CHECK(image.dim() == 3, "{}: expected a CHW image [C, H, W], got shape {}", op, image.shape());
  return core::contiguous_raw(image);
}

Tensor checked_float_chw(const Tensor& image, const char* op) {
  Tensor t = checked_chw(image, op);
  COLOSSAL_CHECK(t.dtype() == DType::f32,
                 "{}: expected an f32 image, got {} (convert uint8 images with ToTensor first)", op, t.dtype());
  return t;
}

/// `value` stored as one element of dtype, as raw bytes.
std::vector<char> element_bytes(DType dtype, double value) {
  std::vector<char> out(core::element_size(dtype));
  Tensor scalar = core::empty({}, dtype);
  scalar.fill_(value);
  std::memcpy(out.data(), scalar.raw_data(), out.size());
  return out;
}

/// Source index for padded position i of a length-n axis, or -1 for the fill value.
int64_t padded_source(int64_t i, int64_t n, PaddingMode mode) {
  if (i >= 0 && i < n) return i;
  switch (mode) {
    case PaddingMode::constant:
      return -1;
    case PaddingMode::edge:
      return std::clamp<int64_t>(i, 0, n - 1);
    case PaddingMode::reflect:
      return i < 0 ? -i : 2 * (n - 1) - i;
    case PaddingMode::symmetric:
      return i < 0 ? -i - 1 : 2 * n - 1 - i;
  }
  return -1;
}

const char* padding_mode_name(PaddingMode mode) {
  switch (mode) {
    case PaddingMode::constant:
      return "constant";
    case PaddingMode::edge:
      return "edge";
    case PaddingMode::reflect:
      return "reflect";
    case PaddingMode::symmetric:
      return "symmetric";
  }
  return "?";
}

}  // namespace

BilinearTaps bilinear_taps(int64_t in, int64_t out, bool antialias) {
  COLOSSAL_CHECK(in >= 1 && out >= 1, "resize: sizes must be positive, got {} -> {}", in, out);
  BilinearTaps a;
  const double scale = static_cast<double>(in) / static_cast<double>(out);
  if (antialias) {
    // PIL's and torch's antialiased bilinear: a triangle filter stretched by the downscale factor.
    const double support = scale >= 1.0 ? scale : 1.0;
    const double inv = scale >= 1.0 ? 1.0 / scale : 1.0;
    a.max_taps = static_cast<int64_t>(std::ceil(support)) * 2 + 1;
    a.weights.assign(static_cast<size_t>(out * a.max_taps), 0.0f);
    for (int64_t i = 0; i < out; ++i) {
      const double center = scale * (static_cast<double>(i) + 0.5);
      const int64_t lo = std::max<int64_t>(static_cast<int64_t>(center - support + 0.5), 0);
      const int64_t hi = std::min<int64_t>(static_cast<int64_t>(center + support + 0.5), in);
      const int64_t n = std::min(hi - lo, a.max_taps);
      double total = 0.0;
      std::vector<double> w(static_cast<size_t>(n));
      for (int64_t j = 0; j < n; ++j) {
        const double x = (static_cast<double>(j + lo) - center + 0.5) * inv;
        w[static_cast<size_t>(j)] = std::max(0.0, 1.0 - std::abs(x));
        total += w[static_cast<size_t>(j)];
      }
      for (int64_t j = 0; j < n; ++j) {
        a.weights[static_cast<size_t>(i * a.max_taps + j)] =
            static_cast<float>(total > 0.0 ? w[static_cast<size_t>(j)] / total : 0.0);
      }
      a.first.push_back(lo);
      a.count.push_back(n);
    }
  } else {
    // torch.nn.functional.interpolate(mode="bilinear", align_corners=False): two taps around
    // scale * (i + 0.5) - 0.5, clamped at 0.
    a.max_taps = 2;
    a.weights.assign(static_cast<size_t>(out * 2), 0.0f);
    for (int64_t i = 0; i < out; ++i) {
      const double src = std::max(scale * (static_cast<double>(i) + 0.5) - 0.5, 0.0);
      const auto x0 = std::min(static_cast<int64_t>(src), in - 1);
      const int64_t step = x0 < in - 1 ? 1 : 0;
      const double lambda = std::min(src - static_cast<double>(x0), 1.0);
      a.first.push_back(x0);
      a.count.push_back(step + 1);
      // At the last input both taps are the same pixel: its weights add up to 1.
      a.weights[static_cast<size_t>(i * 2)] = step ? static_cast<float>(1.0 - lambda) : 1.0f;
      if (step) a.weights[static_cast<size_t>(i * 2 + 1)] = static_cast<float>(lambda);
    }
  }
  return a;
}

Tensor to_float_image(const Tensor& image, Layout layout) {
  COLOSSAL_CHECK(image.defined() && image.device().is_cpu(), "ToTensor: expected a CPU image");
  COLOSSAL_CHECK(image.dtype() == DType::u8, "ToTensor: expected a uint8 image, got {}", image.dtype());
  COLOSSAL_CHECK(image.dim() == 2 || image.dim() == 3, "ToTensor: expected [H, W], [C, H, W] or [H, W, C], got {}",
                 image.shape());
  const Tensor src = core::contiguous_raw(image);
  int64_t c = 1, h = 0, w = 0;
  if (src.dim() == 2) {
    h = src.size(0), w = src.size(1);
  } else if (layout == Layout::chw) {
    c = src.size(0), h = src.size(1), w = src.size(2);
  } else {
    h = src.size(0), w = src.size(1), c = src.size(2);
  }
  Tensor out = core::empty({c, h, w}, DType::f32);
  const uint8_t* in = src.data<uint8_t>();
  float* o = out.data<float>();
  const int64_t plane = h * w;
  if (src.dim() == 3 && layout == Layout::hwc) {
    for (int64_t p = 0; p < plane; ++p)
      for (int64_t k = 0; k < c; ++k) o[k * plane + p] = static_cast<float>(in[p * c + k]) / 255.0f;
  } else {
    for (int64_t i = 0; i < c * plane; ++i) o[i] = static_cast<float>(in[i]) / 255.0f;
  }
  return out;
}

Tensor pad(const Tensor& image, int64_t left, int64_t top, int64_t right, int64_t bottom, double fill,
           PaddingMode mode) {
  const Tensor src = checked_chw(image, "pad");
  COLOSSAL_CHECK(left >= 0 && top >= 0 && right >= 0 && bottom >= 0,
                 "pad: padding must be non-negative, got left={} top={} right={} bottom={}", left, top, right, bottom);
  const int64_t c = src.size(0), h = src.size(1), w = src.size(2);
  if (mode != PaddingMode::constant) {
    COLOSSAL_CHECK(h > 0 && w > 0, "pad: {} padding needs a non-empty image, got {}", padding_mode_name(mode),
                   src.shape());
    const int64_t limit_h = mode == PaddingMode::reflect ? h - 1 : h;
    const int64_t limit_w = mode == PaddingMode::reflect ? w - 1 : w;
    COLOSSAL_CHECK(std::max(top, bottom) <= limit_h && std::max(left, right) <= limit_w,
                   "pad: {} padding of (left={}, top={}, right={}, bottom={}) is larger than the image {} allows (at "
                   "most {} rows and {} columns)",
                   padding_mode_name(mode), left, top, right, bottom, src.shape(), limit_h, limit_w);
  }
  const int64_t oh = h + top + bottom, ow = w + left + right;
  Tensor out = core::empty({c, oh, ow}, src.dtype());
  const size_t es = src.element_size();
  const std::vector<char> fill_value = element_bytes(src.dtype(), fill);
  const char* in = static_cast<const char*>(src.raw_data());
  char* o = static_cast<char*>(out.raw_data());
  for (int64_t k = 0; k < c; ++k) {
    for (int64_t y = 0; y < oh; ++y) {
      const int64_t sy = padded_source(y - top, h, mode);
      for (int64_t x = 0; x < ow; ++x) {
        const int64_t sx = padded_source(x - left, w, mode);
        char* dst = o + static_cast<size_t>((k * oh + y) * ow + x) * es;
        if (sy < 0 || sx < 0) {
          std::memcpy(dst, fill_value.data(), es);
        } else {
          std::memcpy(dst, in + static_cast<size_t>((k * h + sy) * w + sx) * es, es);
        }
      }
    }
  }
  return out;
}

Tensor crop(const Tensor& image, int64_t top, int64_t left, int64_t height, int64_t width) {
  const Tensor src = checked_chw(image, "crop");
  const int64_t c = src.size(0), h = src.size(1), w = src.size(2);
  COLOSSAL_CHECK(top >= 0 && left >= 0 && height >= 0 && width >= 0 && top + height <= h && left + width <= w,
                 "crop: rows [{}, {}) and columns [{}, {}) are not inside the {}x{} image", top, top + height, left,
                 left + width, h, w);
  Tensor out = core::empty({c, height, width}, src.dtype());
  const size_t es = src.element_size();
  const char* in = static_cast<const char*>(src.raw_data());
  char* o = static_cast<char*>(out.raw_data());
  for (int64_t k = 0; k < c; ++k)
    for (int64_t y = 0; y < height; ++y)
      std::memcpy(o + static_cast<size_t>((k * height + y) * width) * es,
                  in + static_cast<size_t>((k * h + top + y) * w + left) * es, static_cast<size_t>(width) * es);
  return out;
}

Tensor horizontal_flip(const Tensor& image) {
  const Tensor src = checked_chw(image, "horizontal_flip");
  const int64_t rows = src.size(0) * src.size(1), w = src.size(2);
  Tensor out = core::empty(src.shape(), src.dtype());
  const size_t es = src.element_size();
  const char* in = static_cast<const char*>(src.raw_data());
  char* o = static_cast<char*>(out.raw_data());
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t x = 0; x < w; ++x)
      std::memcpy(o + static_cast<size_t>(r * w + x) * es, in + static_cast<size_t>(r * w + (w - 1 - x)) * es, es);
  return out;
}

Tensor resize_bilinear(const Tensor& image, int64_t height, int64_t width, bool antialias) {
  const Tensor src = checked_float_chw(image, "resize");
  COLOSSAL_CHECK(height >= 1 && width >= 1, "resize: output size must be positive, got {}x{}", height, width);
  const int64_t c = src.size(0), h = src.size(1), w = src.size(2);
  COLOSSAL_CHECK(h >= 1 && w >= 1, "resize: cannot resize an empty image {}", src.shape());
  const BilinearTaps wx = bilinear_taps(w, width, antialias);
  const BilinearTaps wy = bilinear_taps(h, height, antialias);
  // Horizontal pass into [C, H, width], then vertical into [C, height, width] (torch's order).
  std::vector<float> tmp(static_cast<size_t>(c * h * width));
  const float* in = src.data<float>();
  for (int64_t r = 0; r < c * h; ++r) {
    for (int64_t x = 0; x < width; ++x) {
      float acc = 0.0f;
      const int64_t first = wx.first[static_cast<size_t>(x)];
      for (int64_t t = 0; t < wx.count[static_cast<size_t>(x)]; ++t) {
        acc += wx.weights[static_cast<size_t>(x * wx.max_taps + t)] * in[r * w + first + t];
      }
      tmp[static_cast<size_t>(r * width + x)] = acc;
    }
  }
  Tensor out = core::empty({c, height, width}, DType::f32);
  float* o = out.data<float>();
  for (int64_t k = 0; k < c; ++k) {
    for (int64_t y = 0; y < height; ++y) {
      const int64_t first = wy.first[static_cast<size_t>(y)];
      for (int64_t x = 0; x < width; ++x) {
        float acc = 0.0f;
        for (int64_t t = 0; t < wy.count[static_cast<size_t>(y)]; ++t) {
          acc += wy.weights[static_cast<size_t>(y * wy.max_taps + t)] *
                 tmp[static_cast<size_t>((k * h + first + t) * width + x)];
        }
        o[(k * height + y) * width + x] = acc;
      }
    }
  }
  return out;
}

Tensor normalize(const Tensor& image, const std::vector<double>& mean, const std::vector<double>& std) {
  const Tensor src = checked_float_chw(image, "normalize");
  const int64_t c = src.size(0), plane = src.size(1) * src.size(2);
  const auto per_channel = [&](const std::vector<double>& v, const char* what) {
    COLOSSAL_CHECK(v.size() == 1 || static_cast<int64_t>(v.size()) == c,
                   "normalize: {} has {} values but the image has {} channels (give 1 or {})", what, v.size(), c, c);
  };
  per_channel(mean, "mean");
  per_channel(std, "std");
  Tensor out = core::empty(src.shape(), DType::f32);
  const float* in = src.data<float>();
  float* o = out.data<float>();
  for (int64_t k = 0; k < c; ++k) {
    const double m = mean[mean.size() == 1 ? 0 : static_cast<size_t>(k)];
    const double s = std[std.size() == 1 ? 0 : static_cast<size_t>(k)];
    COLOSSAL_CHECK(s != 0.0, "normalize: std of channel {} is 0", k);
    // In float like torchvision (sub_ then div_ on f32 tensors).
    const auto mf = static_cast<float>(m), sf = static_cast<float>(s);
    for (int64_t i = 0; i < plane; ++i) o[k * plane + i] = (in[k * plane + i] - mf) / sf;
  }
  return out;
}

Tensor ToTensor::apply(const Tensor& image, core::Generator&) const {
  return to_float_image(image, layout_);
}

RandomCrop::RandomCrop(RandomCropOptions options) : options_(options) {
  COLOSSAL_CHECK(options_.height >= 1 && options_.width >= 1, "RandomCrop: crop size must be positive, got {}x{}",
                 options_.height, options_.width);
  COLOSSAL_CHECK(options_.pad_left >= 0 && options_.pad_top >= 0 && options_.pad_right >= 0 && options_.pad_bottom >= 0,
                 "RandomCrop: padding must be non-negative");
}

RandomCrop::RandomCrop(int64_t size, int64_t padding)
    : RandomCrop(RandomCropOptions{.height = size,
                                   .width = size,
                                   .pad_left = padding,
                                   .pad_top = padding,
                                   .pad_right = padding,
                                   .pad_bottom = padding}) {}

Tensor RandomCrop::apply(const Tensor& image, core::Generator& generator) const {
  const RandomCropOptions& o = options_;
  Tensor img = image;
  if (o.pad_left || o.pad_top || o.pad_right || o.pad_bottom) {
    img = pad(img, o.pad_left, o.pad_top, o.pad_right, o.pad_bottom, o.fill, o.padding_mode);
  }
  COLOSSAL_CHECK(img.dim() == 3, "RandomCrop: expected a CHW image [C, H, W], got shape {}", img.shape());
  if (o.pad_if_needed && img.size(2) < o.width) {
    const int64_t p = o.width - img.size(2);
    img = pad(img, p, 0, p, 0, o.fill, o.padding_mode);
  }
  if (o.pad_if_needed && img.size(1) < o.height) {
    const int64_t p = o.height - img.size(1);
    img = pad(img, 0, p, 0, p, o.fill, o.padding_mode);
  }
  const int64_t h = img.size(1), w = img.size(2);
  COLOSSAL_CHECK(h >= o.height && w >= o.width,
                 "RandomCrop: crop {}x{} is larger than the (padded) image {}x{}; pad more or set pad_if_needed",
                 o.height, o.width, h, w);
  if (h == o.height && w == o.width) return crop(img, 0, 0, h, w);
  Rng rng(generator);
  const int64_t top = rng.integer(0, h - o.height + 1);
  const int64_t left = rng.integer(0, w - o.width + 1);
  return crop(img, top, left, o.height, o.width);
}

std::string RandomCrop::name() const {
  return fmt::format("RandomCrop({}x{}, padding=[{}, {}, {}, {}], pad_if_needed={}, mode={})", options_.height,
                     options_.width, options_.pad_left, options_.pad_top, options_.pad_right, options_.pad_bottom,
                     options_.pad_if_needed, padding_mode_name(options_.padding_mode));
}

RandomHorizontalFlip::RandomHorizontalFlip(double p) : p_(p) {
  COLOSSAL_CHECK(p >= 0.0 && p <= 1.0, "RandomHorizontalFlip: p must be in [0, 1], got {}", p);
}

Tensor RandomHorizontalFlip::apply(const Tensor& image, core::Generator& generator) const {
  Rng rng(generator);
  return rng.bernoulli(p_) ? horizontal_flip(image) : image;
}

std::string RandomHorizontalFlip::name() const {
  return fmt::format("RandomHorizontalFlip(p={})", p_);
}

Resize::Resize(int64_t height, int64_t width, bool antialias) : height_(height), width_(width), antialias_(antialias) {
  COLOSSAL_CHECK(height >= 1 && width >= 1, "Resize: size must be positive, got {}x{}", height, width);
}

Resize Resize::smaller_edge(int64_t size, bool antialias) {
  COLOSSAL_CHECK(size >= 1, "Resize: size must be positive, got {}", size);
  Resize r(1, 1, antialias);
  r.height_ = r.width_ = 0;
  r.smaller_edge_ = size;
  return r;
}

Tensor Resize::apply(const Tensor& image, core::Generator&) const {
  int64_t oh = height_, ow = width_;
  if (smaller_edge_ > 0) {
    COLOSSAL_CHECK(image.dim() == 3, "Resize: expected a CHW image [C, H, W], got shape {}", image.shape());
    const int64_t h = image.size(1), w = image.size(2);
    const int64_t short_edge = std::min(h, w), long_edge = std::max(h, w);
    COLOSSAL_CHECK(short_edge > 0, "Resize: cannot resize an empty image {}", image.shape());
    const auto other = static_cast<int64_t>(static_cast<double>(smaller_edge_) * static_cast<double>(long_edge) /
                                            static_cast<double>(short_edge));
    oh = h <= w ? smaller_edge_ : other;
    ow = h <= w ? other : smaller_edge_;
  }
  return resize_bilinear(image, oh, ow, antialias_);
}

std::string Resize::name() const {
  if (smaller_edge_ > 0) return fmt::format("Resize(smaller edge {}, antialias={})", smaller_edge_, antialias_);
  return fmt::format("Resize({}x{}, antialias={})", height_, width_, antialias_);
}

Normalize::Normalize(std::vector<double> mean, std::vector<double> std) : mean_(std::move(mean)), std_(std::move(std)) {
  COLOSSAL_CHECK(!mean_.empty() && !std_.empty(), "Normalize: mean and std need at least one value each");
  for (size_t i = 0; i < std_.size(); ++i) COLOSSAL_CHECK(std_[i] != 0.0, "Normalize: std[{}] is 0", i);
}

Tensor Normalize::apply(const Tensor& image, core::Generator&) const {
  return normalize(image, mean_, std_);
}

std::string Normalize::name() const {
  return fmt::format("Normalize(mean=[{}], std=[{}])", fmt::join(mean_, ", "), fmt::join(std_, ", "));
}

}  // namespace colossal::data
