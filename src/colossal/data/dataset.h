// Dataset: the indexable source the DataLoader reads, and TransformDataset, which applies an image
// transform with a generator derived from (seed, epoch, index).
#pragma once

#include <atomic>
#include <cstdint>
#include <memory>

#include "colossal/core/tensor.h"
#include "colossal/data/transform.h"

namespace colossal::data {

/// One sample. Images are CHW (uint8 as read, float after ToTensor); class labels are 0-d i64.
struct Example {
  Tensor input;
  Tensor target;  ///< may be undefined for unlabelled data
};

class Dataset {
 public:
  virtual ~Dataset() = default;
  virtual int64_t size() const = 0;
  /// Sample `index` in [0, size()). Called from several worker threads at once: implementations
  /// must be thread-safe, and return tensors the caller may keep (no views into shared buffers
  /// that a later call would overwrite).
  virtual Example get(int64_t index) const = 0;
  /// Datasets whose samples are random (augmentation, random windows) draw per epoch. The
  /// DataLoader calls this before each pass, never while its workers read.
  virtual void set_epoch(int64_t epoch) { (void)epoch; }
};

/// A 0-d i64 tensor holding a class label.
Tensor label_tensor(int64_t label);

/// Throws naming `what` and the valid range when index is outside [0, size).
void check_index(int64_t index, int64_t size, const char* what);

/// base's samples with `transform` applied to each input. The transform draws from
/// derive_generator(seed, RandomStream::sample_transform, epoch, index).
class TransformDataset final : public Dataset {
 public:
  TransformDataset(std::shared_ptr<Dataset> base, std::shared_ptr<const Transform> transform, uint64_t seed);
  int64_t size() const override { return base_->size(); }
  Example get(int64_t index) const override;
  void set_epoch(int64_t epoch) override;

 private:
  std::shared_ptr<Dataset> base_;
  std::shared_ptr<const Transform> transform_;
  uint64_t seed_;
  std::atomic<int64_t> epoch_{0};
};

}  // namespace colossal::data
