// CUDA kernels of where, gather, scatter_add and the index check. where and gather run one thread
// per output element (16-byte accesses for where when everything is contiguous); scatter_add gives
// each column of the index (positions that differ only along dim) to one thread, which adds in
// order of k exactly as the CPU kernel does: no two columns share an output element, so there are
// no atomics and the result is deterministic and bitwise the CPU's.
#include <cuda_runtime.h>

#include <cstdint>

#include "colossal/core/cuda/launch.cuh"  // OffsetCalculator, grid_for, stream_of, check_on_device
#include "colossal/core/view.h"           // as_strided
#include "colossal/ops/indexing_kernels.h"

namespace colossal::ops {
namespace {

using core::acc_t;
using core::cuda_detail::check_on_device;
using core::cuda_detail::grid_for;
using core::cuda_detail::kThreads;
using core::cuda_detail::make_offset_calculator;
using core::cuda_detail::OffsetCalculator;
using core::cuda_detail::stream_of;

/// An unsigned integer of N bytes: where and gather move elements without looking at them.
template <size_t N>
using Bits = std::conditional_t<N == 1, uint8_t,
                                std::conditional_t<N == 2, uint16_t, std::conditional_t<N == 4, uint32_t, uint64_t>>>;

template <class F>
void dispatch_element_size(size_t size, F&& f) {
  switch (size) {
    case 1:
      return f.template operator()<Bits<1>>();
    case 2:
      return f.template operator()<Bits<2>>();
    case 4:
      return f.template operator()<Bits<4>>();
    case 8:
      return f.template operator()<Bits<8>>();
    default:
      break;
  }
  COLOSSAL_FAIL("indexing (CUDA): unsupported element size {}", size);
}

template <class P>
__device__ __forceinline__ P* at_byte(P* base, int64_t offset) {
  using Byte = std::conditional_t<std::is_const_v<P>, const char, char>;
  return reinterpret_cast<P*>(reinterpret_cast<Byte*>(base) + offset);
}

// ---- where

template <class T, int kVec>
__global__ void where_contiguous_kernel(int64_t n, T* out, const bool* condition, const T* a, const T* b) {
  using core::cuda_detail::Vec;
  const int64_t groups = n / kVec;
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < groups; i += int64_t{gridDim.x} * blockDim.x) {
    const Vec<bool, kVec> c = reinterpret_cast<const Vec<bool, kVec>*>(condition)[i];
    const Vec<T, kVec> av = reinterpret_cast<const Vec<T, kVec>*>(a)[i];
    const Vec<T, kVec> bv = reinterpret_cast<const Vec<T, kVec>*>(b)[i];
    Vec<T, kVec> o;
#pragma unroll
    for (int k = 0; k < kVec; ++k) o.v[k] = c.v[k] ? av.v[k] : bv.v[k];
    reinterpret_cast<Vec<T, kVec>*>(out)[i] = o;
  }
  for (int64_t i = groups * kVec + blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < n;
       i += int64_t{gridDim.x} * blockDim.x) {
    out[i] = condition[i] ? a[i] : b[i];
  }
}

template <class T>
__global__ void where_strided_kernel(int64_t n, OffsetCalculator<4> calc, char* out, const char* condition,
                                     const char* a, const char* b) {
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < n; i += int64_t{gridDim.x} * blockDim.x) {
    int64_t off[4];
    calc.get(i, off);
    const bool take_a = *at_byte(condition, off[1]);
    *at_byte(reinterpret_cast<T*>(out), off[0]) =
        take_a ? *at_byte(reinterpret_cast<const T*>(a), off[2]) : *at_byte(reinterpret_cast<const T*>(b), off[3]);
  }
}

void where_cuda(const Tensor& out, const Tensor& condition, const Tensor& a, const Tensor& b) {
  const Device device = out.device();
  check_on_device(condition, device, "where", "condition");
  check_on_device(a, device, "where", "a");
  check_on_device(b, device, "where", "b");
  const int64_t n = out.numel();
  if (n == 0) return;
  core::cuda::DeviceGuard guard(device);
  const cudaStream_t stream = stream_of(out);
  dispatch_element_size(out.element_size(), [&]<class T>() {
    constexpr int kVec = 16 / sizeof(T);
    const bool contiguous = out.is_contiguous() && condition.is_contiguous() && a.is_contiguous() &&
                            b.is_contiguous() && condition.shape() == out.shape() && a.shape() == out.shape() &&
                            b.shape() == out.shape();
    const uintptr_t misalignment = reinterpret_cast<uintptr_t>(out.raw_data()) |
                                   reinterpret_cast<uintptr_t>(a.raw_data()) |
                                   reinterpret_cast<uintptr_t>(b.raw_data());
    if (contiguous && misalignment % 16 == 0 && reinterpret_cast<uintptr_t>(condition.raw_data()) % kVec == 0) {
      where_contiguous_kernel<T, kVec><<<grid_for(n, kVec), kThreads, 0, stream>>>(
          n, static_cast<T*>(out.raw_data()), static_cast<const bool*>(condition.raw_data()),
          static_cast<const T*>(a.raw_data()), static_cast<const T*>(b.raw_data()));
    } else if (contiguous) {
      where_contiguous_kernel<T, 1><<<grid_for(n), kThreads, 0, stream>>>(
          n, static_cast<T*>(out.raw_data()), static_cast<const bool*>(condition.raw_data()),
          static_cast<const T*>(a.raw_data()), static_cast<const T*>(b.raw_data()));
    } else {
      const auto operands = core::make_strided_operands<4>(out.shape(), {&out, &condition, &a, &b});
      where_strided_kernel<T><<<grid_for(n), kThreads, 0, stream>>>(n, make_offset_calculator<4>(operands),
                                                                    operands.base[0], operands.base[1],
                                                                    operands.base[2], operands.base[3]);
    }
    COLOSSAL_CUDA_CHECK_LAUNCH();
  });
}

// ---- check_index

/// Sentinel of "no bad index": every byte 0x7f, what cudaMemsetAsync can write.
constexpr long long kNoBadIndex = 0x7f7f7f7f7f7f7f7fLL;

/// first_bad <- the smallest row-major position (over index's distinct elements) whose value lies
/// outside [0, size).
template <class Index>
__global__ void check_index_kernel(int64_t n, OffsetCalculator<1> calc, const char* index, int64_t size,
                                   long long* first_bad) {
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < n; i += int64_t{gridDim.x} * blockDim.x) {
    int64_t off[1];
    calc.get(i, off);
    const int64_t value = *at_byte(reinterpret_cast<const Index*>(index), off[0]);
    if ((value < 0 || value >= size) && i < *first_bad) atomicMin(first_bad, static_cast<long long>(i));
  }
}

void check_index_cuda(const char* op, const Tensor& index, int64_t dim, int64_t size) {
  if (index.numel() == 0) return;
  const Device device = index.device();
  core::cuda::DeviceGuard guard(device);
  const cudaStream_t stream = stream_of(index);
  // Only the distinct elements of a broadcast index: its stride-0 dims count once, at position 0
  // (as the CPU kernel visits them), so a row-major number over this shape is the CPU's order.
  Shape distinct_shape = index.shape();
  for (size_t d = 0; d < distinct_shape.size(); ++d) {
    if (index.strides()[d] == 0) distinct_shape[d] = 1;
  }
  const Tensor distinct = core::as_strided(index, distinct_shape, index.strides(), index.offset());
  const int64_t n = distinct.numel();
  const auto operands = core::make_strided_operands<1>(distinct_shape, {&distinct});
  Tensor first_bad = core::empty({1}, TensorOptions(DType::i64, device));
  COLOSSAL_CUDA_CHECK(cudaMemsetAsync(first_bad.raw_data(), 0x7f, sizeof(long long), stream));
  core::dispatch_index(index.dtype(), op, [&]<class Index>() {
    check_index_kernel<Index><<<grid_for(n), kThreads, 0, stream>>>(
        n, make_offset_calculator<1>(operands), operands.base[0], size, static_cast<long long*>(first_bad.raw_data()));
    COLOSSAL_CUDA_CHECK_LAUNCH();
  });
  // The contract is a host-visible answer (throw or not), so this waits for the stream: one copy of
  // eight bytes. A bad index costs a second copy, of the offending value.
  long long bad = kNoBadIndex;
  COLOSSAL_CUDA_CHECK(cudaMemcpyAsync(&bad, first_bad.raw_data(), sizeof bad, cudaMemcpyDeviceToHost, stream));
  COLOSSAL_CUDA_CHECK(cudaStreamSynchronize(stream));
  if (bad == kNoBadIndex) return;

  Shape position(distinct_shape.size(), 0);
  int64_t rest = bad, element = index.offset();
  for (int64_t d = static_cast<int64_t>(distinct_shape.size()) - 1; d >= 0; --d) {
    position[d] = rest % distinct_shape[d];
    rest /= distinct_shape[d];
    element += position[d] * index.strides()[d];
  }
  int64_t value = 0;
  core::dispatch_index(index.dtype(), op, [&]<class Index>() {
    Index v = 0;
    COLOSSAL_CUDA_CHECK(cudaMemcpyAsync(&v, static_cast<const Index*>(index.storage().data()) + element, sizeof v,
                                        cudaMemcpyDeviceToHost, stream));
    COLOSSAL_CUDA_CHECK(cudaStreamSynchronize(stream));
    value = static_cast<int64_t>(v);
  });
  COLOSSAL_FAIL("{}: index {} at position {} of index {} is out of range for dim {} of size {} (valid: 0..{})", op,
                value, position, index.shape(), dim, size, size - 1);
}

// ---- gather

/// out[i] <- a[a_offset(i) + index[index_offset(i)] * a_step], one thread per element of out.
template <class T, class Index>
__global__ void gather_kernel(int64_t n, OffsetCalculator<3> calc, char* out, const char* index, const char* a,
                              int64_t a_step) {
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < n; i += int64_t{gridDim.x} * blockDim.x) {
    int64_t off[3];
    calc.get(i, off);
    const int64_t k = *at_byte(reinterpret_cast<const Index*>(index), off[1]);
    *at_byte(reinterpret_cast<T*>(out), off[0]) = *at_byte(reinterpret_cast<const T*>(a), off[2] + k * a_step);
  }
}

void gather_cuda(const Tensor& out, const Tensor& a, int64_t dim, const Tensor& index) {
  const Device device = out.device();
  check_on_device(a, device, "gather", "input");
  check_on_device(index, device, "gather", "index");
  const int64_t n = out.numel();
  if (n == 0) return;
  core::cuda::DeviceGuard guard(device);
  // a seen with index's shape and a's strides, dim's stride zeroed: the offset of each element's
  // column start in a; the index value then moves along dim by a's own stride.
  Shape a_strides = a.strides();
  const int64_t a_step = a_strides[dim] * static_cast<int64_t>(a.element_size());
  a_strides[dim] = 0;
  const Tensor a_columns = core::as_strided(a, index.shape(), a_strides, a.offset());
  const auto operands = core::make_strided_operands<3>(index.shape(), {&out, &index, &a_columns});
  core::dispatch_index(index.dtype(), "gather", [&]<class Index>() {
    dispatch_element_size(a.element_size(), [&]<class T>() {
      gather_kernel<T, Index><<<grid_for(n), kThreads, 0, stream_of(out)>>>(
          n, make_offset_calculator<3>(operands), operands.base[0], operands.base[1], operands.base[2], a_step);
      COLOSSAL_CUDA_CHECK_LAUNCH();
    });
  });
}

// ---- scatter_add

template <class T>
__device__ __forceinline__ T add_as_acc(T target, T value) {
  using A = acc_t<T>;
  if constexpr (std::is_same_v<T, core::Half> || std::is_same_v<T, core::BFloat16>) {
    return T(static_cast<float>(target) + static_cast<float>(value));
  } else {
    return static_cast<T>(static_cast<A>(target) + static_cast<A>(value));
  }
}

/// One thread per column: out[column + index[k] * out_step] += src[column + k * src_step] for k in
/// order. Byte offsets throughout.
template <class T, class Index>
__global__ void scatter_add_kernel(int64_t columns, OffsetCalculator<3> calc, char* out, const char* index,
                                   const char* src, int64_t length, int64_t out_step, int64_t index_step,
                                   int64_t src_step) {
  for (int64_t c = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; c < columns; c += int64_t{gridDim.x} * blockDim.x) {
    int64_t off[3];
    calc.get(c, off);
    const char* idx = index + off[1];
    const char* from = src + off[2];
    char* dst = out + off[0];
    for (int64_t k = 0; k < length; ++k) {
      const int64_t target = *reinterpret_cast<const Index*>(idx + k * index_step);
      T& cell = *reinterpret_cast<T*>(dst + target * out_step);
      cell = add_as_acc(cell, *reinterpret_cast<const T*>(from + k * src_step));
    }
  }
}

void scatter_add_cuda(const Tensor& out, int64_t dim, const Tensor& index, const Tensor& src) {
  const Device device = out.device();
  check_on_device(index, device, "scatter_add", "index");
  check_on_device(src, device, "scatter_add", "src");
  const Shape& shape = index.shape();
  const int64_t length = shape[dim];
  if (index.numel() == 0) return;
  const int64_t columns = index.numel() / length;
  core::cuda::DeviceGuard guard(device);
  // The columns: every operand with dim's extent cut to 1 (the offsets of each column's start).
  Shape column_shape = shape;
  column_shape[dim] = 1;
  const Tensor out_columns = core::as_strided(out, column_shape, out.strides(), out.offset());
  const Tensor index_columns = core::as_strided(index, column_shape, index.strides(), index.offset());
  const Tensor src_columns = core::as_strided(src, column_shape, src.strides(), src.offset());
  const auto operands = core::make_strided_operands<3>(column_shape, {&out_columns, &index_columns, &src_columns});
  const int64_t out_step = out.strides()[dim] * static_cast<int64_t>(out.element_size());
  const int64_t index_step = index.strides()[dim] * static_cast<int64_t>(index.element_size());
  const int64_t src_step = src.strides()[dim] * static_cast<int64_t>(src.element_size());
  core::dispatch_index(index.dtype(), "scatter_add", [&]<class Index>() {
    core::dispatch_arithmetic(out.dtype(), "scatter_add", [&]<class T>() {
      scatter_add_kernel<T, Index><<<grid_for(columns), kThreads, 0, stream_of(out)>>>(
          columns, make_offset_calculator<3>(operands), operands.base[0], operands.base[1], operands.base[2], length,
          out_step, index_step, src_step);
      COLOSSAL_CUDA_CHECK_LAUNCH();
    });
  });
}

COLOSSAL_REGISTER_KERNEL(check_index_stub, core::DeviceType::cuda, check_index_cuda);
COLOSSAL_REGISTER_KERNEL(where_stub, core::DeviceType::cuda, where_cuda);
COLOSSAL_REGISTER_KERNEL(gather_stub, core::DeviceType::cuda, gather_cuda);
COLOSSAL_REGISTER_KERNEL(scatter_add_stub, core::DeviceType::cuda, scatter_add_cuda);

}  // namespace
}  // namespace colossal::ops
