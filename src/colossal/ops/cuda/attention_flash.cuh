// FlashAttention-2 forward and backward kernels on the tensor cores (bf16/f16 in, f32
// accumulation) for attention_kernels.cu. Head dimensions are padded to kD (64 or 128): loads
// zero-fill the columns past an operand's own, so q/k and v may have different widths.
//
// Forward: a CTA owns kBlockM query rows (each warp 16 * kAtoms of them) and walks the key tiles
// its rows can see, keeping O and the online softmax statistics in registers; K and V tiles
// alternate through shared memory so that one loads while the other is multiplied (FA2's scheme).
//
// Backward: a CTA owns kBlockN keys (16 * kKeyAtoms per warp) and walks the query tiles that see
// them, double-buffering Q and dO. S^T and dP^T come out with keys as rows, so P^T and dS^T feed dV
// and dK straight from registers; dS^T goes through shared memory for dQ = dS K, which is added
// into an f32 buffer with atomics (see Note [dQ through atomics] in attention_kernels.cu). Shared
// memory, not the tensor cores, bounds it (ncu on an H100: L1/shared 65% busy, tensor pipe 28%,
// at 16 keys a warp), hence the key atoms that share each loaded Q/dO fragment.
#pragma once

#include "colossal/ops/cuda/attention_common.cuh"

namespace colossal::ops::cuda::attention {

/// Rows [row0, row0 + kRows) of one [rows, cols] matrix into the shared tile at `smem` (row
/// pitch kD + 8), 16 bytes per cp.async; rows past `rows` and columns past `cols` (a multiple of 8)
/// are zeroed.
template <class T, int kRows, int kD, int kThreads>
__device__ __forceinline__ void load_tile(uint32_t smem, const T* matrix, int64_t row_stride, int64_t row0,
                                          int64_t rows, int cols) {
  constexpr int kChunksPerRow = kD / 8;
  constexpr int kRowsPerPass = kThreads / kChunksPerRow;
  static_assert(kThreads % kChunksPerRow == 0 && kRows % kRowsPerPass == 0, "every thread copies whole passes");
  const int r0 = static_cast<int>(threadIdx.x) / kChunksPerRow;
  const int c = (static_cast<int>(threadIdx.x) % kChunksPerRow) * 8;
  const uint32_t dst = smem + static_cast<uint32_t>((r0 * (kD + 8) + c) * sizeof(T));
  const T* src = matrix + (row0 + r0) * row_stride + c;
#pragma unroll
  for (int i = 0; i < kRows / kRowsPerPass; ++i) {
    const bool valid = c < cols && row0 + r0 + i * kRowsPerPass < rows;
    cp_async_16(dst + i * kRowsPerPass * (kD + 8) * sizeof(T), valid ? src + i * kRowsPerPass * row_stride : matrix,
                valid);
  }
}

/// Causal masking inside a tile in tile-local indices: key column c is hidden from query row r
/// when c - r > reach, where reach = m0 + (tk - tq) - n0 (clamped so that it fits an int and keeps
/// its meaning: below -kRowSpan hides everything, kColSpan and above nothing).
template <int kRowSpan, int kColSpan>
__device__ __forceinline__ int causal_reach(bool causal, int64_t m0, int64_t n0, int64_t diagonal) {
  if (!causal) return kColSpan;
  return static_cast<int>(std::min<int64_t>(std::max<int64_t>(m0 + diagonal - n0, -kRowSpan), kColSpan));
}

/// Stores two neighbouring outputs (columns col, col + 1 of a row of `cols`), as one 4-byte store
/// when the row pitch keeps it aligned.
template <class T>
__device__ __forceinline__ void store_pair(T* row, int col, int cols, float v0, float v1) {
  if (cols % 2 == 0 && col + 1 < cols) {
    *reinterpret_cast<uint32_t*>(row + col) = pack2<T>(v0, v1);
  } else {
    if (col < cols) row[col] = from_acc<T>(v0);
    if (col + 1 < cols) row[col + 1] = from_acc<T>(v1);
  }
}

// ---- forward

struct FlashForwardParams {
  MatrixOperand q, k, v;
  MatrixOperand out;  // [batch, tq, value_dim] of T, unit column stride, even strides (written)
  float* lse;         // [batch, tq]
  int64_t tq, tk;
  int qk_cols;    // columns of q and k to load (a multiple of 8, <= kD)
  int v_cols;     // columns of v to load (likewise)
  int value_dim;  // columns of out
  float scale_log2;
  bool causal;
};

template <class T, int kD_, int kBlockM_, int kBlockN_, int kWarps_, int kMinBlocks_ = 2>
struct FlashForwardConfig {
  using Element = T;
  static constexpr int kD = kD_, kBlockM = kBlockM_, kBlockN = kBlockN_, kWarps = kWarps_;
  static constexpr int kMinBlocks = kMinBlocks_;  // CTAs per SM the registers must allow
  static constexpr int kThreads = kWarps * 32;
  static constexpr int kWarpRows = kBlockM / kWarps;
  static constexpr int kAtoms = kWarpRows / 16;  // 16-row mma tiles per warp, sharing each K/V fragment
  static constexpr int kStride = kD + 8;         // 16 spare bytes per row: ldmatrix rows hit distinct banks
  static constexpr size_t kSmemBytes = size_t{kBlockM + 2 * kBlockN} * kStride * sizeof(T);
  static_assert(kWarpRows % 16 == 0 && kD % 16 == 0 && kBlockN % 16 == 0, "tiles are whole mma tiles");
};

template <class Cfg>
__global__ void __launch_bounds__(Cfg::kThreads, Cfg::kMinBlocks) flash_forward_kernel(const FlashForwardParams p) {
  using T = typename Cfg::Element;
  constexpr int kD = Cfg::kD, kBlockM = Cfg::kBlockM, kBlockN = Cfg::kBlockN, kThreads = Cfg::kThreads;
  constexpr int kStride = Cfg::kStride, kAtoms = Cfg::kAtoms;
  constexpr int kScoreTiles = kBlockN / 8, kOutTiles = kD / 8;
  constexpr uint32_t kElement = sizeof(T);
  extern __shared__ __align__(16) unsigned char shared_bytes[];
  const uint32_t sq = shared_address(shared_bytes);
  const uint32_t sk = sq + kBlockM * kStride * kElement;
  const uint32_t sv = sk + kBlockN * kStride * kElement;

  const int64_t batch = blockIdx.x;
  // Causal rows further down see more keys: start those first so the short ones fill the tail.
  const int64_t m0 = int64_t{gridDim.y - 1 - blockIdx.y} * kBlockM;
  const int warp = static_cast<int>(threadIdx.x) / 32, lane = static_cast<int>(threadIdx.x) % 32;
  const int group = lane / 4, tig = lane % 4;
  const int warp_row0 = warp * Cfg::kWarpRows;
  const uint32_t q_fragments = sq + (warp_row0 * kStride + a_fragment_offset(lane, kStride)) * kElement;
  const uint32_t k_fragments = sk + b_fragment_offset(lane, kStride) * kElement;
  const uint32_t v_fragments = sv + bt_fragment_offset(lane, kStride) * kElement;
  const T* q = p.q.matrix<T>(batch);
  const T* k = p.k.matrix<T>(batch);
  const T* v = p.v.matrix<T>(batch);
  const int64_t diagonal = p.tk - p.tq;  // causal: query i sees keys j <= i + diagonal
  const int64_t key_end = p.causal ? std::min<int64_t>(std::max<int64_t>(m0 + kBlockM + diagonal, 0), p.tk) : p.tk;
  const int tiles = static_cast<int>(ceil_div<int64_t>(key_end, kBlockN));

  load_tile<T, kBlockM, kD, kThreads>(sq, q, p.q.row_stride, m0, p.tq, p.qk_cols);
  if (tiles > 0) load_tile<T, kBlockN, kD, kThreads>(sk, k, p.k.row_stride, 0, p.tk, p.qk_cols);
  cp_async_commit();

  float acc_o[kAtoms][kOutTiles][4] = {};
  // Per row (g and g + 8 of each atom): running max of the scores in log2 units, and this
  // thread's share of the running sum (the quad's four shares are added at the end).
  float row_max[kAtoms][2], row_sum[kAtoms][2];
#pragma unroll
  for (int atom = 0; atom < kAtoms; ++atom) {
    row_max[atom][0] = row_max[atom][1] = -INFINITY;
    row_sum[atom][0] = row_sum[atom][1] = 0.f;
  }

  for (int tile = 0; tile < tiles; ++tile) {
    const int64_t n0 = int64_t{tile} * kBlockN;
    cp_async_wait<0>();
    __syncthreads();  // this K tile (and Q) is visible, and every warp is done with the last V tile
    load_tile<T, kBlockN, kD, kThreads>(sv, v, p.v.row_stride, n0, p.tk, p.v_cols);
    cp_async_commit();

    // S = Q K^T
    float acc_s[kAtoms][kScoreTiles][4] = {};
#pragma unroll
    for (int ks = 0; ks < kD / 16; ++ks) {
      uint32_t a[kAtoms][4];
#pragma unroll
      for (int atom = 0; atom < kAtoms; ++atom)
        ldmatrix_x4(a[atom], q_fragments + (atom * 16 * kStride + ks * 16) * kElement);
#pragma unroll
      for (int nt = 0; nt < kScoreTiles; nt += 2) {
        uint32_t b[4];
        ldmatrix_x4(b, k_fragments + (nt * 8 * kStride + ks * 16) * kElement);
#pragma unroll
        for (int atom = 0; atom < kAtoms; ++atom) {
          mma_16816<T>(acc_s[atom][nt], a[atom], b[0], b[1]);
          mma_16816<T>(acc_s[atom][nt + 1], a[atom], b[2], b[3]);
        }
      }
    }

    // Scale to log2 units; mask keys past tk and, when causal, past each row's diagonal.
    if (n0 + kBlockN > p.tk || (p.causal && n0 + kBlockN - 1 > m0 + diagonal)) {
      const int key_limit = static_cast<int>(std::min<int64_t>(p.tk - n0, kBlockN));
      const int reach = causal_reach<kBlockM, kBlockN>(p.causal, m0, n0, diagonal);
#pragma unroll
      for (int atom = 0; atom < kAtoms; ++atom) {
#pragma unroll
        for (int nt = 0; nt < kScoreTiles; ++nt) {
#pragma unroll
          for (int e = 0; e < 4; ++e) {
            const int row = warp_row0 + atom * 16 + group + (e / 2) * 8;
            const int col = nt * 8 + tig * 2 + e % 2;
            acc_s[atom][nt][e] = col >= key_limit || col - row > reach ? -INFINITY : acc_s[atom][nt][e] * p.scale_log2;
          }
        }
      }
    } else {
#pragma unroll
      for (int atom = 0; atom < kAtoms; ++atom) {
#pragma unroll
        for (int nt = 0; nt < kScoreTiles; ++nt) {
#pragma unroll
          for (int e = 0; e < 4; ++e) acc_s[atom][nt][e] *= p.scale_log2;
        }
      }
    }

    // Online softmax: P = 2^(S - new max), earlier sums and outputs rescaled by 2^(old - new).
#pragma unroll
    for (int atom = 0; atom < kAtoms; ++atom) {
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        float tile_max = -INFINITY;
#pragma unroll
        for (int nt = 0; nt < kScoreTiles; ++nt) {
          tile_max = fmaxf(tile_max, fmaxf(acc_s[atom][nt][2 * h], acc_s[atom][nt][2 * h + 1]));
        }
        tile_max = fmaxf(tile_max, __shfl_xor_sync(0xffffffffu, tile_max, 1));
        tile_max = fmaxf(tile_max, __shfl_xor_sync(0xffffffffu, tile_max, 2));
        const float new_max = fmaxf(row_max[atom][h], tile_max);
        // A row that has seen only masked keys keeps max -inf; shifting by 0 then gives P = 0
        // instead of nan from -inf - -inf.
        const float shift = new_max == -INFINITY ? 0.f : new_max;
        const float rescale = fast_exp2(row_max[atom][h] - shift);
        row_max[atom][h] = new_max;
        float sum = 0.f;
#pragma unroll
        for (int nt = 0; nt < kScoreTiles; ++nt) {
#pragma unroll
          for (int e = 2 * h; e < 2 * h + 2; ++e) {
            const float prob = fast_exp2(acc_s[atom][nt][e] - shift);
            acc_s[atom][nt][e] = prob;
            sum += prob;
          }
        }
        row_sum[atom][h] = row_sum[atom][h] * rescale + sum;
#pragma unroll
        for (int dt = 0; dt < kOutTiles; ++dt) {
          acc_o[atom][dt][2 * h] *= rescale;
          acc_o[atom][dt][2 * h + 1] *= rescale;
        }
      }
    }

    cp_async_wait<0>();
    __syncthreads();  // this V tile is visible, and every warp is done with this K tile
    if (tile + 1 < tiles) {
      load_tile<T, kBlockN, kD, kThreads>(sk, k, p.k.row_stride, n0 + kBlockN, p.tk, p.qk_cols);
      cp_async_commit();
    }

    // O += P V, P rounded to T as the A operand (as every flash kernel does).
#pragma unroll
    for (int kk = 0; kk < kBlockN / 16; ++kk) {
      uint32_t a[kAtoms][4];
#pragma unroll
      for (int atom = 0; atom < kAtoms; ++atom)
        accumulators_to_a<T>(a[atom], acc_s[atom][2 * kk], acc_s[atom][2 * kk + 1]);
#pragma unroll
      for (int dt = 0; dt < kOutTiles; dt += 2) {
        uint32_t b[4];
        ldmatrix_x4_trans(b, v_fragments + (kk * 16 * kStride + dt * 8) * kElement);
#pragma unroll
        for (int atom = 0; atom < kAtoms; ++atom) {
          mma_16816<T>(acc_o[atom][dt], a[atom], b[0], b[1]);
          mma_16816<T>(acc_o[atom][dt + 1], a[atom], b[2], b[3]);
        }
      }
    }
  }
  cp_async_wait<0>();  // with no key tile, Q's copy is still in flight

  T* out = const_cast<T*>(p.out.matrix<T>(batch));
  float* lse = p.lse + batch * p.tq;
#pragma unroll
  for (int atom = 0; atom < kAtoms; ++atom) {
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      float sum = row_sum[atom][h];
      sum += __shfl_xor_sync(0xffffffffu, sum, 1);
      sum += __shfl_xor_sync(0xffffffffu, sum, 2);
      const int64_t row = m0 + warp_row0 + atom * 16 + group + h * 8;
      if (row >= p.tq) continue;
      // A row that sees no key has sum 0: output 0 and logsumexp -inf, as the contract says.
      const float inv = sum > 0.f ? 1.f / sum : 0.f;
      T* out_row = out + row * p.out.row_stride;
#pragma unroll
      for (int dt = 0; dt < kOutTiles; ++dt) {
        store_pair<T>(out_row, dt * 8 + tig * 2, p.value_dim, acc_o[atom][dt][2 * h] * inv,
                      acc_o[atom][dt][2 * h + 1] * inv);
      }
      if (tig == 0) lse[row] = sum > 0.f ? (row_max[atom][h] + __log2f(sum)) * kLn2 : -INFINITY;
    }
  }
}

// ---- backward

struct FlashBackwardParams {
  MatrixOperand q, k, v, dout;
  const float* lse;    // [batch, tq_padded]: logsumexp * log2(e); +inf where a row sees no key and past tq
  const float* delta;  // [batch, tq_padded]: rowsum(dout * out); 0 past tq
  float* dq_accum;     // [batch, tq, qk_cols], zeroed: receives dS K (unscaled) through atomics
  MatrixOperand dk;    // [batch, tk, head_dim] of T, unit column stride, even strides (written)
  MatrixOperand dv;    // [batch, tk, value_dim] likewise
  int64_t tq, tk, tq_padded;
  int qk_cols, v_cols;  // loaded columns, multiples of 8
  int head_dim, value_dim;
  float scale, scale_log2;
  bool causal;
};

template <class T, int kD_, int kBlockM_, int kBlockN_, int kWarps_, int kMinBlocks_ = 1, int kKeyAtoms_ = 1>
struct FlashBackwardConfig {
  using Element = T;
  static constexpr int kD = kD_, kBlockM = kBlockM_, kBlockN = kBlockN_, kWarps = kWarps_;
  static constexpr int kMinBlocks = kMinBlocks_;  // CTAs per SM the registers must allow
  // 16-key mma tiles per warp: each Q/dO fragment a warp loads from shared memory feeds this many
  // products (shared-memory traffic, not the tensor cores, bounds this kernel).
  static constexpr int kKeyAtoms = kKeyAtoms_;
  static constexpr int kWarpKeys = 16 * kKeyAtoms;
  static constexpr int kThreads = kWarps * 32;
  static constexpr int kStride = kD + 8;
  static constexpr int kScoreStride = kBlockM + 8;  // dS^T rows: keys, columns: queries
  // dQ = dS K: warps tile [kBlockM, kD] as kDqWarpsM x kDqWarpsD blocks of 16 rows.
  static constexpr int kDqWarpsM = kBlockM / 16;
  static constexpr int kDqWarpsD = kWarps / kDqWarpsM;
  static constexpr int kDqCols = kD / kDqWarpsD;
  static constexpr size_t kElements =
      size_t{2 * kBlockN * kStride + 4 * kBlockM * kStride + kBlockN * kScoreStride};        // K, V, 2x Q, 2x dO, dS
  static constexpr size_t kSmemBytes = kElements * sizeof(T) + 4 * kBlockM * sizeof(float);  // 2x lse, 2x delta
  static_assert(kBlockN == kWarpKeys * kWarps, "each warp owns kKeyAtoms 16-key mma tiles");
  static_assert(kBlockM % 16 == 0 && kD % 16 == 0, "tiles are whole mma tiles");
  static_assert(kWarps % kDqWarpsM == 0 && kDqCols % 16 == 0, "the dQ product splits evenly over the warps");
  static_assert(kElements * sizeof(T) % 16 == 0, "the f32 statistics stay 16-byte aligned");
};

template <class Cfg>
__global__ void __launch_bounds__(Cfg::kThreads, Cfg::kMinBlocks) flash_backward_kernel(const FlashBackwardParams p) {
  using T = typename Cfg::Element;
  constexpr int kD = Cfg::kD, kBlockM = Cfg::kBlockM, kBlockN = Cfg::kBlockN, kThreads = Cfg::kThreads;
  constexpr int kStride = Cfg::kStride, kScoreStride = Cfg::kScoreStride, kDqCols = Cfg::kDqCols;
  constexpr int kQueryTiles = kBlockM / 8, kColTiles = kD / 8, kAtoms = Cfg::kKeyAtoms;
  constexpr uint32_t kElement = sizeof(T);
  constexpr uint32_t kQueryTileBytes = kBlockM * kStride * kElement;
  extern __shared__ __align__(16) unsigned char shared_bytes[];
  const uint32_t sk = shared_address(shared_bytes);
  const uint32_t sv = sk + kBlockN * kStride * kElement;
  const uint32_t sq = sv + kBlockN * kStride * kElement;  // two buffers
  const uint32_t sdo = sq + 2 * kQueryTileBytes;          // two buffers
  const uint32_t sds = sdo + 2 * kQueryTileBytes;
  T* sds_pointer = reinterpret_cast<T*>(shared_bytes + (sds - sk));
  float* slse = reinterpret_cast<float*>(sds_pointer + kBlockN * kScoreStride);  // two buffers
  float* sdelta = slse + 2 * kBlockM;                                            // two buffers

  const int64_t batch = blockIdx.x;
  const int64_t n0 = int64_t{blockIdx.y} * kBlockN;  // causal: the first key tiles have the most work
  const int warp = static_cast<int>(threadIdx.x) / 32, lane = static_cast<int>(threadIdx.x) % 32;
  const int group = lane / 4, tig = lane % 4;
  const int key0 = warp * Cfg::kWarpKeys;  // this warp's first key within the tile
  const int dq_m = warp % Cfg::kDqWarpsM, dq_d = warp / Cfg::kDqWarpsM;
  // This lane's ldmatrix addresses: K and V rows of the warp's keys as A (atom i 16 rows further);
  // Q and dO tiles as B (plain for S^T and dP^T, transposed for dK and dV); dS^T transposed as
  // dQ's A, K transposed as its B.
  const uint32_t k_rows = sk + (key0 * kStride + a_fragment_offset(lane, kStride)) * kElement;
  const uint32_t v_rows = sv + (key0 * kStride + a_fragment_offset(lane, kStride)) * kElement;
  const uint32_t query_b = b_fragment_offset(lane, kStride) * kElement;
  const uint32_t query_bt = bt_fragment_offset(lane, kStride) * kElement;
  const uint32_t ds_a = sds + (b_fragment_offset(lane, kScoreStride) + dq_m * 16) * kElement;
  const uint32_t k_bt = sk + (bt_fragment_offset(lane, kStride) + dq_d * kDqCols) * kElement;

  const T* q = p.q.matrix<T>(batch);
  const T* k = p.k.matrix<T>(batch);
  const T* v = p.v.matrix<T>(batch);
  const T* dout = p.dout.matrix<T>(batch);
  const float* lse = p.lse + batch * p.tq_padded;
  const float* delta = p.delta + batch * p.tq_padded;
  const int64_t diagonal = p.tk - p.tq;
  // Query rows that see a key of this tile: i >= n0 - diagonal when causal.
  const int64_t first_row = p.causal ? std::max<int64_t>(n0 - diagonal, 0) : 0;
  const int64_t m_begin = first_row / kBlockM, m_end = ceil_div<int64_t>(p.tq, kBlockM);
  const int key_limit = static_cast<int>(std::min<int64_t>(p.tk - n0, kBlockN));

  auto load_query_tile = [&](int buf, int64_t mb) {
    const int64_t m0 = mb * kBlockM;
    load_tile<T, kBlockM, kD, kThreads>(sq + buf * kQueryTileBytes, q, p.q.row_stride, m0, p.tq, p.qk_cols);
    load_tile<T, kBlockM, kD, kThreads>(sdo + buf * kQueryTileBytes, dout, p.dout.row_stride, m0, p.tq, p.v_cols);
    // The statistics are padded to whole tiles, so every chunk is in bounds.
    const int t = static_cast<int>(threadIdx.x);
    if (t < kBlockM / 4) {
      cp_async_16(shared_address(slse + buf * kBlockM + t * 4), lse + m0 + t * 4, true);
    } else if (t < kBlockM / 2) {
      const int c = t - kBlockM / 4;
      cp_async_16(shared_address(sdelta + buf * kBlockM + c * 4), delta + m0 + c * 4, true);
    }
  };

  float acc_dk[kAtoms][kColTiles][4] = {};
  float acc_dv[kAtoms][kColTiles][4] = {};
  if (m_begin < m_end) {
    load_tile<T, kBlockN, kD, kThreads>(sk, k, p.k.row_stride, n0, p.tk, p.qk_cols);
    load_tile<T, kBlockN, kD, kThreads>(sv, v, p.v.row_stride, n0, p.tk, p.v_cols);
    load_query_tile(0, m_begin);
    cp_async_commit();
  }

  for (int64_t mb = m_begin; mb < m_end; ++mb) {
    const int buf = static_cast<int>((mb - m_begin) & 1);
    if (mb + 1 < m_end) {
      // The other buffer was last read before the previous iteration's middle barrier.
      load_query_tile(buf ^ 1, mb + 1);
      cp_async_commit();
      cp_async_wait<1>();
    } else {
      cp_async_wait<0>();
    }
    __syncthreads();  // this query tile is visible; every warp is done reading dS of the last one
    const int64_t m0 = mb * kBlockM;
    const uint32_t q_tile = sq + buf * kQueryTileBytes, do_tile = sdo + buf * kQueryTileBytes;
    const float* lse_b = slse + buf * kBlockM;
    const float* delta_b = sdelta + buf * kBlockM;

    // Causal: when every key of this warp lies past the last query's reach (half the warps on
    // the first query tile of a key block), P and dS are 0; such a warp writes its zero rows of
    // dS^T and keeps the barriers, leaving its SM sub-partition to the busy warps.
    // (At kD 128 the branch costs the kernel register spills, so only narrower heads skip.)
    const bool warp_idle = kD <= 64 && (key0 >= key_limit || (p.causal && n0 + key0 > m0 + kBlockM - 1 + diagonal));

    // S^T = K Q^T and dP^T = V dO^T for this warp's keys x kBlockM queries.
    float acc_s[kAtoms][kQueryTiles][4] = {};
    float acc_dp[kAtoms][kQueryTiles][4] = {};
    if (!warp_idle) {
#pragma unroll
      for (int ks = 0; ks < kD / 16; ++ks) {
        uint32_t a[kAtoms][4];
#pragma unroll
        for (int atom = 0; atom < kAtoms; ++atom)
          ldmatrix_x4(a[atom], k_rows + (atom * 16 * kStride + ks * 16) * kElement);
#pragma unroll
        for (int nt = 0; nt < kQueryTiles; nt += 2) {
          uint32_t b[4];
          ldmatrix_x4(b, q_tile + query_b + (nt * 8 * kStride + ks * 16) * kElement);
#pragma unroll
          for (int atom = 0; atom < kAtoms; ++atom) {
            mma_16816<T>(acc_s[atom][nt], a[atom], b[0], b[1]);
            mma_16816<T>(acc_s[atom][nt + 1], a[atom], b[2], b[3]);
          }
        }
      }
#pragma unroll
      for (int ks = 0; ks < kD / 16; ++ks) {
        uint32_t a[kAtoms][4];
#pragma unroll
        for (int atom = 0; atom < kAtoms; ++atom)
          ldmatrix_x4(a[atom], v_rows + (atom * 16 * kStride + ks * 16) * kElement);
#pragma unroll
        for (int nt = 0; nt < kQueryTiles; nt += 2) {
          uint32_t b[4];
          ldmatrix_x4(b, do_tile + query_b + (nt * 8 * kStride + ks * 16) * kElement);
#pragma unroll
          for (int atom = 0; atom < kAtoms; ++atom) {
            mma_16816<T>(acc_dp[atom][nt], a[atom], b[0], b[1]);
            mma_16816<T>(acc_dp[atom][nt + 1], a[atom], b[2], b[3]);
          }
        }
      }

      // P^T = 2^(S^T * scale * log2 e - lse) (0 where masked) and dS^T = P^T (dP^T - delta), the
      // softmax scale left for the end.
      const bool masked_tile = n0 + kBlockN > p.tk || (p.causal && n0 + kBlockN - 1 > m0 + diagonal);
      const int reach = causal_reach<kBlockM, kBlockN>(p.causal, m0, n0, diagonal);
#pragma unroll
      for (int nt = 0; nt < kQueryTiles; ++nt) {
        // This lane's two queries of the tile, their statistics as one 8-byte load each.
        const float2 row_lse = *reinterpret_cast<const float2*>(lse_b + nt * 8 + tig * 2);
        const float2 row_delta = *reinterpret_cast<const float2*>(delta_b + nt * 8 + tig * 2);
#pragma unroll
        for (int atom = 0; atom < kAtoms; ++atom) {
#pragma unroll
          for (int e = 0; e < 4; ++e) {
            const int query = nt * 8 + tig * 2 + e % 2;
            const int key = key0 + atom * 16 + group + (e / 2) * 8;
            float prob = fast_exp2(acc_s[atom][nt][e] * p.scale_log2 - (e % 2 ? row_lse.y : row_lse.x));
            if (masked_tile && (key >= key_limit || key - query > reach)) prob = 0.f;
            acc_s[atom][nt][e] = prob;
            acc_dp[atom][nt][e] = prob * (acc_dp[atom][nt][e] - (e % 2 ? row_delta.y : row_delta.x));
          }
        }
      }

      // dV += P^T dO and dK += dS^T Q, the A operands straight from the accumulators.
#pragma unroll
      for (int kk = 0; kk < kBlockM / 16; ++kk) {
        uint32_t a[kAtoms][4];
#pragma unroll
        for (int atom = 0; atom < kAtoms; ++atom)
          accumulators_to_a<T>(a[atom], acc_s[atom][2 * kk], acc_s[atom][2 * kk + 1]);
#pragma unroll
        for (int dt = 0; dt < kColTiles; dt += 2) {
          uint32_t b[4];
          ldmatrix_x4_trans(b, do_tile + query_bt + (kk * 16 * kStride + dt * 8) * kElement);
#pragma unroll
          for (int atom = 0; atom < kAtoms; ++atom) {
            mma_16816<T>(acc_dv[atom][dt], a[atom], b[0], b[1]);
            mma_16816<T>(acc_dv[atom][dt + 1], a[atom], b[2], b[3]);
          }
        }
      }
#pragma unroll
      for (int kk = 0; kk < kBlockM / 16; ++kk) {
        uint32_t a[kAtoms][4];
#pragma unroll
        for (int atom = 0; atom < kAtoms; ++atom)
          accumulators_to_a<T>(a[atom], acc_dp[atom][2 * kk], acc_dp[atom][2 * kk + 1]);
#pragma unroll
        for (int dt = 0; dt < kColTiles; dt += 2) {
          uint32_t b[4];
          ldmatrix_x4_trans(b, q_tile + query_bt + (kk * 16 * kStride + dt * 8) * kElement);
#pragma unroll
          for (int atom = 0; atom < kAtoms; ++atom) {
            mma_16816<T>(acc_dk[atom][dt], a[atom], b[0], b[1]);
            mma_16816<T>(acc_dk[atom][dt + 1], a[atom], b[2], b[3]);
          }
        }
      }
    }  // !warp_idle

    // dS^T to shared memory (rows: keys) for the dQ product, whose warps own query rows.
#pragma unroll
    for (int atom = 0; atom < kAtoms; ++atom) {
#pragma unroll
      for (int nt = 0; nt < kQueryTiles; ++nt) {
        T* top = sds_pointer + (key0 + atom * 16 + group) * kScoreStride + nt * 8 + tig * 2;
        *reinterpret_cast<uint32_t*>(top) = pack2<T>(acc_dp[atom][nt][0], acc_dp[atom][nt][1]);
        *reinterpret_cast<uint32_t*>(top + 8 * kScoreStride) = pack2<T>(acc_dp[atom][nt][2], acc_dp[atom][nt][3]);
      }
    }
    __syncthreads();  // dS^T is visible; every warp is done with this Q/dO buffer

    // dQ[kBlockM, kD] += dS K: A = dS read transposed out of dS^T, B = K read transposed.
    float acc_dq[kDqCols / 8][4] = {};
#pragma unroll
    for (int kk = 0; kk < kBlockN / 16; ++kk) {
      uint32_t a[4];
      ldmatrix_x4_trans(a, ds_a + kk * 16 * kScoreStride * kElement);
#pragma unroll
      for (int dt = 0; dt < kDqCols / 8; dt += 2) {
        uint32_t b[4];
        ldmatrix_x4_trans(b, k_bt + (kk * 16 * kStride + dt * 8) * kElement);
        mma_16816<T>(acc_dq[dt], a, b[0], b[1]);
        mma_16816<T>(acc_dq[dt + 1], a, b[2], b[3]);
      }
    }
    float* dq = p.dq_accum + batch * p.tq * p.qk_cols;
#pragma unroll
    for (int dt = 0; dt < kDqCols / 8; ++dt) {
      const int col = dq_d * kDqCols + dt * 8 + tig * 2;
      if (col >= p.qk_cols) continue;
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        const int64_t row = m0 + dq_m * 16 + group + h * 8;
        if (row >= p.tq) continue;
        float* target = dq + row * p.qk_cols + col;
#if __CUDA_ARCH__ >= 900
        atomicAdd(reinterpret_cast<float2*>(target), make_float2(acc_dq[dt][2 * h], acc_dq[dt][2 * h + 1]));
#else
        atomicAdd(target, acc_dq[dt][2 * h]);
        atomicAdd(target + 1, acc_dq[dt][2 * h + 1]);
#endif
      }
    }
  }

  // Keys past tk are not stored; keys no query sees get zeros.
  T* dk = const_cast<T*>(p.dk.matrix<T>(batch));
  T* dv = const_cast<T*>(p.dv.matrix<T>(batch));
#pragma unroll
  for (int atom = 0; atom < kAtoms; ++atom) {
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const int64_t key = n0 + key0 + atom * 16 + group + h * 8;
      if (key >= p.tk) continue;
#pragma unroll
      for (int dt = 0; dt < kColTiles; ++dt) {
        const int col = dt * 8 + tig * 2;
        store_pair<T>(dk + key * p.dk.row_stride, col, p.head_dim, acc_dk[atom][dt][2 * h] * p.scale,
                      acc_dk[atom][dt][2 * h + 1] * p.scale);
        store_pair<T>(dv + key * p.dv.row_stride, col, p.value_dim, acc_dv[atom][dt][2 * h],
                      acc_dv[atom][dt][2 * h + 1]);
      }
    }
  }
}

}  // namespace colossal::ops::cuda::attention
