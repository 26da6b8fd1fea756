// Partition: how ZeRO (stages 1 and 2) cuts the trainable parameters over the data-parallel ranks.
// The parameters are laid in buckets (about reduce_bucket_mb of gradients each, in the order backward
// produces them); each bucket is one flat buffer of `size` equal chunks, and rank r owns chunk r: the
// gradients of a bucket are reduce-scattered into their owners and the updated parameters
// all-gathered back with one collective per bucket. See Note [ZeRO partition] in partition.cpp.
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

namespace colossal::parallel::zero {

/// How a rank's chunk of a bucket is cut out of the bucket's parameters.
enum class Granularity {
  /// The bucket's parameters flattened end to end and split into equal chunks (the tail padded), so
  /// a parameter may be split between ranks: balanced to the element (Colossal-AI's low-level ZeRO,
  /// DeepSpeed's flat partitions). For optimizers whose update is elementwise (SGD, Adam, AdamW).
  element,
  /// Whole parameters, each given to the rank with the least load in its bucket: a rank steps whole
  /// tensors, so per-tensor norms (LAMB's and LARS's trust ratios) are those of the serial update.
  /// The chunks are padded to the most loaded rank's, so a bucket costs more communication.
  tensor,
};

/// One rank's piece of a parameter: elements [begin, begin + numel) of the flattened parameter,
/// kept at `offset` within the rank's chunk of the bucket.
struct Piece {
  int rank = 0;
  int64_t begin = 0;
  int64_t numel = 0;
  int64_t offset = 0;
};

struct Bucket {
  /// Indices of the bucket's parameters (into the list given to make_partition), in packing order.
  std::vector<size_t> params;
  /// The pieces of each parameter of `params` (index-aligned), in rank order, none empty.
  std::vector<std::vector<Piece>> pieces;
  /// Elements per rank: the bucket's flat buffer has size * chunk.
  int64_t chunk = 0;
  /// Where each parameter of `params` (index-aligned) starts in the flat buffer: it fills
  /// [start, start + numel) under either granularity (element: end to end; tensor: at its owner's
  /// chunk), and what no parameter fills is padding.
  std::vector<int64_t> starts;
};

/// What make_partition needs of a parameter.
struct ParamSize {
  int64_t numel = 0;
  int64_t element_size = 0;  ///< bytes of one element of its gradient
  int dtype = 0;             ///< a bucket holds one dtype: a new one starts where this changes
  /// A bucket holds parameters of one group: a new one starts where this changes (LowLevelZero keeps
  /// the model's own parameters apart from its blocks', Note [Gathers under the forward]).
  int group = 0;
};

class Partition {
 public:
  /// Buckets `params` in the given order (the order their gradients become ready): a new bucket
  /// when the next parameter would take it past `bucket_bytes` or has another dtype or group (a parameter
  /// larger than the cap gets one of its own), each cut over `size` ranks by `granularity`.
  Partition(const std::vector<ParamSize>& params, int64_t bucket_bytes, int size, Granularity granularity);

  int size() const { return size_; }
  Granularity granularity() const { return granularity_; }
  const std::vector<Bucket>& buckets() const { return buckets_; }
  /// The bucket of parameter p and its slot in it.
  size_t bucket_of(size_t p) const { return bucket_of_[p]; }
  size_t slot_of(size_t p) const { return slot_of_[p]; }
  /// Where bucket b's chunk starts in a rank's shard (its chunks of every bucket end to end).
  int64_t shard_offset(size_t b) const { return shard_offsets_[b]; }
  /// Elements of a rank's shard: the sum of the buckets' chunks (the same on every rank).
  int64_t shard_numel() const { return shard_numel_; }
  /// Rank `rank`'s piece of parameter p (numel 0, at the parameter's start, when it owns none).
  Piece piece(size_t p, int rank) const;
  /// The largest piece of parameter p any rank has.
  int64_t max_piece(size_t p) const;
  /// Elements of parameter p's piece on each rank summed over parameters: how many elements rank r
  /// steps (the optimizer's share), for balance checks and memory accounting.
  std::vector<int64_t> owned_numel() const;

 private:
  int size_;
  Granularity granularity_;
  std::vector<Bucket> buckets_;
  std::vector<size_t> bucket_of_, slot_of_;
  std::vector<int64_t> shard_offsets_;
  int64_t shard_numel_ = 0;
};

}  // namespace colossal::parallel::zero
