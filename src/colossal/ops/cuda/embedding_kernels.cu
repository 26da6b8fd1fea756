// CUDA embedding for f32, f64, f16 and bf16 weights: a row gather forward (16-byte vectors where
// the weight's rows allow) that validates the indices on the device, its row-writing mirror for
// embedding_put_, and a deterministic backward
// without float atomics. The backward sorts (index, position) pairs with cub's stable radix sort,
// splits each run of equal indices into chunks of at most 32 positions, sums every chunk in
// position order (one warp per chunk, so a frequent index is spread over many warps instead of
// summed serially), and adds a run's chunk sums in order. Sums run in f32 (f64 for f64). The
// accumulating form adds each named row's sum into the gradient there (old + sum, rounded once) and
// touches no other row; the plain form clears the table first.
#include <cuda_runtime.h>

#include <bit>
#include <cub/device/device_radix_sort.cuh>
#include <cub/device/device_run_length_encode.cuh>
#include <cub/device/device_scan.cuh>

#include "colossal/ops/cuda/row_team.cuh"
#include "colossal/ops/loss_kernels.h"

namespace colossal::ops {
namespace {

using core::acc_t;
using cuda::rows::ceil_div;
using cuda::rows::from_acc;
using cuda::rows::IndexView;
using cuda::rows::kFullMask;
using cuda::rows::kWarp;
using cuda::rows::load_vec;
using cuda::rows::store_vec;
using cuda::rows::to_acc;
using cuda::rows::Vec;

/// Threads per block: eight warps, each on one output row (forward) or one chunk / run (backward).
constexpr int kBlock = 256;
constexpr int kWarpsPerBlock = kBlock / kWarp;
/// Positions per chunk of a run: one per lane, so a warp loads a chunk's positions in one access.
constexpr int kChunk = kWarp;

__device__ __forceinline__ int64_t warp_id() {
  return blockIdx.x * int64_t{kWarpsPerBlock} + threadIdx.x / kWarp;
}

// ---- forward

/// Warp k copies row indices[k] of weight into packed[k] (the forward), or with kPut packed[k] into
/// row indices[k] of weight (embedding_put_); a bad index is reported (lowest position wins) and
/// nothing of its row moved, since the call throws.
template <class T, int kVec, bool kPut>
__global__ void __launch_bounds__(kBlock, 1)
    embedding_rows_kernel(T* __restrict__ packed, T* __restrict__ weight, IndexView indices, int64_t n,
                          int64_t num_embeddings, int64_t dim, int64_t row_stride, int64_t col_stride,
                          unsigned long long* bad_position) {
  const int64_t k = warp_id();
  if (k >= n) return;
  const int lane = threadIdx.x % kWarp;
  const int64_t index = indices[k];
  if (index < 0 || index >= num_embeddings) {
    if (lane == 0) cuda::rows::report_bad(bad_position, k);
    return;
  }
  T* table_row = weight + index * row_stride;
  T* packed_row = packed + k * dim;
  if constexpr (kVec > 1) {  // col_stride == 1
    for (int64_t v = lane; v < dim / kVec; v += kWarp) {
      if constexpr (kPut) {
        store_vec<kVec>(table_row + v * kVec, load_vec<kVec>(packed_row + v * kVec));
      } else {
        store_vec<kVec>(packed_row + v * kVec, load_vec<kVec>(table_row + v * kVec));
      }
    }
  } else {
    for (int64_t j = lane; j < dim; j += kWarp) {
      if constexpr (kPut) {
        table_row[j * col_stride] = packed_row[j];
      } else {
        packed_row[j] = table_row[j * col_stride];
      }
    }
  }
}

/// The multi-index of row-major element `flat` of `shape`, for error messages.
Shape unravel(int64_t flat, const Shape& shape) {
  Shape position(shape.size(), 0);
  for (int64_t d = static_cast<int64_t>(shape.size()) - 1; d >= 0; --d) {
    position[d] = flat % shape[d];
    flat /= shape[d];
  }
  return position;
}

/// The forward (packed = out) or embedding_put_ (kPut, packed = the rows written): one warp per
/// position, 16-byte vectors where the weight's rows allow, the indices checked on the device.
template <bool kPut>
void embedding_rows_cuda(const char* op, const Tensor& packed, const Tensor& indices, const Tensor& weight) {
  const Device device = weight.device();
  core::cuda_detail::check_on_device(packed, device, op, kPut ? "the rows" : "the output");
  core::cuda_detail::check_on_device(indices, device, op, "indices");
  const int64_t n = indices.numel();
  if (n == 0) return;
  const int64_t num_embeddings = weight.shape()[0];
  const int64_t dim = weight.shape()[1];
  COLOSSAL_CHECK(ceil_div(n, kWarpsPerBlock) < (int64_t{1} << 31), "{}: {} indices exceed the CUDA grid limit", op, n);
  core::cuda::DeviceGuard guard(device);
  cudaStream_t stream = core::cuda_detail::stream_of(weight);
  const cuda::rows::DeviceErrorSlot bad_position(device, stream);
  core::dispatch_floating(weight.dtype(), op, [&]<class T>() {
    constexpr int kVec = cuda::rows::kVecOf<T>;
    const int64_t row_stride = weight.strides()[0], col_stride = weight.strides()[1];
    const bool vectorized = col_stride == 1 && dim % kVec == 0 && (row_stride * sizeof(T)) % 16 == 0 &&
                            core::cuda_detail::aligned16(weight.raw_data()) &&
                            core::cuda_detail::aligned16(packed.raw_data());
    const unsigned grid = static_cast<unsigned>(ceil_div(n, kWarpsPerBlock));
    const auto launch = [&](auto kernel) {
      kernel<<<grid, kBlock, 0, stream>>>(packed.data<T>(), weight.data<T>(), cuda::rows::index_view(indices), n,
                                          num_embeddings, dim, row_stride, col_stride, bad_position.get());
    };
    if (vectorized) {
      launch(embedding_rows_kernel<T, kVec, kPut>);
    } else {
      launch(embedding_rows_kernel<T, 1, kPut>);
    }
    COLOSSAL_CUDA_CHECK_LAUNCH();
  });
  // Checked without stopping the host (Note [Deferred device checks]): a bad index throws at a later
  // op or host read, with this message.
  bad_position.defer([op, indices, num_embeddings, stream](int64_t k) {
    const int64_t value = cuda::rows::read_index_at(indices, k, stream);
    return fmt::format("{}: index {} at position {} of indices {} is out of range for num_embeddings {} (valid: 0..{})",
                       op, value, unravel(k, indices.shape()), indices.shape(), num_embeddings, num_embeddings - 1);
  });
}

void embedding_forward_cuda(const Tensor& out, const Tensor& indices, const Tensor& weight) {
  embedding_rows_cuda<false>("embedding", out, indices, weight);
}

void embedding_put_cuda(const Tensor& weight, const Tensor& indices, const Tensor& rows) {
  embedding_rows_cuda<true>("embedding_put_", rows, indices, weight);
}

// ---- backward

/// keys[k] <- indices[k], or num_embeddings (sorted last, never written) for padding_idx and for
/// indices out of range; positions[k] <- k.
__global__ void embedding_sort_keys(uint32_t* __restrict__ keys, int32_t* __restrict__ positions, IndexView indices,
                                    int64_t n, int64_t num_embeddings, int64_t padding_idx) {
  for (int64_t k = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; k < n; k += int64_t{gridDim.x} * blockDim.x) {
    const int64_t index = indices[k];
    const bool kept = index >= 0 && index < num_embeddings && index != padding_idx;
    keys[k] = static_cast<uint32_t>(kept ? index : num_embeddings);
    positions[k] = static_cast<int32_t>(k);
  }
}

/// Per run r (entries past the last run have count 0): its chunks, and its chunks again when it has
/// more than one (those sum through partial rows). The sentinel run gets none.
__global__ void embedding_plan_runs(int32_t* __restrict__ chunks, int32_t* __restrict__ multi,
                                    const int32_t* __restrict__ counts, const uint32_t* __restrict__ run_keys,
                                    const int32_t* __restrict__ num_runs, int64_t entries, int64_t num_embeddings) {
  for (int64_t r = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; r < entries; r += int64_t{gridDim.x} * blockDim.x) {
    const bool real = r < *num_runs && run_keys[r] != num_embeddings;
    const int32_t c = real ? (counts[r] + kChunk - 1) / kChunk : 0;
    chunks[r] = c;
    multi[r] = c > 1 ? c : 0;
  }
}

struct RunTables {
  const uint32_t* run_keys;         // [n] the index of each run
  const int32_t* counts;            // [n + 1] positions per run (0 past the last run)
  const int32_t* run_start;         // [n + 1] exclusive scan of counts
  const int32_t* chunks;            // [n + 1] chunks per run
  const int32_t* chunk_offset;      // [n + 1] exclusive scan of chunks; chunk_offset[n] = all chunks
  const int32_t* multi_offset;      // [n + 1] exclusive scan of multi: the run's first partial row
  const int32_t* sorted_positions;  // [n] positions, grouped by index, ascending within a run
  int64_t n;
};

/// Warp c sums chunk c's rows of grad_out in position order: straight into grad_weight when the
/// chunk is its run's only one (added to the row's old value there when accumulating), else into
/// its partial row.
template <class T, int kVec>
__global__ void __launch_bounds__(kBlock, 1)
    embedding_sum_chunks(T* __restrict__ grad_weight, acc_t<T>* __restrict__ partial, const T* __restrict__ grad_out,
                         RunTables tables, int64_t dim, bool accumulate) {
  using A = acc_t<T>;
  const int64_t c = warp_id();
  if (c >= tables.chunk_offset[tables.n]) return;
  const int lane = threadIdx.x % kWarp;
  // The run holding chunk c: the last r with chunk_offset[r] <= c (runs with no chunks share their
  // successor's offset, so the last such r has chunk c).
  int64_t low = 0, high = tables.n;  // chunk_offset[low] <= c < chunk_offset[high]
  while (high - low > 1) {
    const int64_t mid = (low + high) / 2;
    if (tables.chunk_offset[mid] <= c) {
      low = mid;
    } else {
      high = mid;
    }
  }
  const int64_t r = low;
  const int64_t j = c - tables.chunk_offset[r];
  const int64_t begin = tables.run_start[r] + j * kChunk;
  const int count = static_cast<int>(min(int64_t{kChunk}, tables.run_start[r] + tables.counts[r] - begin));
  const int32_t my_position = lane < count ? tables.sorted_positions[begin + lane] : 0;
  const bool single = tables.chunks[r] == 1;
  T* dst = grad_weight + static_cast<int64_t>(tables.run_keys[r]) * dim;
  A* dst_partial = single ? nullptr : partial + (tables.multi_offset[r] + j) * dim;
  const int64_t vectors = dim / kVec;
  // Warp-uniform trip counts: every lane reaches every __shfl_sync.
  for (int64_t first = 0; first < vectors; first += kWarp) {
    const int64_t v = first + lane;
    const bool active = v < vectors;
    A sums[kVec];
#pragma unroll
    for (int e = 0; e < kVec; ++e) sums[e] = A(0);
#pragma unroll 4
    for (int p = 0; p < count; ++p) {
      const int64_t position = __shfl_sync(kFullMask, my_position, p);
      if (active) {
        const Vec<T, kVec> g = load_vec<kVec>(grad_out + position * dim + v * kVec);
#pragma unroll
        for (int e = 0; e < kVec; ++e) sums[e] += to_acc(g.v[e]);
      }
    }
    if (!active) continue;
    if (single) {
      Vec<T, kVec> out;
      if (accumulate) {
        const Vec<T, kVec> old = load_vec<kVec>(dst + v * kVec);
#pragma unroll
        for (int e = 0; e < kVec; ++e) out.v[e] = from_acc<T>(to_acc(old.v[e]) + sums[e]);
      } else {
#pragma unroll
        for (int e = 0; e < kVec; ++e) out.v[e] = from_acc<T>(sums[e]);
      }
      store_vec<kVec>(dst + v * kVec, out);
    } else {
#pragma unroll
      for (int e = 0; e < kVec; ++e) dst_partial[v * kVec + e] = sums[e];
    }
  }
}

/// Warp r adds run r's partial rows in chunk order, for runs of several chunks, and writes the total
/// into grad_weight (adds it to the row's old value when accumulating).
template <class T>
__global__ void __launch_bounds__(kBlock, 1)
    embedding_sum_partials(T* __restrict__ grad_weight, const acc_t<T>* __restrict__ partial, RunTables tables,
                           int64_t dim, bool accumulate) {
  using A = acc_t<T>;
  const int64_t r = warp_id();
  if (r >= tables.n || tables.chunks[r] < 2) return;
  const int lane = threadIdx.x % kWarp;
  const A* first = partial + static_cast<int64_t>(tables.multi_offset[r]) * dim;
  T* dst = grad_weight + static_cast<int64_t>(tables.run_keys[r]) * dim;
  for (int64_t col = lane; col < dim; col += kWarp) {
    A total = 0;
    for (int k = 0; k < tables.chunks[r]; ++k) total += first[k * dim + col];
    dst[col] = from_acc<T>(accumulate ? to_acc(dst[col]) + total : total);
  }
}

/// cub's two-phase calls: the first (null storage) sizes the temporary storage.
template <class Call>
size_t cub_bytes(Call call) {
  size_t bytes = 0;
  COLOSSAL_CUDA_CHECK(call(nullptr, bytes));
  return bytes;
}

Tensor device_ints(int64_t count, Device device) {
  return core::empty({count}, TensorOptions(DType::i32, device));
}

void embedding_backward_cuda(const Tensor& grad_weight, const Tensor& grad_out, const Tensor& indices,
                             int64_t padding_idx, bool accumulate) {
  const Device device = grad_weight.device();
  core::cuda_detail::check_on_device(grad_out, device, "embedding backward", "grad_out");
  core::cuda_detail::check_on_device(indices, device, "embedding backward", "indices");
  const int64_t n = indices.numel();
  const int64_t num_embeddings = grad_weight.shape()[0];
  const int64_t dim = grad_weight.shape()[1];
  COLOSSAL_CHECK(n < (int64_t{1} << 31) - 1 && num_embeddings < (int64_t{1} << 31) - 1,
                 "embedding backward: {} indices into {} rows exceed the 32-bit sort keys and positions it uses", n,
                 num_embeddings);
  core::cuda::DeviceGuard guard(device);
  cudaStream_t stream = core::cuda_detail::stream_of(grad_weight);
  // Rows no index names, and the padding row, stay zero; accumulating, they keep their gradient.
  if (!accumulate) COLOSSAL_CUDA_CHECK(cudaMemsetAsync(grad_weight.raw_data(), 0, grad_weight.nbytes(), stream));
  if (n == 0 || dim == 0) return;

  const int32_t items = static_cast<int32_t>(n);
  const int end_bit = std::bit_width(static_cast<uint64_t>(num_embeddings));  // the sentinel num_embeddings fits
  Tensor keys = device_ints(n, device), sorted_keys = device_ints(n, device);
  Tensor positions = device_ints(n, device), sorted_positions = device_ints(n, device);
  Tensor run_keys = device_ints(n, device), num_runs = device_ints(1, device);
  Tensor counts = device_ints(n + 1, device), run_start = device_ints(n + 1, device);
  Tensor chunks = device_ints(n + 1, device), chunk_offset = device_ints(n + 1, device);
  Tensor multi = device_ints(n + 1, device), multi_offset = device_ints(n + 1, device);
  auto u32 = [](const Tensor& t) { return static_cast<uint32_t*>(t.raw_data()); };
  auto i32 = [](const Tensor& t) { return static_cast<int32_t*>(t.raw_data()); };

  const auto sort = [&](void* storage, size_t& bytes) {
    return cub::DeviceRadixSort::SortPairs(storage, bytes, u32(keys), u32(sorted_keys), i32(positions),
                                           i32(sorted_positions), items, 0, end_bit, stream);
  };
  const auto encode = [&](void* storage, size_t& bytes) {
    return cub::DeviceRunLengthEncode::Encode(storage, bytes, u32(sorted_keys), u32(run_keys), i32(counts),
                                              i32(num_runs), items, stream);
  };
  const auto scan = [&](const Tensor& in, const Tensor& out) {
    return [&, in_ptr = i32(in), out_ptr = i32(out)](void* storage, size_t& bytes) {
      return cub::DeviceScan::ExclusiveSum(storage, bytes, in_ptr, out_ptr, items + 1, stream);
    };
  };
  const size_t storage_bytes =
      std::max({cub_bytes(sort), cub_bytes(encode), cub_bytes(scan(counts, run_start)), size_t{1}});
  Tensor storage = core::empty({static_cast<int64_t>(storage_bytes)}, TensorOptions(DType::u8, device));
  size_t bytes = storage_bytes;

  const unsigned grid = core::cuda_detail::grid_for(n + 1);
  embedding_sort_keys<<<grid, core::cuda_detail::kThreads, 0, stream>>>(
      u32(keys), i32(positions), cuda::rows::index_view(indices), n, num_embeddings, padding_idx);
  COLOSSAL_CUDA_CHECK_LAUNCH();
  COLOSSAL_CUDA_CHECK(sort(storage.raw_data(), bytes));
  // Entries past the last run must read as empty runs.
  COLOSSAL_CUDA_CHECK(cudaMemsetAsync(counts.raw_data(), 0, counts.nbytes(), stream));
  bytes = storage_bytes;
  COLOSSAL_CUDA_CHECK(encode(storage.raw_data(), bytes));
  embedding_plan_runs<<<grid, core::cuda_detail::kThreads, 0, stream>>>(
      i32(chunks), i32(multi), i32(counts), u32(run_keys), i32(num_runs), n + 1, num_embeddings);
  COLOSSAL_CUDA_CHECK_LAUNCH();
  for (const auto& [in, out] : {std::pair{&counts, &run_start}, {&chunks, &chunk_offset}, {&multi, &multi_offset}}) {
    bytes = storage_bytes;
    COLOSSAL_CUDA_CHECK(scan(*in, *out)(storage.raw_data(), bytes));
  }

  const RunTables tables{u32(run_keys),     i32(counts),       i32(run_start),        i32(chunks),
                         i32(chunk_offset), i32(multi_offset), i32(sorted_positions), n};
  core::dispatch_floating(grad_weight.dtype(), "embedding backward", [&]<class T>() {
    using A = acc_t<T>;
    // Runs of several chunks have more than kChunk positions each, so their chunks number at most
    // n / kChunk + n / (kChunk + 1): the partial rows' bound without reading the device.
    const int64_t max_partials = 2 * ceil_div(n, kChunk);
    Tensor partial = core::empty({max_partials, dim}, TensorOptions(core::dtype_of<A>(), device));
    constexpr int kVec = cuda::rows::kVecOf<T>;
    const bool vectorized = dim % kVec == 0 && core::cuda_detail::aligned16(grad_out.raw_data()) &&
                            core::cuda_detail::aligned16(grad_weight.raw_data());
    // Every chunk holds a position, so n warps cover them all; the surplus warps return at once.
    const unsigned warps_grid = static_cast<unsigned>(ceil_div(n, kWarpsPerBlock));
    if (vectorized) {
      embedding_sum_chunks<T, kVec><<<warps_grid, kBlock, 0, stream>>>(grad_weight.data<T>(), partial.data<A>(),
                                                                       grad_out.data<T>(), tables, dim, accumulate);
    } else {
      embedding_sum_chunks<T, 1><<<warps_grid, kBlock, 0, stream>>>(grad_weight.data<T>(), partial.data<A>(),
                                                                    grad_out.data<T>(), tables, dim, accumulate);
    }
    COLOSSAL_CUDA_CHECK_LAUNCH();
    embedding_sum_partials<T>
        <<<warps_grid, kBlock, 0, stream>>>(grad_weight.data<T>(), partial.data<A>(), tables, dim, accumulate);
    COLOSSAL_CUDA_CHECK_LAUNCH();
  });
}

COLOSSAL_REGISTER_KERNEL(embedding_forward_stub, core::DeviceType::cuda, embedding_forward_cuda);
COLOSSAL_REGISTER_KERNEL(embedding_backward_stub, core::DeviceType::cuda, embedding_backward_cuda);
COLOSSAL_REGISTER_KERNEL(embedding_put_stub, core::DeviceType::cuda, embedding_put_cuda);

}  // namespace
}  // namespace colossal::ops
