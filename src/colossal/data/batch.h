// Batches: collating examples into one tensor per field (stack), the transforms that act on whole
// batches (mixup), and a pool of page-locked host buffers that collation writes into when batches
// go to a GPU.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <unordered_map>
#include <vector>

#include "colossal/core/random.h"
#include "colossal/core/tensor.h"
#include "colossal/data/dataset.h"

namespace colossal::data {

struct Batch {
  Tensor input;       ///< [B, ...]
  Tensor target;      ///< [B, ...] (class indices [B], or soft targets [B, C] after mixup); may be undefined
  int64_t index = 0;  ///< position of this batch in its epoch
  std::vector<int64_t> sample_indices;  ///< the dataset indices it holds, in order
  /// A BatchStage's random draws (mixup's lambda), taken by its prepare() on the worker for its
  /// run() wherever the batch goes.
  std::vector<double> draws;
};

/// Where collation gets its output memory: plain host memory, or pinned buffers from a pool.
using HostAllocator = std::function<Tensor(const Shape& shape, DType dtype)>;
/// Plain (pageable) CPU memory.
Tensor host_empty(const Shape& shape, DType dtype);

/// Turns a batch's examples into a Batch (index and sample_indices are filled in by the caller).
using CollateFn = std::function<Batch(const std::vector<Example>& examples, const HostAllocator& allocate)>;

/// Stacks inputs into [B, ...] and targets into [B, ...]. Throws naming the first example whose
/// shape or dtype differs from example 0's, or which has a target when example 0 has none.
Batch stack_collate(const std::vector<Example>& examples, const HostAllocator& allocate);
/// Stacks same-shaped, same-dtype tensors along a new dimension 0 (`field` names them in errors).
Tensor stack_tensors(const std::vector<Tensor>& tensors, const HostAllocator& allocate, const char* field);

/// A transform of a whole collated batch (mixup), drawing from the batch's own generator
/// (derive_generator(seed, RandomStream::batch_transform, epoch, batch index)). It may modify the
/// batch's tensors in place: collation made them fresh. New tensors come from `allocate`.
class BatchTransform {
 public:
  virtual ~BatchTransform() = default;
  virtual void apply(Batch& batch, core::Generator& generator, const HostAllocator& allocate) const = 0;
  virtual std::string name() const = 0;
};

/// Recycles page-locked host buffers: a tensor from empty() returns its buffer to the pool when its
/// last view is gone, so steady-state loading allocates no pinned memory (cudaHostAlloc is slow and
/// synchronising). Thread-safe. Blocks are matched by exact byte size, which fits batches.
class PinnedMemoryPool : public std::enable_shared_from_this<PinnedMemoryPool> {
 public:
  /// `allocate_block` makes a new block (default core::cuda::pinned_empty, which throws without
  /// CUDA); tests pass plain host memory. At most `max_cached_blocks` idle blocks are kept.
  static std::shared_ptr<PinnedMemoryPool> create(HostAllocator allocate_block = {}, size_t max_cached_blocks = 64);

  Tensor empty(const Shape& shape, DType dtype);
  /// Blocks ever allocated / idle now (for tests and statistics).
  int64_t blocks_allocated() const;
  int64_t blocks_cached() const;

 private:
  PinnedMemoryPool(HostAllocator allocate_block, size_t max_cached_blocks);
  void recycle(Tensor block);

  HostAllocator allocate_block_;
  size_t max_cached_blocks_;
  mutable std::mutex mutex_;
  std::unordered_multimap<size_t, Tensor> idle_;
  int64_t blocks_allocated_ = 0;
};

}  // namespace colossal::data
