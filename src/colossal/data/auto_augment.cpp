// AutoAugment's uint8 ops. Each follows torchvision's tensor code step by step in float32 (the
// dtype torch computes uint8 blends in), truncating where `.to(torch.uint8)` truncates and rounding
// where `_cast_squeeze_out` rounds, so that results match torchvision's bit for bit.
#include "colossal/data/auto_augment.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <numbers>

#include "colossal/core/error.h"
#include "colossal/core/view.h"  // contiguous_raw
#include "colossal/data/random.h"

namespace colossal::data {
namespace {

struct U8Image {
  Tensor tensor;
  int64_t c, h, w;
  const uint8_t* data() const { return tensor.data<uint8_t>(); }
};

U8Image checked_u8(const Tensor& image, const char* op) {
  COLOSSAL_CHECK(image.defined() && image.device().is_cpu(), "{}: expected a CPU image", op);
  COLOSSAL_CHECK(image.dtype() == DType::u8, "{}: expected a uint8 image (AutoAugment runs before ToTensor), got {}",
                 op, image.dtype());
  COLOSSAL_CHECK(image.dim() == 3 && (image.size(0) == 1 || image.size(0) == 3),
                 "{}: expected a CHW image with 1 or 3 channels, got shape {}", op, image.shape());
  Tensor t = core::contiguous_raw(image);
  return {t, t.size(0), t.size(1), t.size(2)};
}

/// float -> uint8 as torch's .to(torch.uint8) does for values already clamped to [0, 255].
inline uint8_t truncate_u8(float v) {
  return static_cast<uint8_t>(v);
}

/// torchvision's _blend(img1, img2, ratio) for uint8 img1: in float32, ratio * img1 and
/// (1 - ratio) * img2 rounded separately, added, clamped to [0, 255] and truncated. img2(k, i)
/// gives the second operand for channel k, pixel i.
template <class Second>
Tensor blend(const U8Image& img, double ratio, Second img2) {
  Tensor out = core::empty({img.c, img.h, img.w}, DType::u8);
  const auto r1 = static_cast<float>(ratio);
  const auto r2 = static_cast<float>(1.0 - ratio);
  const uint8_t* in = img.data();
  uint8_t* o = out.data<uint8_t>();
  const int64_t plane = img.h * img.w;
  for (int64_t k = 0; k < img.c; ++k) {
    for (int64_t i = 0; i < plane; ++i) {
      const float a = r1 * static_cast<float>(in[k * plane + i]);
      const float b = r2 * img2(k, i);
      o[k * plane + i] = truncate_u8(std::clamp(a + b, 0.0f, 255.0f));
    }
  }
  return out;
}

std::vector<uint8_t> grayscale_plane(const U8Image& img) {
  const int64_t plane = img.h * img.w;
  std::vector<uint8_t> out(static_cast<size_t>(plane));
  const uint8_t* in = img.data();
  for (int64_t i = 0; i < plane; ++i) {
    // (0.2989 * r + 0.587 * g + 0.114 * b).to(uint8), each product and sum in float32.
    const float r = 0.2989f * static_cast<float>(in[i]);
    const float g = 0.587f * static_cast<float>(in[plane + i]);
    const float b = 0.114f * static_cast<float>(in[2 * plane + i]);
    out[static_cast<size_t>(i)] = truncate_u8((r + g) + b);
  }
  return out;
}

void check_factor(double factor, const char* op) {
  COLOSSAL_CHECK(factor >= 0.0, "{}: factor must be non-negative, got {}", op, factor);
}

/// Nearest-neighbour resampling through an inverse affine matrix, as torchvision's
/// _gen_affine_grid + grid_sample(mode="nearest", align_corners=False) compute it in float32.
Tensor sample_nearest(const U8Image& img, const std::array<double, 6>& matrix, const std::vector<double>& fill) {
  COLOSSAL_CHECK(fill.empty() || fill.size() == 1 || static_cast<int64_t>(fill.size()) == img.c,
                 "affine: fill has {} values but the image has {} channels (give 0, 1 or {})", fill.size(), img.c,
                 img.c);
  const int64_t h = img.h, w = img.w;
  Tensor out = core::empty({img.c, h, w}, DType::u8);
  std::array<float, 6> theta{};
  for (size_t i = 0; i < 6; ++i) theta[i] = static_cast<float>(matrix[i]);
  const float half_w = 0.5f * static_cast<float>(w), half_h = 0.5f * static_cast<float>(h);
  // rescaled_theta = theta^T / [0.5 w, 0.5 h]
  const float t00 = theta[0] / half_w, t01 = theta[1] / half_w, t02 = theta[2] / half_w;
  const float t10 = theta[3] / half_h, t11 = theta[4] / half_h, t12 = theta[5] / half_h;
  std::vector<uint8_t> fill_values(static_cast<size_t>(img.c), 0);
  for (int64_t k = 0; k < img.c; ++k) {
    if (fill.empty()) continue;
    const double f = fill[fill.size() == 1 ? 0 : static_cast<size_t>(k)];
    fill_values[static_cast<size_t>(k)] = static_cast<uint8_t>(std::clamp(std::nearbyint(f), 0.0, 255.0));
  }
  const uint8_t* in = img.data();
  uint8_t* o = out.data<uint8_t>();
  const int64_t plane = h * w;
  for (int64_t y = 0; y < h; ++y) {
    const float gy_base = -half_h + 0.5f + static_cast<float>(y);  // linspace(-oh/2 + 0.5, oh/2 - 0.5)
    for (int64_t x = 0; x < w; ++x) {
      const float gx_base = -half_w + 0.5f + static_cast<float>(x);
      const float gx = gx_base * t00 + gy_base * t01 + t02;
      const float gy = gx_base * t10 + gy_base * t11 + t12;
      // grid_sample's unnormalize for align_corners=False: (g + 1) * size / 2 - 0.5; nearest rounds
      // half to even.
      const float ix = std::nearbyint((gx + 1.0f) * half_w - 0.5f);
      const float iy = std::nearbyint((gy + 1.0f) * half_h - 0.5f);
      const bool inside =
          ix >= 0.0f && ix <= static_cast<float>(w - 1) && iy >= 0.0f && iy <= static_cast<float>(h - 1);
      const int64_t src = inside ? static_cast<int64_t>(iy) * w + static_cast<int64_t>(ix) : -1;
      for (int64_t k = 0; k < img.c; ++k) {
        o[k * plane + y * w + x] = src >= 0 ? in[k * plane + src] : fill_values[static_cast<size_t>(k)];
      }
    }
  }
  return out;
}

/// torch.linspace(start, end, 10)[bin] in float32, as its CPU kernel computes it.
float linspace10(float start, float end, int bin) {
  const float step = (end - start) / 9.0f;
  return bin < 5 ? start + step * static_cast<float>(bin) : end - step * static_cast<float>(9 - bin);
}

}  // namespace

Tensor rgb_to_grayscale(const Tensor& image) {
  const U8Image img = checked_u8(image, "rgb_to_grayscale");
  COLOSSAL_CHECK(img.c == 3, "rgb_to_grayscale: expected 3 channels, got {}", img.c);
  const std::vector<uint8_t> gray = grayscale_plane(img);
  Tensor out = core::empty({1, img.h, img.w}, DType::u8);
  if (!gray.empty()) std::memcpy(out.raw_data(), gray.data(), gray.size());
  return out;
}

Tensor adjust_brightness(const Tensor& image, double factor) {
  check_factor(factor, "adjust_brightness");
  const U8Image img = checked_u8(image, "adjust_brightness");
  return blend(img, factor, [](int64_t, int64_t) { return 0.0f; });
}

Tensor adjust_saturation(const Tensor& image, double factor) {
  check_factor(factor, "adjust_saturation");
  const U8Image img = checked_u8(image, "adjust_saturation");
  if (img.c == 1) return img.tensor;  // as torchvision (and PIL)
  const std::vector<uint8_t> gray = grayscale_plane(img);
  return blend(img, factor, [&](int64_t, int64_t i) { return static_cast<float>(gray[static_cast<size_t>(i)]); });
}

Tensor adjust_contrast(const Tensor& image, double factor) {
  check_factor(factor, "adjust_contrast");
  const U8Image img = checked_u8(image, "adjust_contrast");
  // The mean of integers below 2^24 in total is exact in float32 whatever the summation order.
  int64_t sum = 0, count = 0;
  if (img.c == 3) {
    for (uint8_t v : grayscale_plane(img)) sum += v;
    count = img.h * img.w;
  } else {
    for (int64_t i = 0; i < img.h * img.w; ++i) sum += img.data()[i];
    count = img.h * img.w;
  }
  const float mean = count > 0 ? static_cast<float>(sum) / static_cast<float>(count) : 0.0f;
  return blend(img, factor, [mean](int64_t, int64_t) { return mean; });
}

Tensor adjust_sharpness(const Tensor& image, double factor) {
  check_factor(factor, "adjust_sharpness");
  const U8Image img = checked_u8(image, "adjust_sharpness");
  if (img.h <= 2 || img.w <= 2) return img.tensor;
  // _blurred_degenerate_image: a 3x3 kernel of ones with 5 in the centre, divided by its sum (13),
  // on the interior; rounded to uint8 (sums of k/13 are never exactly halfway, so the summation
  // order cannot change the result). The border keeps the original pixels.
  const float edge = 1.0f / 13.0f, centre = 5.0f / 13.0f;
  const int64_t h = img.h, w = img.w, plane = h * w;
  std::vector<float> blurred(static_cast<size_t>(img.c * plane));
  const uint8_t* in = img.data();
  for (int64_t k = 0; k < img.c; ++k) {
    for (int64_t y = 0; y < h; ++y) {
      for (int64_t x = 0; x < w; ++x) {
        const int64_t i = k * plane + y * w + x;
        if (y == 0 || x == 0 || y == h - 1 || x == w - 1) {
          blurred[static_cast<size_t>(i)] = in[i];
          continue;
        }
        float acc = 0.0f;
        for (int64_t dy = -1; dy <= 1; ++dy)
          for (int64_t dx = -1; dx <= 1; ++dx)
            acc += (dy == 0 && dx == 0 ? centre : edge) * static_cast<float>(in[i + dy * w + dx]);
        blurred[static_cast<size_t>(i)] = std::nearbyint(acc);
      }
    }
  }
  return blend(img, factor, [&](int64_t k, int64_t i) { return blurred[static_cast<size_t>(k * plane + i)]; });
}

Tensor posterize(const Tensor& image, int64_t bits) {
  COLOSSAL_CHECK(bits >= 0 && bits <= 8, "posterize: bits must be in 0..8, got {}", bits);
  const U8Image img = checked_u8(image, "posterize");
  const auto mask = static_cast<uint8_t>(0xFF << (8 - bits));
  Tensor out = core::empty({img.c, img.h, img.w}, DType::u8);
  for (int64_t i = 0; i < out.numel(); ++i) out.data<uint8_t>()[i] = img.data()[i] & mask;
  return out;
}

Tensor solarize(const Tensor& image, double threshold) {
  COLOSSAL_CHECK(threshold <= 255.0, "solarize: threshold {} is above the largest uint8 value 255", threshold);
  const U8Image img = checked_u8(image, "solarize");
  Tensor out = core::empty({img.c, img.h, img.w}, DType::u8);
  for (int64_t i = 0; i < out.numel(); ++i) {
    const uint8_t v = img.data()[i];
    out.data<uint8_t>()[i] = static_cast<double>(v) >= threshold ? static_cast<uint8_t>(255 - v) : v;
  }
  return out;
}

Tensor autocontrast(const Tensor& image) {
  const U8Image img = checked_u8(image, "autocontrast");
  Tensor out = core::empty({img.c, img.h, img.w}, DType::u8);
  const int64_t plane = img.h * img.w;
  for (int64_t k = 0; k < img.c; ++k) {
    const uint8_t* in = img.data() + k * plane;
    uint8_t* o = out.data<uint8_t>() + k * plane;
    if (plane == 0) continue;
    const auto [lo, hi] = std::minmax_element(in, in + plane);
    float minimum = *lo;
    float scale = 255.0f / (static_cast<float>(*hi) - minimum);
    if (!std::isfinite(scale)) {  // a flat channel is left as it is
      minimum = 0.0f;
      scale = 1.0f;
    }
    for (int64_t i = 0; i < plane; ++i) {
      o[i] = truncate_u8(std::clamp((static_cast<float>(in[i]) - minimum) * scale, 0.0f, 255.0f));
    }
  }
  return out;
}

Tensor equalize(const Tensor& image) {
  const U8Image img = checked_u8(image, "equalize");
  Tensor out = core::empty({img.c, img.h, img.w}, DType::u8);
  const int64_t plane = img.h * img.w;
  for (int64_t k = 0; k < img.c; ++k) {
    const uint8_t* in = img.data() + k * plane;
    uint8_t* o = out.data<uint8_t>() + k * plane;
    std::array<int64_t, 256> hist{};
    for (int64_t i = 0; i < plane; ++i) ++hist[in[i]];
    // step = (sum of the non-zero bins but the last) // 255
    int64_t last_nonzero = -1, total = 0;
    for (int b = 0; b < 256; ++b) {
      if (hist[static_cast<size_t>(b)] != 0) last_nonzero = b;
      total += hist[static_cast<size_t>(b)];
    }
    const int64_t step = last_nonzero < 0 ? 0 : (total - hist[static_cast<size_t>(last_nonzero)]) / 255;
    if (step == 0) {
      std::memcpy(o, in, static_cast<size_t>(plane));
      continue;
    }
    std::array<uint8_t, 256> lut{};
    int64_t cumulative = 0;
    for (int b = 0; b < 256; ++b) {
      // lut[b] = (cumsum[b - 1] + step // 2) // step, lut[0] = 0, clamped to 255
      lut[static_cast<size_t>(b)] = static_cast<uint8_t>(std::min<int64_t>((cumulative + step / 2) / step, 255));
      if (b == 0) lut[0] = 0;
      cumulative += hist[static_cast<size_t>(b)];
    }
    for (int64_t i = 0; i < plane; ++i) o[i] = lut[in[i]];
  }
  return out;
}

Tensor invert(const Tensor& image) {
  const U8Image img = checked_u8(image, "invert");
  Tensor out = core::empty({img.c, img.h, img.w}, DType::u8);
  for (int64_t i = 0; i < out.numel(); ++i) out.data<uint8_t>()[i] = static_cast<uint8_t>(255 - img.data()[i]);
  return out;
}

std::array<double, 6> inverse_affine_matrix(std::array<double, 2> center, double angle, std::array<double, 2> translate,
                                            double scale, std::array<double, 2> shear) {
  COLOSSAL_CHECK(scale > 0.0, "affine: scale must be positive, got {}", scale);
  const double deg = std::numbers::pi / 180.0;
  const double rot = angle * deg, sx = shear[0] * deg, sy = shear[1] * deg;
  const auto [cx, cy] = center;
  const auto [tx, ty] = translate;
  // Rotation-scale-shear without scaling, inverted (its determinant is 1).
  const double a = std::cos(rot - sy) / std::cos(sy);
  const double b = -std::cos(rot - sy) * std::tan(sx) / std::cos(sy) - std::sin(rot);
  const double c = std::sin(rot - sy) / std::cos(sy);
  const double d = -std::sin(rot - sy) * std::tan(sx) / std::cos(sy) + std::cos(rot);
  std::array<double, 6> m = {d / scale, -b / scale, 0.0, -c / scale, a / scale, 0.0};
  m[2] += m[0] * (-cx - tx) + m[1] * (-cy - ty);
  m[5] += m[3] * (-cx - tx) + m[4] * (-cy - ty);
  m[2] += cx;
  m[5] += cy;
  return m;
}

Tensor affine(const Tensor& image, double angle, std::array<double, 2> translate, double scale,
              std::array<double, 2> shear, std::optional<std::array<double, 2>> center,
              const std::vector<double>& fill) {
  const U8Image img = checked_u8(image, "affine");
  std::array<double, 2> center_f = {0.0, 0.0};
  if (center) {
    // Pixel coordinates, shifted so that (0, 0) is the image centre.
    center_f = {(*center)[0] - static_cast<double>(img.w) * 0.5, (*center)[1] - static_cast<double>(img.h) * 0.5};
  }
  return sample_nearest(img, inverse_affine_matrix(center_f, angle, translate, scale, shear), fill);
}

Tensor rotate(const Tensor& image, double angle, const std::vector<double>& fill) {
  const U8Image img = checked_u8(image, "rotate");
  // torchvision negates the angle here: rotate turns counter-clockwise, affine clockwise.
  return sample_nearest(img, inverse_affine_matrix({0.0, 0.0}, -angle, {0.0, 0.0}, 1.0, {0.0, 0.0}), fill);
}

const char* augment_op_name(AugmentOp op) {
  switch (op) {
    case AugmentOp::shear_x:
      return "ShearX";
    case AugmentOp::shear_y:
      return "ShearY";
    case AugmentOp::translate_x:
      return "TranslateX";
    case AugmentOp::translate_y:
      return "TranslateY";
    case AugmentOp::rotate:
      return "Rotate";
    case AugmentOp::brightness:
      return "Brightness";
    case AugmentOp::color:
      return "Color";
    case AugmentOp::contrast:
      return "Contrast";
    case AugmentOp::sharpness:
      return "Sharpness";
    case AugmentOp::posterize:
      return "Posterize";
    case AugmentOp::solarize:
      return "Solarize";
    case AugmentOp::auto_contrast:
      return "AutoContrast";
    case AugmentOp::equalize:
      return "Equalize";
    case AugmentOp::invert:
      return "Invert";
  }
  return "?";
}

bool augment_op_signed(AugmentOp op) {
  switch (op) {
    case AugmentOp::shear_x:
    case AugmentOp::shear_y:
    case AugmentOp::translate_x:
    case AugmentOp::translate_y:
    case AugmentOp::rotate:
    case AugmentOp::brightness:
    case AugmentOp::color:
    case AugmentOp::contrast:
    case AugmentOp::sharpness:
      return true;
    default:
      return false;
  }
}

double augment_magnitude(AugmentOp op, int bin, int64_t height, int64_t width) {
  if (op == AugmentOp::auto_contrast || op == AugmentOp::equalize || op == AugmentOp::invert) return 0.0;
  COLOSSAL_CHECK(bin >= 0 && bin <= 9, "augment_magnitude: bin must be in 0..9, got {} for {}", bin,
                 augment_op_name(op));
  switch (op) {
    case AugmentOp::shear_x:
    case AugmentOp::shear_y:
      return linspace10(0.0f, 0.3f, bin);
    case AugmentOp::translate_x:
      return linspace10(0.0f, static_cast<float>(150.0 / 331.0 * static_cast<double>(width)), bin);
    case AugmentOp::translate_y:
      return linspace10(0.0f, static_cast<float>(150.0 / 331.0 * static_cast<double>(height)), bin);
    case AugmentOp::rotate:
      return linspace10(0.0f, 30.0f, bin);
    case AugmentOp::brightness:
    case AugmentOp::color:
    case AugmentOp::contrast:
    case AugmentOp::sharpness:
      return linspace10(0.0f, 0.9f, bin);
    case AugmentOp::posterize:
      // 8 - round(bin / 2.25): 8 8 7 7 6 6 5 5 4 4
      return 8.0 - std::nearbyint(static_cast<float>(bin) / 2.25f);
    case AugmentOp::solarize:
      return linspace10(255.0f, 0.0f, bin);
    default:
      return 0.0;
  }
}

Tensor apply_augment_op(const Tensor& image, AugmentOp op, double magnitude, const std::vector<double>& fill) {
  constexpr double kDegreesPerRadian = 180.0 / std::numbers::pi;
  switch (op) {
    case AugmentOp::shear_x:
      // Sheared about the top-left corner (center [0, 0]) by atan(magnitude), as torchvision.
      return affine(image, 0.0, {0.0, 0.0}, 1.0, {std::atan(magnitude) * kDegreesPerRadian, 0.0},
                    std::array<double, 2>{0.0, 0.0}, fill);
    case AugmentOp::shear_y:
      return affine(image, 0.0, {0.0, 0.0}, 1.0, {0.0, std::atan(magnitude) * kDegreesPerRadian},
                    std::array<double, 2>{0.0, 0.0}, fill);
    case AugmentOp::translate_x:
      return affine(image, 0.0, {std::trunc(magnitude), 0.0}, 1.0, {0.0, 0.0}, std::nullopt, fill);
    case AugmentOp::translate_y:
      return affine(image, 0.0, {0.0, std::trunc(magnitude)}, 1.0, {0.0, 0.0}, std::nullopt, fill);
    case AugmentOp::rotate:
      return rotate(image, magnitude, fill);
    case AugmentOp::brightness:
      return adjust_brightness(image, 1.0 + magnitude);
    case AugmentOp::color:
      return adjust_saturation(image, 1.0 + magnitude);
    case AugmentOp::contrast:
      return adjust_contrast(image, 1.0 + magnitude);
    case AugmentOp::sharpness:
      return adjust_sharpness(image, 1.0 + magnitude);
    case AugmentOp::posterize:
      return posterize(image, static_cast<int64_t>(magnitude));
    case AugmentOp::solarize:
      return solarize(image, magnitude);
    case AugmentOp::auto_contrast:
      return autocontrast(image);
    case AugmentOp::equalize:
      return equalize(image);
    case AugmentOp::invert:
      return invert(image);
  }
  COLOSSAL_FAIL("apply_augment_op: unknown op {}", static_cast<int>(op));
}

const std::vector<AugmentSubPolicy>& auto_augment_policy(AutoAugmentPolicy policy) {
  using enum AugmentOp;
  // torchvision.transforms.AutoAugmentPolicy.CIFAR10: (op, probability, magnitude bin).
  static const std::vector<AugmentSubPolicy> cifar10 = {
      {{{invert, 0.1, -1}, {contrast, 0.2, 6}}},           {{{rotate, 0.7, 2}, {translate_x, 0.3, 9}}},
      {{{sharpness, 0.8, 1}, {sharpness, 0.9, 3}}},        {{{shear_y, 0.5, 8}, {translate_y, 0.7, 9}}},
      {{{auto_contrast, 0.5, -1}, {equalize, 0.9, -1}}},   {{{shear_y, 0.2, 7}, {posterize, 0.3, 7}}},
      {{{color, 0.4, 3}, {brightness, 0.6, 7}}},           {{{sharpness, 0.3, 9}, {brightness, 0.7, 9}}},
      {{{equalize, 0.6, -1}, {equalize, 0.5, -1}}},        {{{contrast, 0.6, 7}, {sharpness, 0.6, 5}}},
      {{{color, 0.7, 7}, {translate_x, 0.5, 8}}},          {{{equalize, 0.3, -1}, {auto_contrast, 0.4, -1}}},
      {{{translate_y, 0.4, 3}, {sharpness, 0.2, 6}}},      {{{brightness, 0.9, 6}, {color, 0.2, 8}}},
      {{{solarize, 0.5, 2}, {invert, 0.0, -1}}},           {{{equalize, 0.2, -1}, {auto_contrast, 0.6, -1}}},
      {{{equalize, 0.2, -1}, {equalize, 0.6, -1}}},        {{{color, 0.9, 9}, {equalize, 0.6, -1}}},
      {{{auto_contrast, 0.8, -1}, {solarize, 0.2, 8}}},    {{{brightness, 0.1, 3}, {color, 0.7, 0}}},
      {{{solarize, 0.4, 5}, {auto_contrast, 0.9, -1}}},    {{{translate_y, 0.9, 9}, {translate_y, 0.7, 9}}},
      {{{auto_contrast, 0.9, -1}, {solarize, 0.8, 3}}},    {{{equalize, 0.8, -1}, {invert, 0.1, -1}}},
      {{{translate_y, 0.7, 9}, {auto_contrast, 0.9, -1}}},
  };
  switch (policy) {
    case AutoAugmentPolicy::cifar10:
      return cifar10;
  }
  COLOSSAL_FAIL("auto_augment_policy: unknown policy {}", static_cast<int>(policy));
}

AutoAugment::AutoAugment(AutoAugmentPolicy policy, std::vector<double> fill)
    : policies_(&auto_augment_policy(policy)), fill_(std::move(fill)) {}

Tensor AutoAugment::apply(const Tensor& image, core::Generator& generator) const {
  const U8Image img = checked_u8(image, "AutoAugment");
  Rng rng(generator);
  const int64_t policy_id = rng.integer(0, static_cast<int64_t>(policies_->size()));
  const double probs[2] = {rng.uniform(), rng.uniform()};
  const int64_t signs[2] = {rng.integer(0, 2), rng.integer(0, 2)};
  Tensor out = img.tensor;
  const AugmentSubPolicy& sub = (*policies_)[static_cast<size_t>(policy_id)];
  for (size_t i = 0; i < 2; ++i) {
    const AugmentStep& step = sub[i];
    if (probs[i] > step.probability) continue;
    double magnitude = step.bin >= 0 ? augment_magnitude(step.op, step.bin, img.h, img.w) : 0.0;
    if (augment_op_signed(step.op) && signs[i] == 0) magnitude = -magnitude;
    out = apply_augment_op(out, step.op, magnitude, fill_);
  }
  return out;
}

}  // namespace colossal::data
