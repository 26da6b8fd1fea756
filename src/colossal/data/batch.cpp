// Collation by stacking, and the pinned host buffer pool.
#include "colossal/data/batch.h"

#include <cstring>

#include "colossal/core/cuda_device.h"  // pinned_empty
#include "colossal/core/error.h"
#include "colossal/core/view.h"  // contiguous_raw

namespace colossal::data {

Tensor host_empty(const Shape& shape, DType dtype) {
  return core::empty(shape, dtype);
}

Tensor stack_tensors(const std::vector<Tensor>& tensors, const HostAllocator& allocate, const char* field) {
  COLOSSAL_CHECK(!tensors.empty(), "collate: no examples to stack");
  const Tensor& first = tensors[0];
  COLOSSAL_CHECK(first.defined(), "collate: example 0 has no {}", field);
  for (size_t i = 0; i < tensors.size(); ++i) {
    const Tensor& t = tensors[i];
    COLOSSAL_CHECK(t.defined(), "collate: example {} has no {} but example 0 has one", i, field);
    COLOSSAL_CHECK(t.device().is_cpu(), "collate: {} of example {} is on {}; datasets must return CPU tensors", field,
                   i, t.device());
    COLOSSAL_CHECK(t.shape() == first.shape() && t.dtype() == first.dtype(),
                   "collate: cannot stack {}s of different shapes or dtypes: example {} is {} {}, example 0 is {} {} "
                   "(resize or crop images to one size, or pass a custom collate function)",
                   field, i, t.dtype(), t.shape(), first.dtype(), first.shape());
  }
  Shape shape = first.shape();
  shape.insert(shape.begin(), static_cast<int64_t>(tensors.size()));
  Tensor out = allocate(shape, first.dtype());
  COLOSSAL_CHECK(out.is_contiguous() && out.shape() == shape && out.dtype() == first.dtype(),
                 "collate: the allocator returned a {} {} tensor for a request of {} {}", out.dtype(), out.shape(),
                 first.dtype(), shape);
  const size_t bytes = first.nbytes();
  auto* dst = static_cast<char*>(out.raw_data());
  for (size_t i = 0; i < tensors.size(); ++i) {
    const Tensor src = core::contiguous_raw(tensors[i]);
    if (bytes > 0) std::memcpy(dst + i * bytes, src.raw_data(), bytes);
  }
  return out;
}

Batch stack_collate(const std::vector<Example>& examples, const HostAllocator& allocate) {
  COLOSSAL_CHECK(!examples.empty(), "collate: no examples to stack");
  std::vector<Tensor> inputs, targets;
  inputs.reserve(examples.size());
  for (const Example& e : examples) inputs.push_back(e.input);
  Batch batch;
  batch.input = stack_tensors(inputs, allocate, "input");
  if (examples[0].target.defined()) {
    for (const Example& e : examples) targets.push_back(e.target);
    batch.target = stack_tensors(targets, allocate, "target");
  } else {
    for (size_t i = 1; i < examples.size(); ++i) {
      COLOSSAL_CHECK(!examples[i].target.defined(), "collate: example {} has a target but example 0 has none", i);
    }
  }
  return batch;
}

std::shared_ptr<PinnedMemoryPool> PinnedMemoryPool::create(HostAllocator allocate_block, size_t max_cached_blocks) {
  return std::shared_ptr<PinnedMemoryPool>(new PinnedMemoryPool(std::move(allocate_block), max_cached_blocks));
}

PinnedMemoryPool::PinnedMemoryPool(HostAllocator allocate_block, size_t max_cached_blocks)
    : allocate_block_(allocate_block ? std::move(allocate_block) : HostAllocator(core::cuda::pinned_empty)),
      max_cached_blocks_(max_cached_blocks) {}

Tensor PinnedMemoryPool::empty(const Shape& shape, DType dtype) {
  const size_t nbytes = core::checked_nbytes(shape, dtype, "PinnedMemoryPool::empty");
  Tensor block;
  {
    std::lock_guard lock(mutex_);
    if (auto it = idle_.find(nbytes); it != idle_.end()) {
      block = std::move(it->second);
      idle_.erase(it);
    }
  }
  if (!block.defined()) {
    block = allocate_block_({static_cast<int64_t>(nbytes)}, DType::u8);
    std::lock_guard lock(mutex_);
    ++blocks_allocated_;
  }
  // The tensor handed out wraps the block's memory; when its last view is gone the block goes back
  // to the pool (or, if the pool is gone, is freed with the lambda that holds it).
  std::weak_ptr<PinnedMemoryPool> pool = weak_from_this();
  core::Storage storage = core::Storage::wrap(block.raw_data(), nbytes, core::kCpu, [pool, block](void*) mutable {
    if (auto p = pool.lock()) p->recycle(std::move(block));
  });
  return Tensor(
      std::make_shared<core::TensorImpl>(std::move(storage), shape, core::contiguous_strides(shape), 0, dtype));
}

void PinnedMemoryPool::recycle(Tensor block) {
  std::lock_guard lock(mutex_);
  if (idle_.size() < max_cached_blocks_) idle_.emplace(static_cast<size_t>(block.numel()), std::move(block));
}

int64_t PinnedMemoryPool::blocks_allocated() const {
  std::lock_guard lock(mutex_);
  return blocks_allocated_;
}

int64_t PinnedMemoryPool::blocks_cached() const {
  std::lock_guard lock(mutex_);
  return static_cast<int64_t>(idle_.size());
}

}  // namespace colossal::data
