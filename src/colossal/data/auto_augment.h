// AutoAugment (Cubuk et al., 2019) with torchvision's CIFAR-10 policy, and the uint8 image ops it is
// made of, each following torchvision's tensor implementation (transforms/_functional_tensor.py)
// down to its float32 rounding and truncation, so that results match torchvision's on the same
// parameters. Images are u8 CHW with 1 or 3 channels.
#pragma once

#include <array>
#include <optional>
#include <string>
#include <vector>

#include "colossal/data/transform.h"

namespace colossal::data {

// ---- colour ops (torchvision.transforms.functional on uint8 tensors)
/// _blend(image, 0, factor): factor * image, clamped and truncated to uint8.
Tensor adjust_brightness(const Tensor& image, double factor);
/// _blend(image, grayscale(image), factor); identity on 1 channel.
Tensor adjust_saturation(const Tensor& image, double factor);
/// _blend(image, mean of grayscale(image), factor).
Tensor adjust_contrast(const Tensor& image, double factor);
/// _blend(image, 3x3-smoothed image (borders kept), factor).
Tensor adjust_sharpness(const Tensor& image, double factor);
/// Keeps the top `bits` bits (0..8) of each value.
Tensor posterize(const Tensor& image, int64_t bits);
/// Inverts the values >= threshold.
Tensor solarize(const Tensor& image, double threshold);
/// Stretches each channel to span 0..255.
Tensor autocontrast(const Tensor& image);
/// Histogram-equalises each channel (PIL's algorithm as torchvision implements it).
Tensor equalize(const Tensor& image);
Tensor invert(const Tensor& image);
/// The luma of an RGB image as u8 [1, H, W] (0.2989 R + 0.587 G + 0.114 B, truncated).
Tensor rgb_to_grayscale(const Tensor& image);

// ---- geometry (nearest-neighbour sampling, pixels mapped from outside the image get `fill`)
/// torchvision's _get_inverse_affine_matrix: the output-to-input map of a rotation by `angle`
/// degrees, translation, scale and shear (degrees) about `center` (relative to the image centre).
std::array<double, 6> inverse_affine_matrix(std::array<double, 2> center, double angle, std::array<double, 2> translate,
                                            double scale, std::array<double, 2> shear);
/// F.affine(image, angle, translate, scale, shear, NEAREST, fill, center): center in pixel
/// coordinates (default: the image centre). fill has 0, 1 or C values (none: 0).
Tensor affine(const Tensor& image, double angle, std::array<double, 2> translate, double scale,
              std::array<double, 2> shear, std::optional<std::array<double, 2>> center = std::nullopt,
              const std::vector<double>& fill = {});
/// F.rotate(image, angle) about the centre, counter-clockwise, same size.
Tensor rotate(const Tensor& image, double angle, const std::vector<double>& fill = {});

// ---- AutoAugment
enum class AugmentOp {
  shear_x,
  shear_y,
  translate_x,
  translate_y,
  rotate,
  brightness,
  color,
  contrast,
  sharpness,
  posterize,
  solarize,
  auto_contrast,
  equalize,
  invert,
};
const char* augment_op_name(AugmentOp op);

/// torchvision's _apply_op: `magnitude` is the signed value from the augmentation space.
Tensor apply_augment_op(const Tensor& image, AugmentOp op, double magnitude, const std::vector<double>& fill = {});
/// Magnitude of `op` at bin `bin` (0..9) for an image of the given size, as torchvision's
/// _augmentation_space(10, ...) computes it in float32; 0 for ops without one.
double augment_magnitude(AugmentOp op, int bin, int64_t height, int64_t width);
/// Whether torchvision negates the magnitude half of the time for this op.
bool augment_op_signed(AugmentOp op);

struct AugmentStep {
  AugmentOp op;
  double probability;
  int bin;  ///< magnitude bin, or -1 for ops without a magnitude
};
using AugmentSubPolicy = std::array<AugmentStep, 2>;

enum class AutoAugmentPolicy { cifar10 };
/// The 25 sub-policies of torchvision's AutoAugmentPolicy.CIFAR10.
const std::vector<AugmentSubPolicy>& auto_augment_policy(AutoAugmentPolicy policy);

/// Picks one sub-policy uniformly, then applies each of its two ops with its probability and a
/// random sign, drawing (policy, two probabilities, two signs) in torchvision's order.
class AutoAugment final : public Transform {
 public:
  explicit AutoAugment(AutoAugmentPolicy policy = AutoAugmentPolicy::cifar10, std::vector<double> fill = {});
  Tensor apply(const Tensor& image, core::Generator& generator) const override;
  std::string name() const override { return "AutoAugment(cifar10)"; }

 private:
  const std::vector<AugmentSubPolicy>* policies_;
  std::vector<double> fill_;
};

}  // namespace colossal::data
