// CUDA softmax and log_softmax, forward and backward, over the [outer, size, inner] layout of
// ops/nn_kernels.h (f32, f64, f16, bf16; 16-bit types computed in f32). Contiguous rows
// (inner == 1) are held in registers by one warp (up to 1024 elements) or one block (up to 8192) and
// read from memory once; longer rows take an online max/sum pass and an output pass whose re-read
// mostly hits L2. Strided rows (inner > 1) put neighbouring rows on neighbouring threads.
#include <cuda_runtime.h>

#include <algorithm>

#include "colossal/ops/cuda/row_team.cuh"
#include "colossal/ops/nn_kernels.h"

namespace colossal::ops {
namespace {

using core::acc_t;
using cuda::rows::ceil_div;
using cuda::rows::from_acc;
using cuda::rows::kWarp;
using cuda::rows::kWarpTeamBlock;
using cuda::rows::load_vec;
using cuda::rows::MaxSum;
using cuda::rows::row_exp;
using cuda::rows::store_vec;
using cuda::rows::TeamScratch;
using cuda::rows::to_acc;
using cuda::rows::Vec;

/// Vectors (of kVec elements) each thread keeps in registers per tensor it holds: enough for a
/// warp to hold a 1024-element row of 16- or 32-bit floats, at most 8 (32 registers of f32).
template <int kVec>
constexpr int kChunks = std::min(8, std::max(1, 32 / kVec));
/// The largest block team of the register kernels; longer rows go to the online kernels.
constexpr int kMaxRegisterTeam = 256;
static_assert(kWarpTeamBlock <= kMaxRegisterTeam, "the register kernels' launch bound covers both team kinds");
/// Threads per row of the online (long-row) kernels.
constexpr int kOnlineBlock = 512;
/// Strided kernels: 32 neighbouring rows per block, the softmax dimension split 8 ways.
constexpr int kStridedRows = 32;
constexpr int kStridedSplit = 8;

/// Which row this team works on and the thread's rank in it (kTeam: kWarp or kBlockTeam).
template <int kTeam>
struct TeamPosition {
  int64_t row;
  int rank;
  int size;
  __device__ TeamPosition()
      : row(blockIdx.x * int64_t{cuda::rows::teams_per_block<kTeam>()} + cuda::rows::team_index<kTeam>()),
        rank(cuda::rows::team_rank<kTeam>()),
        size(cuda::rows::team_size<kTeam>()) {}
};

// ---- register-resident rows (inner == 1)

template <class T, int kVec, int kTeam>
__global__ void __launch_bounds__(kMaxRegisterTeam, 1)
    softmax_forward_registers(T* __restrict__ y, const T* __restrict__ x, int64_t rows, int64_t size, bool is_log) {
  using A = acc_t<T>;
  __shared__ TeamScratch<A> scratch;
  const TeamPosition<kTeam> team;
  if (team.row >= rows) return;  // only warp teams can overshoot, and they never synchronise
  const int64_t vectors = size / kVec;
  const T* xr = x + team.row * size;
  T* yr = y + team.row * size;
  Vec<T, kVec> data[kChunks<kVec>];
  A row_max = -INFINITY;
#pragma unroll
  for (int k = 0; k < kChunks<kVec>; ++k) {
    const int64_t v = int64_t{k} * team.size + team.rank;
    if (v < vectors) {
      data[k] = load_vec<kVec>(xr + v * kVec);
#pragma unroll
      for (int j = 0; j < kVec; ++j) row_max = max(row_max, to_acc(data[k].v[j]));
    }
  }
  row_max = cuda::rows::team_max<kTeam>(row_max, scratch);
  A sum = 0;
#pragma unroll
  for (int k = 0; k < kChunks<kVec>; ++k) {
    if (int64_t{k} * team.size + team.rank < vectors) {
#pragma unroll
      for (int j = 0; j < kVec; ++j) sum += row_exp<T>(to_acc(data[k].v[j]) - row_max);
    }
  }
  sum = cuda::rows::team_sum<kTeam>(sum, scratch);
  const A inv = A(1) / sum;
  const A log_sum = log(sum);
#pragma unroll
  for (int k = 0; k < kChunks<kVec>; ++k) {
    const int64_t v = int64_t{k} * team.size + team.rank;
    if (v < vectors) {
      Vec<T, kVec> out;
#pragma unroll
      for (int j = 0; j < kVec; ++j) {
        const A shifted = to_acc(data[k].v[j]) - row_max;
        // (x - max) - log(sum), as the CPU kernel: rounding log(sum) at max's magnitude loses digits.
        out.v[j] = from_acc<T>(is_log ? shifted - log_sum : row_exp<T>(shifted) * inv);
      }
      store_vec<kVec>(yr + v * kVec, out);
    }
  }
}

template <class T, int kVec, int kTeam>
__global__ void __launch_bounds__(kMaxRegisterTeam, 1)
    softmax_backward_registers(T* __restrict__ dx, const T* __restrict__ dy, const T* __restrict__ y, int64_t rows,
                               int64_t size, bool is_log) {
  using A = acc_t<T>;
  __shared__ TeamScratch<A> scratch;
  const TeamPosition<kTeam> team;
  if (team.row >= rows) return;
  const int64_t vectors = size / kVec;
  const int64_t start = team.row * size;
  Vec<T, kVec> grad[kChunks<kVec>], out[kChunks<kVec>];
  A dot = 0;  // sum(dy * y) for softmax, sum(dy) for log_softmax
#pragma unroll
  for (int k = 0; k < kChunks<kVec>; ++k) {
    const int64_t v = int64_t{k} * team.size + team.rank;
    if (v < vectors) {
      grad[k] = load_vec<kVec>(dy + start + v * kVec);
      out[k] = load_vec<kVec>(y + start + v * kVec);
#pragma unroll
      for (int j = 0; j < kVec; ++j) dot += is_log ? to_acc(grad[k].v[j]) : to_acc(grad[k].v[j]) * to_acc(out[k].v[j]);
    }
  }
  dot = cuda::rows::team_sum<kTeam>(dot, scratch);
#pragma unroll
  for (int k = 0; k < kChunks<kVec>; ++k) {
    const int64_t v = int64_t{k} * team.size + team.rank;
    if (v < vectors) {
      Vec<T, kVec> result;
#pragma unroll
      for (int j = 0; j < kVec; ++j) {
        const A g = to_acc(grad[k].v[j]), o = to_acc(out[k].v[j]);
        // The accurate exp even for 16-bit outputs: exp(y) * sum(dy) can cancel against dy.
        result.v[j] = from_acc<T>(is_log ? g - exp(o) * dot : o * (g - dot));
      }
      store_vec<kVec>(dx + start + v * kVec, result);
    }
  }
}

// ---- long rows (inner == 1): online statistics, then the output pass

/// Vectors each thread of the online kernels loads before using any, to keep loads in flight.
constexpr int kOnlineUnroll = 4;

template <class T, int kVec>
__global__ void __launch_bounds__(kOnlineBlock, 1)
    softmax_forward_online(T* __restrict__ y, const T* __restrict__ x, int64_t size, bool is_log) {
  using A = acc_t<T>;
  __shared__ TeamScratch<A, 2> scratch;
  const int64_t vectors = size / kVec;
  const int64_t stride = blockDim.x;
  const T* xr = x + int64_t{blockIdx.x} * size;
  T* yr = y + int64_t{blockIdx.x} * size;
  MaxSum<A> state{-INFINITY, A(0)};
  for (int64_t base = threadIdx.x; base < vectors; base += kOnlineUnroll * stride) {
    Vec<T, kVec> data[kOnlineUnroll];
#pragma unroll
    for (int u = 0; u < kOnlineUnroll; ++u) {
      if (base + u * stride < vectors) data[u] = load_vec<kVec>(xr + (base + u * stride) * kVec);
    }
#pragma unroll
    for (int u = 0; u < kOnlineUnroll; ++u) {
      if (base + u * stride < vectors) {
        A vector_max = -INFINITY;
#pragma unroll
        for (int j = 0; j < kVec; ++j) vector_max = max(vector_max, to_acc(data[u].v[j]));
#pragma unroll
        for (int j = 0; j < kVec; ++j) cuda::rows::online_add<T>(state, to_acc(data[u].v[j]), vector_max);
      }
    }
  }
  state = cuda::rows::team_merge<cuda::rows::kBlockTeam, T>(state, scratch);
  // An all -inf row has sum 0 here; make it nan like the CPU's exp(-inf - -inf).
  const A row_max = state.sum == A(0) ? A(NAN) : state.max;
  const A inv = A(1) / state.sum;
  const A log_sum = log(state.sum);
  for (int64_t base = threadIdx.x; base < vectors; base += kOnlineUnroll * stride) {
    Vec<T, kVec> data[kOnlineUnroll];
#pragma unroll
    for (int u = 0; u < kOnlineUnroll; ++u) {
      if (base + u * stride < vectors) data[u] = load_vec<kVec>(xr + (base + u * stride) * kVec);
    }
#pragma unroll
    for (int u = 0; u < kOnlineUnroll; ++u) {
      if (base + u * stride < vectors) {
        Vec<T, kVec> out;
#pragma unroll
        for (int j = 0; j < kVec; ++j) {
          const A shifted = to_acc(data[u].v[j]) - row_max;
          out.v[j] = from_acc<T>(is_log ? shifted - log_sum : row_exp<T>(shifted) * inv);
        }
        store_vec<kVec>(yr + (base + u * stride) * kVec, out);
      }
    }
  }
}

template <class T, int kVec>
__global__ void __launch_bounds__(kOnlineBlock, 1)
    softmax_backward_online(T* __restrict__ dx, const T* __restrict__ dy, const T* __restrict__ y, int64_t size,
                            bool is_log) {
  using A = acc_t<T>;
  __shared__ TeamScratch<A> scratch;
  const int64_t vectors = size / kVec;
  const int64_t stride = blockDim.x;
  const int64_t start = int64_t{blockIdx.x} * size;
  A dot = 0;
  for (int64_t base = threadIdx.x; base < vectors; base += kOnlineUnroll * stride) {
    Vec<T, kVec> g[kOnlineUnroll], o[kOnlineUnroll];
#pragma unroll
    for (int u = 0; u < kOnlineUnroll; ++u) {
      const int64_t v = base + u * stride;
      if (v < vectors) {
        g[u] = load_vec<kVec>(dy + start + v * kVec);
        if (!is_log) o[u] = load_vec<kVec>(y + start + v * kVec);
      }
    }
#pragma unroll
    for (int u = 0; u < kOnlineUnroll; ++u) {
      if (base + u * stride < vectors) {
#pragma unroll
        for (int j = 0; j < kVec; ++j) dot += is_log ? to_acc(g[u].v[j]) : to_acc(g[u].v[j]) * to_acc(o[u].v[j]);
      }
    }
  }
  dot = cuda::rows::team_sum<cuda::rows::kBlockTeam>(dot, scratch);
  for (int64_t base = threadIdx.x; base < vectors; base += kOnlineUnroll * stride) {
    Vec<T, kVec> g[kOnlineUnroll], o[kOnlineUnroll];
#pragma unroll
    for (int u = 0; u < kOnlineUnroll; ++u) {
      const int64_t v = base + u * stride;
      if (v < vectors) {
        g[u] = load_vec<kVec>(dy + start + v * kVec);
        o[u] = load_vec<kVec>(y + start + v * kVec);
      }
    }
#pragma unroll
    for (int u = 0; u < kOnlineUnroll; ++u) {
      const int64_t v = base + u * stride;
      if (v < vectors) {
        Vec<T, kVec> result;
#pragma unroll
        for (int j = 0; j < kVec; ++j) {
          const A gj = to_acc(g[u].v[j]), oj = to_acc(o[u].v[j]);
          result.v[j] = from_acc<T>(is_log ? gj - exp(oj) * dot : oj * (gj - dot));
        }
        store_vec<kVec>(dx + start + v * kVec, result);
      }
    }
  }
}

// ---- strided rows (inner > 1): row r = (o, i) has its elements at o * size * inner + k * inner + i

template <class T>
__global__ void __launch_bounds__(kStridedRows* kStridedSplit, 1)
    softmax_forward_strided(T* __restrict__ y, const T* __restrict__ x, int64_t rows, int64_t size, int64_t inner,
                            bool is_log) {
  using A = acc_t<T>;
  __shared__ A shared_max[kStridedSplit][kStridedRows];
  __shared__ A shared_sum[kStridedSplit][kStridedRows];
  const int64_t row = int64_t{blockIdx.x} * kStridedRows + threadIdx.x;
  const bool active = row < rows;
  const int64_t start = active ? (row / inner) * size * inner + row % inner : 0;
  MaxSum<A> state{-INFINITY, A(0)};
  if (active) {
    for (int64_t k = threadIdx.y; k < size; k += kStridedSplit) {
      const A v = to_acc(x[start + k * inner]);
      cuda::rows::online_add<T>(state, v, v);
    }
  }
  shared_max[threadIdx.y][threadIdx.x] = state.max;
  shared_sum[threadIdx.y][threadIdx.x] = state.sum;
  __syncthreads();
  state = {shared_max[0][threadIdx.x], shared_sum[0][threadIdx.x]};
  for (int s = 1; s < kStridedSplit; ++s) {
    state = cuda::rows::merge<T>(state, MaxSum<A>{shared_max[s][threadIdx.x], shared_sum[s][threadIdx.x]});
  }
  if (!active) return;
  const A row_max = state.sum == A(0) ? A(NAN) : state.max;
  const A inv = A(1) / state.sum;
  const A log_sum = log(state.sum);
  for (int64_t k = threadIdx.y; k < size; k += kStridedSplit) {
    const A shifted = to_acc(x[start + k * inner]) - row_max;
    y[start + k * inner] = from_acc<T>(is_log ? shifted - log_sum : row_exp<T>(shifted) * inv);
  }
}

template <class T>
__global__ void __launch_bounds__(kStridedRows* kStridedSplit, 1)
    softmax_backward_strided(T* __restrict__ dx, const T* __restrict__ dy, const T* __restrict__ y, int64_t rows,
                             int64_t size, int64_t inner, bool is_log) {
  using A = acc_t<T>;
  __shared__ A shared[kStridedSplit][kStridedRows];
  const int64_t row = int64_t{blockIdx.x} * kStridedRows + threadIdx.x;
  const bool active = row < rows;
  const int64_t start = active ? (row / inner) * size * inner + row % inner : 0;
  A dot = 0;
  if (active) {
    for (int64_t k = threadIdx.y; k < size; k += kStridedSplit) {
      const A g = to_acc(dy[start + k * inner]);
      dot += is_log ? g : g * to_acc(y[start + k * inner]);
    }
  }
  shared[threadIdx.y][threadIdx.x] = dot;
  __syncthreads();
  dot = shared[0][threadIdx.x];
  for (int s = 1; s < kStridedSplit; ++s) dot += shared[s][threadIdx.x];
  if (!active) return;
  for (int64_t k = threadIdx.y; k < size; k += kStridedSplit) {
    const A g = to_acc(dy[start + k * inner]), o = to_acc(y[start + k * inner]);
    dx[start + k * inner] = from_acc<T>(is_log ? g - exp(o) * dot : o * (g - dot));
  }
}

// ---- launchers

enum class RowPath { warp, block, online };

struct RowPlan {
  RowPath path;
  int team;  // threads per row for RowPath::block
};

/// Registers hold kChunks vectors per thread: a warp covers 32 * kChunks vectors, a block team up
/// to kMaxRegisterTeam * kChunks (8192 elements of 16- or 32-bit floats); longer rows stream.
template <int kVec>
RowPlan plan_rows(int64_t vectors) {
  constexpr int64_t chunks = kChunks<kVec>;
  if (vectors <= kWarp * chunks) return {RowPath::warp, kWarp};
  if (vectors <= kMaxRegisterTeam * chunks) {
    return {RowPath::block, cuda::rows::pow2_team(ceil_div(vectors, chunks), 64, kMaxRegisterTeam)};
  }
  return {RowPath::online, kOnlineBlock};
}

void check_rows_fit_grid(int64_t rows, const char* op) {
  COLOSSAL_CHECK(rows < (int64_t{1} << 31), "{}: {} rows exceed the CUDA grid limit", op, rows);
}

template <class T, int kVec>
void forward_rows(T* y, const T* x, int64_t rows, int64_t size, bool is_log, cudaStream_t stream) {
  const RowPlan plan = plan_rows<kVec>(size / kVec);
  switch (plan.path) {
    case RowPath::warp:
      softmax_forward_registers<T, kVec, kWarp>
          <<<static_cast<unsigned>(ceil_div(rows, kWarpTeamBlock / kWarp)), kWarpTeamBlock, 0, stream>>>(y, x, rows,
                                                                                                         size, is_log);
      break;
    case RowPath::block:
      softmax_forward_registers<T, kVec, cuda::rows::kBlockTeam>
          <<<static_cast<unsigned>(rows), plan.team, 0, stream>>>(y, x, rows, size, is_log);
      break;
    case RowPath::online:
      softmax_forward_online<T, kVec><<<static_cast<unsigned>(rows), plan.team, 0, stream>>>(y, x, size, is_log);
      break;
  }
  COLOSSAL_CUDA_CHECK_LAUNCH();
}

template <class T, int kVec>
void backward_rows(T* dx, const T* dy, const T* y, int64_t rows, int64_t size, bool is_log, cudaStream_t stream) {
  const RowPlan plan = plan_rows<kVec>(size / kVec);
  switch (plan.path) {
    case RowPath::warp:
      softmax_backward_registers<T, kVec, kWarp>
          <<<static_cast<unsigned>(ceil_div(rows, kWarpTeamBlock / kWarp)), kWarpTeamBlock, 0, stream>>>(
              dx, dy, y, rows, size, is_log);
      break;
    case RowPath::block:
      softmax_backward_registers<T, kVec, cuda::rows::kBlockTeam>
          <<<static_cast<unsigned>(rows), plan.team, 0, stream>>>(dx, dy, y, rows, size, is_log);
      break;
    case RowPath::online:
      softmax_backward_online<T, kVec><<<static_cast<unsigned>(rows), plan.team, 0, stream>>>(dx, dy, y, size, is_log);
      break;
  }
  COLOSSAL_CUDA_CHECK_LAUNCH();
}

void softmax_forward_cuda(const Tensor& out, const Tensor& x, int64_t outer, int64_t size, int64_t inner, bool is_log) {
  const char* op = is_log ? "log_softmax" : "softmax";
  core::cuda_detail::check_on_device(out, x.device(), op, "the output");
  core::cuda::DeviceGuard guard(x.device());
  cudaStream_t stream = core::cuda_detail::stream_of(x);
  const int64_t rows = outer * inner;
  if (rows == 0 || size == 0) return;
  check_rows_fit_grid(inner == 1 ? rows : ceil_div(rows, kStridedRows), op);
  core::dispatch_floating(x.dtype(), op, [&]<class T>() {
    T* y = out.data<T>();
    const T* in = x.data<T>();
    if (inner != 1) {
      softmax_forward_strided<T>
          <<<static_cast<unsigned>(ceil_div(rows, kStridedRows)), dim3(kStridedRows, kStridedSplit), 0, stream>>>(
              y, in, rows, size, inner, is_log);
      COLOSSAL_CUDA_CHECK_LAUNCH();
    } else if (cuda::rows::rows_vectorizable<T>(size, {y, in})) {
      forward_rows<T, cuda::rows::kVecOf<T>>(y, in, rows, size, is_log, stream);
    } else {
      forward_rows<T, 1>(y, in, rows, size, is_log, stream);
    }
  });
}

void softmax_backward_cuda(const Tensor& grad_x, const Tensor& grad_y, const Tensor& y, int64_t outer, int64_t size,
                           int64_t inner, bool is_log) {
  const char* op = is_log ? "log_softmax backward" : "softmax backward";
  core::cuda_detail::check_on_device(grad_x, y.device(), op, "grad_x");
  core::cuda_detail::check_on_device(grad_y, y.device(), op, "grad_y");
  core::cuda::DeviceGuard guard(y.device());
  cudaStream_t stream = core::cuda_detail::stream_of(y);
  const int64_t rows = outer * inner;
  if (rows == 0 || size == 0) return;
  check_rows_fit_grid(inner == 1 ? rows : ceil_div(rows, kStridedRows), op);
  core::dispatch_floating(y.dtype(), op, [&]<class T>() {
    T* dx = grad_x.data<T>();
    const T* dy = grad_y.data<T>();
    const T* out = y.data<T>();
    if (inner != 1) {
      softmax_backward_strided<T>
          <<<static_cast<unsigned>(ceil_div(rows, kStridedRows)), dim3(kStridedRows, kStridedSplit), 0, stream>>>(
              dx, dy, out, rows, size, inner, is_log);
      COLOSSAL_CUDA_CHECK_LAUNCH();
    } else if (cuda::rows::rows_vectorizable<T>(size, {dx, dy, out})) {
      backward_rows<T, cuda::rows::kVecOf<T>>(dx, dy, out, rows, size, is_log, stream);
    } else {
      backward_rows<T, 1>(dx, dy, out, rows, size, is_log, stream);
    }
  });
}

COLOSSAL_REGISTER_KERNEL(softmax_forward_stub, core::DeviceType::cuda, softmax_forward_cuda);
COLOSSAL_REGISTER_KERNEL(softmax_backward_stub, core::DeviceType::cuda, softmax_backward_cuda);

}  // namespace
}  // namespace colossal::ops
