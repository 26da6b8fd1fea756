// CUDA dropout for f32, f64, f16 and bf16: out = [residual +] (keep(i) ? x * scale : 0) with the keep rule of
// Note [Dropout mask] (ops/dropout.cpp): each thread draws one Philox block and handles the four
// consecutive elements it decides, moving them as one vector. The same integer threshold and the
// same f32 (f64) product as the CPU kernel make the output equal to the CPU's bit for bit.
#include <cuda_runtime.h>

#include "colossal/ops/cuda/row_team.cuh"
#include "colossal/ops/loss_kernels.h"

namespace colossal::ops {
namespace {

using core::acc_t;
using cuda::rows::from_acc;
using cuda::rows::to_acc;
using cuda::rows::Vec;

/// Elements decided by one Philox block.
constexpr int kPerBlock = 4;  // elements decided by one Philox call

/// Philox blocks per thread and step: enough that a thread moves 16 bytes (two blocks for bf16/f16,
/// one for f32), so each load is a full vector and is issued before the Philox rounds it waits for.
template <class T>
constexpr int kBlocksPerThread = sizeof(T) >= 4 ? 1 : 16 / (sizeof(T) * kPerBlock);

/// out = [residual +] (keep ? x * scale : 0); kAdd: residual is read (the fused dropout_add).
template <class T, bool kVectorized, bool kAdd>
__global__ void dropout_kernel(T* __restrict__ out, const T* __restrict__ x, const T* __restrict__ residual, int64_t n,
                               DropoutParams params, acc_t<T> scale) {
  using A = acc_t<T>;
  constexpr int kBlocks = kVectorized ? kBlocksPerThread<T> : 1;
  constexpr int kElems = kBlocks * kPerBlock;
  const int64_t steps = (n + kElems - 1) / kElems;
  for (int64_t step = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; step < steps;
       step += int64_t{gridDim.x} * blockDim.x) {
    const int64_t first = step * kElems;
    if (kVectorized && first + kElems <= n) {
      const Vec<T, kElems> in = cuda::rows::load_vec<kElems>(x + first);
      Vec<T, kElems> add;
      if constexpr (kAdd) add = cuda::rows::load_vec<kElems>(residual + first);
      Vec<T, kElems> result;
#pragma unroll
      for (int b = 0; b < kBlocks; ++b) {
        const core::PhiloxBlock bits =
            core::philox_block(params.seed, params.offset, static_cast<uint64_t>(step * kBlocks + b));
#pragma unroll
        for (int w = 0; w < kPerBlock; ++w) {
          const int e = b * kPerBlock + w;
          const A kept = dropout_keeps(bits.x[w], params.keep_threshold) ? to_acc(in.v[e]) * scale : A(0);
          if constexpr (kAdd) {
            result.v[e] = from_acc<T>(to_acc(add.v[e]) + kept);
          } else {
            result.v[e] = from_acc<T>(kept);
          }
        }
      }
      cuda::rows::store_vec<kElems>(out + first, result);
    } else {
      const int64_t last = min(first + kElems, n);
      for (int64_t i = first; i < last; i += kPerBlock) {
        const core::PhiloxBlock bits =
            core::philox_block(params.seed, params.offset, static_cast<uint64_t>(i / kPerBlock));
        const int count = static_cast<int>(min(int64_t{kPerBlock}, last - i));
        for (int w = 0; w < count; ++w) {
          const A kept = dropout_keeps(bits.x[w], params.keep_threshold) ? to_acc(x[i + w]) * scale : A(0);
          out[i + w] = from_acc<T>(kAdd ? to_acc(residual[i + w]) + kept : kept);
        }
      }
    }
  }
}

void dropout_cuda(const Tensor& out, const Tensor& x, const Tensor& residual, const DropoutParams& params) {
  core::cuda_detail::check_on_device(out, x.device(), "dropout", "the output");
  if (residual.defined()) core::cuda_detail::check_on_device(residual, x.device(), "dropout_add", "the residual");
  const int64_t n = x.numel();
  if (n == 0) return;
  core::cuda::DeviceGuard guard(x.device());
  cudaStream_t stream = core::cuda_detail::stream_of(x);
  core::dispatch_floating(x.dtype(), "dropout", [&]<class T>() {
    using A = acc_t<T>;
    T* y = out.data<T>();
    const T* in = x.data<T>();
    const T* add = residual.defined() ? residual.data<T>() : nullptr;
    constexpr int kElems = kBlocksPerThread<T> * kPerBlock;
    const auto aligned = [](const void* p) { return reinterpret_cast<uintptr_t>(p) % (sizeof(T) * kElems) == 0; };
    const bool vectorized = aligned(y) && aligned(in) && (add == nullptr || aligned(add));
    const unsigned grid = core::cuda_detail::grid_for((n + kElems - 1) / kElems);
    const A scale = static_cast<A>(params.scale);
    auto launch = [&]<bool kVectorized, bool kAdd>() {
      dropout_kernel<T, kVectorized, kAdd>
          <<<grid, core::cuda_detail::kThreads, 0, stream>>>(y, in, add, n, params, scale);
    };
    // Vector loads where every pointer allows them, else element loads (one Philox block per step).
    if (vectorized) {
      add ? launch.template operator()<true, true>() : launch.template operator()<true, false>();
    } else {
      add ? launch.template operator()<false, true>() : launch.template operator()<false, false>();
    }
    COLOSSAL_CUDA_CHECK_LAUNCH();
  });
}

COLOSSAL_REGISTER_KERNEL(dropout_stub, core::DeviceType::cuda, dropout_cuda);

}  // namespace
}  // namespace colossal::ops
