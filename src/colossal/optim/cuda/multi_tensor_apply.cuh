// The multi-tensor launcher the fused CUDA optimizers share (apex's multi_tensor_apply, in our
// terms): it packs the chunks of many tensors into one kernel's arguments, runs an optimizer's
// per-element update over them with 16-byte accesses, and takes per-tensor L2 norms for LAMB/LARS.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <array>
#include <climits>
#include <cstdint>
#include <type_traits>
#include <utility>
#include <vector>

#include "colossal/core/cuda/launch.cuh"  // Vec, stream_of, COLOSSAL_CUDA_CHECK_LAUNCH
#include "colossal/optim/optimizer.h"     // MultiTensorLists

namespace colossal::optim::cuda_detail {

// Note [Fused optimizer kernels]
// One optimizer step over a list of tensors runs as a few launches instead of a dozen elementwise
// launches per tensor. Each tensor is cut into chunks of kChunkElements and one block updates one
// chunk. A launch covers every chunk of up to TensorTable::kMaxTensors tensors: their data pointers,
// sizes and per-tensor scalars (bias corrections, "buffers were just created") travel in the
// kernel's arguments, within the classic 4 KiB limit, and a block finds its tensor by a binary search
// over the running chunk counts. With no per-block table a launch has no block cap, so a GPT-2-sized
// list (148 tensors) takes two or three launches, each large enough to fill the GPU.
//
// LAMB and LARS scale each tensor's update by a ratio of two norms. The first kernel also writes one
// partial sum of squares per chunk (a fixed-shape block reduction), a second kernel sums each
// tensor's partials in a fixed order and turns its norms into the trust ratio in device memory, and
// the update kernel reads it there: no host sync, and the same bits on every run. The squares are
// summed in f64, as the CPU sum does for f32 (NormSum), so a norm rounds to the reference's f32
// value in all but near-ties.
//
// Note [Fused optimizer rounding]
// The kernels reproduce the reference loops (sgd_step_reference, ...) operation for operation:
// every value the reference materialises as a tensor of the parameter's dtype is rounded to that
// dtype here as well (round_to), including the state buffers, which gather_for_update creates in
// the parameter's dtype; hyper-parameters reach the kernels converted from double on the host
// exactly as the elementwise kernels convert theirs (static_cast to acc_t); and every expression
// keeps the reference's order of operations. The CPU kernels are built without FMA
// (-march=x86-64-v2), these files with -fmad=false, and CUDA's float division and sqrt round
// correctly by default, so SGD and Adam should match the CPU reference bit for bit in every dtype.
// LAMB and LARS add their f64 sums of squares in another order than the CPU; they match too unless
// a sum lands on the other side of an f32 rounding boundary (rare; then a trust ratio moves by one
// ulp). None of this costs time in kernels bound by memory bandwidth.

constexpr int64_t kChunkElements = 65536;
constexpr int kBlockThreads = 512;
constexpr int kFinishThreads = 256;
constexpr size_t kKernelArgBytes = 4096;
/// A table leaves this much of the kernel's arguments to the op and the partials pointer.
constexpr size_t kTableBytes = kKernelArgBytes - 256;
/// Sums of squares accumulate in f64: exact to f32 rounding at any size, and one DADD per element
/// is hidden under the memory traffic.
using NormSum = double;

/// The tensors of one launch. Column k of the op's lists is data[k]; scalars are per tensor.
template <int Depth, class S, int Scalars>
struct TensorTable {
  static_assert(Depth >= 1 && Scalars >= 1);
  using Scalar = S;
  static constexpr int kDepth = Depth;
  static constexpr int kScalars = Scalars;
  static constexpr int kMaxTensors = static_cast<int>(
      (kTableBytes - 16) / (Depth * sizeof(void*) + sizeof(int64_t) + Scalars * sizeof(S) + sizeof(int32_t)));

  void* data[Depth][kMaxTensors];
  int64_t numel[kMaxTensors];
  S scalars[kMaxTensors][Scalars];
  /// Chunks of tensors 0..t together: block b works on the first tensor t with block_end[t] > b.
  int32_t block_end[kMaxTensors];
  int32_t num_tensors;
  /// Index in the whole list of this table's tensor 0 (per-tensor results such as trust ratios are
  /// indexed in the whole list).
  int32_t first_tensor;
};

/// What the host knows of one tensor of a table.
template <class Table>
struct TensorArgs {
  std::array<void*, Table::kDepth> data;
  int64_t numel = 0;
  std::array<typename Table::Scalar, Table::kScalars> scalars{};
};

inline int64_t chunks_of(int64_t numel) {
  return (numel + kChunkElements - 1) / kChunkElements;
}

/// Packs `tensors`, in order, into as few tables as fit and calls launch(table, blocks, chunk_base)
/// for each table with work; chunk_base counts the chunks (= blocks) of the tables before it, so
/// per-chunk results of all launches can share one buffer.
template <class Table, class Launch>
void for_each_table(const std::vector<TensorArgs<Table>>& tensors, Launch&& launch) {
  static_assert(sizeof(Table) <= kTableBytes, "tensor table exceeds its share of the kernel arguments");
  Table table{};
  int64_t blocks = 0;
  int64_t chunk_base = 0;
  auto flush = [&](size_t next) {
    if (blocks > 0) launch(static_cast<const Table&>(table), static_cast<int>(blocks), chunk_base);
    chunk_base += blocks;
    blocks = 0;
    table.num_tensors = 0;
    table.first_tensor = static_cast<int32_t>(next);
  };
  for (size_t i = 0; i < tensors.size(); ++i) {
    const int64_t chunks = chunks_of(tensors[i].numel);
    COLOSSAL_CHECK(chunks < INT32_MAX, "fused optimizer: a tensor of {} elements has too many chunks",
                   tensors[i].numel);
    if (table.num_tensors == Table::kMaxTensors || blocks + chunks > INT32_MAX) flush(i);
    const int slot = table.num_tensors++;
    for (int k = 0; k < Table::kDepth; ++k) table.data[k][slot] = tensors[i].data[k];
    table.numel[slot] = tensors[i].numel;
    for (int k = 0; k < Table::kScalars; ++k) table.scalars[slot][k] = tensors[i].scalars[k];
    blocks += chunks;
    table.block_end[slot] = static_cast<int32_t>(blocks);
  }
  flush(tensors.size());
}

// ---- device helpers

/// v rounded to T. For f16 and bf16 the conversion instruction: it rounds to nearest even exactly
/// as core's Half(float) and BFloat16(float) do (only a NaN's payload may differ) in one
/// instruction instead of a dozen, which matters with ten roundings per element.
template <class T>
__device__ __forceinline__ T to_storage(core::acc_t<T> v) {
  T out;
  if constexpr (std::is_same_v<T, core::BFloat16>) {
    out.bits = __bfloat16_as_ushort(__float2bfloat16_rn(v));
  } else if constexpr (std::is_same_v<T, core::Half>) {
    out.bits = __half_as_ushort(__float2half_rn(v));
  } else {
    out = static_cast<T>(v);
  }
  return out;
}

/// v as the reference holds it once written to a tensor of dtype T (the identity for f32 and f64).
/// See Note [Fused optimizer rounding].
template <class T>
__device__ __forceinline__ core::acc_t<T> round_to(core::acc_t<T> v) {
  if constexpr (std::is_same_v<T, core::BFloat16>) {
    return __bfloat162float(__float2bfloat16_rn(v));
  } else if constexpr (std::is_same_v<T, core::Half>) {
    return __half2float(__float2half_rn(v));
  } else {
    return v;
  }
}

/// Sums v[0] and v[1] over a block of kThreads threads in a fixed order; thread 0 gets the totals.
template <int kThreads, class A>
__device__ __forceinline__ void block_sum2(A (&v)[2]) {
  static_assert(kThreads % 32 == 0 && kThreads <= 1024);
  constexpr int kWarps = kThreads / 32;
  __shared__ A warp_sums[2][kWarps];
  const int lane = static_cast<int>(threadIdx.x % 32);
  const int warp = static_cast<int>(threadIdx.x / 32);
#pragma unroll
  for (int k = 0; k < 2; ++k) {
    for (int offset = 16; offset > 0; offset /= 2) v[k] += __shfl_down_sync(0xffffffffu, v[k], offset);
    if (lane == 0) warp_sums[k][warp] = v[k];
  }
  __syncthreads();
  if (warp == 0) {
#pragma unroll
    for (int k = 0; k < 2; ++k) {
      v[k] = lane < kWarps ? warp_sums[k][lane] : A(0);
      for (int offset = 16; offset > 0; offset /= 2) v[k] += __shfl_down_sync(0xffffffffu, v[k], offset);
    }
  }
}

/// Elements per vector access of multi_tensor_kernel: Op::kVecElements where the op fixes it,
/// else 16 bytes' worth of T.
template <class Op, class T>
constexpr int vector_elements() {
  if constexpr (requires { Op::kVecElements; }) {
    static_assert(Op::kVecElements * sizeof(T) <= 16 && 16 % (Op::kVecElements * sizeof(T)) == 0);
    return Op::kVecElements;
  } else {
    return static_cast<int>(16 / sizeof(T));
  }
}

/// The table slot block `block` works on: the first t with block_end[t] > block (empty tensors,
/// whose block_end repeats the previous one, are never chosen).
template <class Table>
__device__ __forceinline__ int tensor_of_block(const Table& table, int block) {
  int lo = 0, hi = table.num_tensors - 1;
  while (lo < hi) {
    const int mid = (lo + hi) / 2;
    if (table.block_end[mid] > block) {
      hi = mid;
    } else {
      lo = mid + 1;
    }
  }
  return lo;
}

/// Runs `op` over every element of the table's tensors, one chunk per block. At each element op
/// gets the values of the kDepth columns as acc_t<T>, updates the columns it writes (bit k of
/// Op::kWrites for column k; only those are stored) and may add to two sums of squares, which
/// become the chunk's partials[2 * block + {0, 1}] when Op::kNorms is 2. `op.context` turns the
/// tensor's index in the whole list and its scalars into what op needs per tensor.
template <class T, class Op, class Table>
__global__ void __launch_bounds__(kBlockThreads)
    multi_tensor_kernel(const __grid_constant__ Table table, const Op op, NormSum* __restrict__ partials) {
  using A = core::acc_t<T>;
  constexpr int kDepth = Table::kDepth;
  static_assert(Op::kDepth == kDepth, "the op and its table disagree on the number of columns");
  constexpr int kVec = vector_elements<Op, T>();
  using V = core::cuda_detail::Vec<T, kVec>;

  const int block = static_cast<int>(blockIdx.x);
  const int t = tensor_of_block(table, block);
  const int64_t begin = int64_t{block - (t > 0 ? table.block_end[t - 1] : 0)} * kChunkElements;
  const int n = static_cast<int>(min(kChunkElements, table.numel[t] - begin));
  T* ptr[kDepth];
  bool aligned = true;
#pragma unroll
  for (int k = 0; k < kDepth; ++k) {
    ptr[k] = static_cast<T*>(table.data[k][t]) + begin;
    aligned = aligned && reinterpret_cast<uintptr_t>(ptr[k]) % sizeof(V) == 0;
  }
  const typename Op::Context context = op.context(table.first_tensor + t, table.scalars[t]);
  NormSum sums[2] = {0.0, 0.0};

  int scalar_start = static_cast<int>(threadIdx.x);
  if (aligned) {
    // Chunks start at multiples of 65536 elements, so an aligned tensor has aligned chunks.
    const int n_vec = n / kVec;
    for (int i = static_cast<int>(threadIdx.x); i < n_vec; i += kBlockThreads) {
      V v[kDepth];
#pragma unroll
      for (int k = 0; k < kDepth; ++k) v[k] = reinterpret_cast<const V*>(ptr[k])[i];
#pragma unroll
      for (int j = 0; j < kVec; ++j) {
        A x[kDepth];
#pragma unroll
        for (int k = 0; k < kDepth; ++k) x[k] = static_cast<A>(v[k].v[j]);
        op(x, context, sums);
#pragma unroll
        for (int k = 0; k < kDepth; ++k) {
          if ((Op::kWrites >> k) & 1u) v[k].v[j] = to_storage<T>(x[k]);
        }
      }
#pragma unroll
      for (int k = 0; k < kDepth; ++k) {
        if ((Op::kWrites >> k) & 1u) reinterpret_cast<V*>(ptr[k])[i] = v[k];
      }
    }
    scalar_start += n_vec * kVec;
  }
  if constexpr (Op::kNorms > 0) {
    // A misaligned chunk is visited in the vectors' order, element by element, so that each
    // thread's sums add the same elements in the same order whatever the alignment (Note [Sums
    // of squares in one order] in clip_grad_kernels.cu).
    if (!aligned) {
      const int n_vec = n / kVec;
      for (int i = static_cast<int>(threadIdx.x); i < n_vec; i += kBlockThreads) {
#pragma unroll
        for (int j = 0; j < kVec; ++j) {
          A x[kDepth];
#pragma unroll
          for (int k = 0; k < kDepth; ++k) x[k] = static_cast<A>(ptr[k][i * kVec + j]);
          op(x, context, sums);
#pragma unroll
          for (int k = 0; k < kDepth; ++k) {
            if ((Op::kWrites >> k) & 1u) ptr[k][i * kVec + j] = to_storage<T>(x[k]);
          }
        }
      }
      scalar_start += n_vec * kVec;
    }
  }
  // The tail that does not fill a vector, or the whole chunk when some column is misaligned.
  for (int i = scalar_start; i < n; i += kBlockThreads) {
    A x[kDepth];
#pragma unroll
    for (int k = 0; k < kDepth; ++k) x[k] = static_cast<A>(ptr[k][i]);
    op(x, context, sums);
#pragma unroll
    for (int k = 0; k < kDepth; ++k) {
      if ((Op::kWrites >> k) & 1u) ptr[k][i] = to_storage<T>(x[k]);
    }
  }
  if constexpr (Op::kNorms > 0) {
    block_sum2<kBlockThreads>(sums);
    if (threadIdx.x == 0) {
      partials[2 * int64_t{block}] = sums[0];
      partials[2 * int64_t{block} + 1] = sums[1];
    }
  }
}

/// Calls f(std::integral_constant<int, K>{}) for K = 0, ..., N - 1: a loop over columns whose index
/// is a constant, as a mixed table's columns of different element types need.
template <int N, class F>
__device__ __forceinline__ void for_each_column(F&& f) {
  [&]<int... K>(std::integer_sequence<int, K...>) {
    (f(std::integral_constant<int, K>{}), ...);
  }
  (std::make_integer_sequence<int, N>{});
}

/// multi_tensor_kernel for an op whose columns hold different element types, Op::Column<k> for
/// column k (Note [Fused mixed-precision step] in amp/mixed_precision_optimizer.cpp: an f32 master
/// and its moments beside a bf16 gradient and the bf16 model parameter written through). The op
/// computes in Op::A; column k is read only where bit k of Op::kReads is set (a written-through
/// copy is never read) and stored where bit k of Op::kWrites is, rounded by to_storage. Every
/// column moves four elements per access (16 bytes of f32, 8 of a 16-bit type) where all columns
/// are aligned to that, else one at a time. No norms.
template <class Op, class Table>
__global__ void __launch_bounds__(kBlockThreads)
    multi_tensor_mixed_kernel(const __grid_constant__ Table table, const Op op) {
  using A = typename Op::A;
  constexpr int kDepth = Table::kDepth;
  static_assert(Op::kDepth == kDepth, "the op and its table disagree on the number of columns");
  static_assert(Op::kNorms == 0, "the mixed kernel takes no norms");
  constexpr int kVec = 4;

  const int block = static_cast<int>(blockIdx.x);
  const int t = tensor_of_block(table, block);
  const int64_t begin = int64_t{block - (t > 0 ? table.block_end[t - 1] : 0)} * kChunkElements;
  const int n = static_cast<int>(min(kChunkElements, table.numel[t] - begin));
  void* ptr[kDepth];
  bool aligned = true;
  for_each_column<kDepth>([&](auto k) {
    constexpr int K = decltype(k)::value;
    using C = typename Op::template Column<K>;
    ptr[K] = static_cast<C*>(table.data[K][t]) + begin;
    aligned = aligned && reinterpret_cast<uintptr_t>(ptr[K]) % (kVec * sizeof(C)) == 0;
  });
  const typename Op::Context context = op.context(table.first_tensor + t, table.scalars[t]);
  NormSum sums[2] = {0.0, 0.0};

  int scalar_start = static_cast<int>(threadIdx.x);
  if (aligned) {
    const int n_vec = n / kVec;
    for (int i = static_cast<int>(threadIdx.x); i < n_vec; i += kBlockThreads) {
      A x[kVec][kDepth] = {};
      for_each_column<kDepth>([&](auto k) {
        constexpr int K = decltype(k)::value;
        using C = typename Op::template Column<K>;
        if constexpr ((Op::kReads >> K) & 1u) {
          const auto v = static_cast<const core::cuda_detail::Vec<C, kVec>*>(ptr[K])[i];
#pragma unroll
          for (int j = 0; j < kVec; ++j) x[j][K] = static_cast<A>(v.v[j]);
        }
      });
#pragma unroll
      for (int j = 0; j < kVec; ++j) op(x[j], context, sums);
      for_each_column<kDepth>([&](auto k) {
        constexpr int K = decltype(k)::value;
        using C = typename Op::template Column<K>;
        if constexpr ((Op::kWrites >> K) & 1u) {
          core::cuda_detail::Vec<C, kVec> v;
#pragma unroll
          for (int j = 0; j < kVec; ++j) v.v[j] = to_storage<C>(x[j][K]);
          static_cast<core::cuda_detail::Vec<C, kVec>*>(ptr[K])[i] = v;
        }
      });
    }
    scalar_start += n_vec * kVec;
  }
  for (int i = scalar_start; i < n; i += kBlockThreads) {
    A x[kDepth] = {};
    for_each_column<kDepth>([&](auto k) {
      constexpr int K = decltype(k)::value;
      using C = typename Op::template Column<K>;
      if constexpr ((Op::kReads >> K) & 1u) x[K] = static_cast<A>(static_cast<const C*>(ptr[K])[i]);
    });
    op(x, context, sums);
    for_each_column<kDepth>([&](auto k) {
      constexpr int K = decltype(k)::value;
      using C = typename Op::template Column<K>;
      if constexpr ((Op::kWrites >> K) & 1u) static_cast<C*>(ptr[K])[i] = to_storage<C>(x[K]);
    });
  }
}

/// One block per tensor of the table: sums the tensor's chunk partials in a fixed order and calls
/// finish(tensor's index in the whole list, norm 0, norm 1) in thread 0. A norm is the square root
/// of its sum rounded to Finish::Scalar, as the reference's sqrt(sum(x * x)) in acc_t.
template <class Finish, class Table>
__global__ void __launch_bounds__(kFinishThreads)
    finish_norms_kernel(const __grid_constant__ Table table, const NormSum* __restrict__ partials,
                        const Finish finish) {
  using A = typename Finish::Scalar;
  const int t = static_cast<int>(blockIdx.x);
  const int64_t begin = t > 0 ? table.block_end[t - 1] : 0;
  const int64_t end = table.block_end[t];
  NormSum sums[2] = {0.0, 0.0};
  for (int64_t c = begin + threadIdx.x; c < end; c += kFinishThreads) {
    sums[0] += partials[2 * c];
    sums[1] += partials[2 * c + 1];
  }
  block_sum2<kFinishThreads>(sums);
  if (threadIdx.x == 0) finish(table.first_tensor + t, sqrt(static_cast<A>(sums[0])), sqrt(static_cast<A>(sums[1])));
}

// ---- host side

/// The column number of MultiTensorLists::write_through in make_tensor_args.
constexpr int kWriteThroughColumn = -1;

/// Column c of `lists` at tensor i: 0 the parameters, 1 the gradients, 2 + k state buffer k,
/// kWriteThroughColumn the write-through copies.
inline const Tensor& column_tensor(const MultiTensorLists& lists, int column, size_t i) {
  if (column == kWriteThroughColumn) return lists.write_through[i];
  if (column == 0) return lists.params[i];
  if (column == 1) return lists.grads[i];
  return lists.state[static_cast<size_t>(column - 2)][i];
}

/// One TensorArgs per tensor of `lists`: the data of `columns` and scalars_of(i).
template <class Table, class ScalarsOf>
std::vector<TensorArgs<Table>> make_tensor_args(const MultiTensorLists& lists,
                                                const std::array<int, Table::kDepth>& columns, ScalarsOf scalars_of) {
  std::vector<TensorArgs<Table>> args(lists.params.size());
  for (size_t i = 0; i < args.size(); ++i) {
    for (int k = 0; k < Table::kDepth; ++k) args[i].data[k] = column_tensor(lists, columns[k], i).raw_data();
    args[i].numel = lists.params[i].numel();
    args[i].scalars = scalars_of(i);
  }
  return args;
}

/// Runs `op` (kNorms == 0) over `tensors` on `stream`.
template <class T, class Table, class Op>
void launch_update(const std::vector<TensorArgs<Table>>& tensors, const Op& op, cudaStream_t stream) {
  static_assert(Op::kNorms == 0);
  static_assert(sizeof(Table) + sizeof(Op) + sizeof(void*) <= kKernelArgBytes);
  for_each_table(tensors, [&](const Table& table, int blocks, int64_t) {
    multi_tensor_kernel<T><<<static_cast<unsigned>(blocks), kBlockThreads, 0, stream>>>(table, op, nullptr);
    COLOSSAL_CUDA_CHECK_LAUNCH();
  });
}

/// Runs `op` (kNorms == 0, columns of different element types) over `tensors` on `stream`.
template <class Table, class Op>
void launch_mixed_update(const std::vector<TensorArgs<Table>>& tensors, const Op& op, cudaStream_t stream) {
  static_assert(sizeof(Table) + sizeof(Op) <= kKernelArgBytes);
  for_each_table(tensors, [&](const Table& table, int blocks, int64_t) {
    multi_tensor_mixed_kernel<<<static_cast<unsigned>(blocks), kBlockThreads, 0, stream>>>(table, op);
    COLOSSAL_CUDA_CHECK_LAUNCH();
  });
}

/// Runs `op` (kNorms == 2) over `tensors`, then finish(tensor index, norm 0, norm 1) for each tensor
/// with elements, all on `stream`. The partial sums live in a scratch tensor on `device`, which the
/// stream-ordered allocator reuses only after these kernels.
template <class T, class Table, class Op, class Finish>
void launch_update_with_norms(const std::vector<TensorArgs<Table>>& tensors, const Op& op, const Finish& finish,
                              Device device, cudaStream_t stream) {
  static_assert(Op::kNorms == 2);
  static_assert(sizeof(Table) + sizeof(Op) + sizeof(void*) <= kKernelArgBytes);
  static_assert(sizeof(Table) + sizeof(Finish) + sizeof(void*) <= kKernelArgBytes);
  int64_t total_chunks = 0;
  for (const auto& t : tensors) total_chunks += chunks_of(t.numel);
  if (total_chunks == 0) return;
  const Tensor partials = core::empty({2 * total_chunks}, TensorOptions(core::dtype_of<NormSum>(), device));
  for_each_table(tensors, [&](const Table& table, int blocks, int64_t chunk_base) {
    NormSum* table_partials = partials.data<NormSum>() + 2 * chunk_base;
    multi_tensor_kernel<T><<<static_cast<unsigned>(blocks), kBlockThreads, 0, stream>>>(table, op, table_partials);
    COLOSSAL_CUDA_CHECK_LAUNCH();
    finish_norms_kernel<<<static_cast<unsigned>(table.num_tensors), kFinishThreads, 0, stream>>>(
        table, static_cast<const NormSum*>(table_partials), finish);
    COLOSSAL_CUDA_CHECK_LAUNCH();
  });
}

/// Tensor i's write-through copy (undefined when it has none).
inline Tensor write_through_of(const MultiTensorLists& lists, size_t i) {
  return i < lists.write_through.size() ? lists.write_through[i] : Tensor();
}

/// Whether tensor i of `lists` can take the fused path: every tensor of it contiguous, with the
/// parameter's dtype and size; or, where the kernel takes `mixed` columns, an f32 parameter and
/// state with an f32, bf16 or f16 gradient and write-through copy (anything else goes to the
/// reference loop, which promotes dtypes and follows strides).
inline bool fusable(const MultiTensorLists& lists, size_t i, bool mixed) {
  const Tensor& p = lists.params[i];
  auto same = [&](const Tensor& t) { return t.is_contiguous() && t.dtype() == p.dtype() && t.numel() == p.numel(); };
  auto narrow_f32 = [&](const Tensor& t) {
    return t.is_contiguous() && t.numel() == p.numel() &&
           (t.dtype() == DType::f32 || t.dtype() == DType::bf16 || t.dtype() == DType::f16);
  };
  for (const auto& buffers : lists.state) {
    if (!same(buffers[i])) return false;
  }
  const Tensor copy = write_through_of(lists, i);
  if (same(p) && same(lists.grads[i]) && !copy.defined()) return true;
  return mixed && same(p) && p.dtype() == DType::f32 && narrow_f32(lists.grads[i]) &&
         (!copy.defined() || narrow_f32(copy));
}

/// The tensors `indices` of `lists`, as lists of their own.
inline MultiTensorLists select_tensors(const MultiTensorLists& lists, const std::vector<size_t>& indices) {
  MultiTensorLists out;
  out.device = lists.device;
  out.grad_scale = lists.grad_scale;
  out.grad_unscale = lists.grad_unscale;
  out.state.resize(lists.state.size());
  for (size_t i : indices) {
    out.params.push_back(lists.params[i]);
    out.grads.push_back(lists.grads[i]);
    for (size_t k = 0; k < lists.state.size(); ++k) out.state[k].push_back(lists.state[k][i]);
    out.steps.push_back(lists.steps[i]);
    out.buffers_created.push_back(lists.buffers_created[i]);
    if (!lists.write_through.empty()) out.write_through.push_back(write_through_of(lists, i));
  }
  return out;
}

/// The entry every fused optimizer kernel shares: checks that all tensors are on lists.device,
/// then calls typed.template operator()<T>(sub-lists) once per parameter dtype on the fusable
/// tensors and reference(sub-lists) on the rest (see fusable). With `mixed` (a kernel that takes
/// a narrower gradient and a write-through copy), the sub-lists are split further so that each
/// has one gradient dtype and one copy dtype (or no copies).
template <class Typed, class Reference>
void run_fused(const MultiTensorLists& lists, const char* op, Typed&& typed, Reference&& reference,
               bool mixed = false) {
  const size_t n = lists.params.size();
  COLOSSAL_CHECK(lists.grads.size() == n && lists.steps.size() == n && lists.buffers_created.size() == n,
                 "{}: lists of unequal length: {} params, {} grads, {} steps, {} created flags", op, n,
                 lists.grads.size(), lists.steps.size(), lists.buffers_created.size());
  COLOSSAL_CHECK(lists.write_through.empty() || lists.write_through.size() == n,
                 "{}: {} write-through copies for {} params", op, lists.write_through.size(), n);
  for (const auto& buffers : lists.state) {
    COLOSSAL_CHECK(buffers.size() == n, "{}: a state list has {} tensors for {} params", op, buffers.size(), n);
  }
  auto check_device = [&](const Tensor& t, const char* role, size_t i) {
    COLOSSAL_CHECK(t.defined(), "{}: {} {} is undefined", op, role, i);
    COLOSSAL_CHECK(t.device() == lists.device,
                   "{}: {} {} is on {} but the fused update runs on {}; the parameters, gradients and state buffers of "
                   "one update must all be on its device",
                   op, role, i, t.device(), lists.device);
  };
  std::vector<std::vector<size_t>> by_dtype;
  std::vector<size_t> rest;
  for (size_t i = 0; i < n; ++i) {
    check_device(lists.params[i], "parameter", i);
    check_device(lists.grads[i], "gradient", i);
    for (const auto& buffers : lists.state) check_device(buffers[i], "state buffer", i);
    if (const Tensor copy = write_through_of(lists, i); copy.defined()) check_device(copy, "write-through copy", i);
    if (!fusable(lists, i, mixed)) {
      rest.push_back(i);
      continue;
    }
    // One kernel per (parameter, gradient, copy) dtypes; -1 stands for no copy.
    auto dtypes_of = [&](size_t j) {
      const Tensor copy = write_through_of(lists, j);
      return std::array<int, 3>{static_cast<int>(lists.params[j].dtype()), static_cast<int>(lists.grads[j].dtype()),
                                copy.defined() ? static_cast<int>(copy.dtype()) : -1};
    };
    auto group = std::find_if(by_dtype.begin(), by_dtype.end(),
                              [&](const auto& g) { return dtypes_of(g.front()) == dtypes_of(i); });
    if (group == by_dtype.end()) {
      by_dtype.push_back({i});
    } else {
      group->push_back(i);
    }
  }
  core::cuda::DeviceGuard guard(lists.device);
  auto run_typed = [&](const MultiTensorLists& sub) {
    core::dispatch_floating(sub.params.front().dtype(), op, [&]<class T>() { typed.template operator()<T>(sub); });
  };
  for (const auto& indices : by_dtype) {
    if (indices.size() == n) {
      run_typed(lists);  // the usual case: one dtype, nothing to copy
    } else {
      run_typed(select_tensors(lists, indices));
    }
  }
  if (!rest.empty()) reference(select_tensors(lists, rest));
}

}  // namespace colossal::optim::cuda_detail
