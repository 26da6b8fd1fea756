// Attention kernels without tensor cores, for attention_kernels.cu: f32 and f64, and bf16/f16
// whose head dimensions exceed the flash kernels' 128. They compute in acc_t<T> with the accurate
// exp, so f32 matches the CPU kernel to rounding, and read q, k, v through any strides.
//
// A block owns kSimpleRows<A> rows (query rows forward and for dQ, key rows for dK/dV), a warp
// kSimpleRows / 8 of them, and walks tiles of 32 keys (or queries), one per lane: a lane computes
// its score for each of its warp's rows, the warp shares max and sums through shuffles, and each
// lane accumulates output columns lane, lane + 32, ... (head dimensions up to kSimpleMaxDim).
// Shared-memory rows are padded by one element so that lanes reading a column of different rows
// hit different banks. The backward is deterministic: one kernel for dQ, one for dK and dV.
#pragma once

#include <cmath>

#include "colossal/ops/cuda/attention_common.cuh"

namespace colossal::ops::cuda::attention {

constexpr int kSimpleWarps = 8;
constexpr int kSimpleThreads = kSimpleWarps * 32;
constexpr int kSimpleTile = 32;  // keys (or queries) per tile: one per lane
constexpr int kSimpleMaxDim = 256;
constexpr int kSimpleColsPerLane = kSimpleMaxDim / 32;
constexpr int kSimpleScorePitch = kSimpleTile + 1;

/// Rows per block: 16 for f64 so that D = 256 tiles fit in shared memory, else 32.
template <class A>
constexpr int kSimpleRows = sizeof(A) == 8 ? 16 : 32;

struct SimpleParams {
  MatrixOperand q, k, v;
  int64_t tq, tk, head_dim, value_dim;
  double scale;
  bool causal;
  // forward
  void* out;  // [batch, tq, value_dim], T
  void* lse;  // [batch, tq], acc_t<T>
  // backward
  const void* dout;     // [batch, tq, value_dim] contiguous, T
  const void* lse_bwd;  // [batch, tq_padded], acc_t<T>: logsumexp, +inf for a row that sees no key
  const void* delta;    // [batch, tq_padded]: rowsum(dout * out)
  int64_t tq_padded;
  void* dq;  // [batch, tq, head_dim], T
  void* dk;  // [batch, tk, head_dim]
  void* dv;  // [batch, tk, value_dim]
};

/// Shared-memory bytes of each simple kernel for the given head dimensions.
template <class A>
size_t simple_forward_smem(int64_t head_dim, int64_t value_dim) {
  constexpr int64_t rows = kSimpleRows<A>;
  return sizeof(A) * static_cast<size_t>((rows + kSimpleTile) * (head_dim + 1) + kSimpleTile * (value_dim + 1) +
                                         rows * kSimpleScorePitch);
}
template <class A>
size_t simple_backward_smem(int64_t head_dim, int64_t value_dim) {
  constexpr int64_t rows = kSimpleRows<A>;
  // dK/dV needs the most: rows of K and V, a tile of Q and dO, its statistics, P and dS.
  return sizeof(A) * static_cast<size_t>((rows + kSimpleTile) * (head_dim + value_dim + 2) + 2 * kSimpleTile +
                                         2 * rows * kSimpleScorePitch);
}

template <class A>
__device__ __forceinline__ A warp_max(A v) {
#pragma unroll
  for (int offset = 16; offset > 0; offset /= 2) v = max(v, __shfl_xor_sync(0xffffffffu, v, offset));
  return v;
}
template <class A>
__device__ __forceinline__ A warp_sum(A v) {
#pragma unroll
  for (int offset = 16; offset > 0; offset /= 2) v += __shfl_xor_sync(0xffffffffu, v, offset);
  return v;
}

/// `count` rows from row0 of a [rows, cols] matrix (any strides) into shared memory as A, with
/// row pitch `pitch`; rows past `rows` are zero.
template <class T, class A>
__device__ void load_rows(A* smem, int64_t pitch, const T* matrix, int64_t row_stride, int64_t col_stride, int64_t row0,
                          int64_t rows, int count, int64_t cols) {
  for (int64_t i = threadIdx.x; i < count * cols; i += blockDim.x) {
    const int64_t r = i / cols, c = i % cols;
    smem[r * pitch + c] = row0 + r < rows ? to_acc(matrix[(row0 + r) * row_stride + c * col_stride]) : A(0);
  }
}

template <class T>
__global__ void __launch_bounds__(kSimpleThreads) simple_forward_kernel(const SimpleParams p) {
  using A = acc_t<T>;
  constexpr int kRows = kSimpleRows<A>, kWarpRows = kRows / kSimpleWarps;
  extern __shared__ __align__(16) unsigned char shared_bytes[];
  const int64_t qk_pitch = p.head_dim + 1, v_pitch = p.value_dim + 1;
  A* sq = reinterpret_cast<A*>(shared_bytes);  // [kRows, qk_pitch]
  A* sk = sq + kRows * qk_pitch;               // [kSimpleTile, qk_pitch]
  A* sv = sk + kSimpleTile * qk_pitch;         // [kSimpleTile, v_pitch]
  A* sp = sv + kSimpleTile * v_pitch;          // [kRows, kSimpleScorePitch]

  const int64_t batch = blockIdx.x;
  const int64_t m0 = int64_t{gridDim.y - 1 - blockIdx.y} * kRows;
  const int warp = static_cast<int>(threadIdx.x) / 32, lane = static_cast<int>(threadIdx.x) % 32;
  const int local0 = warp * kWarpRows;
  const A scale = static_cast<A>(p.scale);
  const int64_t diagonal = p.tk - p.tq;
  const int64_t key_end = p.causal ? std::min<int64_t>(std::max<int64_t>(m0 + kRows + diagonal, 0), p.tk) : p.tk;

  load_rows(sq, qk_pitch, p.q.matrix<T>(batch), p.q.row_stride, p.q.col_stride, m0, p.tq, kRows, p.head_dim);
  A acc[kWarpRows][kSimpleColsPerLane] = {};
  A row_max[kWarpRows], lane_sum[kWarpRows];
#pragma unroll
  for (int r = 0; r < kWarpRows; ++r) {
    row_max[r] = -INFINITY;
    lane_sum[r] = 0;
  }

  for (int64_t n0 = 0; n0 < key_end; n0 += kSimpleTile) {
    __syncthreads();  // Q is visible; every warp is done with the last K, V tile
    load_rows(sk, qk_pitch, p.k.matrix<T>(batch), p.k.row_stride, p.k.col_stride, n0, p.tk, kSimpleTile, p.head_dim);
    load_rows(sv, v_pitch, p.v.matrix<T>(batch), p.v.row_stride, p.v.col_stride, n0, p.tk, kSimpleTile, p.value_dim);
    __syncthreads();
    A dot[kWarpRows] = {};
    for (int64_t c = 0; c < p.head_dim; ++c) {
      const A kc = sk[lane * qk_pitch + c];
#pragma unroll
      for (int r = 0; r < kWarpRows; ++r) dot[r] += sq[(local0 + r) * qk_pitch + c] * kc;
    }
    const int64_t key = n0 + lane;
#pragma unroll
    for (int r = 0; r < kWarpRows; ++r) {
      const int64_t row = m0 + local0 + r;
      const bool visible = key < p.tk && !(p.causal && key > row + diagonal);
      const A score = visible ? dot[r] * scale : A(-INFINITY);
      const A new_max = max(row_max[r], warp_max(score));
      const A shift = new_max == A(-INFINITY) ? A(0) : new_max;  // no key seen yet: P = 0, not nan
      const A rescale = exp(row_max[r] - shift);
      const A prob = exp(score - shift);
      row_max[r] = new_max;
      lane_sum[r] = lane_sum[r] * rescale + prob;
#pragma unroll
      for (int j = 0; j < kSimpleColsPerLane; ++j) acc[r][j] *= rescale;
      sp[(local0 + r) * kSimpleScorePitch + lane] = prob;
    }
    __syncwarp();
#pragma unroll
    for (int r = 0; r < kWarpRows; ++r) {
      const A* probs = sp + (local0 + r) * kSimpleScorePitch;
      for (int j = 0; j < kSimpleTile; ++j) {
        const A pj = probs[j];
#pragma unroll
        for (int cj = 0; cj < kSimpleColsPerLane; ++cj) {
          const int64_t c = lane + 32 * cj;
          if (c < p.value_dim) acc[r][cj] += pj * sv[j * v_pitch + c];
        }
      }
    }
  }

  T* out = static_cast<T*>(p.out) + batch * p.tq * p.value_dim;
  A* lse = static_cast<A*>(p.lse) + batch * p.tq;
#pragma unroll
  for (int r = 0; r < kWarpRows; ++r) {
    const A total = warp_sum(lane_sum[r]);
    const int64_t row = m0 + local0 + r;
    if (row >= p.tq) continue;
    const A inv = total > 0 ? A(1) / total : A(0);  // a row that sees no key: output 0, lse -inf
#pragma unroll
    for (int cj = 0; cj < kSimpleColsPerLane; ++cj) {
      const int64_t c = lane + 32 * cj;
      if (c < p.value_dim) out[row * p.value_dim + c] = from_acc<T>(acc[r][cj] * inv);
    }
    if (lane == 0) lse[row] = total > 0 ? row_max[r] + log(total) : A(-INFINITY);
  }
}

/// dQ = scale * dS K with dS = P (dP - delta), P recomputed from the saved logsumexp.
template <class T>
__global__ void __launch_bounds__(kSimpleThreads) simple_backward_dq_kernel(const SimpleParams p) {
  using A = acc_t<T>;
  constexpr int kRows = kSimpleRows<A>, kWarpRows = kRows / kSimpleWarps;
  extern __shared__ __align__(16) unsigned char shared_bytes[];
  const int64_t qk_pitch = p.head_dim + 1, v_pitch = p.value_dim + 1;
  A* sq = reinterpret_cast<A*>(shared_bytes);  // [kRows, qk_pitch]
  A* sdo = sq + kRows * qk_pitch;              // [kRows, v_pitch]
  A* sk = sdo + kRows * v_pitch;               // [kSimpleTile, qk_pitch]
  A* sv = sk + kSimpleTile * qk_pitch;         // [kSimpleTile, v_pitch]
  A* sds = sv + kSimpleTile * v_pitch;         // [kRows, kSimpleScorePitch]

  const int64_t batch = blockIdx.x;
  const int64_t m0 = int64_t{gridDim.y - 1 - blockIdx.y} * kRows;
  const int warp = static_cast<int>(threadIdx.x) / 32, lane = static_cast<int>(threadIdx.x) % 32;
  const int local0 = warp * kWarpRows;
  const A scale = static_cast<A>(p.scale);
  const int64_t diagonal = p.tk - p.tq;
  const int64_t key_end = p.causal ? std::min<int64_t>(std::max<int64_t>(m0 + kRows + diagonal, 0), p.tk) : p.tk;
  const T* dout = static_cast<const T*>(p.dout) + batch * p.tq * p.value_dim;

  load_rows(sq, qk_pitch, p.q.matrix<T>(batch), p.q.row_stride, p.q.col_stride, m0, p.tq, kRows, p.head_dim);
  load_rows(sdo, v_pitch, dout, p.value_dim, int64_t{1}, m0, p.tq, kRows, p.value_dim);
  A row_lse[kWarpRows], row_delta[kWarpRows];
#pragma unroll
  for (int r = 0; r < kWarpRows; ++r) {
    const int64_t row = m0 + local0 + r;
    row_lse[r] = row < p.tq ? static_cast<const A*>(p.lse_bwd)[batch * p.tq_padded + row] : A(INFINITY);
    row_delta[r] = row < p.tq ? static_cast<const A*>(p.delta)[batch * p.tq_padded + row] : A(0);
  }
  A acc[kWarpRows][kSimpleColsPerLane] = {};

  for (int64_t n0 = 0; n0 < key_end; n0 += kSimpleTile) {
    __syncthreads();
    load_rows(sk, qk_pitch, p.k.matrix<T>(batch), p.k.row_stride, p.k.col_stride, n0, p.tk, kSimpleTile, p.head_dim);
    load_rows(sv, v_pitch, p.v.matrix<T>(batch), p.v.row_stride, p.v.col_stride, n0, p.tk, kSimpleTile, p.value_dim);
    __syncthreads();
    A dot[kWarpRows] = {}, dp[kWarpRows] = {};
    for (int64_t c = 0; c < p.head_dim; ++c) {
      const A kc = sk[lane * qk_pitch + c];
#pragma unroll
      for (int r = 0; r < kWarpRows; ++r) dot[r] += sq[(local0 + r) * qk_pitch + c] * kc;
    }
    for (int64_t c = 0; c < p.value_dim; ++c) {
      const A vc = sv[lane * v_pitch + c];
#pragma unroll
      for (int r = 0; r < kWarpRows; ++r) dp[r] += sdo[(local0 + r) * v_pitch + c] * vc;
    }
    const int64_t key = n0 + lane;
#pragma unroll
    for (int r = 0; r < kWarpRows; ++r) {
      const int64_t row = m0 + local0 + r;
      const bool visible = key < p.tk && !(p.causal && key > row + diagonal);
      const A prob = visible ? exp(dot[r] * scale - row_lse[r]) : A(0);
      sds[(local0 + r) * kSimpleScorePitch + lane] = prob * (dp[r] - row_delta[r]);
    }
    __syncwarp();
#pragma unroll
    for (int r = 0; r < kWarpRows; ++r) {
      const A* ds = sds + (local0 + r) * kSimpleScorePitch;
      for (int j = 0; j < kSimpleTile; ++j) {
        const A dsj = ds[j];
#pragma unroll
        for (int cj = 0; cj < kSimpleColsPerLane; ++cj) {
          const int64_t c = lane + 32 * cj;
          if (c < p.head_dim) acc[r][cj] += dsj * sk[j * qk_pitch + c];
        }
      }
    }
  }

  T* dq = static_cast<T*>(p.dq) + batch * p.tq * p.head_dim;
#pragma unroll
  for (int r = 0; r < kWarpRows; ++r) {
    const int64_t row = m0 + local0 + r;
    if (row >= p.tq) continue;
#pragma unroll
    for (int cj = 0; cj < kSimpleColsPerLane; ++cj) {
      const int64_t c = lane + 32 * cj;
      if (c < p.head_dim) dq[row * p.head_dim + c] = from_acc<T>(acc[r][cj] * scale);
    }
  }
}

/// dV = P^T dO and dK = scale * dS^T Q for a block of keys, over the query tiles that see them.
template <class T>
__global__ void __launch_bounds__(kSimpleThreads) simple_backward_dkdv_kernel(const SimpleParams p) {
  using A = acc_t<T>;
  constexpr int kRows = kSimpleRows<A>, kWarpRows = kRows / kSimpleWarps;
  extern __shared__ __align__(16) unsigned char shared_bytes[];
  const int64_t qk_pitch = p.head_dim + 1, v_pitch = p.value_dim + 1;
  A* sk = reinterpret_cast<A*>(shared_bytes);  // [kRows, qk_pitch]
  A* sv = sk + kRows * qk_pitch;               // [kRows, v_pitch]
  A* sq = sv + kRows * v_pitch;                // [kSimpleTile, qk_pitch]
  A* sdo = sq + kSimpleTile * qk_pitch;        // [kSimpleTile, v_pitch]
  A* slse = sdo + kSimpleTile * v_pitch;       // [kSimpleTile]
  A* sdelta = slse + kSimpleTile;              // [kSimpleTile]
  A* sp = sdelta + kSimpleTile;                // [kRows, kSimpleScorePitch]
  A* sds = sp + kRows * kSimpleScorePitch;     // [kRows, kSimpleScorePitch]

  const int64_t batch = blockIdx.x;
  const int64_t n0 = int64_t{blockIdx.y} * kRows;  // causal: the first keys have the most queries
  const int warp = static_cast<int>(threadIdx.x) / 32, lane = static_cast<int>(threadIdx.x) % 32;
  const int local0 = warp * kWarpRows;
  const A scale = static_cast<A>(p.scale);
  const int64_t diagonal = p.tk - p.tq;
  const int64_t first_row = p.causal ? std::max<int64_t>(n0 - diagonal, 0) : 0;
  const T* dout = static_cast<const T*>(p.dout) + batch * p.tq * p.value_dim;
  const A* lse = static_cast<const A*>(p.lse_bwd) + batch * p.tq_padded;
  const A* delta = static_cast<const A*>(p.delta) + batch * p.tq_padded;

  load_rows(sk, qk_pitch, p.k.matrix<T>(batch), p.k.row_stride, p.k.col_stride, n0, p.tk, kRows, p.head_dim);
  load_rows(sv, v_pitch, p.v.matrix<T>(batch), p.v.row_stride, p.v.col_stride, n0, p.tk, kRows, p.value_dim);
  A acc_dk[kWarpRows][kSimpleColsPerLane] = {}, acc_dv[kWarpRows][kSimpleColsPerLane] = {};

  for (int64_t m0 = first_row / kSimpleTile * kSimpleTile; m0 < p.tq; m0 += kSimpleTile) {
    __syncthreads();  // K and V are visible; every warp is done with the last query tile
    load_rows(sq, qk_pitch, p.q.matrix<T>(batch), p.q.row_stride, p.q.col_stride, m0, p.tq, kSimpleTile, p.head_dim);
    load_rows(sdo, v_pitch, dout, p.value_dim, int64_t{1}, m0, p.tq, kSimpleTile, p.value_dim);
    if (threadIdx.x < kSimpleTile) {
      const int64_t row = m0 + threadIdx.x;
      slse[threadIdx.x] = row < p.tq ? lse[row] : A(INFINITY);  // rows past tq get P = 0
      sdelta[threadIdx.x] = row < p.tq ? delta[row] : A(0);
    }
    __syncthreads();
    A dot[kWarpRows] = {}, dp[kWarpRows] = {};
    for (int64_t c = 0; c < p.head_dim; ++c) {
      const A qc = sq[lane * qk_pitch + c];
#pragma unroll
      for (int r = 0; r < kWarpRows; ++r) dot[r] += sk[(local0 + r) * qk_pitch + c] * qc;
    }
    for (int64_t c = 0; c < p.value_dim; ++c) {
      const A oc = sdo[lane * v_pitch + c];
#pragma unroll
      for (int r = 0; r < kWarpRows; ++r) dp[r] += sv[(local0 + r) * v_pitch + c] * oc;
    }
    const int64_t query = m0 + lane;
#pragma unroll
    for (int r = 0; r < kWarpRows; ++r) {
      const int64_t key = n0 + local0 + r;
      const bool visible = key < p.tk && !(p.causal && key > query + diagonal);
      const A prob = visible ? exp(dot[r] * scale - slse[lane]) : A(0);
      sp[(local0 + r) * kSimpleScorePitch + lane] = prob;
      sds[(local0 + r) * kSimpleScorePitch + lane] = prob * (dp[r] - sdelta[lane]);
    }
    __syncwarp();
#pragma unroll
    for (int r = 0; r < kWarpRows; ++r) {
      const A* probs = sp + (local0 + r) * kSimpleScorePitch;
      const A* ds = sds + (local0 + r) * kSimpleScorePitch;
      for (int i = 0; i < kSimpleTile; ++i) {
        const A pi = probs[i], dsi = ds[i];
#pragma unroll
        for (int cj = 0; cj < kSimpleColsPerLane; ++cj) {
          const int64_t c = lane + 32 * cj;
          if (c < p.value_dim) acc_dv[r][cj] += pi * sdo[i * v_pitch + c];
          if (c < p.head_dim) acc_dk[r][cj] += dsi * sq[i * qk_pitch + c];
        }
      }
    }
  }

  T* dk = static_cast<T*>(p.dk) + batch * p.tk * p.head_dim;
  T* dv = static_cast<T*>(p.dv) + batch * p.tk * p.value_dim;
#pragma unroll
  for (int r = 0; r < kWarpRows; ++r) {
    const int64_t key = n0 + local0 + r;
    if (key >= p.tk) continue;
#pragma unroll
    for (int cj = 0; cj < kSimpleColsPerLane; ++cj) {
      const int64_t c = lane + 32 * cj;
      if (c < p.head_dim) dk[key * p.head_dim + c] = from_acc<T>(acc_dk[r][cj] * scale);
      if (c < p.value_dim) dv[key * p.value_dim + c] = from_acc<T>(acc_dv[r][cj]);
    }
  }
}

}  // namespace colossal::ops::cuda::attention
