// pair_average: see pair_average.h.
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <algorithm>

#include "colossal/core/cuda/cuda_check.h"
#include "colossal/core/error.h"
#include "colossal/parallel/dp/cuda/pair_average.h"

namespace colossal::parallel::cuda_detail {
namespace {

template <class T>
struct Convert;
template <>
struct Convert<float> {
  __device__ static float up(float v) { return v; }
  __device__ static float down(float v) { return v; }
};
template <>
struct Convert<double> {
  __device__ static double up(double v) { return v; }
  __device__ static double down(double v) { return v; }
};
template <>
struct Convert<__nv_bfloat16> {
  __device__ static float up(__nv_bfloat16 v) { return __bfloat162float(v); }
  __device__ static __nv_bfloat16 down(float v) { return __float2bfloat16_rn(v); }
};
template <>
struct Convert<__half> {
  __device__ static float up(__half v) { return __half2float(v); }
  __device__ static __half down(float v) { return __float2half_rn(v); }
};

template <class T>
__device__ __forceinline__ T average(T a, T b) {
  using C = Convert<T>;
  const T sum = C::down(C::up(a) + C::up(b));
  return C::down(C::up(sum) * decltype(C::up(a))(0.5));
}

/// Grid-stride over 16-byte vectors (the pointers are 16-byte aligned and numel a whole number of
/// vectors where vectorised), then the elements left.
template <class T>
__global__ void pair_average_kernel(T* __restrict__ mine, T* __restrict__ peer, int64_t numel, bool vectorised) {
  constexpr int kVec = 16 / sizeof(T);
  const int64_t stride = int64_t{gridDim.x} * blockDim.x;
  const int64_t first = int64_t{blockIdx.x} * blockDim.x + threadIdx.x;
  int64_t done = 0;
  if (vectorised) {
    const int64_t vectors = numel / kVec;
    for (int64_t v = first; v < vectors; v += stride) {
      union {
        uint4 raw;
        T x[kVec];
      } a, b, out;
      a.raw = reinterpret_cast<const uint4*>(mine)[v];
      b.raw = reinterpret_cast<const uint4*>(peer)[v];
#pragma unroll
      for (int j = 0; j < kVec; ++j) out.x[j] = average(a.x[j], b.x[j]);
      reinterpret_cast<uint4*>(mine)[v] = out.raw;
      reinterpret_cast<uint4*>(peer)[v] = out.raw;
    }
    done = vectors * kVec;
  }
  for (int64_t i = done + first; i < numel; i += stride) {
    const T v = average(mine[i], peer[i]);
    mine[i] = v;
    peer[i] = v;
  }
}

template <class T>
void launch(void* mine, void* peer, int64_t numel, cudaStream_t stream) {
  constexpr int kVec = 16 / sizeof(T);
  const bool vectorised = reinterpret_cast<uintptr_t>(mine) % 16 == 0 && reinterpret_cast<uintptr_t>(peer) % 16 == 0;
  constexpr int kThreads = 512;
  // A few blocks per SM at most: the loads wait on NVLink, and the kernel should leave the SMs to
  // backward's kernels beside it.
  const int64_t work = vectorised ? numel / kVec + numel % kVec : numel;
  const unsigned blocks = static_cast<unsigned>(std::clamp<int64_t>((work + kThreads - 1) / kThreads, 1, 64));
  pair_average_kernel<T><<<blocks, kThreads, 0, stream>>>(static_cast<T*>(mine), static_cast<T*>(peer), numel,
                                                          vectorised);
  COLOSSAL_CUDA_CHECK_LAUNCH();
}

}  // namespace

void pair_average(void* mine, void* peer, int64_t numel, core::DType dtype, cudaStream_t stream) {
  if (numel == 0) return;
  switch (dtype) {
    case core::DType::f32: return launch<float>(mine, peer, numel, stream);
    case core::DType::f64: return launch<double>(mine, peer, numel, stream);
    case core::DType::bf16: return launch<__nv_bfloat16>(mine, peer, numel, stream);
    case core::DType::f16: return launch<__half>(mine, peer, numel, stream);
    default: COLOSSAL_FAIL("CopyEnginePair: no average of {} gradients (f32, f64, bf16 or f16)", dtype);
  }
}

}  // namespace colossal::parallel::cuda_detail
