// SyntheticPixelStage's CUDA kernel: each thread draws one Philox block (four pixels) of one image
// from the image's key, through the same synthetic_pixel_block the CPU uses.
#include <cuda_runtime.h>

#include <cstdint>

#include "colossal/core/cuda/cuda_check.h"
#include "colossal/core/cuda/launch.cuh"  // stream_of
#include "colossal/data/synthetic.h"

namespace colossal::data {
namespace {

constexpr int kThreads = 256;

/// Grid: x over the Philox blocks of an image, y over the images.
template <class T>
__global__ void __launch_bounds__(kThreads) synthetic_pixels_kernel(T* out, const int64_t* keys, int64_t n) {
  const int64_t block = static_cast<int64_t>(blockIdx.x) * kThreads + threadIdx.x;
  const int64_t i = block * 4;
  if (i >= n) return;
  const int64_t image = blockIdx.y;
  T values[4];
  synthetic_pixel_block<T>(static_cast<uint64_t>(keys[2 * image]), static_cast<uint64_t>(keys[2 * image + 1]),
                           static_cast<uint64_t>(block), values);
  T* o = out + image * n + i;
#pragma unroll
  for (int w = 0; w < 4; ++w) {
    if (i + w < n) o[w] = values[w];
  }
}

void synthetic_pixels_cuda(const Tensor& keys, const Tensor& out) {
  const int64_t batch = keys.size(0);
  const int64_t n = out.numel() / batch;
  COLOSSAL_CHECK(batch <= 65535, "synthetic_pixels: the CUDA kernel takes at most 65535 images a batch, got {}", batch);
  core::cuda::DeviceGuard guard(out.device());
  const dim3 grid(static_cast<unsigned>(((n + 3) / 4 + kThreads - 1) / kThreads), static_cast<unsigned>(batch));
  cudaStream_t stream = core::cuda_detail::stream_of(out);
  if (out.dtype() == DType::u8) {
    synthetic_pixels_kernel<uint8_t><<<grid, kThreads, 0, stream>>>(out.data<uint8_t>(), keys.data<int64_t>(), n);
  } else {
    synthetic_pixels_kernel<float><<<grid, kThreads, 0, stream>>>(out.data<float>(), keys.data<int64_t>(), n);
  }
  COLOSSAL_CUDA_CHECK_LAUNCH();
}
COLOSSAL_REGISTER_KERNEL(synthetic_pixels_stub, core::DeviceType::cuda, synthetic_pixels_cuda);

}  // namespace
}  // namespace colossal::data
