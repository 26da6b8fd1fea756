// CUDA conv2d through cuDNN's convolution API (the legacy one: deprecated in cuDNN 9 but complete
// for NCHW and NHWC with groups, strides, padding and dilation). Forward, backward-data and backward-filter
// algorithms come from cuDNN's heuristics once per shape and are cached; workspaces come from the
// caching allocator. The bias add and the bias gradient are our kernels (per_channel.cuh).
#include <cuda_runtime.h>

#include <algorithm>
#include <array>
#include <climits>
#include <compare>
#include <map>
#include <mutex>
#include <optional>
#include <vector>

#include "colossal/core/cuda/launch.cuh"      // check_on_device, grid_for, stream_of
#include "colossal/ops/conv_kernels.h"        // conv2d stubs, Conv2dGeometry
#include "colossal/ops/cuda/cudnn_handle.h"   // CudnnHandle, COLOSSAL_CUDNN_CHECK
#include "colossal/ops/cuda/per_channel.cuh"  // bias add and bias gradient

// Note [conv2d math on the GPU]
// f32 convolutions run in strict FP32 (CUDNN_FMA_MATH): no TF32, so they agree with the CPU to f32
// rounding and f32 stays the dtype to reach for when precision matters; mixed-precision training
// gets tensor-core speed from bf16/f16, which run on tensor cores (CUDNN_TENSOR_OP_MATH) with f32
// accumulation (compute type f32). f64 computes in f64. Backward algorithms are deterministic
// whenever cuDNN offers one that fits (it always offers ALGO_1 for data and filter), so the same
// seed gives the same bits.

namespace colossal::ops {
namespace {

using core::acc_t;
using cuda::CudnnHandle;

/// Algorithms whose workspace exceeds this are passed over (FFT variants can ask for gigabytes).
constexpr size_t kMaxWorkspaceBytes = size_t{1} << 30;

cudnnDataType_t cudnn_dtype(DType dtype) {
  switch (dtype) {
    case DType::f32:
      return CUDNN_DATA_FLOAT;
    case DType::f64:
      return CUDNN_DATA_DOUBLE;
    case DType::f16:
      return CUDNN_DATA_HALF;
    case DType::bf16:
      return CUDNN_DATA_BFLOAT16;
    default:
      break;
  }
  COLOSSAL_FAIL("conv2d (CUDA): expected f32, f64, f16 or bf16, got {}", dtype);
}

int to_int(int64_t v, const char* what) {
  COLOSSAL_CHECK(v <= INT_MAX, "conv2d (CUDA): {} = {} exceeds cuDNN's 32-bit limit", what, v);
  return static_cast<int>(v);
}

/// cuDNN's alpha/beta: host f64 for f64 data, host f32 otherwise.
struct Blend {
  float f;
  double d;
  explicit Blend(double v) : f(static_cast<float>(v)), d(v) {}
  const void* for_dtype(DType dtype) const { return dtype == DType::f64 ? static_cast<const void*>(&d) : &f; }
};

/// The cuDNN descriptors of one convolution over `batch` images; `nhwc` describes x and y as
/// [N, H, W, C] and the filter as [O, kH, kW, C / groups] (cuDNN still takes the sizes in NCHW order).
class ConvDescriptors {
 public:
  ConvDescriptors(const Conv2dGeometry& g, int64_t batch, DType dtype, bool nhwc) {
    const cudnnDataType_t data = cudnn_dtype(dtype);
    const cudnnTensorFormat_t format = nhwc ? CUDNN_TENSOR_NHWC : CUDNN_TENSOR_NCHW;
    COLOSSAL_CUDNN_CHECK(cudnnCreateTensorDescriptor(&x));
    COLOSSAL_CUDNN_CHECK(cudnnCreateTensorDescriptor(&y));
    COLOSSAL_CUDNN_CHECK(cudnnCreateFilterDescriptor(&w));
    COLOSSAL_CUDNN_CHECK(cudnnCreateConvolutionDescriptor(&conv));
    COLOSSAL_CUDNN_CHECK(cudnnSetTensor4dDescriptor(x, format, data, to_int(batch, "batch"),
                                                    to_int(g.in_channels, "in_channels"), to_int(g.in_height, "height"),
                                                    to_int(g.in_width, "width")));
    COLOSSAL_CUDNN_CHECK(
        cudnnSetTensor4dDescriptor(y, format, data, to_int(batch, "batch"), to_int(g.out_channels, "out_channels"),
                                   to_int(g.out_height, "out_height"), to_int(g.out_width, "out_width")));
    COLOSSAL_CUDNN_CHECK(cudnnSetFilter4dDescriptor(w, data, format, to_int(g.out_channels, "out_channels"),
                                                    to_int(g.in_channels / g.groups, "in_channels / groups"),
                                                    to_int(g.kernel_height, "kernel_height"),
                                                    to_int(g.kernel_width, "kernel_width")));
    // f16/bf16 accumulate in f32; see Note [conv2d math on the GPU].
    const cudnnDataType_t compute = dtype == DType::f64 ? CUDNN_DATA_DOUBLE : CUDNN_DATA_FLOAT;
    COLOSSAL_CUDNN_CHECK(cudnnSetConvolution2dDescriptor(
        conv, to_int(g.pad_h, "pad_h"), to_int(g.pad_w, "pad_w"), to_int(g.stride_h, "stride_h"),
        to_int(g.stride_w, "stride_w"), to_int(g.dilation_h, "dilation_h"), to_int(g.dilation_w, "dilation_w"),
        CUDNN_CROSS_CORRELATION, compute));
    COLOSSAL_CUDNN_CHECK(cudnnSetConvolutionGroupCount(conv, to_int(g.groups, "groups")));
  }
  ~ConvDescriptors() {
    // Destruction cannot fail for valid descriptors; nothing useful to do with an error here.
    cudnnDestroyConvolutionDescriptor(conv);
    cudnnDestroyFilterDescriptor(w);
    cudnnDestroyTensorDescriptor(y);
    cudnnDestroyTensorDescriptor(x);
  }
  ConvDescriptors(const ConvDescriptors&) = delete;
  ConvDescriptors& operator=(const ConvDescriptors&) = delete;

  cudnnTensorDescriptor_t x = nullptr, y = nullptr;
  cudnnFilterDescriptor_t w = nullptr;
  cudnnConvolutionDescriptor_t conv = nullptr;
};

// ---- algorithm choice, cached per (pass, device, dtype, shape)

enum class ConvPass : int { forward, backward_data, backward_filter };

struct ConvKey {
  ConvPass pass;
  int device;
  DType dtype;
  std::array<int64_t, 16> sizes;
  auto operator<=>(const ConvKey&) const = default;
};

ConvKey conv_key(ConvPass pass, Device device, DType dtype, const Conv2dGeometry& g, int64_t batch, bool nhwc) {
  return {pass,
          device.index,
          dtype,
          {batch, g.in_channels, g.in_height, g.in_width, g.out_channels, g.kernel_height, g.kernel_width, g.stride_h,
           g.stride_w, g.pad_h, g.pad_w, g.dilation_h, g.dilation_w, g.groups, nhwc ? 1 : 0, 0}};
}

struct AlgorithmChoice {
  int algorithm;
  cudnnMathType_t math;
  size_t workspace_bytes;
};

class AlgorithmCache {
 public:
  std::optional<AlgorithmChoice> find(const ConvKey& key) {
    std::lock_guard lock(mutex_);
    const auto it = choices_.find(key);
    if (it == choices_.end()) return std::nullopt;
    return it->second;
  }
  void store(const ConvKey& key, const AlgorithmChoice& choice) {
    std::lock_guard lock(mutex_);
    choices_[key] = choice;
  }

 private:
  std::mutex mutex_;
  std::map<ConvKey, AlgorithmChoice> choices_;
};

AlgorithmCache& algorithm_cache() {
  static AlgorithmCache cache;
  return cache;
}

struct ForwardPass {
  using Perf = cudnnConvolutionFwdAlgoPerf_t;
  using Algorithm = cudnnConvolutionFwdAlgo_t;
  static constexpr ConvPass kPass = ConvPass::forward;
  static constexpr int kMaxAlgorithms = CUDNN_CONVOLUTION_FWD_ALGO_COUNT;
  static constexpr const char* kName = "forward";
  static cudnnStatus_t heuristics(cudnnHandle_t h, const ConvDescriptors& d, int* returned, Perf* perf) {
    return cudnnGetConvolutionForwardAlgorithm_v7(h, d.x, d.w, d.conv, d.y, kMaxAlgorithms, returned, perf);
  }
  static cudnnStatus_t workspace(cudnnHandle_t h, const ConvDescriptors& d, Algorithm a, size_t* bytes) {
    return cudnnGetConvolutionForwardWorkspaceSize(h, d.x, d.w, d.conv, d.y, a, bytes);
  }
  static bool transform_based(Algorithm a) {
    return a == CUDNN_CONVOLUTION_FWD_ALGO_FFT || a == CUDNN_CONVOLUTION_FWD_ALGO_FFT_TILING ||
           a == CUDNN_CONVOLUTION_FWD_ALGO_WINOGRAD || a == CUDNN_CONVOLUTION_FWD_ALGO_WINOGRAD_NONFUSED;
  }
};

struct BackwardDataPass {
  using Perf = cudnnConvolutionBwdDataAlgoPerf_t;
  using Algorithm = cudnnConvolutionBwdDataAlgo_t;
  static constexpr ConvPass kPass = ConvPass::backward_data;
  static constexpr int kMaxAlgorithms = CUDNN_CONVOLUTION_BWD_DATA_ALGO_COUNT;
  static constexpr const char* kName = "backward-data";
  static cudnnStatus_t heuristics(cudnnHandle_t h, const ConvDescriptors& d, int* returned, Perf* perf) {
    return cudnnGetConvolutionBackwardDataAlgorithm_v7(h, d.w, d.y, d.conv, d.x, kMaxAlgorithms, returned, perf);
  }
  static cudnnStatus_t workspace(cudnnHandle_t h, const ConvDescriptors& d, Algorithm a, size_t* bytes) {
    return cudnnGetConvolutionBackwardDataWorkspaceSize(h, d.w, d.y, d.conv, d.x, a, bytes);
  }
  static bool transform_based(Algorithm a) {
    return a == CUDNN_CONVOLUTION_BWD_DATA_ALGO_FFT || a == CUDNN_CONVOLUTION_BWD_DATA_ALGO_FFT_TILING ||
           a == CUDNN_CONVOLUTION_BWD_DATA_ALGO_WINOGRAD || a == CUDNN_CONVOLUTION_BWD_DATA_ALGO_WINOGRAD_NONFUSED;
  }
};

struct BackwardFilterPass {
  using Perf = cudnnConvolutionBwdFilterAlgoPerf_t;
  using Algorithm = cudnnConvolutionBwdFilterAlgo_t;
  static constexpr ConvPass kPass = ConvPass::backward_filter;
  static constexpr int kMaxAlgorithms = CUDNN_CONVOLUTION_BWD_FILTER_ALGO_COUNT;
  static constexpr const char* kName = "backward-filter";
  static cudnnStatus_t heuristics(cudnnHandle_t h, const ConvDescriptors& d, int* returned, Perf* perf) {
    return cudnnGetConvolutionBackwardFilterAlgorithm_v7(h, d.x, d.y, d.conv, d.w, kMaxAlgorithms, returned, perf);
  }
  static cudnnStatus_t workspace(cudnnHandle_t h, const ConvDescriptors& d, Algorithm a, size_t* bytes) {
    return cudnnGetConvolutionBackwardFilterWorkspaceSize(h, d.x, d.y, d.conv, d.w, a, bytes);
  }
  static bool transform_based(Algorithm a) {
    return a == CUDNN_CONVOLUTION_BWD_FILTER_ALGO_FFT || a == CUDNN_CONVOLUTION_BWD_FILTER_ALGO_FFT_TILING ||
           a == CUDNN_CONVOLUTION_BWD_FILTER_ALGO_WINOGRAD_NONFUSED;
  }
};

/// A workspace of `bytes` on device from the caching allocator (freed in stream order).
Tensor workspace(size_t bytes, Device device) {
  return core::empty({static_cast<int64_t>(bytes)}, TensorOptions(DType::u8, device));
}

/// Runs `run(algorithm, workspace, bytes)` (which returns cuDNN's status) for `images` images with
/// the cached choice for this pass and shape, or, the first time, with cuDNN's heuristic candidates
/// in order (deterministic ones first) until one is supported and its workspace can be had; that
/// one is cached.
template <class Pass, class Run>
void run_with_algorithm(cudnnHandle_t handle, const ConvDescriptors& d, const Conv2dGeometry& g, int64_t images,
                        bool nhwc, DType dtype, Device device, const Run& run) {
  using Algorithm = typename Pass::Algorithm;
  const ConvKey key = conv_key(Pass::kPass, device, dtype, g, images, nhwc);
  if (const std::optional<AlgorithmChoice> cached = algorithm_cache().find(key)) {
    COLOSSAL_CUDNN_CHECK(cudnnSetConvolutionMathType(d.conv, cached->math));
    const Tensor space = workspace(cached->workspace_bytes, device);
    COLOSSAL_CUDNN_CHECK(run(static_cast<Algorithm>(cached->algorithm), space.raw_data(), cached->workspace_bytes));
    return;
  }
  // The math type the heuristics see: strict FP32 for f32, tensor cores for f16/bf16.
  const cudnnMathType_t requested = key.dtype == DType::f32   ? CUDNN_FMA_MATH
                                    : key.dtype == DType::f64 ? CUDNN_DEFAULT_MATH
                                                              : CUDNN_TENSOR_OP_MATH;
  COLOSSAL_CUDNN_CHECK(cudnnSetConvolutionMathType(d.conv, requested));
  typename Pass::Perf perf[Pass::kMaxAlgorithms];
  int returned = 0;
  COLOSSAL_CUDNN_CHECK(Pass::heuristics(handle, d, &returned, perf));
  std::vector<typename Pass::Perf> candidates;
  for (int i = 0; i < returned; ++i) {
    if (perf[i].status == CUDNN_STATUS_SUCCESS) candidates.push_back(perf[i]);
  }
  std::stable_partition(candidates.begin(), candidates.end(),
                        [](const auto& p) { return p.determinism == CUDNN_DETERMINISTIC; });
  // f32 asks for f32 accuracy: FFT and Winograd transforms err by eps * log(n) * ||x|| ||w|| rather
  // than eps per product (2.6e-3 relative on a filter gradient on an H100), so in f32 the direct and
  // GEMM-based algorithms go first; the transforms remain a fallback.
  if (key.dtype == DType::f32 || key.dtype == DType::f64) {
    std::stable_partition(candidates.begin(), candidates.end(),
                          [](const auto& p) { return !Pass::transform_based(p.algo); });
  }
  for (const auto& candidate : candidates) {
    // f32 never runs TF32 kernels, whatever the heuristics suggest; see Note [conv2d math on the GPU].
    const cudnnMathType_t math = key.dtype == DType::f32 ? CUDNN_FMA_MATH : candidate.mathType;
    COLOSSAL_CUDNN_CHECK(cudnnSetConvolutionMathType(d.conv, math));
    size_t bytes = 0;
    if (Pass::workspace(handle, d, candidate.algo, &bytes) != CUDNN_STATUS_SUCCESS || bytes > kMaxWorkspaceBytes) {
      continue;
    }
    Tensor space;
    try {
      space = workspace(bytes, device);
    } catch (const Error&) {
      continue;  // out of memory: a candidate with a smaller workspace may still fit
    }
    const cudnnStatus_t status = run(candidate.algo, space.raw_data(), bytes);
    if (status == CUDNN_STATUS_SUCCESS) {
      algorithm_cache().store(key, {static_cast<int>(candidate.algo), math, bytes});
      return;
    }
    if (CUDNN_STATUS_CATEGORY(status) != CUDNN_STATUS_NOT_SUPPORTED) COLOSSAL_CUDNN_CHECK(status);
  }
  COLOSSAL_FAIL(
      "conv2d (CUDA): cuDNN offered no usable {} algorithm for batch {}, {} -> {} channels, {}x{} input, {}x{} "
      "kernel, stride {}x{}, padding {}x{}, dilation {}x{}, groups {} in {} {} ({} candidates tried)",
      Pass::kName, key.sizes[0], key.sizes[1], key.sizes[4], key.sizes[2], key.sizes[3], key.sizes[5], key.sizes[6],
      key.sizes[7], key.sizes[8], key.sizes[9], key.sizes[10], key.sizes[11], key.sizes[12], key.sizes[13],
      nhwc ? "nhwc" : "nchw", key.dtype, candidates.size());
}

/// Images per cuDNN call: the legacy API indexes tensors with 32 bits, so batches whose x or out
/// would pass INT_MAX elements are split (as PyTorch does).
int64_t images_per_call(const Conv2dGeometry& g) {
  const int64_t per_image =
      std::max(g.in_channels * g.in_height * g.in_width, g.out_channels * g.out_height * g.out_width);
  COLOSSAL_CHECK(per_image <= INT_MAX,
                 "conv2d (CUDA): one image needs {} elements (x or out), more than cuDNN's 32-bit limit", per_image);
  return std::max<int64_t>(1, std::min<int64_t>(g.batch, INT_MAX / std::max<int64_t>(per_image, 1)));
}

// ---- bias

template <class T>
struct AddBias {
  using A = acc_t<T>;
  T* out;
  const T* bias;

  template <int kVec>
  __device__ void apply(int64_t element, int64_t c) const {
    const A b = static_cast<A>(bias[c]);
    auto group = cuda::load_group<kVec>(out + element);
#pragma unroll
    for (int k = 0; k < kVec; ++k) group.v[k] = cuda::store_as<T>(static_cast<A>(group.v[k]) + b);
    cuda::store_group<kVec>(out + element, group);
  }
};

template <class T>
struct ChannelSums {
  using A = acc_t<T>;
  struct State {
    A sum;
  };
  template <int kVec>
  struct Loaded {
    A v[kVec];
  };
  const T* x;

  __device__ State identity(int64_t) const { return {A(0)}; }
  template <int kVec>
  __device__ Loaded<kVec> load(int64_t element, int64_t) const {
    const auto group = cuda::load_group<kVec>(x + element);
    Loaded<kVec> out;
#pragma unroll
    for (int k = 0; k < kVec; ++k) out.v[k] = static_cast<A>(group.v[k]);
    return out;
  }
  template <int kVec>
  __device__ void accumulate(State& state, const Loaded<kVec>& in) const {
#pragma unroll
    for (int k = 0; k < kVec; ++k) state.sum += in.v[k];
  }
  __device__ static State combine(const State& a, const State& b) {
    return {a.sum + b.sum};
  }
};

/// grad_bias[c] <- channel c's partial sums, added in order in f64 (as the CPU kernel sums).
template <class T>
__global__ void finish_bias_grad_kernel(const typename ChannelSums<T>::State* partials, int splits, int64_t channels,
                                        T* grad_bias) {
  for (int64_t c = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; c < channels; c += int64_t{gridDim.x} * blockDim.x) {
    double total = 0.0;
    for (int s = 0; s < splits; ++s) total += static_cast<double>(partials[c * splits + s].sum);
    grad_bias[c] = cuda::store_as<T>(static_cast<acc_t<T>>(total));
  }
}

template <class T>
void bias_grad_typed(const Tensor& grad_bias, const Tensor& grad_out, cudaStream_t stream) {
  using State = typename ChannelSums<T>::State;
  const cuda::ChannelShape shape = cuda::channel_shape(grad_out);
  const cuda::ChannelReduction plan = cuda::plan_channel_reduction<T>(shape, {grad_out.raw_data()});
  const Tensor partials = workspace(shape.channels * plan.splits * sizeof(State), grad_out.device());
  auto* partial_data = static_cast<State*>(partials.raw_data());
  cuda::launch_channel_partials<T>(ChannelSums<T>{grad_out.data<T>()}, plan, partial_data, stream);
  finish_bias_grad_kernel<T><<<core::cuda_detail::grid_for(shape.channels), core::cuda_detail::kThreads, 0, stream>>>(
      partial_data, plan.splits, shape.channels, grad_bias.data<T>());
  COLOSSAL_CUDA_CHECK_LAUNCH();
}

// ---- the kernels

void conv2d_forward_in(bool nhwc, const Tensor& out, const Tensor& x, const Tensor& weight, const Tensor& bias,
                       const Conv2dGeometry& g) {
  using core::cuda_detail::check_on_device;
  const Device device = x.device();
  check_on_device(out, device, "conv2d", "out");
  check_on_device(weight, device, "conv2d", "weight");
  if (bias.defined()) check_on_device(bias, device, "conv2d", "bias");
  const DType dtype = x.dtype();
  core::cuda::DeviceGuard guard(device);
  const cudaStream_t stream = core::cuda_detail::stream_of(x);
  {
    const CudnnHandle handle(device);
    const int64_t chunk = images_per_call(g);
    const Blend one(1.0), zero(0.0);
    const int64_t x_image = g.in_channels * g.in_height * g.in_width * static_cast<int64_t>(x.element_size());
    const int64_t out_image = g.out_channels * g.out_height * g.out_width * static_cast<int64_t>(x.element_size());
    for (int64_t n0 = 0; n0 < g.batch; n0 += chunk) {
      const int64_t images = std::min(chunk, g.batch - n0);
      const ConvDescriptors d(g, images, dtype, nhwc);
      const char* x_data = static_cast<const char*>(x.raw_data()) + n0 * x_image;
      char* out_data = static_cast<char*>(out.raw_data()) + n0 * out_image;
      run_with_algorithm<ForwardPass>(handle.get(), d, g, images, nhwc, dtype, device,
                                      [&](cudnnConvolutionFwdAlgo_t algorithm, void* space, size_t bytes) {
                                        return cudnnConvolutionForward(handle.get(), one.for_dtype(dtype), d.x, x_data,
                                                                       d.w, weight.raw_data(), d.conv, algorithm, space,
                                                                       bytes, zero.for_dtype(dtype), d.y, out_data);
                                      });
    }
  }
  if (!bias.defined()) return;
  COLOSSAL_CHECK(!nhwc, "conv2d (CUDA): the nhwc kernel adds no bias; ops::conv2d adds it");
  core::dispatch_floating(dtype, "conv2d bias", [&]<class T>() {
    cuda::launch_channel_map<T>(cuda::channel_shape(out), {out.raw_data()}, AddBias<T>{out.data<T>(), bias.data<T>()},
                                stream);
  });
}

void conv2d_backward_in(bool nhwc, const Tensor& grad_x, const Tensor& grad_weight, const Tensor& grad_bias,
                        const Tensor& grad_out, const Tensor& x, const Tensor& weight, const Conv2dGeometry& g) {
  const Device device = x.device();
  core::cuda_detail::check_defined_on_device(device, "conv2d_backward",
                                             {{&grad_x, "grad_x"},
                                              {&grad_weight, "grad_weight"},
                                              {&grad_bias, "grad_bias"},
                                              {&grad_out, "grad_out"},
                                              {&weight, "weight"}});
  const DType dtype = x.dtype();
  core::cuda::DeviceGuard guard(device);
  const cudaStream_t stream = core::cuda_detail::stream_of(x);
  if (grad_bias.defined()) {
    COLOSSAL_CHECK(!nhwc, "conv2d_backward (CUDA): the nhwc kernel computes no bias gradient");
    core::dispatch_floating(dtype, "conv2d bias gradient",
                            [&]<class T>() { bias_grad_typed<T>(grad_bias, grad_out, stream); });
  }
  if (!grad_x.defined() && !grad_weight.defined()) return;

  const CudnnHandle handle(device);
  const int64_t chunk = images_per_call(g);
  const Blend one(1.0), zero(0.0);
  const int64_t x_image = g.in_channels * g.in_height * g.in_width * static_cast<int64_t>(x.element_size());
  const int64_t out_image = g.out_channels * g.out_height * g.out_width * static_cast<int64_t>(x.element_size());
  for (int64_t n0 = 0; n0 < g.batch; n0 += chunk) {
    const int64_t images = std::min(chunk, g.batch - n0);
    const ConvDescriptors d(g, images, dtype, nhwc);
    const char* x_data = static_cast<const char*>(x.raw_data()) + n0 * x_image;
    const char* dy_data = static_cast<const char*>(grad_out.raw_data()) + n0 * out_image;
    if (grad_x.defined()) {
      char* dx_data = static_cast<char*>(grad_x.raw_data()) + n0 * x_image;
      run_with_algorithm<BackwardDataPass>(handle.get(), d, g, images, nhwc, dtype, device,
                                           [&](cudnnConvolutionBwdDataAlgo_t algorithm, void* space, size_t bytes) {
                                             return cudnnConvolutionBackwardData(handle.get(), one.for_dtype(dtype),
                                                                                 d.w, weight.raw_data(), d.y, dy_data,
                                                                                 d.conv, algorithm, space, bytes,
                                                                                 zero.for_dtype(dtype), d.x, dx_data);
                                           });
    }
    if (grad_weight.defined()) {
      // Later chunks add to the first chunk's filter gradient.
      const Blend& beta = n0 == 0 ? zero : one;
      run_with_algorithm<BackwardFilterPass>(handle.get(), d, g, images, nhwc, dtype, device,
                                             [&](cudnnConvolutionBwdFilterAlgo_t algorithm, void* space, size_t bytes) {
                                               return cudnnConvolutionBackwardFilter(
                                                   handle.get(), one.for_dtype(dtype), d.x, x_data, d.y, dy_data,
                                                   d.conv, algorithm, space, bytes, beta.for_dtype(dtype), d.w,
                                                   grad_weight.raw_data());
                                             });
    }
  }
}

void conv2d_forward_cuda(const Tensor& out, const Tensor& x, const Tensor& weight, const Tensor& bias,
                         const Conv2dGeometry& g) {
  conv2d_forward_in(false, out, x, weight, bias, g);
}
void conv2d_backward_cuda(const Tensor& grad_x, const Tensor& grad_weight, const Tensor& grad_bias,
                          const Tensor& grad_out, const Tensor& x, const Tensor& weight, const Conv2dGeometry& g) {
  conv2d_backward_in(false, grad_x, grad_weight, grad_bias, grad_out, x, weight, g);
}
void conv2d_nhwc_forward_cuda(const Tensor& out, const Tensor& x, const Tensor& weight, const Tensor& bias,
                              const Conv2dGeometry& g) {
  conv2d_forward_in(true, out, x, weight, bias, g);
}
void conv2d_nhwc_backward_cuda(const Tensor& grad_x, const Tensor& grad_weight, const Tensor& grad_bias,
                               const Tensor& grad_out, const Tensor& x, const Tensor& weight, const Conv2dGeometry& g) {
  conv2d_backward_in(true, grad_x, grad_weight, grad_bias, grad_out, x, weight, g);
}

COLOSSAL_REGISTER_KERNEL(conv2d_forward_stub, core::DeviceType::cuda, conv2d_forward_cuda);
COLOSSAL_REGISTER_KERNEL(conv2d_backward_stub, core::DeviceType::cuda, conv2d_backward_cuda);
COLOSSAL_REGISTER_KERNEL(conv2d_nhwc_forward_stub, core::DeviceType::cuda, conv2d_nhwc_forward_cuda);
COLOSSAL_REGISTER_KERNEL(conv2d_nhwc_backward_stub, core::DeviceType::cuda, conv2d_nhwc_backward_cuda);

}  // namespace
}  // namespace colossal::ops
