// The tensor-parallel RNG's seeds: see random.h.
#include "colossal/parallel/tp/random.h"

namespace colossal::parallel::tp {

uint64_t tensor_parallel_seed(uint64_t data_seed, const ParallelContext& context) {
  return static_cast<uint64_t>(
      context.seed(SeedMode::kTensor, static_cast<int64_t>(data_seed) + kTensorParallelSeedOffset));
}

}  // namespace colossal::parallel::tp
