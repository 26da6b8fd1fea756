// Building blocks of the CUDA row kernels (softmax, layer_norm, cross_entropy, embedding): a row
// handled by a team of threads (one warp, or a whole block) with the team's deterministic
// reductions, 16-byte vector access, f32 conversions of the 16-bit types, the online max/sum of
// softmax, and the device error slot that turns a bad index found on the GPU into a host exception.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <type_traits>

#include "colossal/core/cuda/launch.cuh"  // Vec, aligned16, stream_of, check_on_device

namespace colossal::ops::cuda::rows {

using core::acc_t;
using core::cuda_detail::Vec;

template <class T>
constexpr bool kIs16Bit = std::is_same_v<T, core::Half> || std::is_same_v<T, core::BFloat16>;

/// Elements of T in one 16-byte access.
template <class T>
constexpr int kVecOf = sizeof(T) >= 16 ? 1 : static_cast<int>(16 / sizeof(T));

constexpr unsigned kFullMask = 0xffffffffu;
constexpr int kWarp = 32;

// ---- conversions (the hardware instructions, round-to-nearest-even like core/half.h)

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

/// Element j of a vector as the accumulation type. For bf16 the pair holding it is read as one
/// 32-bit word and the element moved into a float's high half by one shift or mask, where to_acc on
/// the 16-bit element would first widen it (a row kernel does this for every element, often twice).
template <class T, int kVec>
__device__ __forceinline__ acc_t<T> element_acc(const Vec<T, kVec>& v, int j) {
  if constexpr (std::is_same_v<T, core::BFloat16> && kVec % 2 == 0) {
    uint32_t word;
    memcpy(&word, &v.v[j & ~1], sizeof word);
    return __uint_as_float((j & 1) ? (word & 0xffff0000u) : (word << 16));
  } else {
    return to_acc(v.v[j]);
  }
}

/// Elements j and j + 1 (j even) of a vector from two accumulators, rounded to nearest even as
/// from_acc does, by one paired conversion for the 16-bit types.
template <class T, int kVec, class A>
__device__ __forceinline__ void set_pair(Vec<T, kVec>& v, int j, A lo, A hi) {
  if constexpr (std::is_same_v<T, core::BFloat16> && kVec % 2 == 0) {
    const __nv_bfloat162 pair = __floats2bfloat162_rn(static_cast<float>(lo), static_cast<float>(hi));
    memcpy(&v.v[j], &pair, sizeof pair);
  } else if constexpr (std::is_same_v<T, core::Half> && kVec % 2 == 0) {
    const __half2 pair = __floats2half2_rn(static_cast<float>(lo), static_cast<float>(hi));
    memcpy(&v.v[j], &pair, sizeof pair);
  } else {
    v.v[j] = from_acc<T>(lo);
    if (j + 1 < kVec) v.v[j + 1] = from_acc<T>(hi);
  }
}

/// exp for softmax-like kernels: the hardware ex2.approx path (relative error ~2^-21 for the
/// arguments softmax sees) when the result is rounded to bf16/f16 anyway, the accurate exp for f32
/// and f64 outputs (compared against the CPU at 1e-5).
template <class T, class A>
__device__ __forceinline__ A row_exp(A v) {
  if constexpr (kIs16Bit<T>) {
    return __expf(v);
  } else {
    return exp(v);
  }
}

template <int kVec, class T>
__device__ __forceinline__ Vec<T, kVec> load_vec(const T* p) {
  return *reinterpret_cast<const Vec<T, kVec>*>(p);
}
template <int kVec, class T>
__device__ __forceinline__ void store_vec(T* p, const Vec<T, kVec>& v) {
  *reinterpret_cast<Vec<T, kVec>*>(p) = v;
}

// ---- cache-hinted vector access. Streaming (evict-first in L1 and L2) for data touched once, like
// the rows of a row kernel, so that what every row re-reads (a layer norm's weight and bias) stays
// cached; read-only (the non-coherent path) for those re-read parameters.

template <int kBytes>
struct BitsOf;
template <>
struct BitsOf<16> {
  using type = uint4;
};
template <>
struct BitsOf<8> {
  using type = uint2;
};
template <>
struct BitsOf<4> {
  using type = unsigned int;
};
template <>
struct BitsOf<2> {
  using type = unsigned short;
};

template <class T, int kVec>
using VecBits = typename BitsOf<sizeof(Vec<T, kVec>)>::type;

template <int kVec, class T>
__device__ __forceinline__ Vec<T, kVec> load_vec_streaming(const T* p) {
  const VecBits<T, kVec> bits = __ldcs(reinterpret_cast<const VecBits<T, kVec>*>(p));
  Vec<T, kVec> v;
  memcpy(&v, &bits, sizeof v);
  return v;
}
template <int kVec, class T>
__device__ __forceinline__ Vec<T, kVec> load_vec_readonly(const T* p) {
  const VecBits<T, kVec> bits = __ldg(reinterpret_cast<const VecBits<T, kVec>*>(p));
  Vec<T, kVec> v;
  memcpy(&v, &bits, sizeof v);
  return v;
}
template <int kVec, class T>
__device__ __forceinline__ void store_vec_streaming(T* p, const Vec<T, kVec>& v) {
  VecBits<T, kVec> bits;
  memcpy(&bits, &v, sizeof v);
  __stcs(reinterpret_cast<VecBits<T, kVec>*>(p), bits);
}

// ---- team reductions. Every lane of the team gets the same bits: the xor butterfly adds the same
// two operands on both partners, and the block stage sums the warps' results in a fixed order.

template <class A>
__device__ __forceinline__ A warp_sum(A v) {
#pragma unroll
  for (int offset = kWarp / 2; offset > 0; offset /= 2) v += __shfl_xor_sync(kFullMask, v, offset);
  return v;
}

template <class A>
__device__ __forceinline__ A warp_max(A v) {
#pragma unroll
  for (int offset = kWarp / 2; offset > 0; offset /= 2) v = max(v, __shfl_xor_sync(kFullMask, v, offset));
  return v;
}

// Teams: kTeam consecutive threads of a block share one row. kTeam == kWarp is one warp (its
// reductions never leave it); kTeam == kBlockTeam is the whole block, whatever its size, and
// synchronises with __syncthreads; 64..512 split the block into at most 15 teams of kTeam threads,
// each synchronising on its own named barrier (1 + its index), so that teams do not wait for one
// another. Reductions of teams wider than a warp go through shared memory and must be reached by
// every thread of the team.
constexpr int kBlockTeam = 0;

template <int kTeam>
__device__ __forceinline__ int team_size() {
  return kTeam == kBlockTeam ? static_cast<int>(blockDim.x) : kTeam;
}
template <int kTeam>
__device__ __forceinline__ int team_rank() {
  return kTeam == kBlockTeam ? static_cast<int>(threadIdx.x) : static_cast<int>(threadIdx.x) % kTeam;
}
template <int kTeam>
__device__ __forceinline__ int team_index() {
  return kTeam == kBlockTeam ? 0 : static_cast<int>(threadIdx.x) / kTeam;
}
template <int kTeam>
__device__ __forceinline__ int teams_per_block() {
  return kTeam == kBlockTeam ? 1 : static_cast<int>(blockDim.x) / kTeam;
}

/// Waits for the threads of this thread's team (see above).
template <int kTeam>
__device__ __forceinline__ void team_barrier() {
  static_assert(kTeam == kBlockTeam || kTeam % kWarp == 0, "teams are whole warps");
  if constexpr (kTeam == kBlockTeam) {
    __syncthreads();
  } else {
    asm volatile("bar.sync %0, %1;" : : "r"(team_index<kTeam>() + 1), "r"(kTeam) : "memory");
  }
}

/// Shared scratch for one team reduction of up to kValues values (one slot per warp of the block).
template <class A, int kValues = 1>
struct TeamScratch {
  A values[kWarp][kValues];
};

/// Calls f(k, w, value of warp w) for every value k of each warp w of this thread's team, warps in
/// order, after the warps' leaders stored `values`; the team synchronises before and after.
template <int kTeam, int kValues, class A, class F>
__device__ __forceinline__ void across_team_warps(const A (&values)[kValues], TeamScratch<A, kValues>& scratch, F f) {
  const int warp = threadIdx.x / kWarp;
  if (threadIdx.x % kWarp == 0) {
#pragma unroll
    for (int k = 0; k < kValues; ++k) scratch.values[warp][k] = values[k];
  }
  team_barrier<kTeam>();
  const int warps = team_size<kTeam>() / kWarp;
  const int first = team_index<kTeam>() * warps;
  for (int w = first; w < first + warps; ++w) {
#pragma unroll
    for (int k = 0; k < kValues; ++k) f(k, w, scratch.values[w][k]);
  }
  team_barrier<kTeam>();  // the scratch is free for the team's next reduction
}

/// The sum over the team of each of values[0..kValues).
template <int kTeam, int kValues, class A>
__device__ __forceinline__ void team_sum(A (&values)[kValues], TeamScratch<A, kValues>& scratch) {
#pragma unroll
  for (int k = 0; k < kValues; ++k) values[k] = warp_sum(values[k]);
  if constexpr (kTeam != kWarp) {
    A totals[kValues];
#pragma unroll
    for (int k = 0; k < kValues; ++k) totals[k] = A(0);
    across_team_warps<kTeam>(values, scratch, [&](int k, int, A v) { totals[k] += v; });
#pragma unroll
    for (int k = 0; k < kValues; ++k) values[k] = totals[k];
  }
}

template <int kTeam, class A>
__device__ __forceinline__ A team_sum(A value, TeamScratch<A, 1>& scratch) {
  A values[1] = {value};
  team_sum<kTeam>(values, scratch);
  return values[0];
}

template <int kTeam, class A>
__device__ __forceinline__ A team_max(A value, TeamScratch<A, 1>& scratch) {
  A values[1] = {warp_max(value)};
  if constexpr (kTeam != kWarp) {
    A result = values[0];
    const int first = team_index<kTeam>() * (team_size<kTeam>() / kWarp);
    across_team_warps<kTeam>(values, scratch, [&](int, int w, A v) { result = w == first ? v : max(result, v); });
    return result;
  }
  return values[0];
}

// ---- online softmax statistics: (max, sum of exp(x - max)) merged pairwise

template <class A>
struct MaxSum {
  A max;
  A sum;
};

/// Merges two partial (max, sum) pairs. A side that has seen only -inf (or nothing) has sum 0 and
/// contributes nothing; the guard keeps exp(-inf - -inf) = nan out of the sum.
template <class T, class A>
__device__ __forceinline__ MaxSum<A> merge(MaxSum<A> a, MaxSum<A> b) {
  const A m = max(a.max, b.max);
  if (m == -INFINITY) return {m, a.sum + b.sum};
  const A sa = a.sum == A(0) ? A(0) : a.sum * row_exp<T>(a.max - m);
  const A sb = b.sum == A(0) ? A(0) : b.sum * row_exp<T>(b.max - m);
  return {m, sa + sb};
}

/// Folds x into the running (max, sum). -inf adds exp(-inf) = 0 and is skipped, so that a running
/// max of -inf never meets exp(-inf - -inf); nan still poisons the sum as on the CPU. new_max is the
/// max of a group holding x (x itself, or its vector), so a group rescales the sum at most once.
template <class T, class A>
__device__ __forceinline__ void online_add(MaxSum<A>& state, A x, A new_max) {
  if (new_max > state.max) {
    if (state.sum != A(0)) state.sum *= row_exp<T>(state.max - new_max);
    state.max = new_max;
  }
  state.sum += x == -INFINITY ? A(0) : row_exp<T>(x - state.max);
}

template <class T, class A>
__device__ __forceinline__ MaxSum<A> warp_merge(MaxSum<A> v) {
#pragma unroll
  for (int offset = kWarp / 2; offset > 0; offset /= 2) {
    const MaxSum<A> other{__shfl_xor_sync(kFullMask, v.max, offset), __shfl_xor_sync(kFullMask, v.sum, offset)};
    v = merge<T>(v, other);
  }
  return v;
}

/// The team-wide (max, sum): warps merge by butterfly, then the team's warps merge in order.
template <int kTeam, class T, class A>
__device__ __forceinline__ MaxSum<A> team_merge(MaxSum<A> v, TeamScratch<A, 2>& scratch) {
  v = warp_merge<T>(v);
  if constexpr (kTeam != kWarp) {
    const A values[2] = {v.max, v.sum};
    A warp_max_value = 0;
    const int first = team_index<kTeam>() * (team_size<kTeam>() / kWarp);
    across_team_warps<kTeam>(values, scratch, [&](int k, int w, A value) {
      if (k == 0) {
        warp_max_value = value;
      } else {
        const MaxSum<A> other{warp_max_value, value};
        v = w == first ? other : merge<T>(v, other);
      }
    });
  }
  return v;
}

// ---- launch shapes

/// Threads per block of warp-team kernels: one warp, one row per block. A block's registers are
/// released only when all its warps are done, so in blocks of 8 independent rows the warps that
/// finish early hold their slots until the slowest one ends: layer_norm 65536 x 1024 bf16 took
/// 108-111 us in blocks of 256 threads, 105-108 in 128, 104 in 64 and 102-103 in 32 on an H100
/// (cudaMemcpy's 128 MiB each way: 89 us). An SM runs at most 32 blocks, as many warps as the
/// register kernels' ~50 registers allow anyway.
constexpr int kWarpTeamBlock = 32;

inline int64_t ceil_div(int64_t a, int64_t b) {
  return (a + b - 1) / b;
}

/// The smallest power of two >= n, clamped to [low, high].
inline int pow2_team(int64_t n, int low, int high) {
  int64_t team = low;
  while (team < n && team < high) team *= 2;
  return static_cast<int>(team);
}

/// Whether rows of `cols` T starting at each pointer can be moved in 16-byte vectors: every row
/// start is 16-byte aligned and rows hold whole vectors.
template <class T>
bool rows_vectorizable(int64_t cols, std::initializer_list<const void*> pointers) {
  constexpr int kVec = kVecOf<T>;
  if (kVec == 1 || cols % kVec != 0) return false;
  for (const void* p : pointers) {
    if (p != nullptr && !core::cuda_detail::aligned16(p)) return false;
  }
  return true;
}

// ---- device-side validation

/// An i32 or i64 index tensor read as int64 (one branch per read instead of a template parameter).
struct IndexView {
  const void* data = nullptr;
  bool wide = false;
  __device__ __forceinline__ int64_t operator[](int64_t i) const {
    return wide ? static_cast<const int64_t*>(data)[i] : static_cast<int64_t>(static_cast<const int32_t*>(data)[i]);
  }
};

inline IndexView index_view(const Tensor& indices) {
  return {indices.raw_data(), indices.dtype() == DType::i64};
}

/// One 64-bit slot on the device that kernels lower (atomicMin) to the first bad position they
/// find. defer() hands it to core::cuda::defer_check, so the op does not stop the host; the error
/// is thrown at a later op or host read (Note [Deferred device checks] in core/cuda_device.h).
class DeviceErrorSlot {
 public:
  static constexpr unsigned long long kNone = ~0ull;

  DeviceErrorSlot(Device device, cudaStream_t stream)
      : slot_(core::empty({1}, TensorOptions(DType::i64, device))), stream_(stream) {
    COLOSSAL_CUDA_CHECK(cudaMemsetAsync(slot_.raw_data(), 0xff, sizeof(unsigned long long), stream_));
  }

  unsigned long long* get() const { return static_cast<unsigned long long*>(slot_.raw_data()); }

  /// Checks the slot once the kernels queued so far have run: `describe(position)` builds the
  /// message thrown for a bad position.
  void defer(std::function<std::string(int64_t position)> describe) const {
    core::cuda::defer_check(
        core::Stream{slot_.device(), stream_}, slot_.raw_data(), kNone, std::make_shared<Tensor>(slot_),
        [describe = std::move(describe)](uint64_t value) { return describe(static_cast<int64_t>(value)); });
  }

 private:
  Tensor slot_;
  cudaStream_t stream_;
};

__device__ __forceinline__ void report_bad(unsigned long long* slot, int64_t position) {
  atomicMin(slot, static_cast<unsigned long long>(position));
}

/// Element `position` of an integer tensor on the device, as int64 (for error messages only).
inline int64_t read_index_at(const Tensor& indices, int64_t position, cudaStream_t stream) {
  int64_t value = 0;
  if (indices.dtype() == DType::i64) {
    COLOSSAL_CUDA_CHECK(cudaMemcpyAsync(&value, static_cast<const int64_t*>(indices.raw_data()) + position,
                                        sizeof(int64_t), cudaMemcpyDeviceToHost, stream));
  } else {
    int32_t narrow = 0;
    COLOSSAL_CUDA_CHECK(cudaMemcpyAsync(&narrow, static_cast<const int32_t*>(indices.raw_data()) + position,
                                        sizeof(int32_t), cudaMemcpyDeviceToHost, stream));
    COLOSSAL_CUDA_CHECK(cudaStreamSynchronize(stream));
    return narrow;
  }
  COLOSSAL_CUDA_CHECK(cudaStreamSynchronize(stream));
  return value;
}

}  // namespace colossal::ops::cuda::rows
