// Per-channel work over contiguous NCHW tensors, seen as [N, C, area], for the CUDA kernels of
// batch_norm2d and conv2d's bias: a deterministic per-channel reduction (fixed splits of each
// channel's N * area elements, a fixed tree inside each block, partial results combined in order by
// the caller) and an elementwise map that knows each element's channel. Neither divides per element:
// a cursor carries (plane, position) forward by a constant stride.
#pragma once

#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <initializer_list>
#include <type_traits>

#include "colossal/core/cuda/launch.cuh"

namespace colossal::ops::cuda {

/// A contiguous [batch, channels, area] view of an NCHW tensor (area = H * W).
struct ChannelShape {
  int64_t batch = 0, channels = 0, area = 0;
  __host__ __device__ int64_t per_channel() const { return batch * area; }
};

inline ChannelShape channel_shape(const Tensor& t) {
  return {t.size(0), t.size(1), t.size(2) * t.size(3)};
}

constexpr int kChannelThreads = 256;
/// Groups loaded before any is accumulated, so that several loads are in flight per thread.
constexpr int kChannelUnroll = 4;

/// 16 bytes of T (or one T), the unit every per-channel kernel loads and stores.
template <class T, int kVec>
using Group = core::cuda_detail::Vec<T, kVec>;
template <int kVec, class T>
__device__ __forceinline__ Group<T, kVec> load_group(const T* p) {
  return *reinterpret_cast<const Group<T, kVec>*>(p);
}
template <int kVec, class T>
__device__ __forceinline__ void store_group(T* p, const Group<T, kVec>& g) {
  *reinterpret_cast<Group<T, kVec>*>(p) = g;
}

using core::cuda_detail::store_as;

/// Whether a kernel over `shape` may move 16-byte groups of T: every plane holds whole groups and
/// every pointer is 16-byte aligned (then so is every group).
template <class T>
bool channel_vectorizable(const ChannelShape& shape, std::initializer_list<const void*> pointers) {
  constexpr int kVec = 16 / sizeof(T);
  bool ok = shape.area % kVec == 0;
  for (const void* p : pointers) ok = ok && core::cuda_detail::aligned16(p);
  return ok;
}

/// How a per-channel reduction runs: over groups of `vec` elements (1 or 16 bytes of T), with
/// `splits` blocks per channel, each reducing `chunk` groups.
struct ChannelReduction {
  int vec = 1;
  ChannelShape groups;  ///< the tensor's shape in groups: area / vec groups per plane
  int splits = 1;
  int64_t chunk = 0;
  dim3 grid;
};

/// Enough blocks to fill an H100 several times over (132 SMs), each reducing at least ~4K groups.
template <class T>
ChannelReduction plan_channel_reduction(const ChannelShape& shape, std::initializer_list<const void*> pointers) {
  constexpr int64_t kTargetBlocks = 1024;
  constexpr int64_t kMinPerBlock = int64_t{kChannelThreads} * kChannelUnroll * 4;
  ChannelReduction plan;
  plan.vec = channel_vectorizable<T>(shape, pointers) ? static_cast<int>(16 / sizeof(T)) : 1;
  plan.groups = {shape.batch, shape.channels, shape.area / plan.vec};
  const int64_t count = plan.groups.per_channel();
  const int64_t wanted = (kTargetBlocks + shape.channels - 1) / std::max<int64_t>(shape.channels, 1);
  int64_t splits = std::clamp<int64_t>(wanted, 1, std::max<int64_t>(1, count / kMinPerBlock));
  splits = std::min<int64_t>(splits, 65535);
  plan.chunk = std::max<int64_t>(1, (count + splits - 1) / splits);
  plan.splits = static_cast<int>(std::max<int64_t>(1, (count + plan.chunk - 1) / plan.chunk));  // none empty
  // Channels beyond grid.y's limit are looped over inside the kernel.
  plan.grid = dim3(static_cast<unsigned>(plan.splits), static_cast<unsigned>(std::min<int64_t>(shape.channels, 65535)));
  return plan;
}

/// Walks channel c's groups j = first, first + step, ... where j = n * area + i numbers the
/// channel's N planes; `offset` is group j's index in the [N, C, area] tensor of groups.
struct ChannelCursor {
  int64_t j, i, offset;
  int64_t area, step, step_i, step_offset, wrap;

  __device__ ChannelCursor(int64_t first, int64_t step_, int64_t c, const ChannelShape& shape)
      : j(first), i(first % shape.area), area(shape.area), step(step_) {
    offset = ((first / shape.area) * shape.channels + c) * shape.area + i;
    step_i = step % area;
    step_offset = (step / area) * shape.channels * area + step_i;
    wrap = (shape.channels - 1) * area;  // crossing into the next plane skips the other channels
  }
  __device__ void advance() {
    j += step;
    i += step_i;
    offset += step_offset;
    if (i >= area) {
      i -= area;
      offset += wrap;
    }
  }
};

/// partials[c * splits + s] <- op's reduction over split s of channel c. Op provides State (a
/// trivially constructible aggregate), identity(c), Loaded<kVec>, load<kVec>(element, c) ->
/// Loaded<kVec>, accumulate(State&, Loaded) and combine(State, State) (applied in a fixed order,
/// so results do not depend on timing).
template <class Op, int kVec>
__global__ void __launch_bounds__(kChannelThreads)
    channel_partials_kernel(Op op, ChannelShape groups, int64_t chunk, int splits, typename Op::State* partials) {
  using State = typename Op::State;
  using Loaded = typename Op::template Loaded<kVec>;
  __shared__ State shared[kChannelThreads];
  const int64_t count = groups.per_channel();
  const int64_t begin = blockIdx.x * chunk;
  const int64_t end = min(count, begin + chunk);
  for (int64_t c = blockIdx.y; c < groups.channels; c += gridDim.y) {
    State state = op.identity(c);
    if (begin + threadIdx.x < end) {
      ChannelCursor cursor(begin + threadIdx.x, kChannelThreads, c, groups);
      while (cursor.j < end) {
        Loaded loaded[kChannelUnroll];
        int valid = 0;
#pragma unroll
        for (int u = 0; u < kChannelUnroll; ++u) {
          if (cursor.j < end) {
            loaded[u] = op.template load<kVec>(cursor.offset * kVec, c);
            cursor.advance();
            ++valid;
          }
        }
#pragma unroll
        for (int u = 0; u < kChannelUnroll; ++u) {
          if (u < valid) op.accumulate(state, loaded[u]);
        }
      }
    }
    shared[threadIdx.x] = state;
    __syncthreads();
    for (int width = kChannelThreads / 2; width > 0; width /= 2) {
      if (threadIdx.x < width) shared[threadIdx.x] = Op::combine(shared[threadIdx.x], shared[threadIdx.x + width]);
      __syncthreads();
    }
    if (threadIdx.x == 0) partials[c * splits + blockIdx.x] = shared[0];
    __syncthreads();  // shared[0] is read before the next channel overwrites it
  }
}

/// Runs op's partial reductions; partials must hold channels * plan.splits States.
template <class T, class Op>
void launch_channel_partials(const Op& op, const ChannelReduction& plan, typename Op::State* partials,
                             cudaStream_t stream) {
  constexpr int kVec = 16 / sizeof(T);
  if (plan.vec == kVec && kVec > 1) {
    channel_partials_kernel<Op, kVec>
        <<<plan.grid, kChannelThreads, 0, stream>>>(op, plan.groups, plan.chunk, plan.splits, partials);
  } else {
    channel_partials_kernel<Op, 1>
        <<<plan.grid, kChannelThreads, 0, stream>>>(op, plan.groups, plan.chunk, plan.splits, partials);
  }
  COLOSSAL_CUDA_CHECK_LAUNCH();
}

/// Calls f.template apply<kVec>(element, c) for every group of kVec consecutive elements of one
/// plane (element = the group's first index in the [N, C, area] tensor, c its channel).
template <int kVec, class F>
__global__ void channel_map_kernel(int64_t groups, int64_t groups_per_plane, int64_t channels, F f) {
  int64_t g = blockIdx.x * int64_t{blockDim.x} + threadIdx.x;
  if (g >= groups) return;
  const int64_t step = int64_t{gridDim.x} * blockDim.x;
  const int64_t step_i = step % groups_per_plane;
  const int64_t step_c = (step / groups_per_plane) % channels;
  int64_t i = g % groups_per_plane;
  int64_t c = (g / groups_per_plane) % channels;
  for (; g < groups; g += step) {
    f.template apply<kVec>(g * kVec, c);
    i += step_i;
    c += step_c;
    if (i >= groups_per_plane) {
      i -= groups_per_plane;
      ++c;
    }
    if (c >= channels) c -= channels;  // c + step_c + 1 < 2 * channels
  }
}

/// Runs f over every element of a [N, C, area] tensor, in 16-byte groups of T where
/// channel_vectorizable allows, one element at a time otherwise.
template <class T, class F>
void launch_channel_map(const ChannelShape& shape, std::initializer_list<const void*> pointers, const F& f,
                        cudaStream_t stream) {
  constexpr int kVec = 16 / sizeof(T);
  const int64_t numel = shape.per_channel() * shape.channels;
  if (numel == 0) return;
  using core::cuda_detail::grid_for;
  using core::cuda_detail::kThreads;
  if (kVec > 1 && channel_vectorizable<T>(shape, pointers)) {
    const int64_t groups = numel / kVec;
    channel_map_kernel<kVec><<<grid_for(groups), kThreads, 0, stream>>>(groups, shape.area / kVec, shape.channels, f);
  } else {
    channel_map_kernel<1><<<grid_for(numel), kThreads, 0, stream>>>(numel, shape.area, shape.channels, f);
  }
  COLOSSAL_CUDA_CHECK_LAUNCH();
}

}  // namespace colossal::ops::cuda
