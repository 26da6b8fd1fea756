// The fused CUDA kernel of Lars: lars_step_reference's update of every tensor of a group. With
// adaptation it takes three launches per ~100 tensors: the chunks' sums of squares of p and g, the
// per-tensor trust ratios, then the update; without, the update alone. See Note [Fused optimizer
// kernels].
#include <cmath>

#include "colossal/optim/cuda/multi_tensor_apply.cuh"  // multi_tensor_kernel, run_fused
#include "colossal/optim/lars.h"                       // lars_step_stub, lars_step_reference

namespace colossal::optim {
namespace {

using namespace cuda_detail;

/// Columns p, g: reads both, writes nothing, sums p^2 and g^2.
template <class T>
struct LarsNorms {
  using A = core::acc_t<T>;
  static constexpr int kDepth = 2;
  static constexpr int kNorms = 2;
  static constexpr unsigned kWrites = 0;
  struct Context {};

  __device__ Context context(int, const A*) const { return {}; }
  __device__ void operator()(A (&x)[kDepth], const Context&, NormSum (&sums)[2]) const {
    sums[0] += static_cast<NormSum>(x[0] * x[0]);  // x * x in acc_t, summed in f64, as vector_norm
    sums[1] += static_cast<NormSum>(x[1] * x[1]);
  }
};

/// Turns ||p|| and ||g|| into the trust ratio as lars_step_reference does: eta ||p|| / (||g|| +
/// weight_decay ||p|| + eps) where both norms are > 0, else 1, clamped to [0, trust_clip].
template <class A>
struct LarsTrust {
  using Scalar = A;
  A* trust;
  A eta, weight_decay, eps, trust_clip;

  __device__ void operator()(int tensor, A weight_norm, A grad_norm) const {
    const A denominator = grad_norm + weight_decay * weight_norm + eps;
    A ratio = weight_norm > A(0) && grad_norm > A(0) ? weight_norm * eta / denominator : A(1);
    ratio = ratio < A(0) ? A(0) : (ratio > trust_clip ? trust_clip : ratio);
    trust[tensor] = ratio;
  }
};

/// Columns p, g and, with momentum, the momentum buffer b. Per tensor: whether b was just created.
template <class T, int Depth>
struct LarsUpdate {
  using A = core::acc_t<T>;
  static constexpr int kDepth = Depth;
  static constexpr int kNorms = 0;
  static constexpr unsigned kWrites = Depth == 3 ? 0b101u : 0b001u;
  struct Context {
    bool buffer_created;
    A trust;
  };

  A weight_decay, momentum, grad_clip_low, grad_clip_high, negative_lr;
  bool adaptation, decay, clip;
  const A* trust;  ///< per tensor of the whole list (with adaptation)

  __device__ Context context(int tensor, const A* scalars) const {
    return {scalars[0] != A(0), adaptation ? trust[tensor] : A(1)};
  }

  // Rounds where lars_step_reference writes a tensor; see Note [Fused optimizer rounding].
  __device__ void operator()(A (&x)[kDepth], const Context& c, NormSum (&)[2]) const {
    const A p = x[0];
    A d = x[1];
    if (adaptation && decay) d = round_to<T>(d + weight_decay * p);
    if (clip) d = round_to<T>(d < grad_clip_low ? grad_clip_low : (d > grad_clip_high ? grad_clip_high : d));
    if constexpr (kDepth == 3) {
      A b = x[2];
      if (c.buffer_created) {
        b = d;
      } else {
        b = round_to<T>(b * momentum);
        b = round_to<T>(b + d);
      }
      x[2] = b;
      d = b;
    }
    // d * trust is an f32 (f64) tensor in the reference, rounded when add_ casts it to p's dtype.
    if (adaptation) d = round_to<T>(d * c.trust);
    x[0] = round_to<T>(p + negative_lr * d);
  }
};

template <class T, int Depth>
void lars_update(const MultiTensorLists& lists, const LarsOptions& o, const core::acc_t<T>* trust,
                 cudaStream_t stream) {
  using A = core::acc_t<T>;
  using Table = TensorTable<Depth, A, 1>;
  const LarsUpdate<T, Depth> op{.weight_decay = static_cast<A>(o.weight_decay),
                                .momentum = static_cast<A>(o.momentum),
                                .grad_clip_low = static_cast<A>(-o.grad_clip),
                                .grad_clip_high = static_cast<A>(o.grad_clip),
                                .negative_lr = static_cast<A>(-o.lr),
                                .adaptation = o.adaptation,
                                .decay = o.weight_decay != 0.0,
                                .clip = std::isfinite(o.grad_clip),
                                .trust = trust};
  std::array<int, Depth> columns;
  for (int k = 0; k < Depth; ++k) columns[k] = k;  // p, g[, state[0]]
  const auto args = make_tensor_args<Table>(
      lists, columns, [&](size_t i) { return std::array<A, 1>{lists.buffers_created[i] ? A(1) : A(0)}; });
  launch_update<T>(args, op, stream);
}

template <class T>
void lars_typed(const MultiTensorLists& lists, const LarsOptions& o) {
  using A = core::acc_t<T>;
  cudaStream_t stream = core::cuda_detail::stream_of(lists.params.front());
  Tensor trust;
  if (o.adaptation) {
    trust = core::empty({static_cast<int64_t>(lists.params.size())}, TensorOptions(core::dtype_of<A>(), lists.device));
    using NormTable = TensorTable<2, A, 1>;
    const auto norm_args =
        make_tensor_args<NormTable>(lists, {0, 1}, [](size_t) { return std::array<A, 1>{A(0)}; });  // p, g
    const LarsTrust<A> finish{.trust = trust.data<A>(),
                              .eta = static_cast<A>(o.eta),
                              .weight_decay = static_cast<A>(o.weight_decay),
                              .eps = static_cast<A>(o.eps),
                              .trust_clip = static_cast<A>(o.trust_clip)};
    launch_update_with_norms<T>(norm_args, LarsNorms<T>{}, finish, lists.device, stream);
  }
  const A* trust_data = o.adaptation ? trust.data<A>() : nullptr;
  if (o.momentum != 0.0) {
    lars_update<T, 3>(lists, o, trust_data, stream);
  } else {
    lars_update<T, 2>(lists, o, trust_data, stream);
  }
}

void lars_step_cuda(const MultiTensorLists& lists, const LarsOptions& o) {
  COLOSSAL_CHECK(o.momentum == 0.0 || !lists.state.empty(),
                 "lars_step: momentum {} needs the momentum_buffer state list", o.momentum);
  run_fused(
      lists, "lars_step", [&]<class T>(const MultiTensorLists& typed) { lars_typed<T>(typed, o); },
      [&](const MultiTensorLists& rest) { lars_step_reference(rest, o); });
}

COLOSSAL_REGISTER_KERNEL(lars_step_stub, core::DeviceType::cuda, lars_step_cuda);

}  // namespace
}  // namespace colossal::optim
