// The averaging kernel of CopyEnginePair (copy_engine_pair.cpp): one rank's half of a bucket
// averaged with the other rank's copy of it, read and written over NVLink.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "colossal/core/dtype.h"

namespace colossal::parallel::cuda_detail {

/// For i < numel: v = round(round(mine[i] + peer[i]) / 2) in `dtype` (the sum rounded, then halved
/// exactly: NCCL's average of two), written to both mine[i] and peer[i]. `peer` is the other GPU's
/// memory, mapped here. Queued on `stream`.
void pair_average(void* mine, void* peer, int64_t numel, core::DType dtype, cudaStream_t stream);

}  // namespace colossal::parallel::cuda_detail
