// The Transform interface (one image in, one image out, random draws from a per-sample generator)
// and Compose, which chains transforms. Concrete transforms live in transforms.h (geometry and
// colour on float images) and auto_augment.h (AutoAugment on uint8 images).
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "colossal/core/random.h"  // Generator
#include "colossal/core/tensor.h"

namespace colossal::data {

/// An image transform. `generator` is the sample's own (see derive_generator), so the result
/// depends only on (seed, epoch, index) and never on thread scheduling. Implementations must be
/// safe to call from several threads at once and must not modify `image`, which may be shared.
class Transform {
 public:
  virtual ~Transform() = default;
  virtual Tensor apply(const Tensor& image, core::Generator& generator) const = 0;
  /// For error messages ("RandomCrop(32, padding=4)").
  virtual std::string name() const = 0;
};

/// Applies transforms in order, all drawing from the same generator.
class Compose final : public Transform {
 public:
  explicit Compose(std::vector<std::shared_ptr<const Transform>> transforms) : transforms_(std::move(transforms)) {}
  Tensor apply(const Tensor& image, core::Generator& generator) const override;
  std::string name() const override;

 private:
  std::vector<std::shared_ptr<const Transform>> transforms_;
};

}  // namespace colossal::data
