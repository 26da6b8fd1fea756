// Shared pieces of the CUDA attention kernels (attention_kernels.cu): where each (batch, head)
// matrix of an operand lives, the Hopper/Ampere PTX primitives the flash kernels are built from
// (cp.async, ldmatrix, mma.sync m16n8k16 with f32 accumulation, ex2.approx) and the 16-bit
// conversions. Internal to ops/cuda.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <type_traits>

#include "colossal/core/cuda/launch.cuh"  // for_each_digit
#include "colossal/core/dtype.h"          // acc_t, Half, BFloat16

namespace colossal::ops::cuda::attention {

using core::acc_t;

template <class T>
constexpr bool kIs16Bit = std::is_same_v<T, core::Half> || std::is_same_v<T, core::BFloat16>;

constexpr float kLog2e = 1.4426950408889634f;
constexpr float kLn2 = 0.6931471805599453f;

template <class I>
__host__ __device__ constexpr I ceil_div(I a, I b) {
  return (a + b - 1) / b;
}

// ---- operands

/// Batch dimensions an operand description holds after merging; more fall back to a copy.
constexpr int kMaxBatchDims = 6;

/// One operand of attention: a [rows, cols] matrix per batch entry, entry b (row-major over
/// batch_sizes) starting sum_d index_d * batch_strides[d] elements after `data`. Broadcast heads
/// have stride 0.
struct MatrixOperand {
  const void* data = nullptr;
  int64_t row_stride = 0;
  int64_t col_stride = 1;
  int batch_dims = 0;
  int64_t batch_sizes[kMaxBatchDims] = {};
  int64_t batch_strides[kMaxBatchDims] = {};

  // for_each_digit keeps every index into the arrays a compile-time constant (a kernel calls this
  // per thread on its parameter).
  __host__ __device__ int64_t batch_offset(int64_t b) const {
    int64_t offset = 0;
    core::cuda_detail::for_each_digit(b, batch_dims, batch_sizes,
                                      [&](int d, int64_t index) { offset += index * batch_strides[d]; });
    return offset;
  }
  template <class T>
  __device__ const T* matrix(int64_t b) const {
    return static_cast<const T*>(data) + batch_offset(b);
  }
};

// ---- conversions

template <class T>
__device__ __forceinline__ acc_t<T> to_acc(T v) {
  if constexpr (std::is_same_v<T, core::BFloat16>) {
    return __uint_as_float(static_cast<uint32_t>(v.bits) << 16);
  } else if constexpr (std::is_same_v<T, core::Half>) {
    return __half2float(__ushort_as_half(v.bits));
  } else {
    return v;
  }
}

template <class T, class A>
__device__ __forceinline__ T from_acc(A v) {
  T out;
  if constexpr (std::is_same_v<T, core::BFloat16>) {
    out.bits = __bfloat16_as_ushort(__float2bfloat16_rn(static_cast<float>(v)));
  } else if constexpr (std::is_same_v<T, core::Half>) {
    out.bits = __half_as_ushort(__float2half_rn(static_cast<float>(v)));
  } else {
    out = static_cast<T>(v);
  }
  return out;
}

/// Two floats rounded to T and packed as an mma operand register: `lo` in the low half (the
/// lower column index of the fragment).
template <class T>
__device__ __forceinline__ uint32_t pack2(float lo, float hi) {
  if constexpr (std::is_same_v<T, core::BFloat16>) {
    const __nv_bfloat162 v = __floats2bfloat162_rn(lo, hi);
    return *reinterpret_cast<const uint32_t*>(&v);
  } else {
    const __half2 v = __floats2half2_rn(lo, hi);
    return *reinterpret_cast<const uint32_t*>(&v);
  }
}

/// 2^x through the SFU (relative error ~2^-22; 2^-inf = 0). Inputs to bf16/f16 tensor-core
/// products only.
__device__ __forceinline__ float fast_exp2(float x) {
  float y;
  asm("ex2.approx.ftz.f32 %0, %1;\n" : "=f"(y) : "f"(x));
  return y;
}

// ---- asynchronous copies (sm_80+)

__device__ __forceinline__ uint32_t shared_address(const void* p) {
  return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}

/// 16 bytes global -> shared through L2 only; when `valid` is false nothing is read and the 16
/// shared bytes are zeroed (cp.async's src-size 0). Both addresses must be 16-byte aligned.
__device__ __forceinline__ void cp_async_16(uint32_t smem, const void* gmem, bool valid) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(smem), "l"(gmem), "r"(valid ? 16 : 0));
}
__device__ __forceinline__ void cp_async_commit() {
  asm volatile("cp.async.commit_group;\n" ::);
}
/// Waits until at most N committed groups of this thread are still in flight.
template <int N>
__device__ __forceinline__ void cp_async_wait() {
  asm volatile("cp.async.wait_group %0;\n" ::"n"(N) : "memory");
}

// ---- tensor-core fragments (mma.sync.m16n8k16, row.col)
//
// Lane l has group g = l / 4 and thread-in-group t = l % 4. A 16x16 A fragment is 4 registers of
// two 16-bit values: (row g, cols 2t..2t+1), (row g+8, same cols), (row g, cols 8+2t..), (row g+8,
// cols 8+2t..). A 16x8 B fragment (k x n) is 2 registers: (k 2t..2t+1, n g) and (k 8+2t.., n g).
// The f32 accumulator of a 16x8 tile is 4 floats: (row g, cols 2t, 2t+1) and (row g+8, same).
// Two neighbouring accumulator tiles (16 x 16) therefore hold exactly an A fragment's elements:
// the flash kernels feed softmax probabilities to the next product without leaving registers.

/// Four 8x8 matrices of 16-bit values; lane l gives the (shared-window) row address of matrix
/// l / 8, row l % 8, and receives register j = (row l / 4, cols 2(l % 4)..+1) of matrix j.
__device__ __forceinline__ void ldmatrix_x4(uint32_t (&r)[4], uint32_t smem) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(smem));
}
/// The same, each matrix transposed: register j = (rows 2(l % 4)..+1, col l / 4) of matrix j.
__device__ __forceinline__ void ldmatrix_x4_trans(uint32_t (&r)[4], uint32_t smem) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(smem));
}

// Where lane l points ldmatrix_x4 inside a row-major shared tile of pitch `pitch` elements, for
// the fragments the flash kernels load (add the tile's top-left corner):
/// A fragment (16 rows x 16 k): matrices (rows 0-7, k 0-7), (8-15, 0-7), (0-7, 8-15), (8-15, 8-15).
__device__ __forceinline__ int a_fragment_offset(int lane, int pitch) {
  return (lane % 16) * pitch + (lane / 16) * 8;
}
/// Two B fragments from a tile stored [n][k] (n: 16 rows, k: 16 columns), registers b0, b1 of
/// n 0-7 then b0, b1 of n 8-15. Also the A fragment of a tile stored [k][m] through .trans.
__device__ __forceinline__ int b_fragment_offset(int lane, int pitch) {
  return ((lane / 16) * 8 + lane % 8) * pitch + ((lane / 8) % 2) * 8;
}
/// Two B fragments from a tile stored [k][n] through .trans (k: 16 rows, n: 16 columns).
__device__ __forceinline__ int bt_fragment_offset(int lane, int pitch) {
  return (((lane / 8) % 2) * 8 + lane % 8) * pitch + (lane / 16) * 8;
}

/// c += a * b for one 16x8x16 tile in f32.
template <class T>
__device__ __forceinline__ void mma_16816(float (&c)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1) {
  if constexpr (std::is_same_v<T, core::BFloat16>) {
    asm("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
        "{%0, %1, %2, %3};\n"
        : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
  } else {
    static_assert(std::is_same_v<T, core::Half>, "tensor-core attention takes bf16 or f16");
    asm("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
        "{%0, %1, %2, %3};\n"
        : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
  }
}

/// The A fragment of P[16 rows, keys 16kk..16kk+15] from two neighbouring accumulator tiles.
template <class T>
__device__ __forceinline__ void accumulators_to_a(uint32_t (&a)[4], const float (&left)[4], const float (&right)[4]) {
  a[0] = pack2<T>(left[0], left[1]);
  a[1] = pack2<T>(left[2], left[3]);
  a[2] = pack2<T>(right[0], right[1]);
  a[3] = pack2<T>(right[2], right[3]);
}

}  // namespace colossal::ops::cuda::attention
