// CUDA dropout for f32, f64, f16 and bf16: out = keep(i) ? x * scale : 0 with the keep rule of
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
constexpr int kPerBlock = 4;

/// kVectorized: out and x are aligned to four elements, so each full group of four moves as one
/// 8-byte (16-bit types), 16-byte (f32) or 32-byte (f64) access.
template <class T, bool kVectorized>
__global__ void dropout_kernel(T* __restrict__ out, const T* __restrict__ x, int64_t n, DropoutParams params,
                               acc_t<T> scale) {
  using A = acc_t<T>;
  const int64_t groups = (n + kPerBlock - 1) / kPerBlock;
  for (int64_t group = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; group < groups;
       group += int64_t{gridDim.x} * blockDim.x) {
    const core::PhiloxBlock bits = core::philox_block(params.seed, params.offset, static_cast<uint64_t>(group));
    const int64_t first = group * kPerBlock;
    if (kVectorized && first + kPerBlock <= n) {
      const Vec<T, kPerBlock> in = cuda::rows::load_vec<kPerBlock>(x + first);
      Vec<T, kPerBlock> result;
#pragma unroll
      for (int w = 0; w < kPerBlock; ++w) {
        result.v[w] = from_acc<T>(dropout_keeps(bits.x[w], params.keep_threshold) ? to_acc(in.v[w]) * scale : A(0));
      }
      cuda::rows::store_vec<kPerBlock>(out + first, result);
    } else {
      const int count = static_cast<int>(min(int64_t{kPerBlock}, n - first));
      for (int w = 0; w < count; ++w) {
        out[first + w] =
            from_acc<T>(dropout_keeps(bits.x[w], params.keep_threshold) ? to_acc(x[first + w]) * scale : A(0));
      }
    }
  }
}

void dropout_cuda(const Tensor& out, const Tensor& x, const DropoutParams& params) {
  core::cuda_detail::check_on_device(out, x.device(), "dropout", "the output");
  const int64_t n = x.numel();
  if (n == 0) return;
  core::cuda::DeviceGuard guard(x.device());
  cudaStream_t stream = core::cuda_detail::stream_of(x);
  core::dispatch_floating(x.dtype(), "dropout", [&]<class T>() {
    using A = acc_t<T>;
    T* y = out.data<T>();
    const T* in = x.data<T>();
    const unsigned grid = core::cuda_detail::grid_for((n + kPerBlock - 1) / kPerBlock);
    const auto aligned = [](const void* p) { return reinterpret_cast<uintptr_t>(p) % (sizeof(T) * kPerBlock) == 0; };
    if (aligned(y) && aligned(in)) {
      dropout_kernel<T, true>
          <<<grid, core::cuda_detail::kThreads, 0, stream>>>(y, in, n, params, static_cast<A>(params.scale));
    } else {
      dropout_kernel<T, false>
          <<<grid, core::cuda_detail::kThreads, 0, stream>>>(y, in, n, params, static_cast<A>(params.scale));
    }
    COLOSSAL_CUDA_CHECK_LAUNCH();
  });
}

COLOSSAL_REGISTER_KERNEL(dropout_stub, core::DeviceType::cuda, dropout_cuda);

}  // namespace
}  // namespace colossal::ops
