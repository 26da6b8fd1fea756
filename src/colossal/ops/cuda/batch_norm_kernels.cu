// CUDA batch_norm2d forward (training and evaluation) and fused backward, on the per-channel
// reduction and map of per_channel.cuh. Our own kernels rather than cuDNN's; see
// Note [batch norm without cuDNN].
//
// Forward, training: one read of x for the statistics (Welford/Chan in f32, f64 for f64), a
// per-channel finish that also updates the running statistics, and a read of x plus a write of y:
// 3 passes over x's bytes. Backward: one read of (x, dy) for sum(dy) and sum(dy * (x - mean)), then
// a read of (x, dy) and a write of dx: 5 passes. Both are bandwidth-bound.
#include <cuda_runtime.h>

#include <algorithm>
#include <initializer_list>
#include <utility>

#include "colossal/core/cuda/launch.cuh"      // check_on_device, grid_for, stream_of
#include "colossal/ops/conv_kernels.h"        // batch_norm stubs
#include "colossal/ops/cuda/per_channel.cuh"  // channel reductions and maps

// Note [batch norm without cuDNN]
// cuDNN's batch norm (cudnnBatchNormalizationForwardTraining/Inference/Backward) does not fit the
// kernel contract: it wants f32 scale/bias and running statistics for f16/bf16 input where ours
// are in x's dtype or undefined and the statistics of any floating dtype, it has no backward for
// evaluation mode, wants eps in the backward (our contract passes only save_invstd), and does not
// promise a reduction order. Matching it would take casts and copies around every call; these
// kernels implement the contract directly, deterministically (fixed splits, fixed trees, partials
// combined in order) and at the same memory traffic.

namespace colossal::ops {
namespace {

using core::acc_t;
using cuda::ChannelShape;
using cuda::load_group;
using cuda::store_as;
using cuda::store_group;

/// save_mean / save_invstd hold f64 for f64 input, f32 otherwise (the contract's accumulation dtype).
template <class T>
using stat_t = std::conditional_t<std::is_same_v<T, double>, double, float>;

template <class R>
__device__ __forceinline__ double to_double(R v) {
  return static_cast<double>(static_cast<acc_t<R>>(v));
}

/// Scratch bytes on x's device from the caching allocator, freed in stream order.
Tensor scratch(int64_t bytes, Device device) {
  return core::empty({bytes}, TensorOptions(DType::u8, device));
}

// ---- statistics

/// Count, mean and sum of squared deviations of a set of values.
template <class A>
struct Moments {
  A count, mean, m2;
};

/// Chan et al.'s combination of two sets' moments; exact in count, stable in m2.
template <class A>
__device__ __forceinline__ Moments<A> combine_moments(const Moments<A>& a, const Moments<A>& b) {
  if (b.count == A(0)) return a;
  if (a.count == A(0)) return b;
  const A count = a.count + b.count;
  const A ratio = b.count / count;
  const A delta = b.mean - a.mean;
  return {count, a.mean + delta * ratio, a.m2 + b.m2 + delta * delta * a.count * ratio};
}

template <class T>
struct BatchMoments {
  using A = acc_t<T>;
  using State = Moments<A>;
  template <int kVec>
  struct Loaded {
    A v[kVec];
  };
  const T* x;

  __device__ State identity(int64_t) const { return {A(0), A(0), A(0)}; }
  template <int kVec>
  __device__ Loaded<kVec> load(int64_t element, int64_t) const {
    const auto group = load_group<kVec>(x + element);
    Loaded<kVec> out;
#pragma unroll
    for (int k = 0; k < kVec; ++k) out.v[k] = static_cast<A>(group.v[k]);
    return out;
  }
  /// The group's own moments (two passes over registers), merged in with one division.
  template <int kVec>
  __device__ void accumulate(State& state, const Loaded<kVec>& in) const {
    A sum = A(0);
#pragma unroll
    for (int k = 0; k < kVec; ++k) sum += in.v[k];
    const A mean = sum * (A(1) / A(kVec));
    A m2 = A(0);
#pragma unroll
    for (int k = 0; k < kVec; ++k) m2 += (in.v[k] - mean) * (in.v[k] - mean);
    state = combine_moments(state, State{A(kVec), mean, m2});
  }
  __device__ static State combine(const State& a, const State& b) {
    return combine_moments(a, b);
  }
};

/// y = x * scale + shift per channel: the normalisation and the affine map folded together.
template <class A>
struct Affine {
  A scale, shift;
};

/// A running statistic of any floating dtype (they need not match x's, nor each other's).
struct RunningStat {
  void* data = nullptr;
  DType dtype = DType::f32;

  __device__ double load(int64_t c) const {
    switch (dtype) {
      case DType::f64:
        return static_cast<const double*>(data)[c];
      case DType::f16:
        return static_cast<float>(static_cast<const core::Half*>(data)[c]);
      case DType::bf16:
        return static_cast<float>(static_cast<const core::BFloat16*>(data)[c]);
      default:
        return static_cast<const float*>(data)[c];
    }
  }
  /// Rounds through the dtype's accumulation type, as the CPU kernel stores them.
  __device__ void store(int64_t c, double v) const {
    switch (dtype) {
      case DType::f64:
        static_cast<double*>(data)[c] = v;
        break;
      case DType::f16:
        static_cast<core::Half*>(data)[c] = core::Half(static_cast<float>(v));
        break;
      case DType::bf16:
        static_cast<core::BFloat16*>(data)[c] = core::BFloat16(static_cast<float>(v));
        break;
      default:
        static_cast<float*>(data)[c] = static_cast<float>(v);
        break;
    }
  }
};

RunningStat running_stat(const Tensor& t) {
  if (!t.defined()) return {};
  COLOSSAL_CHECK(core::is_floating(t.dtype()), "batch_norm2d (CUDA): running statistics must be floating, got {}",
                 t.dtype());
  return {t.raw_data(), t.dtype()};
}

/// The folded affine map y = x * scale + shift of channel c from the saved statistics (as rounded
/// to stat_t) and the parameters, in f64: the forward's normalisation and, recomputed from the same
/// values to the same bits, the pre-activation whose sign masks a fused relu's gradient.
template <class T>
__device__ __forceinline__ Affine<acc_t<T>> affine_of(const T* weight, const T* bias, stat_t<T> saved_mean,
                                                      stat_t<T> saved_invstd, int64_t c) {
  using A = acc_t<T>;
  const double mean = static_cast<double>(saved_mean), invstd = static_cast<double>(saved_invstd);
  const double gamma = weight != nullptr ? to_double(weight[c]) : 1.0;
  const double beta = bias != nullptr ? to_double(bias[c]) : 0.0;
  return {static_cast<A>(gamma * invstd), static_cast<A>(beta - mean * gamma * invstd)};
}

/// Per channel: the batch statistics (training, from `partials`) or the running ones (evaluation),
/// save_mean / save_invstd, the running-statistics update and the folded affine map. One thread per
/// channel; the splits are combined in order, in f64 as the CPU kernel computes.
template <class T>
__global__ void finish_forward_kernel(const Moments<acc_t<T>>* partials, int splits, int64_t channels, int64_t count,
                                      bool training, double momentum, double eps, RunningStat running_mean,
                                      RunningStat running_var, const T* weight, const T* bias, stat_t<T>* save_mean,
                                      stat_t<T>* save_invstd, Affine<acc_t<T>>* affine) {
  using A = acc_t<T>;
  for (int64_t c = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; c < channels; c += int64_t{gridDim.x} * blockDim.x) {
    double mean, invstd;
    if (training) {
      Moments<double> total{0.0, 0.0, 0.0};
      for (int s = 0; s < splits; ++s) {
        const Moments<A>& p = partials[c * splits + s];
        total = combine_moments(total, Moments<double>{static_cast<double>(p.count), static_cast<double>(p.mean),
                                                       static_cast<double>(p.m2)});
      }
      mean = total.mean;
      // The exact count, not the merged floating one.
      invstd = 1.0 / sqrt(total.m2 / static_cast<double>(count) + eps);
      if (running_mean.data != nullptr) {
        const double unbiased_var = total.m2 / static_cast<double>(count - 1);
        running_mean.store(c, (1.0 - momentum) * running_mean.load(c) + momentum * mean);
        running_var.store(c, (1.0 - momentum) * running_var.load(c) + momentum * unbiased_var);
      }
    } else {
      mean = running_mean.load(c);
      invstd = 1.0 / sqrt(running_var.load(c) + eps);
    }
    const auto saved_mean = static_cast<stat_t<T>>(mean), saved_invstd = static_cast<stat_t<T>>(invstd);
    save_mean[c] = saved_mean;
    save_invstd[c] = saved_invstd;
    affine[c] = affine_of(weight, bias, saved_mean, saved_invstd, c);
  }
}

template <class T>
struct Normalize {
  using A = acc_t<T>;
  T* y;
  const T* x;
  const Affine<A>* affine;

  template <int kVec>
  __device__ void apply(int64_t element, int64_t c) const {
    const Affine<A> a = affine[c];
    const auto in = load_group<kVec>(x + element);
    cuda::Group<T, kVec> out;
#pragma unroll
    for (int k = 0; k < kVec; ++k) out.v[k] = store_as<T>(static_cast<A>(in.v[k]) * a.scale + a.shift);
    store_group<kVec>(y + element, out);
  }
};

template <class T>
void forward_typed(const Tensor& y, const Tensor& save_mean, const Tensor& save_invstd, const Tensor& x,
                   const Tensor& running_mean, const Tensor& running_var, const Tensor& weight, const Tensor& bias,
                   bool training, double momentum, double eps) {
  using A = acc_t<T>;
  using S = stat_t<T>;
  const ChannelShape shape = cuda::channel_shape(x);
  const cudaStream_t stream = core::cuda_detail::stream_of(x);
  const Device device = x.device();

  Tensor partials;
  int splits = 0;
  if (training) {
    const cuda::ChannelReduction plan = cuda::plan_channel_reduction<T>(shape, {x.raw_data()});
    splits = plan.splits;
    partials = scratch(shape.channels * splits * static_cast<int64_t>(sizeof(Moments<A>)), device);
    cuda::launch_channel_partials<T>(BatchMoments<T>{x.data<T>()}, plan, static_cast<Moments<A>*>(partials.raw_data()),
                                     stream);
  }

  Tensor affine = scratch(shape.channels * static_cast<int64_t>(sizeof(Affine<A>)), device);
  auto* affine_data = static_cast<Affine<A>*>(affine.raw_data());
  const T* weight_data = weight.defined() ? weight.data<T>() : nullptr;
  const T* bias_data = bias.defined() ? bias.data<T>() : nullptr;
  finish_forward_kernel<T><<<core::cuda_detail::grid_for(shape.channels), core::cuda_detail::kThreads, 0, stream>>>(
      partials.defined() ? static_cast<const Moments<A>*>(partials.raw_data()) : nullptr, splits, shape.channels,
      shape.per_channel(), training, momentum, eps, running_stat(running_mean), running_stat(running_var), weight_data,
      bias_data, save_mean.data<S>(), save_invstd.data<S>(), affine_data);
  COLOSSAL_CUDA_CHECK_LAUNCH();

  cuda::launch_channel_map<T>(shape, {y.raw_data(), x.raw_data()}, Normalize<T>{y.data<T>(), x.data<T>(), affine_data},
                              stream);
}

// ---- backward

template <class A>
struct GradSums {
  A dy, dy_xmu;  ///< sum(dy) and sum(dy * (x - mean))
};

template <class T>
struct BatchGradSums {
  using A = acc_t<T>;
  using State = GradSums<A>;
  template <int kVec>
  struct Loaded {
    A dy[kVec], xmu[kVec];
  };
  const T* dy;
  const T* x;
  const stat_t<T>* mean;

  __device__ State identity(int64_t) const { return {A(0), A(0)}; }
  template <int kVec>
  __device__ Loaded<kVec> load(int64_t element, int64_t c) const {
    const auto g = load_group<kVec>(dy + element);
    const auto v = load_group<kVec>(x + element);
    const A m = static_cast<A>(mean[c]);
    Loaded<kVec> out;
#pragma unroll
    for (int k = 0; k < kVec; ++k) {
      out.dy[k] = static_cast<A>(g.v[k]);
      out.xmu[k] = static_cast<A>(v.v[k]) - m;
    }
    return out;
  }
  template <int kVec>
  __device__ void accumulate(State& state, const Loaded<kVec>& in) const {
#pragma unroll
    for (int k = 0; k < kVec; ++k) {
      state.dy += in.dy[k];
      state.dy_xmu += in.dy[k] * in.xmu[k];
    }
  }
  __device__ static State combine(const State& a, const State& b) {
    return {a.dy + b.dy, a.dy_xmu + b.dy_xmu};
  }
};

/// dx = scale * dy - offset - (x - mean) * slope, the CPU's scale * (dy - mean(dy) - xhat *
/// mean(dy * xhat)) with xhat = (x - mean) * invstd; evaluation has offset = slope = 0.
template <class A>
struct GradCoefficients {
  A scale, offset, slope, mean;
};

/// Per channel: grad_weight, grad_bias and the dx coefficients from the partial sums (combined in
/// order, in f64). partials is null when only dx of evaluation mode is wanted.
template <class T>
__global__ void finish_backward_kernel(const GradSums<acc_t<T>>* partials, int splits, int64_t channels, int64_t count,
                                       bool training, const T* weight, const stat_t<T>* save_mean,
                                       const stat_t<T>* save_invstd, T* grad_weight, T* grad_bias,
                                       GradCoefficients<acc_t<T>>* coefficients) {
  using A = acc_t<T>;
  for (int64_t c = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; c < channels; c += int64_t{gridDim.x} * blockDim.x) {
    double sum_dy = 0.0, sum_dy_xmu = 0.0;
    if (partials != nullptr) {
      for (int s = 0; s < splits; ++s) {
        sum_dy += static_cast<double>(partials[c * splits + s].dy);
        sum_dy_xmu += static_cast<double>(partials[c * splits + s].dy_xmu);
      }
    }
    const double mean = static_cast<double>(save_mean[c]);
    const double invstd = static_cast<double>(save_invstd[c]);
    const double sum_dy_xhat = sum_dy_xmu * invstd;
    if (grad_bias != nullptr) grad_bias[c] = store_as<T>(static_cast<A>(sum_dy));
    if (grad_weight != nullptr) grad_weight[c] = store_as<T>(static_cast<A>(sum_dy_xhat));
    if (coefficients == nullptr) continue;
    const double scale = (weight != nullptr ? to_double(weight[c]) : 1.0) * invstd;
    const double mean_dy = training ? sum_dy / static_cast<double>(count) : 0.0;
    const double mean_dy_xhat = training ? sum_dy_xhat / static_cast<double>(count) : 0.0;
    coefficients[c] = {static_cast<A>(scale), static_cast<A>(scale * mean_dy),
                       static_cast<A>(scale * invstd * mean_dy_xhat), static_cast<A>(mean)};
  }
}

/// dx of kVec elements at `element` from their channels' coefficients (coefficient(i) for element
/// i of the group): x is read only in training, where the statistics depend on it.
template <class T, bool kTraining, int kVec, class Coefficient>
__device__ __forceinline__ void write_grad_input(T* dx, const T* dy, const T* x, int64_t element,
                                                 const Coefficient& coefficient) {
  using A = acc_t<T>;
  const auto g = load_group<kVec>(dy + element);
  cuda::Group<T, kVec> v{};
  if constexpr (kTraining) v = load_group<kVec>(x + element);
  cuda::Group<T, kVec> out;
#pragma unroll
  for (int i = 0; i < kVec; ++i) {
    const GradCoefficients<A> k = coefficient(i);
    const A scaled = k.scale * static_cast<A>(g.v[i]);
    out.v[i] = store_as<T>(kTraining ? scaled - k.offset - (static_cast<A>(v.v[i]) - k.mean) * k.slope : scaled);
  }
  store_group<kVec>(dx + element, out);
}

template <class T, bool kTraining>
struct GradInput {
  using A = acc_t<T>;
  T* dx;
  const T* dy;
  const T* x;
  const GradCoefficients<A>* coefficients;

  template <int kVec>
  __device__ void apply(int64_t element, int64_t c) const {
    const GradCoefficients<A> k = coefficients[c];
    write_grad_input<T, kTraining, kVec>(dx, dy, x, element, [&](int) { return k; });
  }
};

template <class T>
void backward_typed(const Tensor& grad_x, const Tensor& grad_weight, const Tensor& grad_bias, const Tensor& grad_y,
                    const Tensor& x, const Tensor& weight, const Tensor& save_mean, const Tensor& save_invstd,
                    bool training) {
  using A = acc_t<T>;
  using S = stat_t<T>;
  const ChannelShape shape = cuda::channel_shape(x);
  const cudaStream_t stream = core::cuda_detail::stream_of(x);
  const Device device = x.device();
  const bool need_sums = grad_weight.defined() || grad_bias.defined() || (training && grad_x.defined());
  if (!need_sums && !grad_x.defined()) return;

  Tensor partials;
  int splits = 0;
  if (need_sums) {
    const cuda::ChannelReduction plan = cuda::plan_channel_reduction<T>(shape, {grad_y.raw_data(), x.raw_data()});
    splits = plan.splits;
    partials = scratch(shape.channels * splits * static_cast<int64_t>(sizeof(GradSums<A>)), device);
    cuda::launch_channel_partials<T>(BatchGradSums<T>{grad_y.data<T>(), x.data<T>(), save_mean.data<S>()}, plan,
                                     static_cast<GradSums<A>*>(partials.raw_data()), stream);
  }
  Tensor coefficients;
  if (grad_x.defined())
    coefficients = scratch(shape.channels * static_cast<int64_t>(sizeof(GradCoefficients<A>)), device);
  auto* coefficient_data =
      coefficients.defined() ? static_cast<GradCoefficients<A>*>(coefficients.raw_data()) : nullptr;
  finish_backward_kernel<T><<<core::cuda_detail::grid_for(shape.channels), core::cuda_detail::kThreads, 0, stream>>>(
      partials.defined() ? static_cast<const GradSums<A>*>(partials.raw_data()) : nullptr, splits, shape.channels,
      shape.per_channel(), training, weight.defined() ? weight.data<T>() : nullptr, save_mean.data<S>(),
      save_invstd.data<S>(), grad_weight.defined() ? grad_weight.data<T>() : nullptr,
      grad_bias.defined() ? grad_bias.data<T>() : nullptr, coefficient_data);
  COLOSSAL_CUDA_CHECK_LAUNCH();

  if (!grad_x.defined()) return;
  if (training) {
    cuda::launch_channel_map<T>(shape, {grad_x.raw_data(), grad_y.raw_data(), x.raw_data()},
                                GradInput<T, true>{grad_x.data<T>(), grad_y.data<T>(), x.data<T>(), coefficient_data},
                                stream);
  } else {
    cuda::launch_channel_map<T>(shape, {grad_x.raw_data(), grad_y.raw_data()},
                                GradInput<T, false>{grad_x.data<T>(), grad_y.data<T>(), x.data<T>(), coefficient_data},
                                stream);
  }
}

// ---- channels innermost (nhwc)
// Note [batch norm over rows of channels]
// An nhwc image is a [rows, C] matrix (rows = N * H * W) normalised per column. A block is tx lanes
// across 16-byte groups of channels by ty = 256 / tx rows; each lane walks its rows of one split
// with a per-channel Welford update (one reciprocal per row for all the group's channels), lanes of
// a column are combined in a fixed tree, and each split's result lands in the same
// partials[c * splits + s] the nchw finish kernels read. The maps keep their channels' coefficients
// in registers and stream rows. Same passes over memory as nchw, every access a whole row segment.

/// combined[c] <- channel c's `splits` partial states combined in a fixed order: thread t folds
/// splits t, t + 128, ... in turn, then a fixed tree over the threads. One block per channel, so
/// hundreds of splits cost a few microseconds where the finish kernels' one thread per channel
/// would fold them serially.
constexpr int kCombineThreads = 128;

template <class State, class Combine>
__global__ void __launch_bounds__(kCombineThreads)
    combine_splits_kernel(const State* partials, int splits, State identity, Combine combine, State* combined) {
  __shared__ State shared[kCombineThreads];
  const State* channel = partials + blockIdx.x * int64_t{splits};
  State acc = identity;
  for (int s = threadIdx.x; s < splits; s += kCombineThreads) acc = combine(acc, channel[s]);
  shared[threadIdx.x] = acc;
  __syncthreads();
  for (int width = kCombineThreads / 2; width > 0; width /= 2) {
    if (threadIdx.x < width) shared[threadIdx.x] = combine(shared[threadIdx.x], shared[threadIdx.x + width]);
    __syncthreads();
  }
  if (threadIdx.x == 0) combined[blockIdx.x] = shared[0];
}

template <class A>
struct CombineMoments {
  __device__ Moments<A> operator()(const Moments<A>& a, const Moments<A>& b) const { return combine_moments(a, b); }
};

template <class A>
struct AddGradSums {
  __device__ GradSums<A> operator()(const GradSums<A>& a, const GradSums<A>& b) const {
    return {a.dy + b.dy, a.dy_xmu + b.dy_xmu};
  }
};

/// The channels' partials folded to one state each (in `scratch_out`, allocated here) when a plan
/// has several splits; the finish kernels then read one split per channel.
template <class State, class Combine>
const State* fold_splits(const State* partials, int& splits, int64_t channels, State identity, Combine combine,
                         Tensor& scratch_out, Device device, cudaStream_t stream) {
  if (splits == 1) return partials;
  scratch_out = scratch(channels * static_cast<int64_t>(sizeof(State)), device);
  auto* combined = static_cast<State*>(scratch_out.raw_data());
  combine_splits_kernel<State, Combine>
      <<<static_cast<unsigned>(channels), kCombineThreads, 0, stream>>>(partials, splits, identity, combine, combined);
  COLOSSAL_CUDA_CHECK_LAUNCH();
  splits = 1;
  return combined;
}

constexpr int kRowsThreads = 256;
constexpr int kRowsUnroll = 4;

/// How a kernel over a [rows, channels] tensor runs: `vec` channels per lane (16 bytes of T or 1),
/// `tx` lanes across the groups of a column tile, `ty` rows per block, `splits` blocks down the rows
/// each covering `chunk` rows.
struct RowsPlan {
  int vec = 1, tx = 1, ty = kRowsThreads;
  int64_t rows = 0, groups = 0;  ///< groups = channels / vec
  int splits = 1;
  int64_t chunk = 0;
  dim3 grid;
};

template <class T>
RowsPlan plan_rows(int64_t rows, int64_t channels, std::initializer_list<const void*> pointers, int64_t max_splits) {
  constexpr int kVec = 16 / sizeof(T);
  RowsPlan plan;
  bool vectorizable = kVec > 1 && channels % kVec == 0;
  for (const void* p : pointers) vectorizable = vectorizable && core::cuda_detail::aligned16(p);
  plan.vec = vectorizable ? kVec : 1;
  plan.rows = rows;
  plan.groups = channels / plan.vec;
  while (plan.tx < 32 && plan.tx < plan.groups) plan.tx *= 2;
  plan.ty = kRowsThreads / plan.tx;
  const int64_t tiles = (plan.groups + plan.tx - 1) / plan.tx;
  // About 1024 blocks (several per SM), each row lane walking at least 8 rows.
  const int64_t wanted = (1024 + tiles - 1) / tiles;
  const int64_t splits =
      std::clamp<int64_t>(wanted, 1, std::max<int64_t>(1, std::min(max_splits, rows / (plan.ty * 8))));
  plan.chunk = std::max<int64_t>(1, (rows + splits - 1) / splits);
  plan.splits = static_cast<int>(std::max<int64_t>(1, (rows + plan.chunk - 1) / plan.chunk));
  plan.grid = dim3(static_cast<unsigned>(tiles), static_cast<unsigned>(plan.splits));
  return plan;
}

/// The lane's place in a RowsPlan's block: its group of channels and its first row.
struct RowsLane {
  int64_t group, row, end;
  int ty;
  bool active;

  __device__ RowsLane(const RowsPlan& plan) {
    const int lane = threadIdx.x % plan.tx;
    ty = plan.ty;
    group = blockIdx.x * int64_t{plan.tx} + lane;
    row = blockIdx.y * plan.chunk + threadIdx.x / plan.tx;
    end = min(plan.rows, (blockIdx.y + int64_t{1}) * plan.chunk);
    active = group < plan.groups;
  }
};

/// Combines the block's per-lane states of each channel down the row lanes in a fixed tree and
/// writes partials[c * splits + split]. `shared` holds kRowsThreads * kVec states.
template <class State, int kVec, class Combine>
__device__ void combine_rows_and_store(State (&state)[kVec], State* shared, const RowsPlan& plan, const RowsLane& at,
                                       Combine combine, State* partials) {
#pragma unroll
  for (int k = 0; k < kVec; ++k) shared[threadIdx.x * kVec + k] = state[k];
  __syncthreads();
  const int row_lane = threadIdx.x / plan.tx;
  for (int width = plan.ty / 2; width > 0; width /= 2) {
    if (row_lane < width) {
      const int other = threadIdx.x + width * plan.tx;
#pragma unroll
      for (int k = 0; k < kVec; ++k) {
        shared[threadIdx.x * kVec + k] = combine(shared[threadIdx.x * kVec + k], shared[other * kVec + k]);
      }
    }
    __syncthreads();
  }
  if (row_lane == 0 && at.active) {
#pragma unroll
    for (int k = 0; k < kVec; ++k) {
      partials[(at.group * kVec + k) * plan.splits + blockIdx.y] = shared[threadIdx.x * kVec + k];
    }
  }
}

template <class T, int kVec>
__global__ void __launch_bounds__(kRowsThreads)
    nhwc_moments_kernel(const T* x, RowsPlan plan, Moments<acc_t<T>>* partials) {
  using A = acc_t<T>;
  __shared__ Moments<A> shared[kRowsThreads * kVec];
  const RowsLane at(plan);
  Moments<A> state[kVec];
#pragma unroll
  for (int k = 0; k < kVec; ++k) state[k] = {A(0), A(0), A(0)};
  if (at.active) {
    A count = A(0);
    for (int64_t r = at.row; r < at.end; r += int64_t{at.ty} * kRowsUnroll) {
      cuda::Group<T, kVec> loaded[kRowsUnroll];
#pragma unroll
      for (int u = 0; u < kRowsUnroll; ++u) {
        const int64_t row = r + int64_t{u} * at.ty;
        if (row < at.end) loaded[u] = load_group<kVec>(x + (row * plan.groups + at.group) * kVec);
      }
#pragma unroll
      for (int u = 0; u < kRowsUnroll; ++u) {
        if (r + int64_t{u} * at.ty >= at.end) break;
        count += A(1);
        const A inv = A(1) / count;
#pragma unroll
        for (int k = 0; k < kVec; ++k) {
          const A v = static_cast<A>(loaded[u].v[k]);
          const A delta = v - state[k].mean;
          state[k].mean += delta * inv;
          state[k].m2 += delta * (v - state[k].mean);
        }
      }
    }
#pragma unroll
    for (int k = 0; k < kVec; ++k) state[k].count = count;
  }
  combine_rows_and_store<Moments<A>, kVec>(state, shared, plan, at, CombineMoments<A>{}, partials);
}

/// With kRelu, dy is that of relu(batch_norm(x)): it is dropped where the pre-activation
/// x * scale + shift (relu_affine) is not positive.
template <class T, int kVec, bool kRelu>
__global__ void __launch_bounds__(kRowsThreads)
    nhwc_grad_sums_kernel(const T* dy, const T* x, const stat_t<T>* mean, const Affine<acc_t<T>>* relu_affine,
                          RowsPlan plan, GradSums<acc_t<T>>* partials) {
  using A = acc_t<T>;
  __shared__ GradSums<A> shared[kRowsThreads * kVec];
  const RowsLane at(plan);
  GradSums<A> state[kVec];
  A m[kVec];
  Affine<A> a[kVec];
#pragma unroll
  for (int k = 0; k < kVec; ++k) {
    state[k] = {A(0), A(0)};
    m[k] = at.active ? static_cast<A>(mean[at.group * kVec + k]) : A(0);
    if constexpr (kRelu) a[k] = at.active ? relu_affine[at.group * kVec + k] : Affine<A>{A(0), A(0)};
  }
  if (at.active) {
    for (int64_t r = at.row; r < at.end; r += int64_t{at.ty} * kRowsUnroll) {
      cuda::Group<T, kVec> g[kRowsUnroll], v[kRowsUnroll];
#pragma unroll
      for (int u = 0; u < kRowsUnroll; ++u) {
        const int64_t row = r + int64_t{u} * at.ty;
        if (row < at.end) {
          const int64_t element = (row * plan.groups + at.group) * kVec;
          g[u] = load_group<kVec>(dy + element);
          v[u] = load_group<kVec>(x + element);
        }
      }
#pragma unroll
      for (int u = 0; u < kRowsUnroll; ++u) {
        if (r + int64_t{u} * at.ty >= at.end) break;
#pragma unroll
        for (int k = 0; k < kVec; ++k) {
          const A xv = static_cast<A>(v[u].v[k]);
          A d = static_cast<A>(g[u].v[k]);
          if constexpr (kRelu) d = xv * a[k].scale + a[k].shift > A(0) ? d : A(0);
          state[k].dy += d;
          state[k].dy_xmu += d * (xv - m[k]);
        }
      }
    }
  }
  combine_rows_and_store<GradSums<A>, kVec>(state, shared, plan, at, AddGradSums<A>{}, partials);
}

/// Streams the lane's rows of a [rows, C] tensor with its kVec channels' coefficients (Affine or
/// GradCoefficients) in registers: apply(element, coefficients) maps the group of row r that starts
/// at `element`.
template <int kVec, class Coefficient, class Apply>
__device__ __forceinline__ void stream_rows(const RowsPlan& plan, const Coefficient* coefficients, const Apply& apply) {
  const RowsLane at(plan);
  if (!at.active) return;
  Coefficient c[kVec];
#pragma unroll
  for (int k = 0; k < kVec; ++k) c[k] = coefficients[at.group * kVec + k];
  for (int64_t r = at.row; r < at.end; r += at.ty) apply((r * plan.groups + at.group) * kVec, c);
}

/// y = x * scale + shift, or relu of it (as ops::relu: v > 0 ? v : 0), or with kResidual relu of
/// it plus the residual r. The normalised value is rounded to T before the residual is added, as the
/// composed ops (batch_norm2d, add, relu) round it: rounding once would be more accurate, but where
/// the sum cancels to near zero it flips the relu's mask against theirs (tens of elements in 32768
/// of uniform bf16 data), and the fused op is to give the composed ops' numbers.
template <class T, int kVec, bool kRelu, bool kResidual = false>
__global__ void __launch_bounds__(kRowsThreads)
    nhwc_normalize_kernel(T* y, const T* x, const T* r, const Affine<acc_t<T>>* affine, RowsPlan plan) {
  using A = acc_t<T>;
  static_assert(kRelu || !kResidual, "the residual comes with the relu");
  stream_rows<kVec>(plan, affine, [&](int64_t element, const Affine<A>(&a)[kVec]) {
    const auto in = load_group<kVec>(x + element);
    cuda::Group<T, kVec> residual;
    if constexpr (kResidual) residual = load_group<kVec>(r + element);
    cuda::Group<T, kVec> out;
#pragma unroll
    for (int k = 0; k < kVec; ++k) {
      A v = static_cast<A>(in.v[k]) * a[k].scale + a[k].shift;
      if constexpr (kResidual) v = static_cast<A>(store_as<T>(v)) + static_cast<A>(residual.v[k]);
      out.v[k] = store_as<T>(kRelu ? (v > A(0) ? v : A(0)) : v);
    }
    store_group<kVec>(y + element, out);
  });
}

/// dx from the per-channel GradCoefficients (training: x is read too).
template <class T, int kVec, bool kTraining>
__global__ void __launch_bounds__(kRowsThreads)
    nhwc_grad_input_kernel(T* dx, const T* dy, const T* x, const GradCoefficients<acc_t<T>>* coefficients,
                           RowsPlan plan) {
  using A = acc_t<T>;
  stream_rows<kVec>(plan, coefficients, [&](int64_t element, const GradCoefficients<A>(&c)[kVec]) {
    write_grad_input<T, kTraining, kVec>(dx, dy, x, element, [&](int i) { return c[i]; });
  });
}

/// dx of relu(batch_norm(x)) (training or not): the dy of positions whose pre-activation is not
/// positive is dropped first; the mean terms still reach them in training.
template <class T, int kVec, bool kTraining>
__global__ void __launch_bounds__(kRowsThreads)
    nhwc_grad_input_relu_kernel(T* dx, const T* dy, const T* x, const GradCoefficients<acc_t<T>>* coefficients,
                                const Affine<acc_t<T>>* relu_affine, RowsPlan plan) {
  using A = acc_t<T>;
  const RowsLane at(plan);
  if (!at.active) return;
  GradCoefficients<A> c[kVec];
  Affine<A> a[kVec];
#pragma unroll
  for (int k = 0; k < kVec; ++k) {
    c[k] = coefficients[at.group * kVec + k];
    a[k] = relu_affine[at.group * kVec + k];
  }
  for (int64_t r = at.row; r < at.end; r += at.ty) {
    const int64_t element = (r * plan.groups + at.group) * kVec;
    const auto g = load_group<kVec>(dy + element);
    const auto v = load_group<kVec>(x + element);
    cuda::Group<T, kVec> out;
#pragma unroll
    for (int k = 0; k < kVec; ++k) {
      const A xv = static_cast<A>(v.v[k]);
      const A scaled = xv * a[k].scale + a[k].shift > A(0) ? c[k].scale * static_cast<A>(g.v[k]) : A(0);
      out.v[k] = store_as<T>(kTraining ? scaled - c[k].offset - (xv - c[k].mean) * c[k].slope : scaled);
    }
    store_group<kVec>(dx + element, out);
  }
}

/// The relu mask's affine map per channel, recomputed from what the forward saved (affine_of).
template <class T>
__global__ void relu_affine_kernel(const T* weight, const T* bias, const stat_t<T>* save_mean,
                                   const stat_t<T>* save_invstd, int64_t channels, Affine<acc_t<T>>* affine) {
  for (int64_t c = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; c < channels; c += int64_t{gridDim.x} * blockDim.x) {
    affine[c] = affine_of(weight, bias, save_mean[c], save_invstd[c], c);
  }
}

/// Launches kernel<kVec> for the plan's vector width: 16 bytes of T or one element.
template <class T, class Launch>
void with_vec(const RowsPlan& plan, const Launch& launch) {
  constexpr int kVec = 16 / sizeof(T);
  if (plan.vec == kVec && kVec > 1) {
    launch.template operator()<kVec>();
  } else {
    launch.template operator()<1>();
  }
  COLOSSAL_CUDA_CHECK_LAUNCH();
}

/// The partial reductions use up to this many splits.
constexpr int64_t kMaxRowSplits = 512;

/// One State per channel of a [rows, channels] reduction: `kernel.template operator()<kVec>(partials)`
/// launches the per-split reduction over plan.grid into channels * plan.splits States, which
/// fold_splits then combines. The buffers live in `partials` and `folded` (the caller keeps them
/// until the kernels that read them are queued); `splits` is what the finish kernels should read.
template <class T, class State, class Combine, class Kernel>
const State* reduce_rows(const RowsPlan& plan, int64_t channels, State identity, Combine combine, const Kernel& kernel,
                         Tensor& partials, Tensor& folded, int& splits, Device device, cudaStream_t stream) {
  partials = scratch(channels * plan.splits * static_cast<int64_t>(sizeof(State)), device);
  auto* partial_data = static_cast<State*>(partials.raw_data());
  with_vec<T>(plan, [&]<int kVec>() { kernel.template operator()<kVec>(partial_data); });
  splits = plan.splits;
  return fold_splits(static_cast<const State*>(partial_data), splits, channels, identity, combine, folded, device,
                     stream);
}

/// With kResidual, y = relu(batch_norm(x) + residual).
template <class T, bool kRelu, bool kResidual = false>
void nhwc_forward_typed(const Tensor& y, const Tensor& save_mean, const Tensor& save_invstd, const Tensor& x,
                        const Tensor& residual, const Tensor& running_mean, const Tensor& running_var,
                        const Tensor& weight, const Tensor& bias, bool training, double momentum, double eps) {
  using A = acc_t<T>;
  using S = stat_t<T>;
  const int64_t channels = x.size(-1);
  const int64_t rows = x.numel() / channels;
  const cudaStream_t stream = core::cuda_detail::stream_of(x);
  const Device device = x.device();
  const RowsPlan plan = plan_rows<T>(rows, channels, {x.raw_data(), y.raw_data()}, kMaxRowSplits);

  Tensor partials, folded;
  const Moments<A>* moments = nullptr;
  int splits = plan.splits;
  if (training) {
    moments = reduce_rows<T>(
        plan, channels, Moments<A>{A(0), A(0), A(0)}, CombineMoments<A>{},
        [&]<int kVec>(Moments<A>* out) {
          nhwc_moments_kernel<T, kVec><<<plan.grid, kRowsThreads, 0, stream>>>(x.data<T>(), plan, out);
        },
        partials, folded, splits, device, stream);
  }
  Tensor affine = scratch(channels * static_cast<int64_t>(sizeof(Affine<A>)), device);
  auto* affine_data = static_cast<Affine<A>*>(affine.raw_data());
  finish_forward_kernel<T><<<core::cuda_detail::grid_for(channels), core::cuda_detail::kThreads, 0, stream>>>(
      moments, splits, channels, rows, training, momentum, eps, running_stat(running_mean), running_stat(running_var),
      weight.defined() ? weight.data<T>() : nullptr, bias.defined() ? bias.data<T>() : nullptr, save_mean.data<S>(),
      save_invstd.data<S>(), affine_data);
  COLOSSAL_CUDA_CHECK_LAUNCH();
  // The map needs no splits: every block streams its rows, as many blocks as rows allow.
  const T* r = kResidual ? residual.data<T>() : nullptr;
  const RowsPlan map = plan_rows<T>(rows, channels, {x.raw_data(), y.raw_data(), r}, 65535);
  with_vec<T>(map, [&]<int kVec>() {
    nhwc_normalize_kernel<T, kVec, kRelu, kResidual>
        <<<map.grid, kRowsThreads, 0, stream>>>(y.data<T>(), x.data<T>(), r, affine_data, map);
  });
}

/// With kRelu, grad_y is that of relu(batch_norm(x)) and `bias` the forward's (for the mask).
template <class T, bool kRelu>
void nhwc_backward_typed(const Tensor& grad_x, const Tensor& grad_weight, const Tensor& grad_bias, const Tensor& grad_y,
                         const Tensor& x, const Tensor& weight, const Tensor& bias, const Tensor& save_mean,
                         const Tensor& save_invstd, bool training) {
  using A = acc_t<T>;
  using S = stat_t<T>;
  const int64_t channels = x.size(-1);
  const int64_t rows = x.numel() / channels;
  const cudaStream_t stream = core::cuda_detail::stream_of(x);
  const Device device = x.device();
  const bool need_sums = grad_weight.defined() || grad_bias.defined() || (training && grad_x.defined());
  if (!need_sums && !grad_x.defined()) return;
  const void* dx_data = grad_x.defined() ? grad_x.raw_data() : nullptr;
  const RowsPlan plan = plan_rows<T>(rows, channels, {grad_y.raw_data(), x.raw_data(), dx_data}, kMaxRowSplits);

  Tensor relu_affine;
  Affine<A>* relu_affine_data = nullptr;
  if constexpr (kRelu) {
    relu_affine = scratch(channels * static_cast<int64_t>(sizeof(Affine<A>)), device);
    relu_affine_data = static_cast<Affine<A>*>(relu_affine.raw_data());
    relu_affine_kernel<T><<<core::cuda_detail::grid_for(channels), core::cuda_detail::kThreads, 0, stream>>>(
        weight.defined() ? weight.data<T>() : nullptr, bias.defined() ? bias.data<T>() : nullptr, save_mean.data<S>(),
        save_invstd.data<S>(), channels, relu_affine_data);
    COLOSSAL_CUDA_CHECK_LAUNCH();
  }
  Tensor partials, folded;
  const GradSums<A>* sums = nullptr;
  int splits = plan.splits;
  if (need_sums) {
    sums = reduce_rows<T>(
        plan, channels, GradSums<A>{A(0), A(0)}, AddGradSums<A>{},
        [&]<int kVec>(GradSums<A>* out) {
          nhwc_grad_sums_kernel<T, kVec, kRelu><<<plan.grid, kRowsThreads, 0, stream>>>(
              grad_y.data<T>(), x.data<T>(), save_mean.data<S>(), relu_affine_data, plan, out);
        },
        partials, folded, splits, device, stream);
  }
  Tensor coefficients;
  if (grad_x.defined()) coefficients = scratch(channels * static_cast<int64_t>(sizeof(GradCoefficients<A>)), device);
  auto* coefficient_data =
      coefficients.defined() ? static_cast<GradCoefficients<A>*>(coefficients.raw_data()) : nullptr;
  finish_backward_kernel<T><<<core::cuda_detail::grid_for(channels), core::cuda_detail::kThreads, 0, stream>>>(
      sums, splits, channels, rows, training, weight.defined() ? weight.data<T>() : nullptr, save_mean.data<S>(),
      save_invstd.data<S>(), grad_weight.defined() ? grad_weight.data<T>() : nullptr,
      grad_bias.defined() ? grad_bias.data<T>() : nullptr, coefficient_data);
  COLOSSAL_CUDA_CHECK_LAUNCH();

  if (!grad_x.defined()) return;
  const RowsPlan map = plan_rows<T>(rows, channels, {grad_y.raw_data(), x.raw_data(), dx_data}, 65535);
  with_vec<T>(map, [&]<int kVec>() {
    if constexpr (kRelu) {
      if (training) {
        nhwc_grad_input_relu_kernel<T, kVec, true><<<map.grid, kRowsThreads, 0, stream>>>(
            grad_x.data<T>(), grad_y.data<T>(), x.data<T>(), coefficient_data, relu_affine_data, map);
      } else {
        nhwc_grad_input_relu_kernel<T, kVec, false><<<map.grid, kRowsThreads, 0, stream>>>(
            grad_x.data<T>(), grad_y.data<T>(), x.data<T>(), coefficient_data, relu_affine_data, map);
      }
    } else if (training) {
      nhwc_grad_input_kernel<T, kVec, true><<<map.grid, kRowsThreads, 0, stream>>>(grad_x.data<T>(), grad_y.data<T>(),
                                                                                   x.data<T>(), coefficient_data, map);
    } else {
      nhwc_grad_input_kernel<T, kVec, false><<<map.grid, kRowsThreads, 0, stream>>>(grad_x.data<T>(), grad_y.data<T>(),
                                                                                    x.data<T>(), coefficient_data, map);
    }
  });
}

// ---- the registered kernels

/// The forward kernels of either layout, nhwc with relu, and nhwc with a residual and relu: devices
/// (and the residual's shape) checked, dtype dispatched.
template <bool kNhwc, bool kRelu = false, bool kResidual = false>
void forward_in(const Tensor& y, const Tensor& save_mean, const Tensor& save_invstd, const Tensor& x,
                const Tensor& residual, const Tensor& running_mean, const Tensor& running_var, const Tensor& weight,
                const Tensor& bias, bool training, double momentum, double eps) {
  static_assert(kNhwc || !kRelu, "relu is fused into the nhwc kernels only");
  static_assert(kRelu || !kResidual, "the residual comes with the relu");
  const char* op = kResidual ? "batch_norm_add_relu2d (nhwc)"
                   : kRelu   ? "batch_norm_relu2d (nhwc)"
                   : kNhwc   ? "batch_norm2d (nhwc)"
                             : "batch_norm2d";
  core::cuda_detail::check_defined_on_device(x.device(), op,
                                             {{&y, "y"},
                                              {&residual, "residual"},
                                              {&save_mean, "save_mean"},
                                              {&save_invstd, "save_invstd"},
                                              {&running_mean, "running_mean"},
                                              {&running_var, "running_var"},
                                              {&weight, "weight"},
                                              {&bias, "bias"}});
  if constexpr (kResidual) {
    COLOSSAL_CHECK(residual.shape() == x.shape() && residual.dtype() == x.dtype() && residual.is_contiguous(),
                   "{}: expected a contiguous {} residual of x's shape {}, got {} of shape {}", op, x.dtype(),
                   x.shape(), residual.dtype(), residual.shape());
  }
  core::cuda::DeviceGuard guard(x.device());
  core::dispatch_floating(x.dtype(), op, [&]<class T>() {
    if constexpr (kNhwc) {
      nhwc_forward_typed<T, kRelu, kResidual>(y, save_mean, save_invstd, x, residual, running_mean, running_var, weight,
                                              bias, training, momentum, eps);
    } else {
      forward_typed<T>(y, save_mean, save_invstd, x, running_mean, running_var, weight, bias, training, momentum, eps);
    }
  });
}

template <bool kNhwc, bool kRelu = false>
void forward_cuda(const Tensor& y, const Tensor& save_mean, const Tensor& save_invstd, const Tensor& x,
                  const Tensor& running_mean, const Tensor& running_var, const Tensor& weight, const Tensor& bias,
                  bool training, double momentum, double eps) {
  forward_in<kNhwc, kRelu>(y, save_mean, save_invstd, x, Tensor(), running_mean, running_var, weight, bias, training,
                           momentum, eps);
}

/// The registered backward kernels: either layout, and nhwc with relu (which also takes the bias).
template <bool kNhwc, bool kRelu>
void backward_in(const Tensor& grad_x, const Tensor& grad_weight, const Tensor& grad_bias, const Tensor& grad_y,
                 const Tensor& x, const Tensor& weight, const Tensor& bias, const Tensor& save_mean,
                 const Tensor& save_invstd, bool training) {
  static_assert(kNhwc || !kRelu, "relu is fused into the nhwc kernels only");
  const char* op = kRelu   ? "batch_norm_relu2d_backward (nhwc)"
                   : kNhwc ? "batch_norm2d_backward (nhwc)"
                           : "batch_norm2d_backward";
  core::cuda_detail::check_defined_on_device(x.device(), op,
                                             {{&grad_x, "grad_x"},
                                              {&grad_weight, "grad_weight"},
                                              {&grad_bias, "grad_bias"},
                                              {&grad_y, "grad_y"},
                                              {&weight, "weight"},
                                              {&bias, "bias"},
                                              {&save_mean, "save_mean"},
                                              {&save_invstd, "save_invstd"}});
  core::cuda::DeviceGuard guard(x.device());
  core::dispatch_floating(x.dtype(), op, [&]<class T>() {
    if constexpr (kNhwc) {
      nhwc_backward_typed<T, kRelu>(grad_x, grad_weight, grad_bias, grad_y, x, weight, bias, save_mean, save_invstd,
                                    training);
    } else {
      backward_typed<T>(grad_x, grad_weight, grad_bias, grad_y, x, weight, save_mean, save_invstd, training);
    }
  });
}

template <bool kNhwc>
void backward_cuda(const Tensor& grad_x, const Tensor& grad_weight, const Tensor& grad_bias, const Tensor& grad_y,
                   const Tensor& x, const Tensor& weight, const Tensor& save_mean, const Tensor& save_invstd,
                   bool training) {
  backward_in<kNhwc, false>(grad_x, grad_weight, grad_bias, grad_y, x, weight, Tensor(), save_mean, save_invstd,
                            training);
}

COLOSSAL_REGISTER_KERNEL(batch_norm_forward_stub, core::DeviceType::cuda, forward_cuda<false>);
COLOSSAL_REGISTER_KERNEL(batch_norm_backward_stub, core::DeviceType::cuda, backward_cuda<false>);
COLOSSAL_REGISTER_KERNEL(batch_norm_nhwc_forward_stub, core::DeviceType::cuda, forward_cuda<true>);
COLOSSAL_REGISTER_KERNEL(batch_norm_nhwc_backward_stub, core::DeviceType::cuda, backward_cuda<true>);
// (One template argument list each: the macro would split at the comma of <true, true>.)
constexpr auto relu_forward_cuda = forward_cuda<true, true>;
constexpr auto relu_backward_cuda = backward_in<true, true>;
COLOSSAL_REGISTER_KERNEL(batch_norm_relu_nhwc_forward_stub, core::DeviceType::cuda, relu_forward_cuda);
COLOSSAL_REGISTER_KERNEL(batch_norm_relu_nhwc_backward_stub, core::DeviceType::cuda, relu_backward_cuda);
constexpr auto add_relu_forward_cuda = forward_in<true, true, true>;
COLOSSAL_REGISTER_KERNEL(batch_norm_add_relu_nhwc_forward_stub, core::DeviceType::cuda, add_relu_forward_cuda);

}  // namespace
}  // namespace colossal::ops
