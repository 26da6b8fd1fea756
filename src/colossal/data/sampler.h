// Samplers: the order in which a DataLoader visits a dataset's indices, per epoch. Sequential,
// random (a seeded permutation per epoch) and distributed (this rank's share of a permutation that
// every rank computes alike, padded or truncated to equal length, as torch's DistributedSampler).
#pragma once

#include <cstdint>
#include <vector>

namespace colossal::data {

class Sampler {
 public:
  virtual ~Sampler() = default;
  /// How many indices one epoch yields.
  virtual int64_t size() const = 0;
  /// The indices of the current epoch, in visiting order.
  virtual std::vector<int64_t> indices() const = 0;
  /// Selects the epoch whose order indices() returns (shuffling samplers reshuffle per epoch).
  void set_epoch(int64_t epoch) { epoch_ = epoch; }
  int64_t epoch() const { return epoch_; }

 protected:
  int64_t epoch_ = 0;
};

/// 0, 1, ..., n-1 every epoch.
class SequentialSampler final : public Sampler {
 public:
  explicit SequentialSampler(int64_t dataset_size);
  int64_t size() const override { return dataset_size_; }
  std::vector<int64_t> indices() const override;

 private:
  int64_t dataset_size_;
};

/// The permutation of 0..n-1 for (seed, epoch) that every sampler here shares, so that a
/// DistributedSampler with world size 1 visits the same order as a RandomSampler.
std::vector<int64_t> shuffled_indices(int64_t n, uint64_t seed, int64_t epoch);

/// A fresh permutation of 0..n-1 per epoch, a pure function of (seed, epoch).
class RandomSampler final : public Sampler {
 public:
  RandomSampler(int64_t dataset_size, uint64_t seed);
  int64_t size() const override { return dataset_size_; }
  std::vector<int64_t> indices() const override;

 private:
  int64_t dataset_size_;
  uint64_t seed_;
};

struct DistributedSamplerOptions {
  int64_t rank = 0;        ///< this replica, in [0, world_size)
  int64_t world_size = 1;  ///< number of data-parallel replicas
  bool shuffle = true;     ///< permute (same permutation on every rank) before splitting
  uint64_t seed = 0;       ///< must be equal on every rank
  /// false: pad with indices from the start so every rank gets ceil(n / world) samples.
  /// true: drop the tail so every rank gets floor(n / world) samples.
  bool drop_last = false;
};

/// Rank r takes positions r, r + world, r + 2 world, ... of the (shuffled, padded or truncated)
/// index list, exactly as torch.utils.data.DistributedSampler does.
class DistributedSampler final : public Sampler {
 public:
  DistributedSampler(int64_t dataset_size, DistributedSamplerOptions options);
  int64_t size() const override { return num_samples_; }
  std::vector<int64_t> indices() const override;
  /// Samples per epoch summed over all ranks (num_samples * world_size).
  int64_t total_size() const { return num_samples_ * options_.world_size; }

 private:
  int64_t dataset_size_;
  DistributedSamplerOptions options_;
  int64_t num_samples_ = 0;
};

}  // namespace colossal::data
