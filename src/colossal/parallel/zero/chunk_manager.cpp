// ChunkManager: see chunk_manager.h.
#include "colossal/parallel/zero/chunk_manager.h"

#include <algorithm>
#include <numeric>
#include <utility>

#include "colossal/autograd/grad_mode.h"  // NoGradGuard
#include "colossal/core/allocator.h"      // memory_stats
#include "colossal/core/cuda_device.h"    // streams, events, pinned memory
#include "colossal/core/error.h"
#include "colossal/core/profiler.h"  // Scope

namespace colossal::parallel::zero {

// Note [Parameters freed in place]
// Between uses a ZeRO-3 parameter holds no memory, yet the layers keep their parameter tensors and
// autograd keeps the detached handles forward saved (a linear layer's weight for its input
// gradient). All of these share the parameter's Storage, so the chunk manager changes the memory
// under that Storage instead of the tensors (core::Storage::swap_allocation, what FSDP's
// storage().resize_() does): a gather points each parameter's storage into the whole chunk (a
// wrapped allocation that keeps the chunk alive), a free swaps in an empty one, and the next gather
// (before the unit's backward) swaps the new chunk in under every handle at once. A parameter must
// therefore own its storage (offset 0, no other parameter in it), which the constructor checks.
// Shards move between host and device the same way, so the optimizer's views of a shard and the
// mixed-precision write-back targets stay valid wherever the shard lives.

// Note [Chunk placement]
// "cuda": the shards stay on the device; a gather is an all-gather from the shard. "cpu": the
// shards live in pinned host memory; a gather first copies the shard to a device buffer on the
// manager's copy stream (which waits for the compute stream, so an eviction's copy has landed), and
// the all-gather runs on the communicator's stream after that copy's event: a prefetch's copy and
// all-gather overlap the unit computing before it. The optimizer steps on the device, so every shard
// is fetched there before the step and moved back after it. A shard's pinned host buffer is made
// once: moved to the device, the shard leaves it behind as its spare, which the next eviction copies
// the shard into, and which optimizer offload's host step stages the shard's update in meanwhile
// (host_buffer(), made for a shard that never had one). Each chunk thus has one pinned host buffer,
// its host shard or its spare, under every placement ("auto" pins no more host memory than "cpu"),
// and ChunkStats counts both kinds.
// "auto" starts as "cpu" for its first step (the warm-up) and then sets its budget to what the
// device has left beside that step's peak (the allocator's peak, reset when the chunks are made),
// less a tenth of the device for fragmentation and other processes: after each step it keeps on
// the device the most recently used shards that fit the budget and moves the rest to the host.
// Whatever it keeps sits in memory the "cpu" run's peak left free, so "auto" cannot run out of
// device memory where "cpu" runs (Colossal-AI's #2246 and #6272 report its auto placement doing
// so), nor of host memory, and gathers fewer chunks from the host. Without a device to measure (the
// CPU build) and no budget given, "auto" keeps everything where it is, as "cuda".

struct ChunkManager::Chunk {
  std::vector<size_t> params;
  int64_t shard_numel = 0;
  DType dtype = DType::f32;
  Tensor shard;       // this rank's shard, wherever it lives
  Tensor spare_host;  // while the shard is on the device: its pinned host buffer (host_buffer())
  ShardPlace place = ShardPlace::device;
  ChunkState state = ChunkState::freed;
  int users = 0;
  uint64_t last_use = 0;
  Tensor whole;    // the gathered chunk (gathering, gathered)
  Tensor staging;  // a host shard's copy on the device, until its all-gather is done
  comm::Work work;
  int64_t bytes() const { return shard_numel * static_cast<int64_t>(core::element_size(dtype)); }
};

namespace {

Tensor host_empty(int64_t numel, DType dtype, Device device) {
  if (device.is_cuda()) return core::cuda::pinned_empty({numel}, dtype);
  return core::empty({numel}, TensorOptions(dtype, core::kCpu));
}

/// An allocation of no memory, to swap in where a parameter is freed.
core::Storage empty_storage(Device device) {
  return core::Storage::wrap(nullptr, 0, device, [](void*) {});
}

}  // namespace

ChunkManager::ChunkManager(std::vector<Tensor> params, const std::vector<std::vector<size_t>>& units,
                           int64_t chunk_bytes, std::shared_ptr<comm::ProcessGroup> group, Placement placement,
                           std::optional<int64_t> device_budget_bytes)
    : params_(std::move(params)), group_(std::move(group)), placement_(placement), budget_(device_budget_bytes) {
  COLOSSAL_CHECK(group_ != nullptr, "ZeRO-3 chunks need a process group");
  COLOSSAL_CHECK(chunk_bytes > 0, "zero.chunk_size_mb must be > 0, got {} bytes", chunk_bytes);
  COLOSSAL_CHECK(!budget_ || *budget_ >= 0, "ZeRO-3: the device budget must be >= 0 bytes, got {}",
                 budget_.value_or(0));
  autograd::NoGradGuard no_grad;
  const Device device = group_->device();
  for (size_t p = 0; p < params_.size(); ++p) {
    const Tensor& param = params_[p];
    COLOSSAL_CHECK(param.device() == device, "ZeRO-3: parameter {} is on {} but the {} group's tensors live on {}", p,
                   param.device(), group_->backend_name(), device);
    COLOSSAL_CHECK(param.is_contiguous() && param.offset() == 0 && param.storage().nbytes() == param.nbytes(),
                   "ZeRO-3: parameter {} (shape {}) must own its memory (contiguous, offset 0, its storage of its "
                   "own size) to be freed in place; it is a view of {} bytes at offset {}",
                   p, param.shape(), param.storage().nbytes(), param.offset());
    for (size_t q = 0; q < p; ++q) {
      COLOSSAL_CHECK(!params_[q].storage().is_same(param.storage()),
                     "ZeRO-3: parameters {} and {} share one storage; each must own its memory", q, p);
    }
  }

  const int size = group_->size(), rank = group_->rank();
  chunk_of_.assign(params_.size(), 0);
  offsets_.assign(params_.size(), 0);
  pieces_.assign(params_.size(), Piece{});
  std::vector<bool> seen(params_.size(), false);
  for (const std::vector<size_t>& unit : units) {
    std::vector<ParamSize> sizes;
    for (size_t p : unit) {
      COLOSSAL_CHECK(p < params_.size() && !seen[p], "ZeRO-3: parameter {} is in no unit or in two", p);
      seen[p] = true;
      const Tensor& param = params_[p];
      sizes.push_back(
          ParamSize{param.numel(), static_cast<int64_t>(param.element_size()), static_cast<int>(param.dtype())});
    }
    // Element granularity: each chunk one flat buffer of `size` equal shards (Note [ZeRO partition]).
    const Partition partition(sizes, chunk_bytes, size, Granularity::element);
    std::vector<size_t>& mine = unit_chunks_.emplace_back();
    for (const Bucket& bucket : partition.buckets()) {
      Chunk chunk;
      int64_t offset = 0;
      for (size_t i = 0; i < bucket.params.size(); ++i) {
        const size_t p = unit[bucket.params[i]];
        chunk.params.push_back(p);
        chunk_of_[p] = chunks_.size();
        offsets_[p] = offset;
        pieces_[p] = partition.piece(bucket.params[i], rank);
        offset += params_[p].numel();
      }
      chunk.shard_numel = bucket.chunk;
      chunk.dtype = params_[chunk.params.front()].dtype();
      mine.push_back(chunks_.size());
      chunks_.push_back(std::move(chunk));
    }
  }
  for (size_t p = 0; p < params_.size(); ++p) {
    COLOSSAL_CHECK(seen[p], "ZeRO-3: parameter {} (shape {}) is in no unit", p, params_[p].shape());
  }

  // The shards out of the whole parameters, which are then freed.
  for (Chunk& chunk : chunks_) {
    chunk.shard = core::zeros({chunk.shard_numel}, TensorOptions(chunk.dtype, device));
    for (size_t p : chunk.params) {
      const Piece& own = pieces_[p];
      if (own.numel > 0) {
        chunk.shard.narrow(0, own.offset, own.numel)
            .copy_(params_[p].detach().view({-1}).narrow(0, own.begin, own.numel));
      }
    }
    stats_.device_shard_bytes += chunk.bytes();
  }
  stats_.peak_device_shard_bytes = stats_.device_shard_bytes;
  for (const Chunk& chunk : chunks_) unbind(chunk);
  if (device.is_cuda()) {
    copy_stream_ = core::cuda::create_stream(device);
    own_copy_stream_ = true;
  }
  // "cpu" keeps its shards on the host from the start; "auto" too until its warm-up step ends.
  if (placement_ != Placement::cuda) {
    for (Chunk& chunk : chunks_) move_shard(chunk, ShardPlace::host);
  }
  // "auto"'s budget is what the warm-up step leaves free, so the allocator's peak is counted from
  // here: the model's construction and mixed-precision conversion (an f32 model and its 16-bit copy
  // side by side on the device, Note [Masters on the host]) peak higher than any step and would
  // otherwise shrink the budget by the difference. LogMemoryHook's peak then also starts here.
  if (placement_ == Placement::auto_ && !budget_ && device.is_cuda()) core::reset_peak_memory(device);
}

ChunkManager::~ChunkManager() {
  for (Chunk& chunk : chunks_) {
    if (chunk.state == ChunkState::gathering) chunk.work.wait();
  }
  if (own_copy_stream_) {
    core::cuda::synchronize(copy_stream_);
    core::cuda::destroy_stream(copy_stream_);
  }
}

size_t ChunkManager::num_chunks() const {
  return chunks_.size();
}
ChunkState ChunkManager::state(size_t c) const {
  return chunks_.at(c).state;
}
ShardPlace ChunkManager::place(size_t c) const {
  return chunks_.at(c).place;
}
int ChunkManager::users(size_t c) const {
  return chunks_.at(c).users;
}
const std::vector<size_t>& ChunkManager::chunk_params(size_t c) const {
  return chunks_.at(c).params;
}
int64_t ChunkManager::shard_numel(size_t c) const {
  return chunks_.at(c).shard_numel;
}
DType ChunkManager::dtype(size_t c) const {
  return chunks_.at(c).dtype;
}

Piece ChunkManager::piece_range(size_t p) const {
  return pieces_.at(p);
}

Tensor ChunkManager::shard(size_t c) const {
  return chunks_.at(c).shard;
}

Tensor ChunkManager::host_buffer(size_t c) {
  Chunk& chunk = chunks_.at(c);
  COLOSSAL_CHECK(chunk.place == ShardPlace::device,
                 "ZeRO-3: chunk {}'s shard is on the host: its host memory is the shard itself (shard())", c);
  if (!chunk.spare_host.defined()) {
    chunk.spare_host = host_empty(chunk.shard_numel, chunk.dtype, group_->device());
    chunk.spare_host.fill_(0.0);
    stats_.spare_host_bytes += chunk.bytes();
  }
  return chunk.spare_host;
}

Tensor ChunkManager::spare_host_buffer(size_t c) const {
  return chunks_.at(c).spare_host;
}

Tensor ChunkManager::piece(size_t p) const {
  const Piece& own = pieces_.at(p);
  return chunks_[chunk_of_[p]].shard.narrow(0, own.numel == 0 ? 0 : own.offset, own.numel);
}

void ChunkManager::prefetch(size_t c) {
  Chunk& chunk = chunks_.at(c);
  if (chunk.state != ChunkState::freed) return;
  autograd::NoGradGuard no_grad;
  core::profiler::Scope scope("zero3: chunk all-gather", group_->device());
  const Device device = group_->device();
  Tensor source = chunk.shard;
  if (chunk.place == ShardPlace::host) {
    // The copy runs on the copy stream; the buffer belongs to the compute stream, which frees it
    // only after it waited for the all-gather (Note [Chunk placement]).
    chunk.staging = core::empty({chunk.shard_numel}, TensorOptions(chunk.dtype, device));
    if (device.is_cuda()) {
      const core::Stream compute = core::cuda::current_stream(device);
      core::cuda::Event ready;
      ready.record(compute);
      ready.block(copy_stream_);
      {
        core::cuda::StreamGuard on_copy(copy_stream_);
        chunk.staging.copy_(chunk.shard);
      }
      core::cuda::Event copied;
      copied.record(copy_stream_);
      copied.block(compute);
    } else {
      chunk.staging.copy_(chunk.shard);
    }
    stats_.host_to_device_bytes += chunk.bytes();
    source = chunk.staging;
  }
  chunk.whole = core::empty({chunk.shard_numel * group_->size()}, TensorOptions(chunk.dtype, device));
  chunk.work = group_->all_gather(chunk.whole, source, /*async=*/true);
  chunk.state = ChunkState::gathering;
  ++stats_.gathers;
  stats_.gathered_bytes += chunk.bytes() * group_->size();
  stats_.peak_gathered_bytes = std::max(stats_.peak_gathered_bytes, stats_.gathered_bytes);
}

void ChunkManager::wait_gather(Chunk& chunk) {
  chunk.work.wait();
  chunk.work = comm::Work();
  chunk.staging = Tensor();
  bind(chunk);
  chunk.state = ChunkState::gathered;
}

void ChunkManager::acquire(size_t c) {
  Chunk& chunk = chunks_.at(c);
  prefetch(c);
  if (chunk.state == ChunkState::gathering) wait_gather(chunk);
  ++chunk.users;
  chunk.last_use = ++clock_;
}

void ChunkManager::release(size_t c) {
  Chunk& chunk = chunks_.at(c);
  if (chunk.users > 0) --chunk.users;
  if (chunk.users == 0 && chunk.state == ChunkState::gathered) free_whole(chunk);
}

void ChunkManager::release_all() {
  for (Chunk& chunk : chunks_) {
    if (chunk.state == ChunkState::gathering) wait_gather(chunk);
    chunk.users = 0;
    if (chunk.state == ChunkState::gathered) free_whole(chunk);
  }
}

void ChunkManager::free_whole(Chunk& chunk) {
  unbind(chunk);
  chunk.whole = Tensor();
  chunk.state = ChunkState::freed;
  stats_.gathered_bytes -= chunk.bytes() * group_->size();
}

void ChunkManager::bind(const Chunk& chunk) {
  const core::Storage& whole = chunk.whole.storage();
  auto* base = static_cast<char*>(chunk.whole.raw_data());
  for (size_t p : chunk.params) {
    const Tensor& param = params_[p];
    const size_t at = static_cast<size_t>(offsets_[p]) * param.element_size();
    // The wrapped allocation holds the whole chunk alive while any parameter points into it.
    const core::Storage view =
        core::Storage::wrap(base + at, param.nbytes(), whole.device(), [keep = whole](void*) { (void)keep; });
    param.storage().swap_allocation(view);
  }
}

void ChunkManager::unbind(const Chunk& chunk) {
  for (size_t p : chunk.params) params_[p].storage().swap_allocation(empty_storage(group_->device()));
}

void ChunkManager::move_shard(Chunk& chunk, ShardPlace to) {
  if (chunk.place == to) return;
  autograd::NoGradGuard no_grad;
  const Device device = group_->device();
  if (to == ShardPlace::host) {
    if (chunk.spare_host.defined()) {
      stats_.spare_host_bytes -= chunk.bytes();  // it becomes the shard
    } else {
      chunk.spare_host = host_empty(chunk.shard_numel, chunk.dtype, device);
    }
    // Synchronous (the host reads it next), after whatever the compute stream did to the shard: an
    // offloaded update's copy out of this very buffer included, so the copy writes back what it holds.
    chunk.spare_host.copy_(chunk.shard);
    chunk.shard.storage().swap_allocation(chunk.spare_host.storage());
    chunk.spare_host = Tensor();  // it held the device memory now, freed in stream order after the copy
    stats_.device_to_host_bytes += chunk.bytes();
    stats_.device_shard_bytes -= chunk.bytes();
    stats_.host_shard_bytes += chunk.bytes();
    ++stats_.evictions;
  } else {
    Tensor on_device = core::empty({chunk.shard_numel}, TensorOptions(chunk.dtype, device));
    on_device.copy_(chunk.shard);
    chunk.shard.storage().swap_allocation(on_device.storage());
    // The copy is asynchronous on the compute stream (from pinned memory); whoever writes the old
    // host buffer, now the spare, next must wait for that stream (HostOffload::set_output does).
    chunk.spare_host = on_device;  // now the pinned host buffer, kept for the next eviction
    stats_.spare_host_bytes += chunk.bytes();
    stats_.host_to_device_bytes += chunk.bytes();
    stats_.host_shard_bytes -= chunk.bytes();
    stats_.device_shard_bytes += chunk.bytes();
    stats_.peak_device_shard_bytes = std::max(stats_.peak_device_shard_bytes, stats_.device_shard_bytes);
  }
  chunk.place = to;
}

void ChunkManager::fetch_all() {
  core::profiler::Scope scope("zero3: shards to the device", group_->device());
  for (Chunk& chunk : chunks_) move_shard(chunk, ShardPlace::device);
}

void ChunkManager::place_after_step() {
  if (placement_ == Placement::cuda) return;
  core::profiler::Scope scope("zero3: shard placement", group_->device());
  const Device device = group_->device();
  if (placement_ == Placement::auto_ && !budget_ && !warmed_up_ && device.is_cuda()) {
    // The warm-up step ran as "cpu": what it left of the device is the budget.
    const int64_t total = core::cuda::memory_info(device.index).second;
    const int64_t peak = core::memory_stats(device).peak_allocated_bytes;
    budget_ = std::max<int64_t>(0, total - peak - total / 10);
  }
  warmed_up_ = true;
  if (placement_ == Placement::cpu || !budget_) {
    const bool to_host = placement_ == Placement::cpu || device.is_cuda();
    for (Chunk& chunk : chunks_) move_shard(chunk, to_host ? ShardPlace::host : ShardPlace::device);
    return;
  }
  // "auto": the most recently used first, while they fit.
  std::vector<size_t> order(chunks_.size());
  std::iota(order.begin(), order.end(), size_t{0});
  std::stable_sort(order.begin(), order.end(),
                   [&](size_t a, size_t b) { return chunks_[a].last_use > chunks_[b].last_use; });
  int64_t kept = 0;
  for (size_t c : order) {
    Chunk& chunk = chunks_[c];
    const bool fits = kept + chunk.bytes() <= *budget_;
    if (fits) kept += chunk.bytes();
    move_shard(chunk, fits ? ShardPlace::device : ShardPlace::host);
  }
}

}  // namespace colossal::parallel::zero
