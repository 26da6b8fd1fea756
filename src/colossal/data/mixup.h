// Mixup (Zhang et al., 2018) as a batch transform: each input is blended with its neighbour in the
// batch (torchvision.transforms.v2.MixUp's pairing, batch.roll(1, 0)) by lambda ~ Beta(alpha, alpha),
// and the class targets become soft targets [B, C] blended the same way.
#pragma once

#include <cstdint>
#include <string>

#include "colossal/data/batch.h"

namespace colossal::data {

struct MixupOptions {
  double alpha = 0.2;       ///< Beta(alpha, alpha) parameter; > 0
  int64_t num_classes = 0;  ///< C of the soft targets; > 0
  /// Mixes the one-hot targets with the uniform distribution first: (1 - s) onehot + s / C.
  double label_smoothing = 0.0;
};

/// One-hot [B, C] f32 of class indices [B] (i32 or i64), with optional label smoothing. Throws
/// naming the sample whose class is outside [0, C).
Tensor one_hot(const Tensor& labels, int64_t num_classes, double label_smoothing = 0.0,
               const HostAllocator& allocate = host_empty);

/// Mixes a contiguous f32 [B, ...] in place, each row with the one before it (row B-1 for row 0):
/// x_i becomes lambda x_i + (1 - lambda) x_{i-1}, in float as torchvision's MixUp.
void mix_with_previous_(const Tensor& rows, double lambda);
/// The soft targets [B, C] f32 of mixup_batch for class indices [B].
Tensor mixup_targets(const Tensor& labels, double lambda, const MixupOptions& options,
                     const HostAllocator& allocate = host_empty);
/// lambda ~ Beta(alpha, alpha), the one draw Mixup takes from a batch's generator.
double draw_mixup_lambda(core::Generator& generator, double alpha);

/// Mixes the batch in place with weight `lambda` on each sample and 1 - lambda on the one before it
/// (sample B-1 for sample 0): input becomes lambda x_i + (1 - lambda) x_{i-1} (f32), target the same
/// blend of one-hot rows ([B, C] f32, rows sum to 1).
void mixup_batch(Batch& batch, double lambda, const MixupOptions& options, const HostAllocator& allocate = host_empty);

class Mixup final : public BatchTransform {
 public:
  explicit Mixup(MixupOptions options);
  /// Draws lambda ~ Beta(alpha, alpha) from the batch's generator and calls mixup_batch.
  void apply(Batch& batch, core::Generator& generator, const HostAllocator& allocate) const override;
  std::string name() const override;

 private:
  MixupOptions options_;
};

}  // namespace colossal::data
