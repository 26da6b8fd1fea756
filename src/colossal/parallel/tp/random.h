// Megatron-LM's RNG tracker, reduced to what dropout needs: a tensor-parallel model draws its masks
// from two generators. Dropout on activations every rank of the tensor group holds whole and equal
// (the embeddings' output, the residual branches after a row-parallel all-reduce) draws from the
// data generator, seeded alike on every rank, so the ranks keep equal activations and equal
// replicated parameters. Dropout on what each rank holds a part of (attention probabilities of its
// heads; under sequence parallelism its sequence shard) draws from the tensor-parallel generator,
// seeded per rank, so the parts of one logical tensor get independent masks rather than one mask
// repeated tp times (Megatron's get_cuda_rng_tracker().fork(), model_parallel_cuda_manual_seed).
#pragma once

#include <cstdint>

#include "colossal/core/random.h"  // Generator
#include "colossal/parallel/parallel_context.h"

namespace colossal::parallel::tp {

/// The generators a tensor-parallel layer's dropout draws from. Null tensor: the data generator
/// (a model without dropout, or a test that wants one stream); null data: the global default.
struct DropoutGenerators {
  core::Generator* data = nullptr;    ///< replicated activations: the same masks on every tp rank
  core::Generator* tensor = nullptr;  ///< activations split over the group: differs by tp rank
  core::Generator* tensor_or_data() const { return tensor != nullptr ? tensor : data; }
};

/// What Megatron adds to the seed for its tensor-parallel stream (model_parallel_cuda_manual_seed:
/// seed + 2718 + tp_rank), so that tp rank 0's stream is not the data stream.
inline constexpr int64_t kTensorParallelSeedOffset = 2718;

/// The tensor-parallel generator's seed on this rank for a run whose data generator has
/// `data_seed`: data_seed + 2718 + tp_rank + 1024 pp_rank (ParallelLayout::seed_for with
/// SeedMode::kTensor, Colossal-AI's rule for the rank part). Equal on the data-parallel replicas of
/// one tensor rank, so the replicas stay equal.
uint64_t tensor_parallel_seed(uint64_t data_seed, const ParallelContext& context);

}  // namespace colossal::parallel::tp
