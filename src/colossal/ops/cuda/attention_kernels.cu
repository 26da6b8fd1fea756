// CUDA scaled dot-product attention, forward and backward, under the contract of ops/nn_kernels.h.
// bf16/f16 problems that cuDNN's fused attention engine takes run there (attention_cudnn.h: [B, H,
// T, D] with Tq == Tk; PyTorch's kernels, 1.6x our forward and 1.3x our backward on an H100). Other
// bf16/f16 problems with head dimensions up to 128 run the FlashAttention-2 kernels of
// attention_flash.cuh on the tensor cores (padded to 64 or 128); f32, f64 and wider heads run the
// simple kernels of attention_simple.cuh. All save only each row's logsumexp (natural log, so the
// forward of one and the backward of another agree); the backward recomputes P from it.
//
// Note [dQ through atomics]
// The flash backward gives each CTA a block of keys, so dK and dV stay in its registers, while
// every CTA adds its share of dQ = dS K into an f32 buffer with atomics (converted to T at the
// end), as FlashAttention-2 does. The deterministic alternative, a second pass over query tiles
// recomputing S and dP, costs 7 products instead of 5 (+40% FLOPs) for a backward that is
// already the slower half; the price of atomics is that dQ's f32 sums may differ in the last bits
// from run to run (below bf16/f16 resolution almost always). The simple kernels are deterministic.
#include <cuda_runtime.h>

#include <algorithm>
#include <climits>
#include <optional>
#include <vector>

#include "colossal/core/cuda/launch.cuh"        // stream_of, check_on_device, Vec, aligned16
#include "colossal/core/view.h"                 // contiguous_raw
#include "colossal/ops/cuda/attention_cudnn.h"  // cuDNN's fused engine, tried first
#include "colossal/ops/cuda/attention_flash.cuh"
#include "colossal/ops/cuda/attention_simple.cuh"
#include "colossal/ops/nn_kernels.h"

namespace colossal::ops {
namespace {

using namespace cuda::attention;  // NOLINT: the kernels and their parameter blocks

constexpr const char* kOp = "scaled_dot_product_attention";
/// A multiple of the flash backward's query tiles; the saved statistics are padded to it.
constexpr int kStatsPadding = 64;

struct AttentionShape {
  int64_t batch, tq, tk, head_dim, value_dim;
};

AttentionShape shape_of(const Tensor& q, const Tensor& k, const Tensor& v) {
  int64_t batch = 1;
  for (int64_t d = 0; d < q.dim() - 2; ++d) batch *= q.size(d);
  return {batch, q.size(-2), k.size(-2), q.size(-1), v.size(-1)};
}

void check_supported(const AttentionShape& s, const Tensor& q, const Tensor& v) {
  COLOSSAL_CHECK(s.head_dim <= kSimpleMaxDim && s.value_dim <= kSimpleMaxDim,
                 "{}: CUDA attention supports head dimensions up to {}, got q {} and v {} (head_dim {}, value_dim "
                 "{}); split the heads further or run on the CPU",
                 kOp, kSimpleMaxDim, q.shape(), v.shape(), s.head_dim, s.value_dim);
  COLOSSAL_CHECK(s.batch <= INT_MAX, "{}: {} (batch, head) matrices exceed the CUDA grid limit of {}", kOp, s.batch,
                 INT_MAX);
}

/// Whether the tensor-core kernels take this problem (otherwise the simple kernels do).
template <class T>
bool use_flash(const AttentionShape& s) {
  return kIs16Bit<T> && s.head_dim > 0 && s.tk > 0 && std::max(s.head_dim, s.value_dim) <= 128;
}

/// Tiles along grid.y must stay within CUDA's 65535.
void check_tiles(int64_t length, int64_t tile, const char* what) {
  COLOSSAL_CHECK(ceil_div(length, tile) <= 65535, "{}: {} of {} is too long for the CUDA kernels (at most {})", kOp,
                 what, length, 65535 * tile);
}

template <class Kernel>
void allow_shared_memory(Kernel kernel, size_t bytes, int device) {
  if (bytes <= 48 * 1024) return;
  int limit = 0;
  COLOSSAL_CUDA_CHECK(cudaDeviceGetAttribute(&limit, cudaDevAttrMaxSharedMemoryPerBlockOptin, device));
  COLOSSAL_CHECK(bytes <= static_cast<size_t>(limit),
                 "{}: the kernel needs {} bytes of shared memory per block, the GPU allows {}", kOp, bytes, limit);
  COLOSSAL_CUDA_CHECK(
      cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(bytes)));
}

// ---- operand descriptions

/// t's batch dimensions merged where the strides allow (size-1 dimensions dropped); nullopt when
/// more than kMaxBatchDims remain.
std::optional<MatrixOperand> describe(const Tensor& t) {
  std::vector<std::pair<int64_t, int64_t>> dims;  // (size, stride), outermost first
  for (int64_t d = 0; d < t.dim() - 2; ++d) {
    if (t.size(d) == 1) continue;
    if (!dims.empty() && dims.back().second == t.stride(d) * t.size(d)) {
      dims.back() = {dims.back().first * t.size(d), t.stride(d)};
    } else {
      dims.emplace_back(t.size(d), t.stride(d));
    }
  }
  if (dims.size() > static_cast<size_t>(kMaxBatchDims)) return std::nullopt;
  MatrixOperand m;
  m.data = t.raw_data();
  m.row_stride = t.stride(-2);
  m.col_stride = t.stride(-1);
  m.batch_dims = static_cast<int>(dims.size());
  for (size_t i = 0; i < dims.size(); ++i) {
    m.batch_sizes[i] = dims[i].first;
    m.batch_strides[i] = dims[i].second;
  }
  return m;
}

/// A contiguous [batch, rows, cols] buffer as an operand.
MatrixOperand contiguous_operand(const void* data, int64_t batch, int64_t rows, int64_t cols) {
  MatrixOperand m;
  m.data = data;
  m.row_stride = cols;
  m.col_stride = 1;
  m.batch_dims = 1;
  m.batch_sizes[0] = batch;
  m.batch_strides[0] = rows * cols;
  return m;
}

/// An operand for the simple kernels, which take any strides; `keep` holds a copy if one was needed.
MatrixOperand simple_operand(const Tensor& t, Tensor& keep) {
  if (auto m = describe(t)) return *m;
  keep = core::contiguous_raw(t);
  return *describe(keep);
}

/// Whether vector accesses of `elements` consecutive elements (`bytes` wide) fit m: unit column
/// stride, every row and batch entry starting at a multiple of `elements`, a `bytes`-aligned start.
bool vector_rows(const MatrixOperand& m, int64_t elements, uintptr_t bytes) {
  bool ok = m.col_stride == 1 && m.row_stride % elements == 0 && reinterpret_cast<uintptr_t>(m.data) % bytes == 0;
  for (int d = 0; d < m.batch_dims; ++d) ok = ok && m.batch_strides[d] % elements == 0;
  return ok;
}

/// An output the flash kernels can write in place: unit column stride and, when the row has an
/// even number of columns (stored two at a time as one 32-bit word), pairs that start aligned.
/// Contiguous tensors and [B, T, H, D] memory viewed as [B, H, T, D] qualify.
std::optional<MatrixOperand> flash_output(const Tensor& t) {
  std::optional<MatrixOperand> m = describe(t);
  if (!m || m->col_stride != 1) return std::nullopt;
  if (t.size(-1) % 2 == 0 && !vector_rows(*m, 2, 4)) return std::nullopt;
  return m;
}

/// Where a kernel writes output `target`: the tensor itself when it can (`direct`), else a
/// contiguous temporary that finish() copies into target.
struct OutputBuffer {
  Tensor target, buffer;
  OutputBuffer(const Tensor& t, bool direct)
      : target(t), buffer(direct ? t : core::empty(t.shape(), TensorOptions(t.dtype(), t.device()))) {}
  void finish() const {
    if (target.numel() > 0 && buffer.raw_data() != target.raw_data()) core::copy_stub(target.device(), target, buffer);
  }
};

/// dst[b, r, c] = src's element (b, r, c) for c < cols, 0 for cols <= c < padded_cols.
template <class T>
__global__ void pack_operand_kernel(T* dst, const MatrixOperand src, int64_t rows, int64_t cols, int64_t padded_cols,
                                    int64_t total) {
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < total; i += int64_t{gridDim.x} * blockDim.x) {
    const int64_t c = i % padded_cols, rest = i / padded_cols;
    const int64_t r = rest % rows, b = rest / rows;
    dst[i] = c < cols ? src.matrix<T>(b)[r * src.row_stride + c * src.col_stride] : T(0.f);
  }
}

/// An operand of the flash kernels: `cols` (a multiple of 8) columns readable with 16-byte
/// copies; `storage` holds the packed copy when the tensor itself is not laid out for that.
struct FlashOperand {
  MatrixOperand matrix;
  int cols;
  Tensor storage;
};

/// Rows must be 16-byte aligned runs of a multiple of 8 elements (every batch entry too); a
/// transposed [B, T, H, D] view or broadcast heads qualify, other layouts are packed first.
template <class T>
FlashOperand flash_operand(const Tensor& t, int64_t batch, cudaStream_t stream) {
  const int64_t rows = t.size(-2), cols = t.size(-1);
  const std::optional<MatrixOperand> m = describe(t);
  if (m && cols % 8 == 0 && vector_rows(*m, 8, 16)) return {*m, static_cast<int>(cols), Tensor()};

  Tensor keep;
  const MatrixOperand source = simple_operand(t, keep);
  const int64_t padded_cols = ceil_div<int64_t>(cols, 8) * 8;
  Tensor packed = core::empty({batch, rows, padded_cols}, TensorOptions(t.dtype(), t.device()));
  const int64_t total = packed.numel();
  pack_operand_kernel<T><<<core::cuda_detail::grid_for(total), core::cuda_detail::kThreads, 0, stream>>>(
      packed.data<T>(), source, rows, cols, padded_cols, total);
  COLOSSAL_CUDA_CHECK_LAUNCH();
  return {contiguous_operand(packed.raw_data(), batch, rows, padded_cols), static_cast<int>(padded_cols), packed};
}

// ---- forward

template <class Cfg>
void launch_flash_forward(const FlashForwardParams& p, int64_t batch, int device, cudaStream_t stream) {
  check_tiles(p.tq, Cfg::kBlockM, "a query length");
  allow_shared_memory(flash_forward_kernel<Cfg>, Cfg::kSmemBytes, device);
  const dim3 grid(static_cast<unsigned>(batch), static_cast<unsigned>(ceil_div<int64_t>(p.tq, Cfg::kBlockM)));
  flash_forward_kernel<Cfg><<<grid, Cfg::kThreads, Cfg::kSmemBytes, stream>>>(p);
  COLOSSAL_CUDA_CHECK_LAUNCH();
}

template <class T>
void flash_forward(const Tensor& out, const Tensor& lse, const Tensor& q, const Tensor& k, const Tensor& v,
                   const AttentionShape& s, const AttentionParams& params, cudaStream_t stream) {
  const FlashOperand fq = flash_operand<T>(q, s.batch, stream), fk = flash_operand<T>(k, s.batch, stream),
                     fv = flash_operand<T>(v, s.batch, stream);
  const OutputBuffer o(out, flash_output(out).has_value());
  FlashForwardParams p;
  p.q = fq.matrix;
  p.k = fk.matrix;
  p.v = fv.matrix;
  p.out = *flash_output(o.buffer);
  p.lse = lse.data<float>();
  p.tq = s.tq;
  p.tk = s.tk;
  p.qk_cols = fq.cols;  // equal to fk.cols: both are round_up(head_dim, 8)
  p.v_cols = fv.cols;
  p.value_dim = static_cast<int>(s.value_dim);
  p.scale_log2 = static_cast<float>(params.scale) * kLog2e;
  p.causal = params.causal;
  const int device = q.device().index;
  // 128 query rows (32 per warp, sharing each K/V fragment between two mma row tiles) against
  // 64-key tiles keeps S, O and the statistics within 255 registers at head dimension 128.
  if (std::max(p.qk_cols, p.v_cols) <= 64) {
    launch_flash_forward<FlashForwardConfig<T, 64, 128, 64, 4>>(p, s.batch, device, stream);
  } else {
    launch_flash_forward<FlashForwardConfig<T, 128, 128, 64, 4>>(p, s.batch, device, stream);
  }
  o.finish();
}

template <class T>
void simple_forward(const Tensor& out, const Tensor& lse, const Tensor& q, const Tensor& k, const Tensor& v,
                    const AttentionShape& s, const AttentionParams& params, cudaStream_t stream) {
  using A = acc_t<T>;
  constexpr int kRows = kSimpleRows<A>;
  Tensor keep_q, keep_k, keep_v;
  const OutputBuffer o(out, out.is_contiguous());
  SimpleParams p{};
  p.q = simple_operand(q, keep_q);
  p.k = simple_operand(k, keep_k);
  p.v = simple_operand(v, keep_v);
  p.tq = s.tq;
  p.tk = s.tk;
  p.head_dim = s.head_dim;
  p.value_dim = s.value_dim;
  p.scale = params.scale;
  p.causal = params.causal;
  p.out = o.buffer.raw_data();
  p.lse = lse.raw_data();
  check_tiles(s.tq, kRows, "a query length");
  const size_t smem = simple_forward_smem<A>(s.head_dim, s.value_dim);
  allow_shared_memory(simple_forward_kernel<T>, smem, q.device().index);
  const dim3 grid(static_cast<unsigned>(s.batch), static_cast<unsigned>(ceil_div<int64_t>(s.tq, kRows)));
  simple_forward_kernel<T><<<grid, kSimpleThreads, smem, stream>>>(p);
  COLOSSAL_CUDA_CHECK_LAUNCH();
  o.finish();
}

void attention_forward_cuda(const Tensor& out, const Tensor& lse, const Tensor& q, const Tensor& k, const Tensor& v,
                            const AttentionParams& params) {
  const Device device = q.device();
  for (const auto& [t, role] : {std::pair{&k, "k"}, {&v, "v"}, {&out, "the output"}, {&lse, "the logsumexp"}}) {
    core::cuda_detail::check_on_device(*t, device, kOp, role);
  }
  const AttentionShape s = shape_of(q, k, v);
  check_supported(s, q, v);
  if (s.batch == 0 || s.tq == 0 || s.value_dim == 0) return;
  if (cuda::cudnn_attention_forward(out, lse, q, k, v, params)) return;
  core::cuda::DeviceGuard guard(device);
  cudaStream_t stream = core::cuda_detail::stream_of(q);
  core::dispatch_floating(q.dtype(), kOp, [&]<class T>() {
    if constexpr (kIs16Bit<T>) {
      if (use_flash<T>(s)) return flash_forward<T>(out, lse, q, k, v, s, params, stream);
    }
    simple_forward<T>(out, lse, q, k, v, s, params, stream);
  });
}

// ---- backward

/// Where the `index`-th of `count` work items (rows, or groups of a row) lands when the items are
/// visited in memory order: item = ((outer * rows + r) * inner + h) * groups + g, batch entry
/// b = outer * inner + h. `inner` > 1 when consecutive batch entries (heads) sit side by side within
/// one row of memory ([B, T, H, D] viewed as [B, H, T, D]): visiting them together reads whole
/// token rows instead of one head's slice of every row, which the memory serves several times
/// faster. 32-bit division where the count allows (several times cheaper than 64-bit).
struct RowItem {
  int64_t b, r, g;
};
__device__ __forceinline__ RowItem row_item(int64_t index, int64_t count, int64_t rows, int64_t inner, int64_t groups) {
  if (count <= UINT32_MAX) {
    auto rest = static_cast<uint32_t>(index);
    const uint32_t q0 = rest / static_cast<uint32_t>(groups);
    const uint32_t g = rest - q0 * static_cast<uint32_t>(groups);
    const uint32_t q1 = q0 / static_cast<uint32_t>(inner);
    const uint32_t h = q0 - q1 * static_cast<uint32_t>(inner);
    const uint32_t outer = q1 / static_cast<uint32_t>(rows);
    const uint32_t r = q1 - outer * static_cast<uint32_t>(rows);
    return {int64_t{outer} * inner + h, r, g};
  }
  const int64_t q0 = index / groups, q1 = q0 / inner;
  return {(q1 / rows) * inner + q0 % inner, q1 % rows, index % groups};
}

/// How many consecutive batch entries of `m` share its rows of memory (row_item's `inner`): the
/// innermost batch dimension's size when its stride is below the row stride (heads interleaved
/// within each token's row), else 1.
int64_t interleaved_entries(const MatrixOperand& m) {
  if (m.batch_dims == 0) return 1;
  const int last = m.batch_dims - 1;
  return m.batch_strides[last] > 0 && m.batch_strides[last] < m.row_stride ? m.batch_sizes[last] : 1;
}

/// delta[b, i] = rowsum(dout * out) and lse_bwd[b, i] = lse * lse_factor, +inf for a row that
/// sees no key (so that its recomputed P is 0 rather than inf); rows tq <= i < tq_padded get
/// delta 0 and lse_bwd +inf. A team of 8 lanes per row, kVec elements per load; the rows visited
/// in out's memory order (row_item, `inner` interleaved batch entries).
template <class T, int kVec>
__global__ void backward_statistics_kernel(const MatrixOperand out, const MatrixOperand dout, const acc_t<T>* lse,
                                           acc_t<T>* lse_bwd, acc_t<T>* delta, int64_t rows_padded, int64_t tq,
                                           int64_t tq_padded, int64_t cols, acc_t<T> lse_factor, int64_t inner) {
  using A = acc_t<T>;
  constexpr int kTeam = 8;
  const int64_t team = (blockIdx.x * int64_t{blockDim.x} + threadIdx.x) / kTeam;
  const int rank = static_cast<int>(threadIdx.x) % kTeam;
  const RowItem item = row_item(team, rows_padded, tq_padded, inner, 1);
  const int64_t b = item.b, i = item.r;
  const bool real = team < rows_padded && i < tq;
  A dot = 0;
  if (real) {
    // kVec > 1 only for unit column strides (the launch checks).
    const T* out_row = out.matrix<T>(b) + i * out.row_stride;
    const T* dout_row = dout.matrix<T>(b) + i * dout.row_stride;
    for (int64_t c = int64_t{rank} * kVec; c < cols; c += kTeam * kVec) {
      const auto o = *reinterpret_cast<const core::cuda_detail::Vec<T, kVec>*>(out_row + c * out.col_stride);
      const auto g = *reinterpret_cast<const core::cuda_detail::Vec<T, kVec>*>(dout_row + c * dout.col_stride);
#pragma unroll
      for (int j = 0; j < kVec; ++j) dot += to_acc(o.v[j]) * to_acc(g.v[j]);
    }
  }
#pragma unroll
  for (int offset = kTeam / 2; offset > 0; offset /= 2) dot += __shfl_xor_sync(0xffffffffu, dot, offset);
  if (team < rows_padded && rank == 0) {
    const A row_lse = real ? lse[b * tq + i] : A(-INFINITY);
    delta[b * tq_padded + i] = dot;
    lse_bwd[b * tq_padded + i] = row_lse == A(-INFINITY) ? A(INFINITY) : row_lse * lse_factor;
  }
}

/// dq = accum * scale, dropping the accumulator's padding columns; dq [batch, tq, cols] any strides.
/// Each thread converts kVec consecutive columns of one row (kVec divides cols; with kVec > 1 dq
/// has unit column stride and 16-byte aligned rows), finding the row's matrix once.
template <class T, int kVec>
__global__ void dq_from_accumulator_kernel(const MatrixOperand dq, const float* accum, int64_t tq, int64_t rows,
                                           int64_t cols, int64_t accum_cols, float scale, int64_t inner) {
  const int64_t groups_per_row = cols / kVec;
  const int64_t total = rows * groups_per_row;
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < total; i += int64_t{gridDim.x} * blockDim.x) {
    // Visited in dq's memory order (row_item): the writes stream, the accumulator's rows are read whole.
    const RowItem item = row_item(i, total, tq, inner, groups_per_row);
    const int64_t b = item.b, r = item.r, row = b * tq + r;
    const int64_t c = item.g * kVec;
    T* dst = const_cast<T*>(dq.matrix<T>(b)) + r * dq.row_stride + c * dq.col_stride;
    const float* src = accum + row * accum_cols + c;
    if constexpr (kVec == 8) {
      const float4 lo = reinterpret_cast<const float4*>(src)[0], hi = reinterpret_cast<const float4*>(src)[1];
      core::cuda_detail::Vec<T, 8> v;
      v.v[0] = from_acc<T>(lo.x * scale), v.v[1] = from_acc<T>(lo.y * scale);
      v.v[2] = from_acc<T>(lo.z * scale), v.v[3] = from_acc<T>(lo.w * scale);
      v.v[4] = from_acc<T>(hi.x * scale), v.v[5] = from_acc<T>(hi.y * scale);
      v.v[6] = from_acc<T>(hi.z * scale), v.v[7] = from_acc<T>(hi.w * scale);
      *reinterpret_cast<core::cuda_detail::Vec<T, 8>*>(dst) = v;
    } else {
      *dst = from_acc<T>(*src * scale);
    }
  }
}

template <class Cfg>
void launch_flash_backward(const FlashBackwardParams& p, int64_t batch, int device, cudaStream_t stream) {
  static_assert(kStatsPadding % Cfg::kBlockM == 0, "the statistics cover whole query tiles");
  check_tiles(p.tk, Cfg::kBlockN, "a key length");
  allow_shared_memory(flash_backward_kernel<Cfg>, Cfg::kSmemBytes, device);
  const dim3 grid(static_cast<unsigned>(batch), static_cast<unsigned>(ceil_div<int64_t>(p.tk, Cfg::kBlockN)));
  flash_backward_kernel<Cfg><<<grid, Cfg::kThreads, Cfg::kSmemBytes, stream>>>(p);
  COLOSSAL_CUDA_CHECK_LAUNCH();
}

/// Columns of the flash backward's dQ accumulator: the head dimension padded as flash_operand pads q.
int64_t flash_accum_cols(const AttentionShape& s) {
  return ceil_div<int64_t>(s.head_dim, 8) * 8;
}

/// `dq_accum` ([batch, tq, flash_accum_cols], f32) must be zeroed.
template <class T>
void flash_backward(const Tensor& grad_q, const Tensor& grad_k, const Tensor& grad_v, const Tensor& grad_out,
                    const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& lse_bwd, const Tensor& delta,
                    const Tensor& dq_accum, const AttentionShape& s, const AttentionParams& params,
                    cudaStream_t stream) {
  const FlashOperand fq = flash_operand<T>(q, s.batch, stream), fk = flash_operand<T>(k, s.batch, stream),
                     fv = flash_operand<T>(v, s.batch, stream), fdo = flash_operand<T>(grad_out, s.batch, stream);
  COLOSSAL_CHECK(fq.cols == dq_accum.size(-1), "{}: dQ accumulator of {} columns for q padded to {}", kOp,
                 dq_accum.size(-1), fq.cols);
  const OutputBuffer dk(grad_k, flash_output(grad_k).has_value()), dv(grad_v, flash_output(grad_v).has_value()),
      dq(grad_q, describe(grad_q).has_value());
  FlashBackwardParams p;
  p.q = fq.matrix;
  p.k = fk.matrix;
  p.v = fv.matrix;
  p.dout = fdo.matrix;
  p.lse = lse_bwd.data<float>();
  p.delta = delta.data<float>();
  p.dq_accum = dq_accum.data<float>();
  p.dk = *flash_output(dk.buffer);
  p.dv = *flash_output(dv.buffer);
  p.tq = s.tq;
  p.tk = s.tk;
  p.tq_padded = lse_bwd.size(-1);
  p.qk_cols = fq.cols;
  p.v_cols = fv.cols;  // equal to fdo.cols: both are round_up(value_dim, 8)
  p.head_dim = static_cast<int>(s.head_dim);
  p.value_dim = static_cast<int>(s.value_dim);
  p.scale = static_cast<float>(params.scale);
  p.scale_log2 = p.scale * kLog2e;
  p.causal = params.causal;
  const int device = q.device().index;
  // 128 keys per CTA. Up to 64 columns: 4 warps of 32 keys against 32-query tiles, two CTAs per
  // SM; each Q/dO fragment a warp loads feeds two key tiles, a quarter less shared-memory traffic
  // per product than 16 keys a warp (the kernel's bound). At 128 columns the accumulators of 32
  // keys do not fit the registers: 8 warps of 16 keys against 64-query tiles.
  if (std::max(p.qk_cols, p.v_cols) <= 64) {
    launch_flash_backward<FlashBackwardConfig<T, 64, 32, 128, 4, 2, 2>>(p, s.batch, device, stream);
  } else {
    launch_flash_backward<FlashBackwardConfig<T, 128, 64, 128, 8>>(p, s.batch, device, stream);
  }
  const int64_t rows = s.batch * s.tq;
  const MatrixOperand dq_m = *describe(dq.buffer);
  // The accumulator's rows are fq.cols (a multiple of 8) floats: 32-byte aligned groups of 8.
  if (s.head_dim % 8 == 0 && vector_rows(dq_m, 8, 16)) {
    dq_from_accumulator_kernel<T, 8>
        <<<core::cuda_detail::grid_for(rows * s.head_dim, 8), core::cuda_detail::kThreads, 0, stream>>>(
            dq_m, p.dq_accum, s.tq, rows, s.head_dim, fq.cols, p.scale, interleaved_entries(dq_m));
  } else {
    dq_from_accumulator_kernel<T, 1>
        <<<core::cuda_detail::grid_for(rows * s.head_dim), core::cuda_detail::kThreads, 0, stream>>>(
            dq_m, p.dq_accum, s.tq, rows, s.head_dim, fq.cols, p.scale, interleaved_entries(dq_m));
  }
  COLOSSAL_CUDA_CHECK_LAUNCH();
  for (const OutputBuffer* b : {&dq, &dk, &dv}) b->finish();
}

template <class T>
void simple_backward(const Tensor& grad_q, const Tensor& grad_k, const Tensor& grad_v, const Tensor& grad_out,
                     const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& lse_bwd, const Tensor& delta,
                     const AttentionShape& s, const AttentionParams& params, cudaStream_t stream) {
  using A = acc_t<T>;
  constexpr int kRows = kSimpleRows<A>;
  Tensor keep_q, keep_k, keep_v;
  // These kernels read dout and write the gradients as contiguous tensors.
  const Tensor dout = core::contiguous_raw(grad_out);
  const OutputBuffer dq(grad_q, grad_q.is_contiguous()), dk(grad_k, grad_k.is_contiguous()),
      dv(grad_v, grad_v.is_contiguous());
  SimpleParams p{};
  p.q = simple_operand(q, keep_q);
  p.k = simple_operand(k, keep_k);
  p.v = simple_operand(v, keep_v);
  p.tq = s.tq;
  p.tk = s.tk;
  p.head_dim = s.head_dim;
  p.value_dim = s.value_dim;
  p.scale = params.scale;
  p.causal = params.causal;
  p.dout = dout.raw_data();
  p.lse_bwd = lse_bwd.raw_data();
  p.delta = delta.raw_data();
  p.tq_padded = lse_bwd.size(-1);
  p.dq = dq.buffer.raw_data();
  p.dk = dk.buffer.raw_data();
  p.dv = dv.buffer.raw_data();
  check_tiles(s.tq, kRows, "a query length");
  check_tiles(s.tk, kRows, "a key length");
  const size_t smem = simple_backward_smem<A>(s.head_dim, s.value_dim);
  const int device = q.device().index;
  allow_shared_memory(simple_backward_dq_kernel<T>, smem, device);
  allow_shared_memory(simple_backward_dkdv_kernel<T>, smem, device);
  if (s.head_dim > 0) {
    const dim3 grid(static_cast<unsigned>(s.batch), static_cast<unsigned>(ceil_div<int64_t>(s.tq, kRows)));
    simple_backward_dq_kernel<T><<<grid, kSimpleThreads, smem, stream>>>(p);
    COLOSSAL_CUDA_CHECK_LAUNCH();
  }
  const dim3 grid(static_cast<unsigned>(s.batch), static_cast<unsigned>(ceil_div<int64_t>(s.tk, kRows)));
  simple_backward_dkdv_kernel<T><<<grid, kSimpleThreads, smem, stream>>>(p);
  COLOSSAL_CUDA_CHECK_LAUNCH();
  for (const OutputBuffer* b : {&dq, &dk, &dv}) b->finish();
}

void zero_(const Tensor& t, cudaStream_t stream) {
  if (t.numel() > 0) {
    COLOSSAL_CUDA_CHECK(cudaMemsetAsync(t.raw_data(), 0, t.numel() * core::element_size(t.dtype()), stream));
  }
}

void attention_backward_cuda(const Tensor& grad_q, const Tensor& grad_k, const Tensor& grad_v, const Tensor& grad_out,
                             const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& out, const Tensor& lse,
                             const AttentionParams& params) {
  const char* op = "scaled_dot_product_attention backward";
  const Device device = q.device();
  for (const auto& [t, role] : {std::pair{&k, "k"},
                                {&v, "v"},
                                {&out, "the output"},
                                {&lse, "the logsumexp"},
                                {&grad_out, "grad_out"},
                                {&grad_q, "grad_q"},
                                {&grad_k, "grad_k"},
                                {&grad_v, "grad_v"}}) {
    core::cuda_detail::check_on_device(*t, device, op, role);
  }
  const AttentionShape s = shape_of(q, k, v);
  check_supported(s, q, v);
  core::cuda::DeviceGuard guard(device);
  cudaStream_t stream = core::cuda_detail::stream_of(q);
  if (s.batch == 0) return;
  if (s.tq == 0 || s.tk == 0 || s.value_dim == 0) {
    // No query, no key or an empty output: the output does not depend on the inputs.
    for (const Tensor* g : {&grad_q, &grad_k, &grad_v}) zero_(*g, stream);
    return;
  }
  if (cuda::cudnn_attention_backward(grad_q, grad_k, grad_v, grad_out, q, k, v, out, lse, params)) return;
  core::dispatch_floating(q.dtype(), op, [&]<class T>() {
    using A = acc_t<T>;
    const bool flash = use_flash<T>(s);
    const TensorOptions stats(std::is_same_v<A, double> ? DType::f64 : DType::f32, device);
    const int64_t tq_padded = ceil_div<int64_t>(s.tq, kStatsPadding) * kStatsPadding;
    Tensor lse_bwd = core::empty({s.batch, tq_padded}, stats), delta = core::empty({s.batch, tq_padded}, stats);
    const int64_t rows_padded = s.batch * tq_padded;
    const unsigned blocks = static_cast<unsigned>(ceil_div<int64_t>(rows_padded * 8, core::cuda_detail::kThreads));
    // The flash kernels work in log2 units; the simple ones call exp.
    const A lse_factor = flash ? A(kLog2e) : A(1);
    // The flash backward adds dQ into an f32 buffer (Note [dQ through atomics]), zeroed here.
    Tensor dq_accum;
    if (flash) {
      dq_accum = core::empty({s.batch, s.tq, flash_accum_cols(s)}, TensorOptions(DType::f32, device));
      zero_(dq_accum, stream);
    }
    // out and grad_out may be strided views (a [B, T, H, D] buffer seen as [B, H, T, D]).
    constexpr int kVec = 16 / sizeof(T);
    Tensor keep_out, keep_dout;
    const MatrixOperand out_m = simple_operand(out, keep_out), dout_m = simple_operand(grad_out, keep_dout);
    if (s.value_dim % kVec == 0 && vector_rows(out_m, kVec, 16) && vector_rows(dout_m, kVec, 16)) {
      backward_statistics_kernel<T, kVec><<<blocks, core::cuda_detail::kThreads, 0, stream>>>(
          out_m, dout_m, lse.data<A>(), lse_bwd.data<A>(), delta.data<A>(), rows_padded, s.tq, tq_padded, s.value_dim,
          lse_factor, interleaved_entries(out_m));
    } else {
      backward_statistics_kernel<T, 1><<<blocks, core::cuda_detail::kThreads, 0, stream>>>(
          out_m, dout_m, lse.data<A>(), lse_bwd.data<A>(), delta.data<A>(), rows_padded, s.tq, tq_padded, s.value_dim,
          lse_factor, interleaved_entries(out_m));
    }
    COLOSSAL_CUDA_CHECK_LAUNCH();
    if constexpr (kIs16Bit<T>) {
      if (flash) {
        return flash_backward<T>(grad_q, grad_k, grad_v, grad_out, q, k, v, lse_bwd, delta, dq_accum, s, params,
                                 stream);
      }
    }
    simple_backward<T>(grad_q, grad_k, grad_v, grad_out, q, k, v, lse_bwd, delta, s, params, stream);
  });
}

COLOSSAL_REGISTER_KERNEL(attention_forward_stub, core::DeviceType::cuda, attention_forward_cuda);
COLOSSAL_REGISTER_KERNEL(attention_backward_stub, core::DeviceType::cuda, attention_backward_cuda);

}  // namespace
}  // namespace colossal::ops
