// Partition: see partition.h.
#include "colossal/parallel/zero/partition.h"

#include <algorithm>
#include <numeric>

#include "colossal/core/error.h"

namespace colossal::parallel::zero {

// Note [ZeRO partition]
// A flat buffer per bucket, split into `size` equal chunks, is what makes one reduce-scatter (and one
// all-gather) per bucket possible: the collective's chunk r is rank r's. Balancing a single flat
// buffer of all parameters over the ranks (DeepSpeed's contiguous ranges) would give each rank equal
// shares too, but then a bucket's slice of that buffer mostly belongs to one or two ranks, and the
// reduction becomes one reduce per owner. With per-bucket chunks each rank owns 1/size of every
// bucket: the optimizer state of every rank is within size - 1 elements per bucket of the others'
// (the padding at the bucket's tail), and a parameter has at most one piece on each rank (a chunk is
// contiguous in the bucket), which is what lets the optimizer step a piece as one 1-D tensor.
//
// Tensor granularity keeps parameters whole for the optimizers that take norms per tensor: a
// parameter goes to the rank with the least load in its bucket (ties: the least load over all
// buckets so far, then the lowest rank), and the chunk is the most loaded rank's, the others padded.
// A bucket of one large parameter then sends size times its bytes: the price of serial trust ratios
// without a per-tensor reduction inside the optimizer.

Partition::Partition(const std::vector<ParamSize>& params, int64_t bucket_bytes, int size, Granularity granularity)
    : size_(size), granularity_(granularity) {
  COLOSSAL_CHECK(size >= 1, "ZeRO partition: the group must have at least one rank, got {}", size);
  COLOSSAL_CHECK(bucket_bytes > 0, "ZeRO partition: the bucket size must be > 0 bytes, got {}", bucket_bytes);
  bucket_of_.resize(params.size());
  slot_of_.resize(params.size());
  int64_t current_bytes = 0;
  for (size_t p = 0; p < params.size(); ++p) {
    const ParamSize& param = params[p];
    COLOSSAL_CHECK(param.numel >= 0 && param.element_size > 0,
                   "ZeRO partition: parameter {} has numel {} and {}-byte elements", p, param.numel,
                   param.element_size);
    const int64_t bytes = param.numel * param.element_size;
    const ParamSize& first = params[buckets_.empty() ? 0 : buckets_.back().params.front()];
    const bool fits = !buckets_.empty() && current_bytes + bytes <= bucket_bytes && first.dtype == param.dtype &&
                      first.group == param.group;
    if (!fits) {
      buckets_.emplace_back();
      current_bytes = 0;
    }
    bucket_of_[p] = buckets_.size() - 1;
    slot_of_[p] = buckets_.back().params.size();
    buckets_.back().params.push_back(p);
    current_bytes += bytes;
  }

  std::vector<int64_t> total_load(static_cast<size_t>(size), 0);
  for (Bucket& bucket : buckets_) {
    bucket.pieces.resize(bucket.params.size());
    if (granularity == Granularity::element) {
      int64_t numel = 0;
      for (size_t p : bucket.params) numel += params[p].numel;
      bucket.chunk = (numel + size - 1) / size;
      int64_t start = 0;  // the parameter's offset in the bucket
      for (size_t i = 0; i < bucket.params.size(); ++i) {
        const int64_t n = params[bucket.params[i]].numel;
        for (int r = 0; r < size && bucket.chunk > 0; ++r) {
          const int64_t lo = std::max(start, r * bucket.chunk), hi = std::min(start + n, (r + 1) * bucket.chunk);
          if (hi > lo) bucket.pieces[i].push_back(Piece{r, lo - start, hi - lo, lo - r * bucket.chunk});
        }
        start += n;
      }
    } else {
      std::vector<int64_t> load(static_cast<size_t>(size), 0);
      for (size_t i = 0; i < bucket.params.size(); ++i) {
        int best = 0;
        for (int r = 1; r < size; ++r) {
          const auto ru = static_cast<size_t>(r), bu = static_cast<size_t>(best);
          if (load[ru] < load[bu] || (load[ru] == load[bu] && total_load[ru] < total_load[bu])) best = r;
        }
        const int64_t n = params[bucket.params[i]].numel;
        const auto bu = static_cast<size_t>(best);
        if (n > 0) bucket.pieces[i].push_back(Piece{best, 0, n, load[bu]});
        load[bu] += n;
        total_load[bu] += n;
      }
      bucket.chunk = *std::max_element(load.begin(), load.end());
    }
  }
  for (Bucket& bucket : buckets_) {
    for (size_t i = 0; i < bucket.params.size(); ++i) {
      const std::vector<Piece>& pieces = bucket.pieces[i];
      // A parameter's pieces are contiguous in the flat buffer (element granularity's chunks follow
      // each other; tensor granularity gives it one piece), so its first piece places it.
      bucket.starts.push_back(pieces.empty() ? 0 : pieces.front().rank * bucket.chunk + pieces.front().offset);
    }
  }
  shard_offsets_.resize(buckets_.size());
  for (size_t b = 0; b < buckets_.size(); ++b) {
    shard_offsets_[b] = shard_numel_;
    shard_numel_ += buckets_[b].chunk;
  }
}

Piece Partition::piece(size_t p, int rank) const {
  const Bucket& bucket = buckets_[bucket_of_[p]];
  for (const Piece& piece : bucket.pieces[slot_of_[p]]) {
    if (piece.rank == rank) return piece;
  }
  return Piece{rank, 0, 0, 0};
}

int64_t Partition::max_piece(size_t p) const {
  int64_t most = 0;
  for (const Piece& piece : buckets_[bucket_of_[p]].pieces[slot_of_[p]]) most = std::max(most, piece.numel);
  return most;
}

std::vector<int64_t> Partition::owned_numel() const {
  std::vector<int64_t> owned(static_cast<size_t>(size_), 0);
  for (const Bucket& bucket : buckets_) {
    for (const auto& pieces : bucket.pieces) {
      for (const Piece& piece : pieces) owned[static_cast<size_t>(piece.rank)] += piece.numel;
    }
  }
  return owned;
}

}  // namespace colossal::parallel::zero
