// CUDA kernels core needs itself: strided copy with dtype conversion, fill, gradient
// accumulation, host<->device copies, the Philox random fill (the same numbers as the CPU) and the
// stream hold of cuda::hold.
#include <cuda_runtime.h>

#include "colossal/core/cuda/launch.cuh"
#include "colossal/core/philox.h"
#include "colossal/core/random.h"
#include "colossal/core/view.h"

namespace colossal::core {
namespace {

using cuda_detail::launch_map;

template <class To, class From>
__host__ __device__ To convert_value(From v) {
  if constexpr (std::is_same_v<To, bool>) {
    // Compare in the source type: a double such as 1e-300 is nonzero but 0 as a float.
    if constexpr (std::is_same_v<From, Half> || std::is_same_v<From, BFloat16>) {
      return static_cast<float>(v) != 0.0f;
    } else {
      return v != From(0);
    }
  } else if constexpr (std::is_same_v<From, Half> || std::is_same_v<From, BFloat16>) {
    return static_cast<To>(static_cast<float>(v));
  } else if constexpr (std::is_same_v<To, Half> || std::is_same_v<To, BFloat16>) {
    return To(static_cast<float>(v));
  } else {
    return static_cast<To>(v);
  }
}

// Extended __device__ lambdas may not sit inside the generic dispatch lambdas, so each kernel body
// is a named function template that the dispatch calls.
template <class To, class From>
void copy_typed(const Tensor& dst, const Tensor& src) {
  // launch_map hands f the accumulation type of From; convert from there.
  launch_map<To, From, 1>(dst, {&src},
                          [] __device__(acc_t<From> v) { return convert_value<To>(static_cast<From>(v)); });
}

template <class T>
void fill_typed(const Tensor& dst, double value) {
  const T v = convert_value<T>(value);
  // The output doubles as the (ignored) input so the vectorised path applies.
  launch_map<T, T, 1>(dst, {&dst}, [v] __device__(acc_t<T>) { return v; });
}

template <class T>
void accumulate_typed(const Tensor& dst, const Tensor& src) {
  launch_map<T, T, 2>(dst, {&dst, &src}, [] __device__(acc_t<T> a, acc_t<T> b) { return static_cast<T>(a + b); });
}

void copy_cuda(const Tensor& dst, const Tensor& src) {
  COLOSSAL_CHECK(src.device() == dst.device(), "copy: source on {} and destination on {}", src.device(), dst.device());
  if (dst.dtype() == src.dtype() && dst.is_contiguous() && src.is_contiguous() && dst.shape() == src.shape()) {
    cuda::DeviceGuard guard(dst.device());
    COLOSSAL_CUDA_CHECK(cudaMemcpyAsync(dst.raw_data(), src.raw_data(), dst.nbytes(), cudaMemcpyDeviceToDevice,
                                        cuda_detail::stream_of(dst)));
    return;
  }
  dispatch_all(dst.dtype(),
               [&]<class To>() { dispatch_all(src.dtype(), [&]<class From>() { copy_typed<To, From>(dst, src); }); });
}

void fill_cuda(const Tensor& dst, double value) {
  dispatch_all(dst.dtype(), [&]<class T>() { fill_typed<T>(dst, value); });
}

void accumulate_cuda(const Tensor& dst, const Tensor& src) {
  dispatch_arithmetic(dst.dtype(), "accumulate", [&]<class T>() { accumulate_typed<T>(dst, src); });
}

// accumulate_many_: up to kManyPairs contiguous pairs of one dtype in one launch. Each block adds
// kManyPerBlock elements of one pair; a pair's blocks start at first_block[pair]. The sum is
// accumulate_typed's, element for element: a + b in the accumulation type, rounded once. The table is
// a __grid_constant__ parameter, so reading it at a runtime index reads the parameter space in place
// rather than copying it to each thread's local memory (docs/design.md's rule on kernel parameters).
constexpr int kManyPairs = 64;
constexpr int kManyPerBlock = 4 * cuda_detail::kThreads;

template <class T>
struct ManyPairs {
  T* dst[kManyPairs];
  const T* src[kManyPairs];
  int64_t numel[kManyPairs];
  int64_t first_block[kManyPairs + 1];
  int count;
};

template <class T>
__global__ void accumulate_many_kernel(const __grid_constant__ ManyPairs<T> pairs) {
  const int64_t block = blockIdx.x;
  int p = 0;
  while (p + 1 < pairs.count && pairs.first_block[p + 1] <= block) ++p;
  const int64_t begin = (block - pairs.first_block[p]) * kManyPerBlock;
  const int64_t end = begin + kManyPerBlock < pairs.numel[p] ? begin + kManyPerBlock : pairs.numel[p];
  T* dst = pairs.dst[p];
  const T* src = pairs.src[p];
  for (int64_t i = begin + threadIdx.x; i < end; i += blockDim.x) {
    dst[i] = static_cast<T>(static_cast<acc_t<T>>(dst[i]) + static_cast<acc_t<T>>(src[i]));
  }
}

void accumulate_many_cuda(const std::vector<Tensor>& dst, const std::vector<Tensor>& src) {
  if (dst.empty()) return;
  cuda::DeviceGuard guard(dst.front().device());
  cudaStream_t stream = cuda_detail::stream_of(dst.front());
  dispatch_arithmetic(dst.front().dtype(), "accumulate_many", [&]<class T>() {
    for (size_t at = 0; at < dst.size(); at += kManyPairs) {
      ManyPairs<T> pairs{};
      int64_t blocks = 0;
      for (size_t i = at; i < dst.size() && i < at + kManyPairs; ++i) {
        const int k = pairs.count++;
        pairs.dst[k] = dst[i].data<T>();
        pairs.src[k] = src[i].data<T>();
        pairs.numel[k] = dst[i].numel();
        pairs.first_block[k] = blocks;
        blocks += (dst[i].numel() + kManyPerBlock - 1) / kManyPerBlock;
      }
      pairs.first_block[pairs.count] = blocks;
      COLOSSAL_CHECK(blocks < (int64_t{1} << 31), "accumulate_many: {} blocks of {} elements exceed one launch's grid",
                     blocks, kManyPerBlock);
      accumulate_many_kernel<T><<<static_cast<unsigned>(blocks), cuda_detail::kThreads, 0, stream>>>(pairs);
      COLOSSAL_CUDA_CHECK_LAUNCH();
    }
  });
}

/// Contiguous same-dtype copy between the CPU and a GPU (or two GPUs). A copy to the host waits
/// for completion, since the host reads the result next; a copy from pageable host memory is
/// synchronous in CUDA anyway, and from pinned memory it stays asynchronous.
void cross_device_copy_cuda(const Tensor& dst, const Tensor& src) {
  const Device gpu = dst.device().is_cuda() ? dst.device() : src.device();
  cuda::DeviceGuard guard(gpu);
  cudaStream_t stream = static_cast<cudaStream_t>(cuda::current_stream(gpu).handle);
  if (dst.device().is_cuda() && src.device().is_cuda()) {
    COLOSSAL_CUDA_CHECK(cudaMemcpyPeerAsync(dst.raw_data(), dst.device().index, src.raw_data(), src.device().index,
                                            dst.nbytes(), stream));
    return;
  }
  const cudaMemcpyKind kind = dst.device().is_cuda() ? cudaMemcpyHostToDevice : cudaMemcpyDeviceToHost;
  COLOSSAL_CUDA_CHECK(cudaMemcpyAsync(dst.raw_data(), src.raw_data(), dst.nbytes(), kind, stream));
  if (kind == cudaMemcpyDeviceToHost) {
    COLOSSAL_CUDA_CHECK(cudaStreamSynchronize(stream));
    // A host read is where a deferred check of this stream's earlier ops surfaces (Note [Deferred
    // device checks] in core/cuda_device.h).
    cuda::resolve_deferred_checks(false);
  }
}

template <class T>
__global__ void random_fill_kernel(T* out, int64_t n, uint64_t seed, uint64_t offset, int kind, double a, double b) {
  constexpr bool kDouble = std::is_same_v<T, double>;
  const int64_t blocks = (n + 3) / 4;
  for (int64_t block = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; block < blocks;
       block += int64_t{gridDim.x} * blockDim.x) {
    const PhiloxBlock r = philox_block(seed, offset, static_cast<uint64_t>(block));
    const PhiloxBlock r2 = kDouble ? philox_block(seed, offset ^ (1ull << 63), static_cast<uint64_t>(block)) : r;
    double u[4];
#pragma unroll
    for (int w = 0; w < 4; ++w)
      u[w] = kDouble ? uniform_double(r.x[w], r2.x[w]) : static_cast<double>(uniform_float(r.x[w]));
    double v[4];
    if (kind == 0) {
#pragma unroll
      for (int w = 0; w < 4; ++w) v[w] = a + (b - a) * u[w];
    } else {
#pragma unroll
      for (int w = 0; w < 4; w += 2) {
        const double radius = sqrt(-2.0 * log(1.0 - u[w]));
        const double angle = 2.0 * 3.14159265358979323846 * u[w + 1];
        v[w] = a + b * radius * cos(angle);
        v[w + 1] = a + b * radius * sin(angle);
      }
    }
#pragma unroll
    for (int w = 0; w < 4; ++w) {
      const int64_t i = block * 4 + w;
      if (i < n) out[i] = kind == 0 ? store_uniform<T>(v[w], b) : static_cast<T>(static_cast<acc_t<T>>(v[w]));
    }
  }
}

void random_fill_cuda(const Tensor& t, uint64_t seed, uint64_t offset, int kind, double a, double b) {
  cuda::DeviceGuard guard(t.device());
  dispatch_floating(t.dtype(), "random", [&]<class T>() {
    const int64_t n = t.numel();
    random_fill_kernel<T><<<cuda_detail::grid_for((n + 3) / 4), cuda_detail::kThreads, 0, cuda_detail::stream_of(t)>>>(
        t.data<T>(), n, seed, offset, kind, a, b);
    COLOSSAL_CUDA_CHECK_LAUNCH();
  });
}

COLOSSAL_REGISTER_KERNEL(copy_stub, DeviceType::cuda, copy_cuda);
COLOSSAL_REGISTER_KERNEL(fill_stub, DeviceType::cuda, fill_cuda);
COLOSSAL_REGISTER_KERNEL(accumulate_stub, DeviceType::cuda, accumulate_cuda);
COLOSSAL_REGISTER_KERNEL(accumulate_many_stub, DeviceType::cuda, accumulate_many_cuda);
COLOSSAL_REGISTER_KERNEL(cross_device_copy_stub, DeviceType::cuda, cross_device_copy_cuda);
COLOSSAL_REGISTER_KERNEL(random_fill_stub, DeviceType::cuda, random_fill_cuda);

// One thread reads the device's nanosecond clock until `nanoseconds` have passed, sleeping between
// reads so that it takes no issue slots from kernels beside it.
__global__ void hold_kernel(uint64_t nanoseconds) {
  uint64_t start = 0, now = 0;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(start));
  do {
    __nanosleep(1000);
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(now));
  } while (now - start < nanoseconds);
}

}  // namespace

void cuda::hold(Stream stream, double milliseconds) {
  COLOSSAL_CHECK(stream.device.is_cuda() && milliseconds >= 0 && milliseconds <= 60e3,
                 "cuda::hold: needs a GPU stream and 0 to 60000 ms, got {} ms on {}", milliseconds, stream.device);
  cuda::DeviceGuard guard(stream.device);
  hold_kernel<<<1, 1, 0, static_cast<cudaStream_t>(stream.handle)>>>(static_cast<uint64_t>(milliseconds * 1e6));
  COLOSSAL_CUDA_CHECK_LAUNCH();
}

}  // namespace colossal::core
