// CUDA layer_norm, forward and backward, over the [rows, cols] view of ops/nn_kernels.h (f32, f64,
// f16, bf16; statistics and sums in f32, f64 for f64). A row lives in the registers of one warp or
// of a small team of warps: the forward reads x once; the backward reads x and dy once, writes dx
// and accumulates each thread's columns of the weight and bias gradients across the rows its team
// visits. The teams of a block combine those in a fixed order into one partial row per block, and
// a second small kernel sums the blocks' partial rows in order: deterministic, no float atomics.
// Rows too wide for the registers stream from memory (and their weight gradients take a separate
// column-parallel pass).
#include <cuda_runtime.h>

#include <algorithm>

#include "colossal/ops/cuda/row_team.cuh"
#include "colossal/ops/nn_kernels.h"

namespace colossal::ops {
namespace {

using core::acc_t;
using cuda::rows::ceil_div;
using cuda::rows::element_acc;
using cuda::rows::from_acc;
using cuda::rows::kBlockTeam;
using cuda::rows::kWarp;
using cuda::rows::kWarpTeamBlock;
using cuda::rows::load_vec;
using cuda::rows::set_pair;
using cuda::rows::store_vec;
using cuda::rows::TeamScratch;
using cuda::rows::to_acc;
using cuda::rows::Vec;

/// Threads per block of the register kernels.
constexpr int kBlock = 256;
static_assert(kBlock / 64 <= 15, "multi-warp teams synchronise on named barriers 1..15");
/// Forward: vectors per thread in registers, enough for a warp to hold 1024 16/32-bit floats.
template <int kVec>
constexpr int kForwardChunks = std::min(8, std::max(1, 32 / kVec));
/// Backward: 16 elements per thread, since each also keeps two gradient sums per element.
template <int kVec>
constexpr int kBackwardChunks = std::max(1, 16 / kVec);
/// Threads per row of the streaming kernels (rows wider than the register kernels hold).
constexpr int kStreamBlock = 512;

// ---- forward

/// One row per team (a warp, or the block for rows of more than 32 * kChunks vectors), no loop: x
/// streams through once (evict-first), y is written evict-first, and weight and bias stay in L1.
/// Whether there is a weight and a bias is a template argument, so the per-element work is the
/// formula's and nothing else: with runtime null checks (a select per element) and per-element bf16
/// conversions the kernel took 63 registers and 111 us at 65536 x 1024 bf16 on an H100 against
/// cudaMemcpy's 92 us; as written, 50 registers, and in gpu_kernels_bench 102-103 us against the
/// copy's 89 us when launched one warp per block (kWarpTeamBlock). Where x and y live (cudaMalloc or
/// the pool, 1 to 64 MiB apart) and the data (centred or offset) made no difference there. Tried and
/// slower, in the same run: two rows per warp with both rows' loads issued first (116-118 us
/// against 106-107, in gpu_kernels_bench), and in a lab:
/// persistent warps that load their next row before reducing the current one (104 us: fewer
/// resident warps keep fewer rows in flight than this grid does), persistent warps fed by the bulk
/// copy engine 2 to 8 rows deep in shared memory (101 to 115 us), and more blocks per SM forced
/// through __launch_bounds__ (spills: 114 to 211 us).
template <class T, int kVec, int kTeam, bool kWeight, bool kBias>
__global__ void __launch_bounds__(kBlock, 1)
    layer_norm_forward_registers(T* __restrict__ y, acc_t<T>* __restrict__ mean_out, acc_t<T>* __restrict__ rstd_out,
                                 const T* __restrict__ x, const T* __restrict__ weight, const T* __restrict__ bias,
                                 int64_t rows, int64_t cols, acc_t<T> eps) {
  using A = acc_t<T>;
  constexpr int kChunks = kForwardChunks<kVec>;
  __shared__ TeamScratch<A> scratch;
  const int rank = cuda::rows::team_rank<kTeam>(), size = cuda::rows::team_size<kTeam>();
  const int64_t row = blockIdx.x * int64_t{cuda::rows::teams_per_block<kTeam>()} + cuda::rows::team_index<kTeam>();
  if (row >= rows) return;                            // only warp teams overshoot, and they never synchronise the block
  const int vectors = static_cast<int>(cols / kVec);  // the register kernels take rows of at most kBlock * kChunks
  const T* xr = x + row * cols;
  Vec<T, kVec> data[kChunks];
  A sum = 0;
#pragma unroll
  for (int k = 0; k < kChunks; ++k) {
    const int v = k * size + rank;
    if (v < vectors) {
      data[k] = cuda::rows::load_vec_streaming<kVec>(xr + v * kVec);
#pragma unroll
      for (int j = 0; j < kVec; ++j) sum += element_acc(data[k], j);
    }
  }
  const A mean = cuda::rows::team_sum<kTeam>(sum, scratch) / static_cast<A>(cols);
  // Two passes over the registers (mean, then squared deviations), as the CPU kernel: no E[x^2] - E[x]^2.
  A squares = 0;
#pragma unroll
  for (int k = 0; k < kChunks; ++k) {
    if (k * size + rank < vectors) {
#pragma unroll
      for (int j = 0; j < kVec; ++j) {
        const A d = element_acc(data[k], j) - mean;
        squares += d * d;
      }
    }
  }
  const A variance = cuda::rows::team_sum<kTeam>(squares, scratch) / static_cast<A>(cols);
  const A rstd = A(1) / sqrt(variance + eps);
  if (rank == 0) {
    mean_out[row] = mean;
    rstd_out[row] = rstd;
  }
  T* yr = y + row * cols;
#pragma unroll
  for (int k = 0; k < kChunks; ++k) {
    const int v = k * size + rank;
    if (v < vectors) {
      Vec<T, kVec> w, b, out;
      if constexpr (kWeight)
        w = cuda::rows::load_vec_readonly<kVec>(weight + v * kVec);  // L1 hits after the first rows
      if constexpr (kBias) b = cuda::rows::load_vec_readonly<kVec>(bias + v * kVec);
      A values[kVec];
#pragma unroll
      for (int j = 0; j < kVec; ++j) {
        values[j] = (element_acc(data[k], j) - mean) * rstd;
        if constexpr (kWeight) values[j] *= element_acc(w, j);
        if constexpr (kBias) values[j] += element_acc(b, j);
      }
#pragma unroll
      for (int j = 0; j < kVec; j += 2) set_pair(out, j, values[j], values[j + 1 < kVec ? j + 1 : j]);
      cuda::rows::store_vec_streaming<kVec>(yr + v * kVec, out);
    }
  }
}

/// One block per row, reading x three times (sum, squared deviations, output); for rows wider
/// than the register kernels hold, where the re-reads mostly hit L2.
template <class T, int kVec>
__global__ void __launch_bounds__(kStreamBlock, 1)
    layer_norm_forward_stream(T* __restrict__ y, acc_t<T>* __restrict__ mean_out, acc_t<T>* __restrict__ rstd_out,
                              const T* __restrict__ x, const T* __restrict__ weight, const T* __restrict__ bias,
                              int64_t cols, acc_t<T> eps) {
  using A = acc_t<T>;
  __shared__ TeamScratch<A> scratch;
  const int64_t row = blockIdx.x;
  const int64_t vectors = cols / kVec;
  const T* xr = x + row * cols;
  A sum = 0;
  for (int64_t v = threadIdx.x; v < vectors; v += blockDim.x) {
    const Vec<T, kVec> data = load_vec<kVec>(xr + v * kVec);
#pragma unroll
    for (int j = 0; j < kVec; ++j) sum += to_acc(data.v[j]);
  }
  const A mean = cuda::rows::team_sum<kBlockTeam>(sum, scratch) / static_cast<A>(cols);
  A squares = 0;
  for (int64_t v = threadIdx.x; v < vectors; v += blockDim.x) {
    const Vec<T, kVec> data = load_vec<kVec>(xr + v * kVec);
#pragma unroll
    for (int j = 0; j < kVec; ++j) {
      const A d = to_acc(data.v[j]) - mean;
      squares += d * d;
    }
  }
  const A variance = cuda::rows::team_sum<kBlockTeam>(squares, scratch) / static_cast<A>(cols);
  const A rstd = A(1) / sqrt(variance + eps);
  if (threadIdx.x == 0) {
    mean_out[row] = mean;
    rstd_out[row] = rstd;
  }
  T* yr = y + row * cols;
  for (int64_t v = threadIdx.x; v < vectors; v += blockDim.x) {
    const Vec<T, kVec> data = load_vec<kVec>(xr + v * kVec);
    Vec<T, kVec> w, b, out;
    if (weight) w = load_vec<kVec>(weight + v * kVec);
    if (bias) b = load_vec<kVec>(bias + v * kVec);
#pragma unroll
    for (int j = 0; j < kVec; ++j) {
      A value = (to_acc(data.v[j]) - mean) * rstd;
      if (weight) value *= to_acc(w.v[j]);
      if (bias) value += to_acc(b.v[j]);
      out.v[j] = from_acc<T>(value);
    }
    store_vec<kVec>(yr + v * kVec, out);
  }
}

// ---- backward

/// Writes (or adds to the previous teams' values in `combined`) this thread's per-column sums, in
/// team order, then copies the block's partial row out.
template <int kTeam, int kVec, int kChunks, class A>
__device__ void write_block_partial(const A (&sums)[kChunks][kVec], A* __restrict__ partial_row, A* combined,
                                    int64_t cols) {
  constexpr int kTeams = kBlock / kTeam;
  const int rank = cuda::rows::team_rank<kTeam>();
  const int team = cuda::rows::team_index<kTeam>();
  const int64_t vectors = cols / kVec;
  if constexpr (kTeams == 1) {
#pragma unroll
    for (int k = 0; k < kChunks; ++k) {
      const int64_t v = int64_t{k} * kTeam + rank;
      if (v < vectors) {
#pragma unroll
        for (int j = 0; j < kVec; ++j) partial_row[v * kVec + j] = sums[k][j];
      }
    }
  } else {
    for (int t = 0; t < kTeams; ++t) {
      if (team == t) {
#pragma unroll
        for (int k = 0; k < kChunks; ++k) {
          const int64_t v = int64_t{k} * kTeam + rank;
          if (v < vectors) {
#pragma unroll
            for (int j = 0; j < kVec; ++j) {
              A& slot = combined[v * kVec + j];
              slot = t == 0 ? sums[k][j] : slot + sums[k][j];
            }
          }
        }
      }
      __syncthreads();
    }
    for (int64_t c = threadIdx.x; c < cols; c += blockDim.x) partial_row[c] = combined[c];
    __syncthreads();  // `combined` is reused by the next gradient
  }
}

/// Persistent: block b's teams take rows b * teams + team, then a grid's worth further, ...; the
/// grid is fixed by the row count and the device, so every sum has a fixed order.
/// dx = rstd * (g - mean(g) - xhat * mean(g * xhat)) with g = dy * weight and xhat = (x - mean) * rstd;
/// partial_weight[b] and partial_bias[b] receive block b's sums of dy * xhat and dy.
template <class T, int kVec, int kTeam>
__global__ void __launch_bounds__(kBlock, 1)
    layer_norm_backward_registers(T* __restrict__ dx, acc_t<T>* __restrict__ partial_weight,
                                  acc_t<T>* __restrict__ partial_bias, const T* __restrict__ dy,
                                  const T* __restrict__ x, const acc_t<T>* __restrict__ mean,
                                  const acc_t<T>* __restrict__ rstd, const T* __restrict__ weight, int64_t rows,
                                  int64_t cols, bool accumulate) {
  using A = acc_t<T>;
  constexpr int kChunks = kBackwardChunks<kVec>;
  constexpr int kTeams = kBlock / kTeam;
  extern __shared__ __align__(16) unsigned char combine_storage[];
  __shared__ TeamScratch<A, 2> scratch;
  const int rank = cuda::rows::team_rank<kTeam>();
  const int team = cuda::rows::team_index<kTeam>();
  const int64_t vectors = cols / kVec;
  A sum_weight[kChunks][kVec], sum_bias[kChunks][kVec];
#pragma unroll
  for (int k = 0; k < kChunks; ++k) {
#pragma unroll
    for (int j = 0; j < kVec; ++j) sum_weight[k][j] = sum_bias[k][j] = A(0);
  }
  // The loop bound depends on the block only, so every thread of a team reaches every team_sum.
  for (int64_t first = blockIdx.x * int64_t{kTeams}; first < rows; first += int64_t{gridDim.x} * kTeams) {
    const int64_t row = first + team;
    const bool active = row < rows;
    const A mu = active ? mean[row] : A(0);
    const A inv = active ? rstd[row] : A(0);
    Vec<T, kVec> xs[kChunks], gs[kChunks];
    A sums[2] = {A(0), A(0)};  // sum of g, sum of g * xhat
#pragma unroll
    for (int k = 0; k < kChunks; ++k) {
      const int64_t v = int64_t{k} * kTeam + rank;
      if (active && v < vectors) {
        xs[k] = load_vec<kVec>(x + row * cols + v * kVec);
        gs[k] = load_vec<kVec>(dy + row * cols + v * kVec);
        Vec<T, kVec> w;
        if (weight) w = load_vec<kVec>(weight + v * kVec);
#pragma unroll
        for (int j = 0; j < kVec; ++j) {
          const A g = weight ? to_acc(gs[k].v[j]) * to_acc(w.v[j]) : to_acc(gs[k].v[j]);
          sums[0] += g;
          sums[1] += g * ((to_acc(xs[k].v[j]) - mu) * inv);
        }
      }
    }
    cuda::rows::team_sum<kTeam>(sums, scratch);
    const A mean_g = sums[0] / static_cast<A>(cols);
    const A mean_g_xhat = sums[1] / static_cast<A>(cols);
#pragma unroll
    for (int k = 0; k < kChunks; ++k) {
      const int64_t v = int64_t{k} * kTeam + rank;
      if (active && v < vectors) {
        Vec<T, kVec> w, out, old;
        if (weight) w = load_vec<kVec>(weight + v * kVec);  // an L1 hit: every row reads the same weight
        if (dx && accumulate) old = load_vec<kVec>(dx + row * cols + v * kVec);
#pragma unroll
        for (int j = 0; j < kVec; ++j) {
          const A d = to_acc(gs[k].v[j]);
          const A g = weight ? d * to_acc(w.v[j]) : d;
          const A xhat = (to_acc(xs[k].v[j]) - mu) * inv;
          const A value = inv * (g - mean_g - xhat * mean_g_xhat);
          out.v[j] = accumulate ? from_acc<T>(to_acc(old.v[j]) + to_acc(from_acc<T>(value))) : from_acc<T>(value);
          sum_weight[k][j] += d * xhat;
          sum_bias[k][j] += d;
        }
        if (dx) store_vec<kVec>(dx + row * cols + v * kVec, out);
      }
    }
  }
  A* combined = reinterpret_cast<A*>(combine_storage);
  if (partial_weight) write_block_partial<kTeam>(sum_weight, partial_weight + blockIdx.x * cols, combined, cols);
  if (partial_bias) write_block_partial<kTeam>(sum_bias, partial_bias + blockIdx.x * cols, combined, cols);
}

/// dx for rows too wide for the registers: one block per row, x and dy read twice.
template <class T, int kVec>
__global__ void __launch_bounds__(kStreamBlock, 1)
    layer_norm_backward_stream(T* __restrict__ dx, const T* __restrict__ dy, const T* __restrict__ x,
                               const acc_t<T>* __restrict__ mean, const acc_t<T>* __restrict__ rstd,
                               const T* __restrict__ weight, int64_t cols, bool accumulate) {
  using A = acc_t<T>;
  __shared__ TeamScratch<A, 2> scratch;
  const int64_t row = blockIdx.x;
  const int64_t vectors = cols / kVec;
  const A mu = mean[row], inv = rstd[row];
  const T* xr = x + row * cols;
  const T* dyr = dy + row * cols;
  A sums[2] = {A(0), A(0)};
  for (int64_t v = threadIdx.x; v < vectors; v += blockDim.x) {
    const Vec<T, kVec> xs = load_vec<kVec>(xr + v * kVec), gs = load_vec<kVec>(dyr + v * kVec);
    Vec<T, kVec> w;
    if (weight) w = load_vec<kVec>(weight + v * kVec);
#pragma unroll
    for (int j = 0; j < kVec; ++j) {
      const A g = weight ? to_acc(gs.v[j]) * to_acc(w.v[j]) : to_acc(gs.v[j]);
      sums[0] += g;
      sums[1] += g * ((to_acc(xs.v[j]) - mu) * inv);
    }
  }
  cuda::rows::team_sum<kBlockTeam>(sums, scratch);
  const A mean_g = sums[0] / static_cast<A>(cols);
  const A mean_g_xhat = sums[1] / static_cast<A>(cols);
  for (int64_t v = threadIdx.x; v < vectors; v += blockDim.x) {
    const Vec<T, kVec> xs = load_vec<kVec>(xr + v * kVec), gs = load_vec<kVec>(dyr + v * kVec);
    Vec<T, kVec> w, out, old;
    if (weight) w = load_vec<kVec>(weight + v * kVec);
    if (accumulate) old = load_vec<kVec>(dx + row * cols + v * kVec);
#pragma unroll
    for (int j = 0; j < kVec; ++j) {
      const A g = weight ? to_acc(gs.v[j]) * to_acc(w.v[j]) : to_acc(gs.v[j]);
      const A xhat = (to_acc(xs.v[j]) - mu) * inv;
      const A value = inv * (g - mean_g - xhat * mean_g_xhat);
      out.v[j] = accumulate ? from_acc<T>(to_acc(old.v[j]) + to_acc(from_acc<T>(value))) : from_acc<T>(value);
    }
    store_vec<kVec>(dx + row * cols + v * kVec, out);
  }
}

constexpr int kColumnTile = 32;
constexpr int kColumnSplit = 8;

/// Weight and bias gradient partials for rows too wide for the registers: block (column tile,
/// split s) sums rows [s * chunk, (s + 1) * chunk) of its 32 columns, 8 row phases combined in order.
template <class T>
__global__ void __launch_bounds__(kColumnTile* kColumnSplit, 1)
    layer_norm_backward_columns(acc_t<T>* __restrict__ partial_weight, acc_t<T>* __restrict__ partial_bias,
                                const T* __restrict__ dy, const T* __restrict__ x, const acc_t<T>* __restrict__ mean,
                                const acc_t<T>* __restrict__ rstd, int64_t rows, int64_t cols, int64_t chunk) {
  using A = acc_t<T>;
  __shared__ A shared_weight[kColumnSplit][kColumnTile];
  __shared__ A shared_bias[kColumnSplit][kColumnTile];
  const int64_t c = int64_t{blockIdx.x} * kColumnTile + threadIdx.x;
  const int64_t begin = int64_t{blockIdx.y} * chunk;
  const int64_t end = min(rows, begin + chunk);
  A sum_weight = 0, sum_bias = 0;
  if (c < cols) {
    for (int64_t r = begin + threadIdx.y; r < end; r += kColumnSplit) {
      const A d = to_acc(dy[r * cols + c]);
      sum_weight += d * ((to_acc(x[r * cols + c]) - mean[r]) * rstd[r]);
      sum_bias += d;
    }
  }
  shared_weight[threadIdx.y][threadIdx.x] = sum_weight;
  shared_bias[threadIdx.y][threadIdx.x] = sum_bias;
  __syncthreads();
  if (threadIdx.y == 0 && c < cols) {
    for (int s = 1; s < kColumnSplit; ++s) {
      sum_weight += shared_weight[s][threadIdx.x];
      sum_bias += shared_bias[s][threadIdx.x];
    }
    if (partial_weight) partial_weight[blockIdx.y * cols + c] = sum_weight;
    if (partial_bias) partial_bias[blockIdx.y * cols + c] = sum_bias;
  }
}

constexpr int kFinishTile = 32;

/// grad[c] <- the sum over b of partial[b][c], in b order within each of 32 phases, the phases in order.
template <class T>
__global__ void __launch_bounds__(kFinishTile* kFinishTile, 1)
    layer_norm_finish_partials(T* __restrict__ grad, const acc_t<T>* __restrict__ partial, int64_t blocks,
                               int64_t cols) {
  using A = acc_t<T>;
  __shared__ A shared[kFinishTile][kFinishTile + 1];
  const int64_t c = int64_t{blockIdx.x} * kFinishTile + threadIdx.x;
  A total = 0;
  if (c < cols) {
    for (int64_t b = threadIdx.y; b < blocks; b += kFinishTile) total += partial[b * cols + c];
  }
  shared[threadIdx.y][threadIdx.x] = total;
  __syncthreads();
  if (threadIdx.y == 0 && c < cols) {
    for (int y = 1; y < kFinishTile; ++y) total += shared[y][threadIdx.x];
    grad[c] = from_acc<T>(total);
  }
}

// ---- launchers

template <class T>
const T* optional_data(const Tensor& t) {
  return t.defined() ? t.data<T>() : nullptr;
}
template <class T>
T* optional_mutable_data(const Tensor& t) {
  return t.defined() ? t.data<T>() : nullptr;
}

template <class T, int kVec>
void forward_rows(const Tensor& y, const Tensor& mean, const Tensor& rstd, const Tensor& x, const Tensor& weight,
                  const Tensor& bias, double eps, cudaStream_t stream) {
  using A = acc_t<T>;
  const int64_t rows = x.size(0), cols = x.size(1);
  const int64_t vectors = cols / kVec;
  constexpr int64_t kChunks = kForwardChunks<kVec>;
  // The register kernel for a team size and whether there is a weight and a bias.
  auto registers = [&]<int kTeam>(unsigned grid, int block) {
    auto launch = [&]<bool kWeight, bool kBias>() {
      layer_norm_forward_registers<T, kVec, kTeam, kWeight, kBias><<<grid, block, 0, stream>>>(
          y.data<T>(), mean.data<A>(), rstd.data<A>(), x.data<T>(), optional_data<T>(weight), optional_data<T>(bias),
          rows, cols, static_cast<A>(eps));
    };
    if (weight.defined()) {
      bias.defined() ? launch.template operator()<true, true>() : launch.template operator()<true, false>();
    } else {
      bias.defined() ? launch.template operator()<false, true>() : launch.template operator()<false, false>();
    }
  };
  if (vectors <= kWarp * kChunks) {
    registers.template operator()<kWarp>(static_cast<unsigned>(ceil_div(rows, kWarpTeamBlock / kWarp)), kWarpTeamBlock);
  } else if (vectors <= kBlock * kChunks) {
    registers.template operator()<kBlockTeam>(static_cast<unsigned>(rows),
                                              cuda::rows::pow2_team(ceil_div(vectors, kChunks), 64, kBlock));
  } else {
    layer_norm_forward_stream<T, kVec><<<static_cast<unsigned>(rows), kStreamBlock, 0, stream>>>(
        y.data<T>(), mean.data<A>(), rstd.data<A>(), x.data<T>(), optional_data<T>(weight), optional_data<T>(bias),
        cols, static_cast<A>(eps));
  }
  COLOSSAL_CUDA_CHECK_LAUNCH();
}

void layer_norm_forward_cuda(const Tensor& y, const Tensor& mean, const Tensor& rstd, const Tensor& x,
                             const Tensor& weight, const Tensor& bias, double eps) {
  const Device device = x.device();
  for (const auto& [t, role] :
       {std::pair{&y, "the output"}, {&mean, "mean"}, {&rstd, "rstd"}, {&weight, "weight"}, {&bias, "bias"}}) {
    if (t->defined()) core::cuda_detail::check_on_device(*t, device, "layer_norm", role);
  }
  const int64_t rows = x.size(0), cols = x.size(1);
  if (rows == 0) return;
  COLOSSAL_CHECK(rows < (int64_t{1} << 31), "layer_norm: {} rows exceed the CUDA grid limit", rows);
  core::cuda::DeviceGuard guard(device);
  cudaStream_t stream = core::cuda_detail::stream_of(x);
  core::dispatch_floating(x.dtype(), "layer_norm", [&]<class T>() {
    if (cuda::rows::rows_vectorizable<T>(cols,
                                         {y.raw_data(), x.raw_data(), weight.defined() ? weight.raw_data() : nullptr,
                                          bias.defined() ? bias.raw_data() : nullptr})) {
      forward_rows<T, cuda::rows::kVecOf<T>>(y, mean, rstd, x, weight, bias, eps, stream);
    } else {
      forward_rows<T, 1>(y, mean, rstd, x, weight, bias, eps, stream);
    }
  });
}

/// Sums the partial rows into the defined gradients.
template <class T>
void finish_partials(const Tensor& grad_weight, const Tensor& grad_bias, const Tensor& partial_weight,
                     const Tensor& partial_bias, int64_t blocks, int64_t cols, cudaStream_t stream) {
  using A = acc_t<T>;
  const dim3 block(kFinishTile, kFinishTile);
  const unsigned grid = static_cast<unsigned>(ceil_div(cols, kFinishTile));
  if (grad_weight.defined()) {
    layer_norm_finish_partials<T>
        <<<grid, block, 0, stream>>>(grad_weight.data<T>(), partial_weight.data<A>(), blocks, cols);
    COLOSSAL_CUDA_CHECK_LAUNCH();
  }
  if (grad_bias.defined()) {
    layer_norm_finish_partials<T>
        <<<grid, block, 0, stream>>>(grad_bias.data<T>(), partial_bias.data<A>(), blocks, cols);
    COLOSSAL_CUDA_CHECK_LAUNCH();
  }
}

template <class T, int kVec, int kTeam>
void backward_registers(const Tensor& grad_x, const Tensor& grad_weight, const Tensor& grad_bias, const Tensor& grad_y,
                        const Tensor& x, const Tensor& mean, const Tensor& rstd, const Tensor& weight, bool accumulate,
                        cudaStream_t stream) {
  using A = acc_t<T>;
  const int64_t rows = x.size(0), cols = x.size(1);
  constexpr int kTeams = kBlock / kTeam;
  auto kernel = layer_norm_backward_registers<T, kVec, kTeam>;
  const int shared_bytes = kTeams > 1 ? static_cast<int>(cols * sizeof(A)) : 0;  // <= 4096 * 8: static limit holds
  // One wave of resident blocks: fewer partial rows to sum than a block per few rows, and no tail
  // wave. Fixed per device, so the sums' order is too.
  int device = 0, sms = 0, per_sm = 0;
  COLOSSAL_CUDA_CHECK(cudaGetDevice(&device));
  COLOSSAL_CUDA_CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device));
  COLOSSAL_CUDA_CHECK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, kernel, kBlock, shared_bytes));
  const int64_t blocks = std::clamp<int64_t>(int64_t{sms} * std::max(per_sm, 1), 1, ceil_div(rows, kTeams));
  const TensorOptions partial_options(core::dtype_of<A>(), x.device());
  const Tensor partial_weight = grad_weight.defined() ? core::empty({blocks, cols}, partial_options) : Tensor();
  const Tensor partial_bias = grad_bias.defined() ? core::empty({blocks, cols}, partial_options) : Tensor();
  kernel<<<static_cast<unsigned>(blocks), kBlock, shared_bytes, stream>>>(
      optional_mutable_data<T>(grad_x), optional_mutable_data<A>(partial_weight),
      optional_mutable_data<A>(partial_bias), grad_y.data<T>(), x.data<T>(), mean.data<A>(), rstd.data<A>(),
      optional_data<T>(weight), rows, cols, accumulate);
  COLOSSAL_CUDA_CHECK_LAUNCH();
  finish_partials<T>(grad_weight, grad_bias, partial_weight, partial_bias, blocks, cols, stream);
}

template <class T, int kVec>
void backward_stream(const Tensor& grad_x, const Tensor& grad_weight, const Tensor& grad_bias, const Tensor& grad_y,
                     const Tensor& x, const Tensor& mean, const Tensor& rstd, const Tensor& weight, bool accumulate,
                     cudaStream_t stream) {
  using A = acc_t<T>;
  const int64_t rows = x.size(0), cols = x.size(1);
  if (grad_x.defined()) {
    layer_norm_backward_stream<T, kVec><<<static_cast<unsigned>(rows), kStreamBlock, 0, stream>>>(
        grad_x.data<T>(), grad_y.data<T>(), x.data<T>(), mean.data<A>(), rstd.data<A>(), optional_data<T>(weight), cols,
        accumulate);
    COLOSSAL_CUDA_CHECK_LAUNCH();
  }
  if (!grad_weight.defined() && !grad_bias.defined()) return;
  // Enough row splits to fill the GPU with column tiles, each split at least 64 rows.
  const int64_t tiles = ceil_div(cols, kColumnTile);
  const int64_t splits = std::clamp<int64_t>(ceil_div(1024, tiles), 1, std::min<int64_t>(ceil_div(rows, 64), 1024));
  const int64_t chunk = ceil_div(rows, splits);
  const TensorOptions partial_options(core::dtype_of<A>(), x.device());
  const Tensor partial_weight = grad_weight.defined() ? core::empty({splits, cols}, partial_options) : Tensor();
  const Tensor partial_bias = grad_bias.defined() ? core::empty({splits, cols}, partial_options) : Tensor();
  layer_norm_backward_columns<T>
      <<<dim3(static_cast<unsigned>(tiles), static_cast<unsigned>(splits)), dim3(kColumnTile, kColumnSplit), 0,
         stream>>>(optional_mutable_data<A>(partial_weight), optional_mutable_data<A>(partial_bias), grad_y.data<T>(),
                   x.data<T>(), mean.data<A>(), rstd.data<A>(), rows, cols, chunk);
  COLOSSAL_CUDA_CHECK_LAUNCH();
  finish_partials<T>(grad_weight, grad_bias, partial_weight, partial_bias, splits, cols, stream);
}

template <class T, int kVec>
void backward_rows(const Tensor& grad_x, const Tensor& grad_weight, const Tensor& grad_bias, const Tensor& grad_y,
                   const Tensor& x, const Tensor& mean, const Tensor& rstd, const Tensor& weight, bool accumulate,
                   cudaStream_t stream) {
  const int64_t vectors = x.size(1) / kVec;
  constexpr int64_t kChunks = kBackwardChunks<kVec>;
  if (vectors > kBlock * kChunks) {
    return backward_stream<T, kVec>(grad_x, grad_weight, grad_bias, grad_y, x, mean, rstd, weight, accumulate, stream);
  }
  switch (cuda::rows::pow2_team(ceil_div(vectors, kChunks), kWarp, kBlock)) {
    case 32:
      return backward_registers<T, kVec, 32>(grad_x, grad_weight, grad_bias, grad_y, x, mean, rstd, weight, accumulate,
                                             stream);
    case 64:
      return backward_registers<T, kVec, 64>(grad_x, grad_weight, grad_bias, grad_y, x, mean, rstd, weight, accumulate,
                                             stream);
    case 128:
      return backward_registers<T, kVec, 128>(grad_x, grad_weight, grad_bias, grad_y, x, mean, rstd, weight, accumulate,
                                              stream);
    default:
      return backward_registers<T, kVec, 256>(grad_x, grad_weight, grad_bias, grad_y, x, mean, rstd, weight, accumulate,
                                              stream);
  }
}

void layer_norm_backward_cuda(const Tensor& grad_x, const Tensor& grad_weight, const Tensor& grad_bias,
                              const Tensor& grad_y, const Tensor& x, const Tensor& mean, const Tensor& rstd,
                              const Tensor& weight, bool accumulate_x) {
  const Device device = x.device();
  for (const auto& [t, role] : {std::pair{&grad_x, "grad_x"},
                                {&grad_weight, "grad_weight"},
                                {&grad_bias, "grad_bias"},
                                {&grad_y, "grad_y"},
                                {&mean, "mean"},
                                {&rstd, "rstd"},
                                {&weight, "weight"}}) {
    if (t->defined()) core::cuda_detail::check_on_device(*t, device, "layer_norm backward", role);
  }
  const int64_t rows = x.size(0), cols = x.size(1);
  if (cols == 0 || (!grad_x.defined() && !grad_weight.defined() && !grad_bias.defined())) return;
  COLOSSAL_CHECK(rows < (int64_t{1} << 31), "layer_norm backward: {} rows exceed the CUDA grid limit", rows);
  core::cuda::DeviceGuard guard(device);
  cudaStream_t stream = core::cuda_detail::stream_of(x);
  core::dispatch_floating(x.dtype(), "layer_norm backward", [&]<class T>() {
    if (rows == 0) {  // the sums over no rows are zero
      if (grad_weight.defined()) grad_weight.zero_();
      if (grad_bias.defined()) grad_bias.zero_();
      return;
    }
    if (cuda::rows::rows_vectorizable<T>(cols, {grad_x.defined() ? grad_x.raw_data() : nullptr, grad_y.raw_data(),
                                                x.raw_data(), weight.defined() ? weight.raw_data() : nullptr})) {
      backward_rows<T, cuda::rows::kVecOf<T>>(grad_x, grad_weight, grad_bias, grad_y, x, mean, rstd, weight,
                                              accumulate_x && grad_x.defined(), stream);
    } else {
      backward_rows<T, 1>(grad_x, grad_weight, grad_bias, grad_y, x, mean, rstd, weight,
                          accumulate_x && grad_x.defined(), stream);
    }
  });
}

COLOSSAL_REGISTER_KERNEL(layer_norm_forward_stub, core::DeviceType::cuda, layer_norm_forward_cuda);
COLOSSAL_REGISTER_KERNEL(layer_norm_backward_stub, core::DeviceType::cuda, layer_norm_backward_cuda);

}  // namespace
}  // namespace colossal::ops
