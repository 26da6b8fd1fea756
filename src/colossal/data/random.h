// Random numbers for data loading: per-sample generators derived from (seed, epoch, index), and the
// host-side draws (uniform, integers, normal, gamma, beta, permutations) that samplers, transforms
// and datasets take from them. Every draw is a pure function of the generator's (seed, offset), so a
// sample's augmentation never depends on which worker thread produced it or when.
#pragma once

#include <cstdint>
#include <vector>

#include "colossal/core/random.h"  // Generator

namespace colossal::data {

/// Which consumer a derived generator serves, so that a shuffle and an augmentation seeded with the
/// same user seed still draw unrelated numbers.
enum class RandomStream : uint64_t {
  shuffle = 1,           ///< samplers' per-epoch permutations (index unused)
  sample_transform = 2,  ///< per-sample transforms
  batch_transform = 3,   ///< per-batch transforms (index = batch number in the epoch)
  token_window = 4,      ///< random windows of token files
  synthetic = 5,         ///< synthetic datasets (epoch unused)
};

/// The generator for item `index` of `epoch` in `stream` of a pipeline seeded with `seed`. Philox
/// itself mixes the key, so neighbouring indices get unrelated streams.
core::Generator derive_generator(uint64_t seed, RandomStream stream, int64_t epoch, int64_t index);

/// Host-side draws from a Generator. Each scalar draw reserves one Philox offset on the generator
/// (as every random op does), so a saved generator state replays exactly.
class Rng {
 public:
  explicit Rng(core::Generator& generator) : generator_(generator) {}

  /// Uniform in [0, 1) with 53 random bits.
  double uniform();
  double uniform(double low, double high) { return low + (high - low) * uniform(); }
  /// Uniform integer in [low, high), without modulo bias; throws when the range is empty.
  int64_t integer(int64_t low, int64_t high);
  /// True with probability p (torch's `rand() < p`).
  bool bernoulli(double p) { return uniform() < p; }
  /// Standard normal (Box-Muller).
  double normal();
  /// Gamma(shape, 1) by Marsaglia and Tsang, boosted for shape < 1.
  double gamma(double shape);
  /// Beta(a, b) as X / (X + Y) with X ~ Gamma(a), Y ~ Gamma(b).
  double beta(double a, double b);
  /// A uniformly random permutation of 0..n-1 (Fisher-Yates; one offset for the whole draw).
  std::vector<int64_t> permutation(int64_t n);

  core::Generator& generator() { return generator_; }

 private:
  uint64_t bits64();
  core::Generator& generator_;
};

}  // namespace colossal::data
