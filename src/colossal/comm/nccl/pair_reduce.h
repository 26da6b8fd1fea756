// The adding kernel of the copy-engine reductions of a GPU pair (pair_window.h): one rank's half of
// a buffer summed, or averaged, with the other rank's values of it.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "colossal/core/dtype.h"

namespace colossal::comm::cuda_detail {

/// For i < numel: v = round(mine[i] + other[i]) in `dtype`, halved exactly when `average` (NCCL's sum
/// and average of two), written to mine[i] and, where `also` is not null, to also[i]. `other` and
/// `also` may be the other GPU's memory, mapped here, and may be the same. Queued on `stream` with at
/// most `max_blocks` blocks of 512 threads: a few SMs, leaving the rest to the kernels beside it.
void pair_reduce(void* mine, const void* other, void* also, int64_t numel, core::DType dtype, bool average,
                 cudaStream_t stream, int max_blocks = 64);

/// Copies `bytes` (a multiple of 16, both pointers 16-byte aligned) from `src` to `dst` with at most
/// `max_blocks` blocks of 512 threads: the SMs' stores, for a destination in the other GPU's memory
/// (over NVLink) where they are faster than a copy engine. Queued on `stream`.
void pair_copy(void* dst, const void* src, int64_t bytes, cudaStream_t stream, int max_blocks = 64);

}  // namespace colossal::comm::cuda_detail
