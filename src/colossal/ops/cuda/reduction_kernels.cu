// CUDA reductions over [outer, reduce, inner]: a two-stage sum (fixed chunks of the reduced
// dimension, then the chunks in order), so results are deterministic, and one thread per output
// for max and its backward.
#include <cuda_runtime.h>

#include "colossal/core/cuda/launch.cuh"
#include "colossal/ops/reduction_kernels.h"

namespace colossal::ops {
namespace {

using core::acc_t;
using core::cuda_detail::kThreads;
using core::cuda_detail::store_as;
using core::cuda_detail::stream_of;

/// Sums accumulate in f32 for 16/32-bit floats, f64 for f64 and i64 for integers.
template <class T>
using gpu_sum_acc_t = std::conditional_t<std::is_floating_point_v<acc_t<T>>, acc_t<T>, int64_t>;

constexpr int kColumnThreadsX = 32;
constexpr int kColumnThreadsY = 8;

template <class T, class A>
__global__ void partial_sum_rows(const T* in, A* partial, int64_t reduce, int64_t chunk, int splits) {
  // One block per (row, chunk); the flat x index keeps any number of rows within grid limits.
  const int64_t o = blockIdx.x / splits;
  const int split = static_cast<int>(blockIdx.x % splits);
  const int64_t begin = split * chunk;
  const int64_t end = min(reduce, begin + chunk);
  A acc = A(0);
  for (int64_t r = begin + threadIdx.x; r < end; r += blockDim.x) acc += static_cast<A>(in[o * reduce + r]);
  __shared__ A shared[kThreads];
  shared[threadIdx.x] = acc;
  __syncthreads();
  for (int width = blockDim.x / 2; width > 0; width /= 2) {
    if (threadIdx.x < width) shared[threadIdx.x] += shared[threadIdx.x + width];
    __syncthreads();
  }
  if (threadIdx.x == 0) partial[o * splits + split] = shared[0];
}

/// The column totals of a block of kColumnThreadsX x kColumnThreadsY threads, each holding kVec
/// values for the block's columns x * kVec .. x * kVec + kVec - 1: thread t (t = y *
/// kColumnThreadsX + x) gets column t's sum over the row lanes, in lane order, for t <
/// kColumnThreadsX * kVec (with kVec 1: the threads of row lane 0, each its own column).
template <int kVec, class A>
__device__ __forceinline__ A sum_row_lanes(const A (&values)[kVec]) {
  static_assert(kVec <= kColumnThreadsY, "one column per thread at the end");
  __shared__ A shared[kColumnThreadsY][kColumnThreadsX * kVec];
#pragma unroll
  for (int j = 0; j < kVec; ++j) shared[threadIdx.y][threadIdx.x * kVec + j] = values[j];
  __syncthreads();
  const int t = threadIdx.y * kColumnThreadsX + threadIdx.x;
  A total = A(0);
  if (t < kColumnThreadsX * kVec) {
#pragma unroll
    for (int y = 0; y < kColumnThreadsY; ++y) total += shared[y][t];
  }
  return total;
}

template <class T, class A>
__global__ void partial_sum_columns(const T* in, A* partial, int64_t reduce, int64_t inner, int64_t chunk, int splits) {
  const int64_t i = blockIdx.x * int64_t{kColumnThreadsX} + threadIdx.x;
  const int split = blockIdx.y;
  const int64_t o = blockIdx.z;
  const int64_t begin = split * chunk;
  const int64_t end = min(reduce, begin + chunk);
  A acc = A(0);
  if (i < inner) {
    for (int64_t r = begin + threadIdx.y; r < end; r += kColumnThreadsY)
      acc += static_cast<A>(in[(o * reduce + r) * inner + i]);
  }
  const A values[1] = {acc};
  const A total = sum_row_lanes(values);
  if (threadIdx.y == 0 && i < inner) partial[(o * splits + split) * inner + i] = total;
}

/// Rows each thread of the vectorised column sums loads before adding any.
constexpr int kColumnUnroll = 4;

/// partial_sum_columns with 16-byte loads, for floating T when inner is a multiple of kVec and the
/// rows are 16-byte aligned: each thread owns kVec adjacent columns and walks every
/// kColumnThreadsY-th row of its split, kColumnUnroll rows in flight; then the block's 32 * kVec
/// columns are summed over its kColumnThreadsY row lanes, one column a thread. The scalar kernel
/// loads 2 bytes a thread a row for bf16, one load in flight: it read GPT-2's bias gradients
/// (16384 x 768 and x 3072) at ~65% of the copy bandwidth.
template <class T, class A, int kVec>
__global__ void __launch_bounds__(kColumnThreadsX* kColumnThreadsY)
    partial_sum_columns_vec(const T* in, A* partial, int64_t reduce, int64_t inner, int64_t chunk, int splits) {
  using core::cuda_detail::Vec;
  const int64_t vectors = inner / kVec;
  const int64_t v = blockIdx.x * int64_t{kColumnThreadsX} + threadIdx.x;
  const int split = blockIdx.y;
  const int64_t o = blockIdx.z;
  const int64_t begin = split * chunk;
  const int64_t end = min(reduce, begin + chunk);
  A acc[kVec];
#pragma unroll
  for (int j = 0; j < kVec; ++j) acc[j] = A(0);
  if (v < vectors) {
    const T* base = in + o * reduce * inner + v * kVec;
    auto load = [&](int64_t r) { return *reinterpret_cast<const Vec<T, kVec>*>(base + r * inner); };
    int64_t r = begin + threadIdx.y;
    for (; r + (kColumnUnroll - 1) * kColumnThreadsY < end; r += kColumnUnroll * kColumnThreadsY) {
      Vec<T, kVec> x[kColumnUnroll];
#pragma unroll
      for (int u = 0; u < kColumnUnroll; ++u) x[u] = load(r + u * kColumnThreadsY);
#pragma unroll
      for (int u = 0; u < kColumnUnroll; ++u) {
#pragma unroll
        for (int j = 0; j < kVec; ++j) acc[j] += static_cast<A>(x[u].v[j]);
      }
    }
    for (; r < end; r += kColumnThreadsY) {
      const Vec<T, kVec> x = load(r);
#pragma unroll
      for (int j = 0; j < kVec; ++j) acc[j] += static_cast<A>(x.v[j]);
    }
  }
  const A total = sum_row_lanes(acc);
  const int t = threadIdx.y * kColumnThreadsX + threadIdx.x;
  const int64_t column = blockIdx.x * int64_t{kColumnThreadsX} * kVec + t;
  if (t < kColumnThreadsX * kVec && column < inner) partial[(o * splits + split) * inner + column] = total;
}

/// The column sums' partials [outer, splits, inner] summed over splits: 32 neighbouring columns a
/// block (coalesced), its kColumnThreadsY row lanes taking every kColumnThreadsY-th split.
template <class A, class Out>
__global__ void __launch_bounds__(kColumnThreadsX* kColumnThreadsY)
    finish_sum_columns(const A* partial, Out* out, int64_t inner, int splits) {
  const int64_t i = blockIdx.x * int64_t{kColumnThreadsX} + threadIdx.x;
  const int64_t o = blockIdx.y;
  A total = A(0);
  if (i < inner) {
#pragma unroll 4
    for (int s = threadIdx.y; s < splits; s += kColumnThreadsY) total += partial[(o * splits + s) * inner + i];
  }
  const A values[1] = {total};
  const A sum = sum_row_lanes(values);
  if (threadIdx.y == 0 && i < inner) out[o * inner + i] = store_as<Out>(sum);
}

template <class A, class Out>
__global__ void finish_sum(const A* partial, Out* out, int64_t outer, int64_t inner, int splits) {
  for (int64_t job = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; job < outer * inner;
       job += int64_t{gridDim.x} * blockDim.x) {
    const int64_t o = job / inner, i = job % inner;
    A total = A(0);
    for (int s = 0; s < splits; ++s) total += partial[(o * splits + s) * inner + i];
    out[job] = store_as<Out>(total);
  }
}

template <class T>
void sum_typed(const Tensor& out, const Tensor& in, int64_t outer, int64_t reduce, int64_t inner) {
  using A = gpu_sum_acc_t<T>;
  using Out = std::conditional_t<std::is_floating_point_v<acc_t<T>>, T, int64_t>;
  cudaStream_t stream = stream_of(in);
  // Enough (output, chunk) pairs to fill the GPU; chunks of at least 1024 elements.
  const int64_t outputs = outer * inner;
  const int64_t target_threads = 132 * 2048;
  int64_t splits = std::clamp<int64_t>(target_threads / std::max<int64_t>(outputs, 1) / (inner == 1 ? kThreads : 1), 1,
                                       std::max<int64_t>(1, reduce / 1024));
  splits = std::min<int64_t>(splits, 65535);
  constexpr int kVec = 16 / sizeof(T);
  const bool vectorised = std::is_floating_point_v<A> && kVec > 1 && inner > 1 && inner % kVec == 0 &&
                          core::cuda_detail::aligned16(in.raw_data());
  const int64_t tiles = (inner / kVec + kColumnThreadsX - 1) / kColumnThreadsX;
  if (vectorised) {
    // About four blocks per SM, each row lane walking at least 16 rows.
    splits = std::clamp<int64_t>((4 * 132 + tiles * outer - 1) / (tiles * outer), 1,
                                 std::max<int64_t>(1, reduce / (16 * kColumnThreadsY)));
    splits = std::min<int64_t>(splits, 65535);
  }
  const int64_t chunk = (reduce + splits - 1) / splits;
  Tensor partial = core::empty({outer * splits * inner}, TensorOptions(core::dtype_of<A>(), in.device()));
  if (vectorised) {
    if constexpr (std::is_floating_point_v<A> && kVec > 1) {
      const dim3 grid(static_cast<unsigned>(tiles), static_cast<unsigned>(splits), static_cast<unsigned>(outer));
      partial_sum_columns_vec<T, A, kVec><<<grid, dim3(kColumnThreadsX, kColumnThreadsY), 0, stream>>>(
          in.data<T>(), partial.data<A>(), reduce, inner, chunk, static_cast<int>(splits));
    }
  } else if (inner == 1) {
    partial_sum_rows<T, A><<<static_cast<unsigned>(splits * outer), kThreads, 0, stream>>>(
        in.data<T>(), partial.data<A>(), reduce, chunk, static_cast<int>(splits));
  } else {
    const dim3 grid(static_cast<unsigned>((inner + kColumnThreadsX - 1) / kColumnThreadsX),
                    static_cast<unsigned>(splits), static_cast<unsigned>(outer));
    partial_sum_columns<T, A><<<grid, dim3(kColumnThreadsX, kColumnThreadsY), 0, stream>>>(
        in.data<T>(), partial.data<A>(), reduce, inner, chunk, static_cast<int>(splits));
  }
  COLOSSAL_CUDA_CHECK_LAUNCH();
  if (vectorised) {
    const dim3 grid(static_cast<unsigned>((inner + kColumnThreadsX - 1) / kColumnThreadsX),
                    static_cast<unsigned>(outer));
    finish_sum_columns<A, Out><<<grid, dim3(kColumnThreadsX, kColumnThreadsY), 0, stream>>>(
        partial.data<A>(), static_cast<Out*>(out.raw_data()), inner, static_cast<int>(splits));
  } else {
    finish_sum<A, Out><<<core::cuda_detail::grid_for(outputs), kThreads, 0, stream>>>(
        partial.data<A>(), static_cast<Out*>(out.raw_data()), outer, inner, static_cast<int>(splits));
  }
  COLOSSAL_CUDA_CHECK_LAUNCH();
}

void sum_cuda(const Tensor& out, const Tensor& in, int64_t outer, int64_t reduce, int64_t inner) {
  COLOSSAL_CHECK(inner == 1 || outer <= 65535,
                 "sum: {} outer slices exceed the CUDA grid limit of 65535 (shape [{}, {}, {}])", outer, outer, reduce,
                 inner);
  core::cuda::DeviceGuard guard(in.device());
  core::dispatch_all(in.dtype(), [&]<class T>() { sum_typed<T>(out, in, outer, reduce, inner); });
}

template <class T>
__global__ void max_kernel(const T* in, T* values, int64_t* indices, int64_t outer, int64_t reduce, int64_t inner) {
  using A = acc_t<T>;
  for (int64_t job = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; job < outer * inner;
       job += int64_t{gridDim.x} * blockDim.x) {
    const int64_t o = job / inner, i = job % inner;
    const T* base = in + o * reduce * inner + i;
    A best = static_cast<A>(base[0]);
    int64_t best_at = 0;
    for (int64_t r = 1; r < reduce; ++r) {
      const A v = static_cast<A>(base[r * inner]);
      if (best != best) break;  // NaN wins and stays
      if (v != v || v > best) {
        best = v;
        best_at = r;
      }
    }
    values[job] = base[best_at * inner];
    indices[job] = best_at;
  }
}

void max_cuda(const Tensor& values, const Tensor& indices, const Tensor& in, int64_t outer, int64_t reduce,
              int64_t inner) {
  core::cuda::DeviceGuard guard(in.device());
  core::dispatch_arithmetic(in.dtype(), "max", [&]<class T>() {
    max_kernel<T><<<core::cuda_detail::grid_for(outer * inner), kThreads, 0, stream_of(in)>>>(
        in.data<T>(), values.data<T>(), indices.data<int64_t>(), outer, reduce, inner);
    COLOSSAL_CUDA_CHECK_LAUNCH();
  });
}

template <class T>
__global__ void max_backward_kernel(T* grad_in, const T* grad, const int64_t* indices, int64_t outer, int64_t reduce,
                                    int64_t inner) {
  for (int64_t job = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; job < outer * inner;
       job += int64_t{gridDim.x} * blockDim.x) {
    const int64_t o = job / inner, i = job % inner;
    grad_in[(o * reduce + indices[job]) * inner + i] = grad[job];
  }
}

void max_backward_cuda(const Tensor& grad_in, const Tensor& grad, const Tensor& indices, int64_t outer, int64_t reduce,
                       int64_t inner) {
  core::cuda::DeviceGuard guard(grad.device());
  core::dispatch_floating(grad.dtype(), "max backward", [&]<class T>() {
    max_backward_kernel<T><<<core::cuda_detail::grid_for(outer * inner), kThreads, 0, stream_of(grad)>>>(
        grad_in.data<T>(), grad.data<T>(), indices.data<int64_t>(), outer, reduce, inner);
    COLOSSAL_CUDA_CHECK_LAUNCH();
  });
}

COLOSSAL_REGISTER_KERNEL(sum_stub, core::DeviceType::cuda, sum_cuda);
COLOSSAL_REGISTER_KERNEL(max_stub, core::DeviceType::cuda, max_cuda);
COLOSSAL_REGISTER_KERNEL(max_backward_stub, core::DeviceType::cuda, max_backward_cuda);

}  // namespace
}  // namespace colossal::ops
