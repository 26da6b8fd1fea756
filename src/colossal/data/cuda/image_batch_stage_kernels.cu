// ImageBatchStage's CUDA kernel: uint8 (or f32) images to f32, bilinear resize, normalisation and
// mixup in one pass over the output. Built with -fmad=false and summing the taps in the CPU
// kernel's order (horizontal taps per source row, then the rows), so it rounds as the CPU does.
#include <cuda_runtime.h>

#include <cstdint>

#include "colossal/core/cuda/cuda_check.h"
#include "colossal/core/cuda/launch.cuh"  // stream_of
#include "colossal/data/image_batch_stage.h"

namespace colossal::data {

const void* ImageStagePlan::packed(Device device) const {
  std::lock_guard lock(mutex_);
  if (auto it = packed_.find(device.index); it != packed_.end()) return it->second.get();
  const std::vector<uint32_t> words = packed_words();
  core::cuda::DeviceGuard guard(device);
  void* memory = nullptr;
  COLOSSAL_CUDA_CHECK(cudaMalloc(&memory, words.size() * sizeof(uint32_t)));
  std::shared_ptr<void> owner(memory, [](void* p) { (void)cudaFree(p); });
  COLOSSAL_CUDA_CHECK(cudaMemcpy(memory, words.data(), words.size() * sizeof(uint32_t), cudaMemcpyHostToDevice));
  // A pageable copy may still be in flight when cudaMemcpy returns, and the streams that read the
  // tables do not order after it: wait once, for the legacy stream the copy ran on only (a device-wide
  // wait would also wait for whatever NCCL kernel is spinning on a peer at that moment).
  COLOSSAL_CUDA_CHECK(cudaStreamSynchronize(cudaStreamLegacy));
  packed_.emplace(device.index, owner);
  return memory;
}

namespace {

constexpr int kThreadsX = 128;

/// The plan's arrays inside its packed device buffer (ImageStagePlan::packed's order).
struct PlanView {
  const int32_t *first_x, *count_x, *first_y, *count_y;
  const float *weights_x, *weights_y, *mean, *std;
  int taps_x, taps_y;
  bool normalize;
};

template <class In>
__device__ __forceinline__ float pixel(In v) {
  if constexpr (sizeof(In) == 1) {
    return static_cast<float>(v) / 255.0f;  // to_float_image's division
  } else {
    return v;
  }
}

/// Output (y, x) of channel plane `plane` (an [H, W] plane of one image): resize_bilinear's two
/// passes for that one pixel, then normalize's (v - mean) / std.
template <class In>
__device__ __forceinline__ float resized(const In* plane, int64_t w, int y, int x, int c, const PlanView& p) {
  const int fx = p.first_x[x], nx = p.count_x[x];
  const int fy = p.first_y[y], ny = p.count_y[y];
  const float* wx = p.weights_x + static_cast<int64_t>(x) * p.taps_x;
  const float* wy = p.weights_y + static_cast<int64_t>(y) * p.taps_y;
  float vertical = 0.0f;
  for (int ty = 0; ty < ny; ++ty) {
    const In* row = plane + static_cast<int64_t>(fy + ty) * w + fx;
    float horizontal = 0.0f;
    for (int tx = 0; tx < nx; ++tx) horizontal = horizontal + wx[tx] * pixel(row[tx]);
    vertical = vertical + wy[ty] * horizontal;
  }
  return p.normalize ? (vertical - p.mean[c]) / p.std[c] : vertical;
}

/// Grid: x over output columns, y over output rows, z over (image, channel).
template <class In>
__global__ void __launch_bounds__(kThreadsX)
    image_stage_kernel(float* out, const In* in, int64_t batch, int64_t channels, int64_t h, int64_t w, int64_t out_h,
                       int64_t out_w, PlanView plan, bool mix, float keep, float take) {
  const int x = static_cast<int>(blockIdx.x * kThreadsX + threadIdx.x);
  const int y = static_cast<int>(blockIdx.y);
  if (x >= out_w) return;
  const int64_t image = blockIdx.z / channels;
  const int c = static_cast<int>(blockIdx.z % channels);
  const int64_t plane = h * w;
  float v = resized(in + (image * channels + c) * plane, w, y, x, c, plan);
  if (mix) {
    // mix_with_previous_: lambda x_i + (1 - lambda) x_{i-1}, image 0 with image B-1.
    const int64_t previous = image == 0 ? batch - 1 : image - 1;
    const float u = resized(in + (previous * channels + c) * plane, w, y, x, c, plan);
    v = keep * v + take * u;
  }
  out[((image * channels + c) * out_h + y) * out_w + x] = v;
}

void image_stage_cuda(const Tensor& input, const Tensor& out, const ImageStagePlan& plan, bool mix, double lambda) {
  const int64_t batch = input.size(0), channels = input.size(1), h = input.size(2), w = input.size(3);
  const int64_t out_h = out.size(2), out_w = out.size(3);
  COLOSSAL_CHECK(out_h <= 65535 && batch * channels <= 65535,
                 "image_batch_stage: the CUDA kernel takes at most 65535 output rows and 65535 images x channels, got "
                 "output {} from input {}",
                 out.shape(), input.shape());
  core::cuda::DeviceGuard guard(input.device());
  const auto* words = static_cast<const int32_t*>(plan.packed(input.device()));
  PlanView view{};
  view.first_x = words;
  view.count_x = view.first_x + out_w;
  view.first_y = view.count_x + out_w;
  view.count_y = view.first_y + out_h;
  view.weights_x = reinterpret_cast<const float*>(view.count_y + out_h);
  view.weights_y = view.weights_x + out_w * plan.taps_x;
  view.mean = view.weights_y + out_h * plan.taps_y;
  view.std = view.mean + static_cast<int64_t>(plan.mean.size());
  view.taps_x = static_cast<int>(plan.taps_x);
  view.taps_y = static_cast<int>(plan.taps_y);
  view.normalize = !plan.mean.empty();
  // mix_with_previous_ rounds lambda and 1 - lambda to float on the host the same way.
  const auto keep = static_cast<float>(lambda), take = static_cast<float>(1.0 - lambda);
  const dim3 grid(static_cast<unsigned>((out_w + kThreadsX - 1) / kThreadsX), static_cast<unsigned>(out_h),
                  static_cast<unsigned>(batch * channels));
  cudaStream_t stream = core::cuda_detail::stream_of(out);
  if (input.dtype() == DType::u8) {
    image_stage_kernel<uint8_t><<<grid, kThreadsX, 0, stream>>>(out.data<float>(), input.data<uint8_t>(), batch,
                                                                channels, h, w, out_h, out_w, view, mix, keep, take);
  } else {
    image_stage_kernel<float><<<grid, kThreadsX, 0, stream>>>(out.data<float>(), input.data<float>(), batch, channels,
                                                              h, w, out_h, out_w, view, mix, keep, take);
  }
  COLOSSAL_CUDA_CHECK_LAUNCH();
}
COLOSSAL_REGISTER_KERNEL(image_stage_stub, core::DeviceType::cuda, image_stage_cuda);

}  // namespace
}  // namespace colossal::data
