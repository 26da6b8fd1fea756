// The averaging kernel of CopyEnginePair (copy_engine_pair.cpp): one rank's half of a bucket
// averaged with the other rank's values of it.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "colossal/core/dtype.h"

namespace colossal::parallel::cuda_detail {

/// For i < numel: v = round(round(mine[i] + other[i]) / 2) in `dtype` (the sum rounded, then halved
/// exactly: NCCL's average of two), written to mine[i] and, where `also` is not null, to also[i].
/// `other` and `also` may be the other GPU's memory, mapped here, and may be the same. Queued on
/// `stream`.
void pair_average(void* mine, const void* other, void* also, int64_t numel, core::DType dtype, cudaStream_t stream);

}  // namespace colossal::parallel::cuda_detail
