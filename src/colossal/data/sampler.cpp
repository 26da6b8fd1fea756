// Sequential, random and distributed samplers.
#include "colossal/data/sampler.h"

#include "colossal/core/error.h"
#include "colossal/data/random.h"

namespace colossal::data {
namespace {
void check_dataset_size(int64_t n, const char* sampler) {
  COLOSSAL_CHECK(n >= 0, "{}: dataset size must be non-negative, got {}", sampler, n);
}
}  // namespace

SequentialSampler::SequentialSampler(int64_t dataset_size) : dataset_size_(dataset_size) {
  check_dataset_size(dataset_size, "SequentialSampler");
}

std::vector<int64_t> SequentialSampler::indices() const {
  std::vector<int64_t> out(static_cast<size_t>(dataset_size_));
  for (int64_t i = 0; i < dataset_size_; ++i) out[static_cast<size_t>(i)] = i;
  return out;
}

std::vector<int64_t> shuffled_indices(int64_t n, uint64_t seed, int64_t epoch) {
  core::Generator generator = derive_generator(seed, RandomStream::shuffle, epoch, 0);
  Rng rng(generator);
  return rng.permutation(n);
}

RandomSampler::RandomSampler(int64_t dataset_size, uint64_t seed) : dataset_size_(dataset_size), seed_(seed) {
  check_dataset_size(dataset_size, "RandomSampler");
}

std::vector<int64_t> RandomSampler::indices() const {
  return shuffled_indices(dataset_size_, seed_, epoch_);
}

DistributedSampler::DistributedSampler(int64_t dataset_size, DistributedSamplerOptions options)
    : dataset_size_(dataset_size), options_(options) {
  check_dataset_size(dataset_size, "DistributedSampler");
  COLOSSAL_CHECK(options.world_size >= 1, "DistributedSampler: world_size must be at least 1, got {}",
                 options.world_size);
  COLOSSAL_CHECK(options.rank >= 0 && options.rank < options.world_size,
                 "DistributedSampler: rank {} is outside [0, {}) for world_size {}", options.rank, options.world_size,
                 options.world_size);
  const int64_t world = options.world_size;
  if (options.drop_last && dataset_size % world != 0) {
    // torch: math.ceil((len - world) / world), which for len % world != 0 is floor(len / world).
    num_samples_ = dataset_size / world;
  } else {
    num_samples_ = (dataset_size + world - 1) / world;
  }
}

std::vector<int64_t> DistributedSampler::indices() const {
  std::vector<int64_t> all;
  if (options_.shuffle) {
    all = shuffled_indices(dataset_size_, options_.seed, epoch_);
  } else {
    all.resize(static_cast<size_t>(dataset_size_));
    for (int64_t i = 0; i < dataset_size_; ++i) all[static_cast<size_t>(i)] = i;
  }
  const auto total = static_cast<size_t>(total_size());
  if (all.size() < total) {
    // Pad by cycling from the start (torch repeats the list as often as needed).
    const size_t original = all.size();
    for (size_t i = 0; all.size() < total; ++i) all.push_back(all[i % original]);
  } else {
    all.resize(total);
  }
  std::vector<int64_t> out;
  out.reserve(static_cast<size_t>(num_samples_));
  for (size_t i = static_cast<size_t>(options_.rank); i < total; i += static_cast<size_t>(options_.world_size)) {
    out.push_back(all[i]);
  }
  return out;
}

}  // namespace colossal::data
