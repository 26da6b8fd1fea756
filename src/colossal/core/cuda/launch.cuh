// Launch helpers every CUDA elementwise kernel uses. launch_map runs f over the elements of
// same-shaped operands: 16-byte vector loads and stores when all operands are contiguous and
// aligned, and an offset calculator over (merged) dims otherwise. f receives the inputs
// converted to their accumulation type and returns the output value.
#pragma once

#include <cuda_runtime.h>

#include <algorithm>
#include <array>
#include <cstdint>
#include <initializer_list>
#include <type_traits>
#include <utility>

#include "colossal/core/cuda/cuda_check.h"
#include "colossal/core/cuda_device.h"
#include "colossal/core/strided_loop.h"

namespace colossal::core::cuda_detail {

constexpr int kMaxDims = 10;
constexpr int kThreads = 256;

inline cudaStream_t stream_of(const Tensor& t) {
  return static_cast<cudaStream_t>(cuda::current_stream(t.device()).handle);
}

/// Grid size for n work items of `per_thread` elements: enough blocks to fill the GPU several
/// times over, capped so that grid-stride loops do the rest.
inline unsigned grid_for(int64_t n, int per_thread = 1) {
  const int64_t blocks = (n + int64_t{kThreads} * per_thread - 1) / (int64_t{kThreads} * per_thread);
  return static_cast<unsigned>(std::clamp<int64_t>(blocks, 1, 65535LL * 16));
}

/// The mixed-radix digits of `rest` over sizes[0..dims) (the last dimension varies fastest), visited
/// innermost first as visit(d, digit). The loop runs over the compile-time bound kMax with `dims` as
/// a guard, so `sizes` may be a kernel parameter's array: indexing one with a runtime index makes
/// every thread copy the parameter into local memory (seen: 7x the bytes a row-statistics kernel
/// needed). Index is the type the division runs in: uint32_t where the value fits, several times
/// cheaper than 64-bit on the GPU; a size beyond its range (then larger than the value) takes what
/// is left.
template <int kMax, class Index, class Visit>
__host__ __device__ __forceinline__ void for_each_digit(Index rest, int dims, const int64_t (&sizes)[kMax],
                                                        Visit&& visit) {
#pragma unroll
  for (int j = 0; j < kMax; ++j) {
    const int d = kMax - 1 - j;
    if (d >= dims) continue;
    if constexpr (sizeof(Index) < sizeof(int64_t)) {
      if (sizes[d] > static_cast<int64_t>(static_cast<Index>(-1))) {
        visit(d, static_cast<int64_t>(rest));
        rest = 0;
        continue;
      }
    }
    const auto size = static_cast<Index>(sizes[d]);
    const Index quotient = rest / size;
    visit(d, static_cast<int64_t>(rest - quotient * size));
    rest = quotient;
  }
}

/// for_each_digit of a non-negative `value`, in 32-bit arithmetic when it fits.
template <int kMax, class Visit>
__host__ __device__ __forceinline__ void for_each_digit(int64_t value, int dims, const int64_t (&sizes)[kMax],
                                                        Visit&& visit) {
  if (value <= UINT32_MAX) {
    for_each_digit<kMax>(static_cast<uint32_t>(value), dims, sizes, visit);
  } else {
    for_each_digit<kMax>(static_cast<uint64_t>(value), dims, sizes, visit);
  }
}

/// Byte offsets of element `linear` for N operands over merged dims.
template <int N>
struct OffsetCalculator {
  int dims = 0;
  int64_t sizes[kMaxDims];
  int64_t strides[N][kMaxDims];

  // for_each_digit keeps every index into sizes and strides a compile-time constant.
  __host__ __device__ void get(int64_t linear, int64_t (&offsets)[N]) const {
#pragma unroll
    for (int k = 0; k < N; ++k) offsets[k] = 0;
    for_each_digit(linear, dims, sizes, [&](int d, int64_t index) {
#pragma unroll
      for (int k = 0; k < N; ++k) offsets[k] += index * strides[k][d];
    });
  }
};

template <int N>
OffsetCalculator<N> make_offset_calculator(const StridedOperands<N>& ops) {
  OffsetCalculator<N> calc;
  calc.dims = static_cast<int>(ops.shape.size());
  COLOSSAL_CHECK(calc.dims <= kMaxDims, "CUDA kernels support up to {} non-mergeable dimensions, got {} (shape {})",
                 kMaxDims, calc.dims, ops.shape);
  for (int d = 0; d < calc.dims; ++d) {
    calc.sizes[d] = ops.shape[d];
    for (int k = 0; k < N; ++k) calc.strides[k][d] = ops.strides[k][d];
  }
  return calc;
}

template <class T>
struct AccOf {
  using type = acc_t<T>;
};

template <class T, int kVec>
struct alignas(sizeof(T) * kVec) Vec {
  T v[kVec];
};

/// A value of the accumulation type stored as T, rounding to nearest even (f16/bf16 through float).
template <class T, class A>
__device__ __forceinline__ T store_as(A v) {
  if constexpr (std::is_same_v<T, Half> || std::is_same_v<T, BFloat16>) {
    return T(static_cast<float>(v));
  } else {
    return static_cast<T>(v);
  }
}

// ---- contiguous, vectorised
template <int kVec, class Out, class In, class F>
__global__ void map_unary_vec(int64_t n, Out* __restrict__ out, const In* __restrict__ x, F f) {
  const int64_t n_vec = n / kVec;
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < n_vec; i += int64_t{gridDim.x} * blockDim.x) {
    const Vec<In, kVec> xv = reinterpret_cast<const Vec<In, kVec>*>(x)[i];
    Vec<Out, kVec> ov;
#pragma unroll
    for (int j = 0; j < kVec; ++j) ov.v[j] = static_cast<Out>(f(static_cast<acc_t<In>>(xv.v[j])));
    reinterpret_cast<Vec<Out, kVec>*>(out)[i] = ov;
  }
  // The tail that does not fill a vector.
  for (int64_t i = n_vec * kVec + blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < n;
       i += int64_t{gridDim.x} * blockDim.x) {
    out[i] = static_cast<Out>(f(static_cast<acc_t<In>>(x[i])));
  }
}

template <int kVec, class Out, class In, class F>
__global__ void map_binary_vec(int64_t n, Out* __restrict__ out, const In* __restrict__ a, const In* __restrict__ b,
                               F f) {
  const int64_t n_vec = n / kVec;
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < n_vec; i += int64_t{gridDim.x} * blockDim.x) {
    const Vec<In, kVec> av = reinterpret_cast<const Vec<In, kVec>*>(a)[i];
    const Vec<In, kVec> bv = reinterpret_cast<const Vec<In, kVec>*>(b)[i];
    Vec<Out, kVec> ov;
#pragma unroll
    for (int j = 0; j < kVec; ++j)
      ov.v[j] = static_cast<Out>(f(static_cast<acc_t<In>>(av.v[j]), static_cast<acc_t<In>>(bv.v[j])));
    reinterpret_cast<Vec<Out, kVec>*>(out)[i] = ov;
  }
  for (int64_t i = n_vec * kVec + blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < n;
       i += int64_t{gridDim.x} * blockDim.x) {
    out[i] = static_cast<Out>(f(static_cast<acc_t<In>>(a[i]), static_cast<acc_t<In>>(b[i])));
  }
}

template <int kVec, class Out, class In, class F>
__global__ void map_ternary_vec(int64_t n, Out* __restrict__ out, const In* __restrict__ a, const In* __restrict__ b,
                                const In* __restrict__ c, F f) {
  const int64_t n_vec = n / kVec;
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < n_vec; i += int64_t{gridDim.x} * blockDim.x) {
    const Vec<In, kVec> av = reinterpret_cast<const Vec<In, kVec>*>(a)[i];
    const Vec<In, kVec> bv = reinterpret_cast<const Vec<In, kVec>*>(b)[i];
    const Vec<In, kVec> cv = reinterpret_cast<const Vec<In, kVec>*>(c)[i];
    Vec<Out, kVec> ov;
#pragma unroll
    for (int j = 0; j < kVec; ++j) {
      ov.v[j] = static_cast<Out>(
          f(static_cast<acc_t<In>>(av.v[j]), static_cast<acc_t<In>>(bv.v[j]), static_cast<acc_t<In>>(cv.v[j])));
    }
    reinterpret_cast<Vec<Out, kVec>*>(out)[i] = ov;
  }
  for (int64_t i = n_vec * kVec + blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < n;
       i += int64_t{gridDim.x} * blockDim.x) {
    out[i] =
        static_cast<Out>(f(static_cast<acc_t<In>>(a[i]), static_cast<acc_t<In>>(b[i]), static_cast<acc_t<In>>(c[i])));
  }
}

/// out = f(a, b) (or f(b, a) when kRowFirst) with a contiguous and b one contiguous row of `row`
/// elements repeated over out's leading dimensions (a bias [C] broadcast over [..., C]); n and row
/// are multiples of kVec.
template <int kVec, bool kRowFirst, class Out, class In, class F>
__global__ void map_binary_row_vec(int64_t n, int64_t row, Out* __restrict__ out, const In* __restrict__ a,
                                   const In* __restrict__ b, F f) {
  const int64_t n_vec = n / kVec, row_vec = row / kVec;
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < n_vec; i += int64_t{gridDim.x} * blockDim.x) {
    const Vec<In, kVec> av = reinterpret_cast<const Vec<In, kVec>*>(a)[i];
    const Vec<In, kVec> bv = reinterpret_cast<const Vec<In, kVec>*>(b)[i % row_vec];
    Vec<Out, kVec> ov;
#pragma unroll
    for (int j = 0; j < kVec; ++j) {
      const auto x = static_cast<acc_t<In>>(av.v[j]), y = static_cast<acc_t<In>>(bv.v[j]);
      ov.v[j] = static_cast<Out>(kRowFirst ? f(y, x) : f(x, y));
    }
    reinterpret_cast<Vec<Out, kVec>*>(out)[i] = ov;
  }
}

// ---- strided
template <int N, class Out, class In, class F>
__global__ void map_strided(int64_t n, OffsetCalculator<N> calc, Out* out, std::array<const In*, N - 1> inputs, F f) {
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < n; i += int64_t{gridDim.x} * blockDim.x) {
    int64_t off[N];
    calc.get(i, off);
    auto load = [&](int k) {
      return static_cast<acc_t<In>>(
          *reinterpret_cast<const In*>(reinterpret_cast<const char*>(inputs[k - 1]) + off[k]));
    };
    Out* dst = reinterpret_cast<Out*>(reinterpret_cast<char*>(out) + off[0]);
    if constexpr (N == 2) {
      *dst = static_cast<Out>(f(load(1)));
    } else if constexpr (N == 3) {
      *dst = static_cast<Out>(f(load(1), load(2)));
    } else {
      *dst = static_cast<Out>(f(load(1), load(2), load(3)));
    }
  }
}

inline bool aligned16(const void* p) {
  return reinterpret_cast<uintptr_t>(p) % 16 == 0;
}

/// True when t (of out's shape) repeats one contiguous, 16-byte aligned row of out's last dimension
/// over the others (strides 0 there): a broadcast bias.
inline bool is_broadcast_row(const Tensor& t, const Tensor& out) {
  const int64_t d = t.dim();
  if (d < 2 || t.shape() != out.shape() || t.stride(d - 1) != 1 || !aligned16(t.raw_data())) return false;
  for (int64_t k = 0; k + 1 < d; ++k) {
    if (t.stride(k) != 0 && t.size(k) != 1) return false;
  }
  return true;
}

/// Runs out[i] = f(inputs[i]...) for 1 to 3 inputs of dtype In, all already of out's shape.
template <class Out, class In, size_t K, class F>
void launch_map(const Tensor& out, const std::array<const Tensor*, K>& inputs, F f) {
  static_assert(K >= 1 && K <= 3, "launch_map handles 1 to 3 inputs");
  const int64_t n = out.numel();
  if (n == 0) return;
  cuda::DeviceGuard guard(out.device());
  cudaStream_t stream = stream_of(out);
  bool contiguous = out.is_contiguous() && aligned16(out.raw_data());
  for (const Tensor* t : inputs) {
    contiguous = contiguous && t->is_contiguous() && t->shape() == out.shape() && aligned16(t->raw_data());
  }
  // Two operands, one of them a broadcast row (a bias added to activations): vector accesses too.
  if constexpr (K == 2) {
    constexpr int kVec = 16 / (sizeof(Out) > sizeof(In) ? sizeof(Out) : sizeof(In));
    const int64_t row = out.dim() > 0 ? out.size(out.dim() - 1) : 0;
    const bool out_ok = !contiguous && out.is_contiguous() && aligned16(out.raw_data()) && row % kVec == 0;
    auto dense = [&](const Tensor& t) {
      return t.is_contiguous() && t.shape() == out.shape() && aligned16(t.raw_data());
    };
    const bool row_second = out_ok && dense(*inputs[0]) && is_broadcast_row(*inputs[1], out);
    const bool row_first = out_ok && !row_second && dense(*inputs[1]) && is_broadcast_row(*inputs[0], out);
    if (row_second || row_first) {
      const In* full = static_cast<const In*>((row_second ? inputs[0] : inputs[1])->raw_data());
      const In* bias = static_cast<const In*>((row_second ? inputs[1] : inputs[0])->raw_data());
      Out* o = static_cast<Out*>(out.raw_data());
      const unsigned grid = grid_for(n, kVec);
      if (row_second) {
        map_binary_row_vec<kVec, false><<<grid, kThreads, 0, stream>>>(n, row, o, full, bias, f);
      } else {
        map_binary_row_vec<kVec, true><<<grid, kThreads, 0, stream>>>(n, row, o, full, bias, f);
      }
      COLOSSAL_CUDA_CHECK_LAUNCH();
      return;
    }
  }
  if (contiguous) {
    // 16 bytes per access for the wider of the two types.
    constexpr int kVec = 16 / (sizeof(Out) > sizeof(In) ? sizeof(Out) : sizeof(In));
    Out* o = static_cast<Out*>(out.raw_data());
    const unsigned grid = grid_for(n, kVec);
    if constexpr (K == 1) {
      map_unary_vec<kVec><<<grid, kThreads, 0, stream>>>(n, o, static_cast<const In*>(inputs[0]->raw_data()), f);
    } else if constexpr (K == 2) {
      map_binary_vec<kVec><<<grid, kThreads, 0, stream>>>(n, o, static_cast<const In*>(inputs[0]->raw_data()),
                                                          static_cast<const In*>(inputs[1]->raw_data()), f);
    } else {
      map_ternary_vec<kVec><<<grid, kThreads, 0, stream>>>(n, o, static_cast<const In*>(inputs[0]->raw_data()),
                                                           static_cast<const In*>(inputs[1]->raw_data()),
                                                           static_cast<const In*>(inputs[2]->raw_data()), f);
    }
  } else {
    std::array<const Tensor*, K + 1> all;
    all[0] = &out;
    for (size_t k = 0; k < K; ++k) all[k + 1] = inputs[k];
    const auto operands = make_strided_operands<K + 1>(out.shape(), all);
    std::array<const In*, K> ptrs;
    for (size_t k = 0; k < K; ++k) ptrs[k] = reinterpret_cast<const In*>(operands.base[k + 1]);
    map_strided<static_cast<int>(K + 1)><<<grid_for(n), kThreads, 0, stream>>>(
        n, make_offset_calculator<K + 1>(operands), reinterpret_cast<Out*>(operands.base[0]), ptrs, f);
  }
  COLOSSAL_CUDA_CHECK_LAUNCH();
}

/// Every tensor of a CUDA op must be on the op's device.
inline void check_on_device(const Tensor& t, Device device, const char* op, const char* role) {
  COLOSSAL_CHECK(t.device() == device, "{}: {} is on {} but the op runs on {}; move it with .to()", op, role,
                 t.device(), device);
}

/// check_on_device for each of a kernel's (tensor, role) pairs that is defined (optional operands
/// may be undefined).
inline void check_defined_on_device(Device device, const char* op,
                                    std::initializer_list<std::pair<const Tensor*, const char*>> tensors) {
  for (const auto& [t, role] : tensors) {
    if (t->defined()) check_on_device(*t, device, op, role);
  }
}

}  // namespace colossal::core::cuda_detail
