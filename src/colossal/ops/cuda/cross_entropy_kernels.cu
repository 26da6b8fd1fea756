// CUDA cross-entropy, forward and backward, with the semantics of ops/loss_kernels.h (label
// smoothing, ignore_index, soft targets; f32, f64, f16, bf16 logits computed in f32). The forward
// reads each row of logits once (an online logsumexp, with the sums the smoothed and soft losses
// need gathered in the same pass) and keeps the row's logsumexp; sum and mean then add the row
// losses in one block in a fixed order (deterministic). The backward writes
// (softmax * sum(q) - q) * g in one pass from the saved logsumexp.
#include <cuda_runtime.h>

#include <algorithm>

#include "colossal/ops/cuda/row_team.cuh"
#include "colossal/ops/loss_kernels.h"

namespace colossal::ops {
namespace {

using core::acc_t;
using cuda::rows::ceil_div;
using cuda::rows::from_acc;
using cuda::rows::kBlockTeam;
using cuda::rows::kWarp;
using cuda::rows::load_vec;
using cuda::rows::MaxSum;
using cuda::rows::row_exp;
using cuda::rows::store_vec;
using cuda::rows::TeamScratch;
using cuda::rows::to_acc;
using cuda::rows::Vec;

/// Rows of up to kWarp * kWarpVectors vectors go to one warp (8 per block), longer ones to a block.
constexpr int kWarpVectors = 4;
constexpr int kWarpBlock = 256;
constexpr int kMaxRowBlock = 256;
/// Vectors each thread loads before using any.
constexpr int kUnroll = 4;
constexpr int kFinishBlock = 1024;
/// Blocks of kMaxRowBlock threads the forward row kernel must fit on an SM (at most 64 registers a
/// thread; soft targets and f64 keep two, which they fit without spilling). Free to use 93
/// registers, two blocks fitted and the forward read GPT-2's 16384 x 50304 logits at 51% of the DRAM
/// bandwidth, waiting on loads (ncu, H100); at four, 1.01 -> 0.79-0.85 ms. The backward stays unbounded
/// (72 registers, three blocks): capped the same way it went from 1.60 to 2.00 ms. Hard and soft
/// targets are separate instantiations (kSoft), so the hard ones carry no soft-target registers.
template <class T, bool kSoft>
constexpr int kRowBlocksPerSm = kSoft || sizeof(T) == 8 ? 2 : 4;

using Labels = cuda::rows::IndexView;

template <class T>
struct ForwardArgs {
  using A = acc_t<T>;
  const T* logits;
  Labels labels;  // hard targets (soft == nullptr)
  const T* soft;  // soft targets [N, C], or nullptr
  A* lse;         // [N]
  A* row_loss;    // [N] for sum and mean, else nullptr
  A* out_rows;    // [N] for Reduction::none, else nullptr (the loss is in the accumulation type)
  unsigned long long* bad_row;
  int64_t rows, classes, ignore_index;
  A smoothing;
};

template <int kTeam>
__device__ __forceinline__ int64_t team_row() {
  return blockIdx.x * int64_t{cuda::rows::teams_per_block<kTeam>()} + cuda::rows::team_index<kTeam>();
}

/// Row i's logsumexp and loss sum_c q_c (lse - x_c). Every sum is taken relative to the row's first
/// logit x0, so that lse - x_c stays accurate when the logits are large but close together.
template <class T, int kVec, int kTeam, bool kSoft>
__global__ void __launch_bounds__(kMaxRowBlock, (kRowBlocksPerSm<T, kSoft>))
    cross_entropy_forward_rows(ForwardArgs<T> args) {
  using A = acc_t<T>;
  __shared__ TeamScratch<A, 2> merge_scratch;
  __shared__ TeamScratch<A, 3> sum_scratch;
  const int64_t row = team_row<kTeam>();
  if (row >= args.rows) return;  // only warp teams overshoot, and they never synchronise the block
  const int rank = cuda::rows::team_rank<kTeam>(), size = cuda::rows::team_size<kTeam>();
  const int64_t classes = args.classes;
  const T* xr = args.logits + row * classes;
  const T* tr = kSoft ? args.soft + row * classes : nullptr;
  const A uniform_share = args.smoothing / static_cast<A>(classes);
  const A reference = to_acc(xr[0]);
  const bool smoothed = args.smoothing != A(0);  // sum_x is needed only for label smoothing

  MaxSum<A> state{-INFINITY, A(0)};
  A sum_x = 0, sum_q = 0, sum_qx = 0;  // sum (x - x0); sum q; sum q (x - x0)
  const int64_t vectors = classes / kVec;
  for (int64_t base = rank; base < vectors; base += int64_t{kUnroll} * size) {
    Vec<T, kVec> xs[kUnroll], ts[kSoft ? kUnroll : 1];
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) {
      const int64_t v = base + int64_t{u} * size;
      if (v < vectors) {
        xs[u] = load_vec<kVec>(xr + v * kVec);
        if constexpr (kSoft) ts[u] = load_vec<kVec>(tr + v * kVec);
      }
    }
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) {
      if (base + int64_t{u} * size < vectors) {
        A vector_max = -INFINITY;
#pragma unroll
        for (int j = 0; j < kVec; ++j) vector_max = max(vector_max, to_acc(xs[u].v[j]));
        // One rescale per vector, then its exponentials summed apart from the running sum (the
        // per-element online_add compared and branched on every element: this kernel was bound by
        // instructions, not memory). Same guards: -inf adds nothing, nan poisons the sum.
        if (vector_max > state.max) {
          if (state.sum != A(0)) state.sum *= cuda::rows::row_exp<T>(state.max - vector_max);
          state.max = vector_max;
        }
        A vector_sum = 0;
#pragma unroll
        for (int j = 0; j < kVec; ++j) {
          const A x = to_acc(xs[u].v[j]);
          vector_sum += x == -INFINITY ? A(0) : cuda::rows::row_exp<T>(x - state.max);
        }
        state.sum += vector_sum;
        if (!smoothed && !kSoft) continue;
#pragma unroll
        for (int j = 0; j < kVec; ++j) {
          const A x = to_acc(xs[u].v[j]);
          sum_x += x - reference;
          if constexpr (kSoft) {
            const A q = (A(1) - args.smoothing) * to_acc(ts[u].v[j]) + uniform_share;
            sum_q += q;
            sum_qx += q * (x - reference);
          }
        }
      }
    }
  }
  state = cuda::rows::team_merge<kTeam, T>(state, merge_scratch);
  A sums[3] = {sum_x, sum_q, sum_qx};
  cuda::rows::team_sum<kTeam>(sums, sum_scratch);
  if (rank != 0) return;

  // A row of -inf logits has sum 0 here; the CPU's exp(-inf - -inf) makes its lse nan.
  const A lse = state.sum == A(0) ? A(NAN) : state.max + log(state.sum);
  args.lse[row] = lse;
  A loss = 0;
  if constexpr (kSoft) {
    loss = sums[1] * (lse - reference) - sums[2];
  } else {
    const int64_t label = args.labels[row];
    if (label != args.ignore_index) {
      if (label < 0 || label >= classes) {
        cuda::rows::report_bad(args.bad_row, row);
      } else {
        // (1 - s) nll + s * mean_c(lse - x_c)
        loss = (A(1) - args.smoothing) * (lse - to_acc(xr[label]));
        if (args.smoothing != A(0)) {
          loss += args.smoothing * ((lse - reference) - sums[0] / static_cast<A>(classes));
        }
      }
    }
  }
  if (args.out_rows) {
    args.out_rows[row] = loss;
  } else {
    args.row_loss[row] = loss;
  }
}

/// One block: total_weight <- the rows not ignored, and for sum/mean out <- the row losses added in
/// f64 in a fixed order (per thread in row order, then the threads in order), divided by the count
/// for mean.
template <class T>
__global__ void __launch_bounds__(kFinishBlock, 1)
    cross_entropy_finish(acc_t<T>* __restrict__ out, double* __restrict__ total_weight,
                         const acc_t<T>* __restrict__ row_loss, Labels labels, bool soft, int64_t rows,
                         int64_t ignore_index, Reduction reduction) {
  __shared__ TeamScratch<double, 2> scratch;
  double values[2] = {0.0, 0.0};  // loss sum, rows counted
  for (int64_t i = threadIdx.x; i < rows; i += blockDim.x) {
    if (row_loss) values[0] += static_cast<double>(row_loss[i]);
    if (!soft && labels[i] != ignore_index) values[1] += 1.0;
  }
  cuda::rows::team_sum<kBlockTeam>(values, scratch);
  if (threadIdx.x != 0) return;
  const double counted = soft ? static_cast<double>(rows) : values[1];  // exact below 2^53
  *total_weight = counted;
  if (reduction == Reduction::none) return;
  // mean over no counted rows is 0 / 0 = nan, as in torch (Note [Cross entropy over no targets]).
  const double total = reduction == Reduction::mean ? values[0] / counted : values[0];
  out[0] = static_cast<acc_t<T>>(total);
}

template <class T>
struct BackwardArgs {
  using A = acc_t<T>;
  T* grad_logits;     // or nullptr
  T* grad_target;     // soft targets only, or nullptr
  const A* grad_out;  // the accumulation type, as the loss
  const T* logits;
  Labels labels;
  const T* soft;
  const A* lse;
  const double* total_weight;
  int64_t rows, classes, ignore_index;
  A smoothing;
  Reduction reduction;
};

/// Soft targets' row of the backward (see cross_entropy_backward_rows).
template <class T, int kVec, int kTeam>
__device__ __forceinline__ void soft_backward_row(const BackwardArgs<T>& args, int64_t start, int64_t vectors, int rank,
                                                  int size, acc_t<T> scale, acc_t<T> lse, acc_t<T> uniform_share,
                                                  acc_t<T> keep, TeamScratch<acc_t<T>>& scratch) {
  using A = acc_t<T>;
  const T* tr = args.soft + start;
  A q_total = 0;  // soft targets need not sum to 1
  if (args.grad_logits) {
    for (int64_t v = rank; v < vectors; v += size) {
      const Vec<T, kVec> ts = load_vec<kVec>(tr + v * kVec);
#pragma unroll
      for (int j = 0; j < kVec; ++j) q_total += keep * to_acc(ts.v[j]) + uniform_share;
    }
    q_total = cuda::rows::team_sum<kTeam>(q_total, scratch);
  }
  for (int64_t v = rank; v < vectors; v += size) {
    const Vec<T, kVec> xs = load_vec<kVec>(args.logits + start + v * kVec);
    const Vec<T, kVec> ts = load_vec<kVec>(tr + v * kVec);
    Vec<T, kVec> dx, dt;
#pragma unroll
    for (int j = 0; j < kVec; ++j) {
      const A log_p = to_acc(xs.v[j]) - lse;
      const A q = keep * to_acc(ts.v[j]) + uniform_share;
      dx.v[j] = from_acc<T>((row_exp<T>(log_p) * q_total - q) * scale);
      dt.v[j] = from_acc<T>(-keep * log_p * scale);
    }
    if (args.grad_logits) store_vec<kVec>(args.grad_logits + start + v * kVec, dx);
    if (args.grad_target) store_vec<kVec>(args.grad_target + start + v * kVec, dt);
  }
}

/// Hard targets: grad = (softmax - q) * g with q = s / C + (1 - s) [c == label], elementwise from
/// the saved lse; ignored rows (and, memory-safely, labels the forward would have rejected, which
/// never equal a class) get no one-hot term. Soft targets: sum(q) first, then
/// grad_logits = (softmax * sum(q) - q) * g and grad_target = -(1 - s) (x - lse) * g.
template <class T, int kVec, int kTeam, bool kSoft>
__global__ void __launch_bounds__(kMaxRowBlock, 1) cross_entropy_backward_rows(BackwardArgs<T> args) {
  using A = acc_t<T>;
  __shared__ TeamScratch<A> scratch;
  const int64_t row = team_row<kTeam>();
  if (row >= args.rows) return;  // only warp teams overshoot, and they never synchronise the block
  const int rank = cuda::rows::team_rank<kTeam>(), size = cuda::rows::team_size<kTeam>();
  const int64_t classes = args.classes;
  const int64_t vectors = classes / kVec;
  const int64_t start = row * classes;
  const int64_t label = kSoft ? -1 : args.labels[row];
  const bool ignored = !kSoft && label == args.ignore_index;

  A scale;
  if (args.reduction == Reduction::none) {
    scale = args.grad_out[row];
  } else {
    double shared = static_cast<double>(args.grad_out[0]);
    if (args.reduction == Reduction::mean) shared /= *args.total_weight;
    scale = static_cast<A>(shared);
  }
  const A lse = args.lse[row];
  const A uniform_share = args.smoothing / static_cast<A>(classes);
  const A keep = A(1) - args.smoothing;

  if constexpr (!kSoft) {
    if (!args.grad_logits) return;
    for (int64_t base = rank; base < vectors; base += int64_t{kUnroll} * size) {
      Vec<T, kVec> xs[kUnroll];
#pragma unroll
      for (int u = 0; u < kUnroll; ++u) {
        const int64_t v = base + int64_t{u} * size;
        if (v < vectors && !ignored) xs[u] = load_vec<kVec>(args.logits + start + v * kVec);
      }
#pragma unroll
      for (int u = 0; u < kUnroll; ++u) {
        const int64_t v = base + int64_t{u} * size;
        if (v < vectors) {
          Vec<T, kVec> out;
#pragma unroll
          for (int j = 0; j < kVec; ++j) {
            // Ignored rows get an exact 0 even when mean's divisor is 0 (Note [Cross entropy over no targets]).
            if (ignored) {
              out.v[j] = from_acc<T>(A(0));
            } else {
              const A q = uniform_share + (v * kVec + j == label ? keep : A(0));
              out.v[j] = from_acc<T>((row_exp<T>(to_acc(xs[u].v[j]) - lse) - q) * scale);
            }
          }
          store_vec<kVec>(args.grad_logits + start + v * kVec, out);
        }
      }
    }
  } else {
    soft_backward_row<T, kVec, kTeam>(args, start, vectors, rank, size, scale, lse, uniform_share, keep, scratch);
  }
}

// ---- vocab-parallel slices (ops/loss_kernels.h, parallel/tp/cross_entropy.h)

template <class T>
struct ShardArgs {
  using A = acc_t<T>;
  const T* logits;
  Labels labels;
  A* stats;                     // forward: [3, rows]
  T* grad_logits;               // backward
  const A* lse;                 // backward: the whole vocabulary's, [rows]
  const A* scale;               // backward: [rows]
  unsigned long long* bad_row;  // forward: a target outside the whole vocabulary
  int64_t rows, columns, class_start, real_columns, classes, ignore_index;
  A smoothing, uniform_share;
};

/// Row i's target as a column of this slice, or -1 where another slice holds it (or it is ignored).
template <class T>
__device__ __forceinline__ int64_t shard_column(const ShardArgs<T>& args, int64_t row) {
  const int64_t label = args.labels[row];
  const int64_t y = label - args.class_start;
  return label != args.ignore_index && y >= 0 && y < args.real_columns ? y : -1;
}

/// The slice's logsumexp over its real columns (an online max/sum, one rescale per vector), the
/// target's logit where the slice holds it and, with label smoothing, the sum of the real columns.
/// Vectors past real_columns are masked element by element; the ones before it are not.
template <class T, int kVec, int kTeam>
__global__ void __launch_bounds__(kMaxRowBlock, (kRowBlocksPerSm<T, false>)) shard_forward_rows(ShardArgs<T> args) {
  using A = acc_t<T>;
  __shared__ TeamScratch<A, 2> merge_scratch;
  __shared__ TeamScratch<A, 1> sum_scratch;
  const int64_t row = team_row<kTeam>();
  if (row >= args.rows) return;
  const int rank = cuda::rows::team_rank<kTeam>(), size = cuda::rows::team_size<kTeam>();
  const T* xr = args.logits + row * args.columns;
  const int64_t real = args.real_columns;
  const int64_t vectors = (real + kVec - 1) / kVec;
  const bool smoothed = args.smoothing != A(0);
  MaxSum<A> state{-INFINITY, A(0)};
  A sum_x = 0;
  for (int64_t v = rank; v < vectors; v += size) {
    const Vec<T, kVec> xs = load_vec<kVec>(xr + v * kVec);
    const bool whole = (v + 1) * kVec <= real;
    A vector_max = -INFINITY;
#pragma unroll
    for (int j = 0; j < kVec; ++j) {
      if (whole || v * kVec + j < real) vector_max = max(vector_max, to_acc(xs.v[j]));
    }
    if (vector_max > state.max) {
      if (state.sum != A(0)) state.sum *= row_exp<T>(state.max - vector_max);
      state.max = vector_max;
    }
    A vector_sum = 0;
#pragma unroll
    for (int j = 0; j < kVec; ++j) {
      if (whole || v * kVec + j < real) {
        const A x = to_acc(xs.v[j]);
        vector_sum += x == -INFINITY ? A(0) : row_exp<T>(x - state.max);
        if (smoothed) sum_x += x;
      }
    }
    state.sum += vector_sum;
  }
  state = cuda::rows::team_merge<kTeam, T>(state, merge_scratch);
  sum_x = cuda::rows::team_sum<kTeam>(sum_x, sum_scratch);
  if (rank != 0) return;
  // No real column (a slice of padding only): it adds exp(-inf) = 0 to the whole row's sum.
  args.stats[row] = state.sum == A(0) ? A(-INFINITY) : state.max + log(state.sum);
  const int64_t label = args.labels[row];
  if (label != args.ignore_index && (label < 0 || label >= args.classes)) cuda::rows::report_bad(args.bad_row, row);
  const int64_t y = shard_column(args, row);
  args.stats[args.rows + row] = y >= 0 ? to_acc(xr[y]) : A(0);
  args.stats[2 * args.rows + row] = sum_x;
}

/// (exp(x - lse) - q) * scale on the real columns, 0 on the padding.
template <class T, int kVec, int kTeam>
__global__ void __launch_bounds__(kMaxRowBlock, 1) shard_backward_rows(ShardArgs<T> args) {
  using A = acc_t<T>;
  const int64_t row = team_row<kTeam>();
  if (row >= args.rows) return;
  const int rank = cuda::rows::team_rank<kTeam>(), size = cuda::rows::team_size<kTeam>();
  const int64_t start = row * args.columns;
  const int64_t vectors = args.columns / kVec;
  const int64_t y = shard_column(args, row);
  const A lse = args.lse[row], scale = args.scale[row], keep = A(1) - args.smoothing;
  for (int64_t v = rank; v < vectors; v += size) {
    const Vec<T, kVec> xs = load_vec<kVec>(args.logits + start + v * kVec);
    Vec<T, kVec> out;
#pragma unroll
    for (int j = 0; j < kVec; ++j) {
      const int64_t c = v * kVec + j;
      const A q = args.uniform_share + (c == y ? keep : A(0));
      out.v[j] = from_acc<T>(c < args.real_columns ? (row_exp<T>(to_acc(xs.v[j]) - lse) - q) * scale : A(0));
    }
    store_vec<kVec>(args.grad_logits + start + v * kVec, out);
  }
}

// ---- launchers

/// A warp for short rows, else one block of up to kMaxRowBlock threads per row.
struct RowLaunch {
  bool warp;
  unsigned grid;
  int block;
};

RowLaunch plan_rows(int64_t rows, int64_t vectors) {
  if (vectors <= int64_t{kWarp} * kWarpVectors) {
    return {true, static_cast<unsigned>(ceil_div(rows, kWarpBlock / kWarp)), kWarpBlock};
  }
  return {false, static_cast<unsigned>(rows), cuda::rows::pow2_team(ceil_div(vectors, kWarpVectors), 64, kMaxRowBlock)};
}

Labels labels_of(const Tensor& target, const CrossEntropyParams& params) {
  return params.soft_target ? Labels{} : cuda::rows::index_view(target);
}

template <class T, int kVec>
void launch_forward(const ForwardArgs<T>& args, cudaStream_t stream) {
  const RowLaunch launch = plan_rows(args.rows, args.classes / kVec);
  auto run = [&]<bool kSoft>() {
    if (launch.warp) {
      cross_entropy_forward_rows<T, kVec, kWarp, kSoft><<<launch.grid, launch.block, 0, stream>>>(args);
    } else {
      cross_entropy_forward_rows<T, kVec, kBlockTeam, kSoft><<<launch.grid, launch.block, 0, stream>>>(args);
    }
  };
  args.soft ? run.template operator()<true>() : run.template operator()<false>();
  COLOSSAL_CUDA_CHECK_LAUNCH();
}

template <class T, int kVec>
void launch_backward(const BackwardArgs<T>& args, cudaStream_t stream) {
  const RowLaunch launch = plan_rows(args.rows, args.classes / kVec);
  auto run = [&]<bool kSoft>() {
    if (launch.warp) {
      cross_entropy_backward_rows<T, kVec, kWarp, kSoft><<<launch.grid, launch.block, 0, stream>>>(args);
    } else {
      cross_entropy_backward_rows<T, kVec, kBlockTeam, kSoft><<<launch.grid, launch.block, 0, stream>>>(args);
    }
  };
  args.soft ? run.template operator()<true>() : run.template operator()<false>();
  COLOSSAL_CUDA_CHECK_LAUNCH();
}

void check_devices(const char* op, Device device,
                   std::initializer_list<std::pair<const Tensor*, const char*>> tensors) {
  for (const auto& [t, role] : tensors) {
    if (t->defined()) core::cuda_detail::check_on_device(*t, device, op, role);
  }
}

void cross_entropy_forward_cuda(const Tensor& out, const Tensor& lse, const Tensor& total_weight, const Tensor& logits,
                                const Tensor& target, const CrossEntropyParams& params) {
  const Device device = logits.device();
  check_devices("cross_entropy", device,
                {{&out, "the output"}, {&lse, "lse"}, {&total_weight, "total_weight"}, {&target, "target"}});
  const int64_t rows = logits.shape()[0];
  const int64_t classes = logits.shape()[1];
  COLOSSAL_CHECK(rows < (int64_t{1} << 31), "cross_entropy: {} rows exceed the CUDA grid limit", rows);
  COLOSSAL_CHECK(classes > 0 || rows == 0, "cross_entropy: logits of shape {} have no classes", logits.shape());
  core::cuda::DeviceGuard guard(device);
  cudaStream_t stream = core::cuda_detail::stream_of(logits);
  const Labels labels = labels_of(target, params);
  std::optional<cuda::rows::DeviceErrorSlot> bad_row;
  if (!params.soft_target && rows > 0) bad_row.emplace(device, stream);
  core::dispatch_floating(logits.dtype(), "cross_entropy", [&]<class T>() {
    using A = acc_t<T>;
    const bool none = params.reduction == Reduction::none;
    Tensor row_loss;
    if (!none && rows > 0) row_loss = core::empty({rows}, TensorOptions(core::dtype_of<A>(), device));
    if (rows > 0) {
      const ForwardArgs<T> args{logits.data<T>(),
                                labels,
                                params.soft_target ? target.data<T>() : nullptr,
                                lse.data<A>(),
                                none ? nullptr : row_loss.data<A>(),
                                none ? out.data<A>() : nullptr,
                                bad_row ? bad_row->get() : nullptr,
                                rows,
                                classes,
                                params.ignore_index,
                                static_cast<A>(params.label_smoothing)};
      if (cuda::rows::rows_vectorizable<T>(classes, {logits.raw_data(), args.soft})) {
        launch_forward<T, cuda::rows::kVecOf<T>>(args, stream);
      } else {
        launch_forward<T, 1>(args, stream);
      }
    }
    cross_entropy_finish<T><<<1, kFinishBlock, 0, stream>>>(
        none ? nullptr : out.data<A>(), total_weight.data<double>(), row_loss.defined() ? row_loss.data<A>() : nullptr,
        labels, params.soft_target, rows, params.ignore_index, params.reduction);
    COLOSSAL_CUDA_CHECK_LAUNCH();
  });
  if (!bad_row) return;
  // Checked without stopping the host (Note [Deferred device checks]): a bad target throws at a later
  // op or host read, with this message.
  bad_row->defer([target, classes, ignore_index = params.ignore_index, stream](int64_t row) {
    const int64_t value = cuda::rows::read_index_at(target, row, stream);
    return fmt::format(
        "cross_entropy: target {} at row {} is out of range for {} classes (valid: 0..{}, or ignore_index {})", value,
        row, classes, classes - 1, ignore_index);
  });
}

// The backward does not check the targets again: they are the tensor the forward validated (the op
// saves it), and a bad label cannot make this kernel touch memory out of bounds; a second host
// synchronisation per step would only stall the backward.
void cross_entropy_backward_cuda(const Tensor& grad_logits, const Tensor& grad_target, const Tensor& grad_out,
                                 const Tensor& logits, const Tensor& target, const Tensor& lse,
                                 const Tensor& total_weight, const CrossEntropyParams& params) {
  const Device device = logits.device();
  check_devices("cross_entropy backward", device,
                {{&grad_logits, "grad_logits"},
                 {&grad_target, "grad_target"},
                 {&grad_out, "grad_out"},
                 {&target, "target"},
                 {&lse, "lse"},
                 {&total_weight, "total_weight"}});
  const int64_t rows = logits.shape()[0];
  const int64_t classes = logits.shape()[1];
  if (rows == 0 || classes == 0 || (!grad_logits.defined() && !grad_target.defined())) return;
  COLOSSAL_CHECK(rows < (int64_t{1} << 31), "cross_entropy backward: {} rows exceed the CUDA grid limit", rows);
  core::cuda::DeviceGuard guard(device);
  cudaStream_t stream = core::cuda_detail::stream_of(logits);
  core::dispatch_floating(logits.dtype(), "cross_entropy backward", [&]<class T>() {
    using A = acc_t<T>;
    const BackwardArgs<T> args{grad_logits.defined() ? grad_logits.data<T>() : nullptr,
                               grad_target.defined() ? grad_target.data<T>() : nullptr,
                               grad_out.data<A>(),
                               logits.data<T>(),
                               labels_of(target, params),
                               params.soft_target ? target.data<T>() : nullptr,
                               lse.data<A>(),
                               total_weight.data<double>(),
                               rows,
                               classes,
                               params.ignore_index,
                               static_cast<A>(params.label_smoothing),
                               params.reduction};
    if (cuda::rows::rows_vectorizable<T>(classes, {args.grad_logits, args.grad_target, args.logits, args.soft})) {
      launch_backward<T, cuda::rows::kVecOf<T>>(args, stream);
    } else {
      launch_backward<T, 1>(args, stream);
    }
  });
}

template <class T, int kVec, bool kBackward>
void launch_shard(const ShardArgs<T>& args, cudaStream_t stream) {
  const RowLaunch launch = plan_rows(args.rows, args.columns / kVec);
  if (launch.warp) {
    kBackward ? shard_backward_rows<T, kVec, kWarp><<<launch.grid, launch.block, 0, stream>>>(args)
              : shard_forward_rows<T, kVec, kWarp><<<launch.grid, launch.block, 0, stream>>>(args);
  } else {
    kBackward ? shard_backward_rows<T, kVec, kBlockTeam><<<launch.grid, launch.block, 0, stream>>>(args)
              : shard_forward_rows<T, kVec, kBlockTeam><<<launch.grid, launch.block, 0, stream>>>(args);
  }
  COLOSSAL_CUDA_CHECK_LAUNCH();
}

/// The slice kernels' arguments and launch: vectors of 16 bytes where the rows allow them.
template <bool kBackward>
void run_shard(const char* op, const Tensor& grad_logits, const Tensor& stats, const Tensor& logits,
               const Tensor& target, const Tensor& lse, const Tensor& scale, const VocabShardParams& params) {
  const Device device = logits.device();
  check_devices(
      op, device,
      {{&grad_logits, "grad_logits"}, {&stats, "stats"}, {&target, "target"}, {&lse, "lse"}, {&scale, "scale"}});
  const int64_t rows = logits.shape()[0];
  const int64_t columns = logits.shape()[1];
  if (rows == 0 || columns == 0) return;
  COLOSSAL_CHECK(rows < (int64_t{1} << 31), "{}: {} rows exceed the CUDA grid limit", op, rows);
  core::cuda::DeviceGuard guard(device);
  cudaStream_t stream = core::cuda_detail::stream_of(logits);
  std::optional<cuda::rows::DeviceErrorSlot> bad_row;
  if (!kBackward) bad_row.emplace(device, stream);
  core::dispatch_floating(logits.dtype(), op, [&]<class T>() {
    using A = acc_t<T>;
    const ShardArgs<T> args{logits.data<T>(),
                            cuda::rows::index_view(target),
                            stats.defined() ? stats.data<A>() : nullptr,
                            grad_logits.defined() ? grad_logits.data<T>() : nullptr,
                            lse.defined() ? lse.data<A>() : nullptr,
                            scale.defined() ? scale.data<A>() : nullptr,
                            bad_row ? bad_row->get() : nullptr,
                            rows,
                            columns,
                            params.class_start,
                            params.real_columns,
                            params.classes,
                            params.ignore_index,
                            static_cast<A>(params.label_smoothing),
                            static_cast<A>(params.label_smoothing / static_cast<double>(params.classes))};
    if (cuda::rows::rows_vectorizable<T>(columns, {args.logits, args.grad_logits})) {
      launch_shard<T, cuda::rows::kVecOf<T>, kBackward>(args, stream);
    } else {
      launch_shard<T, 1, kBackward>(args, stream);
    }
  });
  if (!bad_row) return;
  bad_row->defer([target, classes = params.classes, ignore_index = params.ignore_index, stream](int64_t row) {
    const int64_t value = cuda::rows::read_index_at(target, row, stream);
    return fmt::format(
        "vocab_parallel_cross_entropy: target {} at row {} is out of range for a vocabulary of {} (valid: 0..{}, or "
        "ignore_index {})",
        value, row, classes, classes - 1, ignore_index);
  });
}

void vocab_shard_forward_cuda(const Tensor& stats, const Tensor& logits, const Tensor& target,
                              const VocabShardParams& params) {
  run_shard<false>("vocab_parallel_cross_entropy", Tensor(), stats, logits, target, Tensor(), Tensor(), params);
}

void vocab_shard_backward_cuda(const Tensor& grad_logits, const Tensor& logits, const Tensor& target, const Tensor& lse,
                               const Tensor& scale, const VocabShardParams& params) {
  run_shard<true>("vocab_parallel_cross_entropy backward", grad_logits, Tensor(), logits, target, lse, scale, params);
}

COLOSSAL_REGISTER_KERNEL(vocab_shard_cross_entropy_forward_stub, core::DeviceType::cuda, vocab_shard_forward_cuda);
COLOSSAL_REGISTER_KERNEL(vocab_shard_cross_entropy_backward_stub, core::DeviceType::cuda, vocab_shard_backward_cuda);

COLOSSAL_REGISTER_KERNEL(cross_entropy_forward_stub, core::DeviceType::cuda, cross_entropy_forward_cuda);
COLOSSAL_REGISTER_KERNEL(cross_entropy_backward_stub, core::DeviceType::cuda, cross_entropy_backward_cuda);

}  // namespace
}  // namespace colossal::ops
