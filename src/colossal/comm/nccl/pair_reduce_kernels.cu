// pair_reduce: see pair_reduce.h.
#include <algorithm>

#include "colossal/comm/nccl/pair_reduce.h"
#include "colossal/core/cuda/launch.cuh"  // Vec, store_as, cuda_check
#include "colossal/core/dtype.h"          // dispatch_floating, acc_t

namespace colossal::comm::cuda_detail {
namespace {

using core::acc_t;
using core::cuda_detail::store_as;
using core::cuda_detail::Vec;

/// The sum rounded to T, then (average) halved exactly: what accumulate_ followed by a scale by 0.5
/// gives.
template <class T>
__device__ __forceinline__ T reduce(T a, T b, bool average) {
  using A = acc_t<T>;
  const T sum = store_as<T>(static_cast<A>(a) + static_cast<A>(b));
  return average ? store_as<T>(static_cast<A>(sum) * A(0.5)) : sum;
}

/// Grid-stride over 16-byte vectors (the pointers are 16-byte aligned where vectorised), then the
/// elements left. `other` and `also` may alias, so neither is __restrict__.
template <class T>
__global__ void pair_reduce_kernel(T* __restrict__ mine, const T* other, T* also, int64_t numel, bool average,
                                   bool vectorised) {
  constexpr int kVec = 16 / sizeof(T);
  const int64_t stride = int64_t{gridDim.x} * blockDim.x;
  const int64_t first = int64_t{blockIdx.x} * blockDim.x + threadIdx.x;
  int64_t done = 0;
  if (vectorised) {
    const int64_t vectors = numel / kVec;
    for (int64_t v = first; v < vectors; v += stride) {
      const Vec<T, kVec> a = reinterpret_cast<const Vec<T, kVec>*>(mine)[v];
      const Vec<T, kVec> b = reinterpret_cast<const Vec<T, kVec>*>(other)[v];
      Vec<T, kVec> out;
#pragma unroll
      for (int j = 0; j < kVec; ++j) out.v[j] = reduce(a.v[j], b.v[j], average);
      reinterpret_cast<Vec<T, kVec>*>(mine)[v] = out;
      if (also != nullptr) reinterpret_cast<Vec<T, kVec>*>(also)[v] = out;
    }
    done = vectors * kVec;
  }
  for (int64_t i = done + first; i < numel; i += stride) {
    const T v = reduce(mine[i], other[i], average);
    mine[i] = v;
    if (also != nullptr) also[i] = v;
  }
}

__global__ void pair_copy_kernel(uint4* __restrict__ dst, const uint4* __restrict__ src, int64_t vectors) {
  const int64_t stride = int64_t{gridDim.x} * blockDim.x;
  for (int64_t v = int64_t{blockIdx.x} * blockDim.x + threadIdx.x; v < vectors; v += stride) dst[v] = src[v];
}

}  // namespace

void pair_copy(void* dst, const void* src, int64_t bytes, cudaStream_t stream, int max_blocks) {
  if (bytes == 0) return;
  COLOSSAL_CHECK(
      bytes % 16 == 0 && reinterpret_cast<uintptr_t>(dst) % 16 == 0 && reinterpret_cast<uintptr_t>(src) % 16 == 0,
      "pair_copy: {} bytes between {} and {}: needs 16-byte multiples", bytes, dst, src);
  constexpr int kThreads = 512;
  const int64_t vectors = bytes / 16;
  const unsigned blocks =
      static_cast<unsigned>(std::clamp<int64_t>((vectors + kThreads - 1) / kThreads, 1, std::max(max_blocks, 1)));
  pair_copy_kernel<<<blocks, kThreads, 0, stream>>>(static_cast<uint4*>(dst), static_cast<const uint4*>(src), vectors);
  COLOSSAL_CUDA_CHECK_LAUNCH();
}

void pair_reduce(void* mine, const void* other, void* also, int64_t numel, core::DType dtype, bool average,
                 cudaStream_t stream, int max_blocks) {
  if (numel == 0) return;
  core::dispatch_floating(dtype, "the pair reduction", [&]<class T>() {
    constexpr int kVec = 16 / sizeof(T);
    auto aligned = [](const void* p) { return p == nullptr || reinterpret_cast<uintptr_t>(p) % 16 == 0; };
    const bool vectorised = aligned(mine) && aligned(other) && aligned(also);
    constexpr int kThreads = 512;
    // A few blocks per SM at most: the loads may wait on NVLink, and the kernel should leave the SMs
    // to the kernels beside it.
    const int64_t work = vectorised ? numel / kVec + numel % kVec : numel;
    const unsigned blocks =
        static_cast<unsigned>(std::clamp<int64_t>((work + kThreads - 1) / kThreads, 1, std::max(max_blocks, 1)));
    pair_reduce_kernel<T><<<blocks, kThreads, 0, stream>>>(static_cast<T*>(mine), static_cast<const T*>(other),
                                                           static_cast<T*>(also), numel, average, vectorised);
    COLOSSAL_CUDA_CHECK_LAUNCH();
  });
}

}  // namespace colossal::comm::cuda_detail
