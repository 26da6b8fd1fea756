// Image transforms on CHW tensors with torchvision's semantics: conversion from uint8 (ToTensor),
// padding and cropping (RandomCrop), flipping, bilinear resizing (align_corners=False, optional
// antialiasing as torchvision's default) and per-channel normalisation. Each transform has a plain
// function underneath for callers that pick parameters themselves.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "colossal/data/transform.h"

namespace colossal::data {

enum class Layout { chw, hwc };
enum class PaddingMode { constant, edge, reflect, symmetric };

// ---- functions
/// u8 image ([C, H, W], [H, W, C] or [H, W]) to f32 CHW in [0, 1] (divided by 255).
Tensor to_float_image(const Tensor& image, Layout layout = Layout::chw);
/// Pads a CHW image (any dtype) by left, top, right, bottom; `fill` is used by PaddingMode::constant.
Tensor pad(const Tensor& image, int64_t left, int64_t top, int64_t right, int64_t bottom, double fill = 0.0,
           PaddingMode mode = PaddingMode::constant);
/// Rows [top, top + height) and columns [left, left + width) of a CHW image; must lie inside it.
Tensor crop(const Tensor& image, int64_t top, int64_t left, int64_t height, int64_t width);
/// Mirrors a CHW image left to right.
Tensor horizontal_flip(const Tensor& image);
/// Bilinear resize of an f32 CHW image to [C, height, width] with align_corners=False. With
/// antialias (torchvision's default), downscaling averages over the whole footprint of each output
/// pixel (PIL's triangle filter); upscaling is the same either way.
Tensor resize_bilinear(const Tensor& image, int64_t height, int64_t width, bool antialias = true);
/// The source taps of each output position along one axis of resize_bilinear (in pixels -> out
/// pixels): output i reads inputs first[i] .. first[i] + count[i] - 1 with weights
/// weights[i * max_taps + t]. The batch stages (image_batch_stage.h) resize with the same taps.
struct BilinearTaps {
  std::vector<int64_t> first;
  std::vector<int64_t> count;
  std::vector<float> weights;
  int64_t max_taps = 0;
};
BilinearTaps bilinear_taps(int64_t in, int64_t out, bool antialias);
/// (image - mean[c]) / std[c] on an f32 CHW image; mean and std have 1 or C entries.
Tensor normalize(const Tensor& image, const std::vector<double>& mean, const std::vector<double>& std);

// ---- transforms
class ToTensor final : public Transform {
 public:
  explicit ToTensor(Layout layout = Layout::chw) : layout_(layout) {}
  Tensor apply(const Tensor& image, core::Generator& generator) const override;
  std::string name() const override { return layout_ == Layout::chw ? "ToTensor(chw)" : "ToTensor(hwc)"; }

 private:
  Layout layout_;
};

struct RandomCropOptions {
  int64_t height = 0;
  int64_t width = 0;
  /// Padding added to each side before cropping: left, top, right, bottom.
  int64_t pad_left = 0, pad_top = 0, pad_right = 0, pad_bottom = 0;
  /// Pad an image smaller than the crop on both sides by the shortfall (as torchvision).
  bool pad_if_needed = false;
  double fill = 0.0;
  PaddingMode padding_mode = PaddingMode::constant;
};

/// torchvision.transforms.RandomCrop: pad, then crop at top ~ U{0..H-h}, left ~ U{0..W-w} (drawn in
/// that order).
class RandomCrop final : public Transform {
 public:
  explicit RandomCrop(RandomCropOptions options);
  /// Square crop of `size` with `padding` on every side (RandomCrop(32, padding=4)).
  RandomCrop(int64_t size, int64_t padding);
  Tensor apply(const Tensor& image, core::Generator& generator) const override;
  std::string name() const override;

 private:
  RandomCropOptions options_;
};

/// Flips with probability p (one uniform draw per image, flipped when it is below p).
class RandomHorizontalFlip final : public Transform {
 public:
  explicit RandomHorizontalFlip(double p = 0.5);
  Tensor apply(const Tensor& image, core::Generator& generator) const override;
  std::string name() const override;

 private:
  double p_;
};

class Resize final : public Transform {
 public:
  /// Exact output size.
  Resize(int64_t height, int64_t width, bool antialias = true);
  /// Smaller edge to `size`, the other scaled to keep the aspect ratio (truncated, as torchvision's
  /// Resize(size) with one int).
  static Resize smaller_edge(int64_t size, bool antialias = true);
  Tensor apply(const Tensor& image, core::Generator& generator) const override;
  std::string name() const override;

 private:
  int64_t height_ = 0, width_ = 0, smaller_edge_ = 0;
  bool antialias_;
};

class Normalize final : public Transform {
 public:
  Normalize(std::vector<double> mean, std::vector<double> std);
  Tensor apply(const Tensor& image, core::Generator& generator) const override;
  std::string name() const override;

 private:
  std::vector<double> mean_, std_;
};

}  // namespace colossal::data
