// ChunkManager: the parameter memory of ZeRO-3 (parallel/zero/zero3.h), Colossal-AI's Gemini chunks.
// Each unit's parameters (a module ZeRO-3 hooks) are packed into chunks of at most chunk_bytes, and
// each chunk is cut into equal shards over the data-parallel group (partition.h, element
// granularity): rank r keeps shard r, in the model's dtype, on the device or in pinned host memory
// (the placement). A chunk is gathered whole on the device (an all-gather, from a host shard
// through a copy on its own stream) while a unit computes, its parameters pointed into it, and freed
// after. See Note [Parameters freed in place] and Note [Chunk placement] in chunk_manager.cpp.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "colossal/comm/process_group.h"
#include "colossal/core/tensor.h"
#include "colossal/parallel/zero/partition.h"
#include "colossal/parallel/zero/zero_handler.h"  // Placement

namespace colossal::parallel::zero {

/// The whole chunk on the device.
enum class ChunkState {
  freed,      ///< only the shards exist; the parameters hold no memory
  gathering,  ///< an all-gather (a prefetch) is in flight into the whole buffer
  gathered,   ///< the parameters point into the whole buffer
};

/// Where a chunk's shard lives now.
enum class ShardPlace { host, device };

/// What the chunks hold and moved (bytes), for tests, LogMemory and the benchmarks.
struct ChunkStats {
  int64_t device_shard_bytes = 0;       ///< shards resident on the device now
  int64_t host_shard_bytes = 0;         ///< shards in pinned host memory now
  int64_t spare_host_bytes = 0;         ///< pinned host buffers kept for device shards (host_buffer)
  int64_t peak_device_shard_bytes = 0;  ///< the most device_shard_bytes reached
  int64_t gathered_bytes = 0;           ///< whole chunks on the device now (gathering or gathered)
  int64_t peak_gathered_bytes = 0;
  int64_t host_to_device_bytes = 0;  ///< shard copies to the device (gathers from the host, fetches)
  int64_t device_to_host_bytes = 0;  ///< shard evictions
  int64_t gathers = 0;               ///< all-gathers issued
  int64_t evictions = 0;             ///< shards moved to the host
};

class ChunkManager {
 public:
  /// Packs `params` (each contiguous, with its own storage; every rank the same list) unit by unit
  /// (`units`: indices into params, every index in exactly one unit) into chunks, copies this rank's
  /// shard of each out of the whole parameters (the same on every rank) and frees the parameters'
  /// memory. `placement` and `device_budget_bytes` as ZeroOptions says.
  ChunkManager(std::vector<Tensor> params, const std::vector<std::vector<size_t>>& units, int64_t chunk_bytes,
               std::shared_ptr<comm::ProcessGroup> group, Placement placement,
               std::optional<int64_t> device_budget_bytes);
  ~ChunkManager();
  ChunkManager(const ChunkManager&) = delete;
  ChunkManager& operator=(const ChunkManager&) = delete;

  size_t num_chunks() const;
  /// The chunks of unit u, in packing order.
  const std::vector<size_t>& unit_chunks(size_t u) const { return unit_chunks_[u]; }
  ChunkState state(size_t chunk) const;
  ShardPlace place(size_t chunk) const;
  /// Units using the gathered chunk now (acquire minus release).
  int users(size_t chunk) const;
  /// Parameters of chunk c (indices into the constructor's list), their elements in it, and the
  /// elements of one shard (the whole chunk is that times the group's size, the tail padded).
  const std::vector<size_t>& chunk_params(size_t chunk) const;
  int64_t shard_numel(size_t chunk) const;
  DType dtype(size_t chunk) const;

  /// Starts gathering the chunk (asynchronously) when it is freed; nothing otherwise. Collective:
  /// every rank issues the same gathers in the same order.
  void prefetch(size_t chunk);
  /// Gathers the chunk (or waits for its prefetch), points its parameters into it and counts a user.
  void acquire(size_t chunk);
  /// Counts a user off; the last one frees the whole chunk (the parameters hold no memory again).
  void release(size_t chunk);
  /// Frees every gathered chunk whatever its users (the end of a backward), waiting for prefetches.
  void release_all();

  /// This rank's piece of parameter p as a 1-D view of its chunk's shard (empty where it owns none):
  /// the optimizer steps these, the mixed-precision masters write back into them.
  Tensor piece(size_t p) const;
  /// Chunk c's shard (this rank's, 1-D in the model's dtype), wherever it lives now: optimizer
  /// offload writes the updated parameters into it where that is the host.
  Tensor shard(size_t chunk) const;
  /// While chunk c's shard is on the device: its pinned host buffer (the shard's size and dtype), the
  /// one the shard's next eviction copies it into, kept from its last move to the device or made now
  /// (zeros) where it never had one ("cuda" placement). Optimizer offload's host step writes a device
  /// shard's update there before it is copied to the device (Note [ZeRO-3 offload] in zero3.cpp).
  Tensor host_buffer(size_t chunk);
  /// That buffer where it exists; undefined where it was never made or the shard is on the host.
  Tensor spare_host_buffer(size_t chunk) const;
  /// This rank's piece of parameter p: [begin, begin + numel) of the flattened parameter, at
  /// `offset` in the shard.
  Piece piece_range(size_t p) const;
  /// Parameter p's offset (elements) in its whole chunk, and its chunk.
  int64_t offset(size_t p) const { return offsets_[p]; }
  size_t chunk_of(size_t p) const { return chunk_of_[p]; }

  /// Moves every shard to the device (before the optimizer steps them).
  void fetch_all();
  /// After a step: "cuda" keeps every shard on the device, "cpu" moves them all to the host, "auto"
  /// keeps the most recently used ones that fit its budget (set after the first call from the
  /// warm-up step's peak, unless given) and moves the rest. See Note [Chunk placement].
  void place_after_step();
  /// "auto"'s budget (unset before the warm-up step ended or without a device to measure).
  std::optional<int64_t> device_budget_bytes() const { return budget_; }

  ChunkStats stats() const { return stats_; }
  Placement placement() const { return placement_; }
  const comm::ProcessGroup& group() const { return *group_; }

 private:
  struct Chunk;
  void move_shard(Chunk& chunk, ShardPlace to);
  void bind(const Chunk& chunk);
  void unbind(const Chunk& chunk);
  void wait_gather(Chunk& chunk);
  void free_whole(Chunk& chunk);

  std::vector<Tensor> params_;
  std::shared_ptr<comm::ProcessGroup> group_;
  Placement placement_;
  std::optional<int64_t> budget_;
  bool warmed_up_ = false;
  std::vector<Chunk> chunks_;
  std::vector<std::vector<size_t>> unit_chunks_;
  std::vector<size_t> chunk_of_;
  std::vector<int64_t> offsets_;
  std::vector<Piece> pieces_;
  uint64_t clock_ = 0;  // ticks at each acquire: the chunks' last use, for "auto"'s LRU
  core::Stream copy_stream_{};
  bool own_copy_stream_ = false;
  ChunkStats stats_;
};

}  // namespace colossal::parallel::zero
