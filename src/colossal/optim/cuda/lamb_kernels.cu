// The fused CUDA kernel of Lamb: lamb_step_reference's update of every tensor of a group. With the
// trust ratio it takes three launches per ~70 tensors: moments and the chunks' sums of squares of p
// and of the update, the per-tensor trust ratios, then the scaled update, which recomputes the
// update from the new moments instead of storing it (the same bytes moved as a scratch copy, and
// no scratch memory). See Note [Fused optimizer kernels].
#include <cmath>

#include "colossal/optim/cuda/multi_tensor_apply.cuh"  // multi_tensor_kernel, run_fused
#include "colossal/optim/lamb.h"                       // lamb_step_stub, lamb_step_reference

namespace colossal::optim {
namespace {

using namespace cuda_detail;

/// The three kernels of a step: moments_and_norms (columns p, g, m, v; writes m, v; sums p^2 and
/// r^2), apply_trust (columns p, m, v; writes p) and, without the trust ratio, one complete pass
/// (columns p, g, m, v; writes p, m, v).
enum class LambPass { moments_and_norms, apply_trust, complete };

/// Per tensor (from its step count): 1 / (1 - beta1^t) and 1 / sqrt(1 - beta2^t) (1 and 1 without
/// bias correction), as the reference's div(tensor, double) multiplies by them.
template <class T, LambPass Pass>
struct LambUpdate {
  using A = core::acc_t<T>;
  static constexpr int kDepth = Pass == LambPass::apply_trust ? 3 : 4;
  static constexpr int kNorms = Pass == LambPass::moments_and_norms ? 2 : 0;
  static constexpr unsigned kWrites = Pass == LambPass::moments_and_norms ? 0b1100u
                                      : Pass == LambPass::apply_trust     ? 0b001u
                                                                          : 0b1101u;
  struct Context {
    A inverse_bias_correction1, inverse_sqrt_bias_correction2, trust;
  };

  A beta1, one_minus_beta1, beta2, one_minus_beta2, eps, weight_decay, negative_lr;
  bool decay;
  const A* trust;  ///< per tensor of the whole list (apply_trust only)

  __device__ Context context(int tensor, const A* scalars) const {
    return {scalars[0], scalars[1], Pass == LambPass::apply_trust ? trust[tensor] : A(1)};
  }

  /// The update r of lamb_step_reference before the trust ratio, from the new moments.
  __device__ A update(A p, A m, A v, const Context& c) const {
    const A root = round_to<T>(sqrt(v));
    const A denom = round_to<T>(round_to<T>(root * c.inverse_sqrt_bias_correction2) + eps);
    A r = round_to<T>(round_to<T>(m * c.inverse_bias_correction1) / denom);
    if (decay) r = round_to<T>(r + weight_decay * p);
    return r;
  }

  // Rounds where lamb_step_reference writes a tensor; see Note [Fused optimizer rounding].
  __device__ void operator()(A (&x)[kDepth], const Context& c, NormSum (&sums)[2]) const {
    const A p = x[0];
    if constexpr (Pass == LambPass::apply_trust) {
      // update * trust is an f32 (f64) tensor in the reference, rounded when add_ casts it to p's dtype.
      const A scaled = round_to<T>(update(p, x[1], x[2], c) * c.trust);
      x[0] = round_to<T>(p + negative_lr * scaled);
    } else {
      const A g = x[1];
      A m = round_to<T>(x[2] * beta1);
      m = round_to<T>(m + one_minus_beta1 * g);
      A v = round_to<T>(x[3] * beta2);
      v = round_to<T>(v + one_minus_beta2 * g * g);
      x[2] = m;
      x[3] = v;
      const A r = update(p, m, v, c);
      if constexpr (Pass == LambPass::moments_and_norms) {
        sums[0] += static_cast<NormSum>(p * p);  // x * x in acc_t, summed in f64, as vector_norm
        sums[1] += static_cast<NormSum>(r * r);
      } else {
        x[0] = round_to<T>(p + negative_lr * r);
      }
    }
  }
};

/// Turns ||p|| and ||r|| into the trust ratio as lamb_step_reference does (guarded_ratio, clamp).
template <class A>
struct LambTrust {
  using Scalar = A;
  A* trust;
  A trust_clip;
  bool clip;

  __device__ void operator()(int tensor, A weight_norm, A update_norm) const {
    A ratio = weight_norm > A(0) && update_norm > A(0) ? weight_norm / update_norm : A(1);
    if (clip) ratio = ratio < A(0) ? A(0) : (ratio > trust_clip ? trust_clip : ratio);
    trust[tensor] = ratio;
  }
};

template <class T>
void lamb_typed(const MultiTensorLists& lists, const LambOptions& o) {
  using A = core::acc_t<T>;
  auto make_op = [&]<LambPass Pass>(const A* trust) {
    return LambUpdate<T, Pass>{.beta1 = static_cast<A>(o.beta1),
                               .one_minus_beta1 = static_cast<A>(1.0 - o.beta1),
                               .beta2 = static_cast<A>(o.beta2),
                               .one_minus_beta2 = static_cast<A>(1.0 - o.beta2),
                               .eps = static_cast<A>(o.eps),
                               .weight_decay = static_cast<A>(o.weight_decay),
                               .negative_lr = static_cast<A>(-o.lr),
                               .decay = o.weight_decay != 0.0,
                               .trust = trust};
  };
  // The scalars exactly as lamb_step_reference computes them in double from the tensor's step.
  auto scalars_of = [&](size_t i) {
    const auto step = static_cast<double>(lists.steps[i]);
    const double bias_correction1 = o.bias_correction ? 1.0 - std::pow(o.beta1, step) : 1.0;
    const double bias_correction2 = o.bias_correction ? 1.0 - std::pow(o.beta2, step) : 1.0;
    return std::array<A, 2>{static_cast<A>(1.0 / bias_correction1), static_cast<A>(1.0 / std::sqrt(bias_correction2))};
  };
  using FullTable = TensorTable<4, A, 2>;
  const auto full_args = make_tensor_args<FullTable>(lists, {0, 1, 2, 3}, scalars_of);  // p, g, m, v
  cudaStream_t stream = core::cuda_detail::stream_of(lists.params.front());
  if (!o.use_trust_ratio) {
    launch_update<T>(full_args, make_op.template operator()<LambPass::complete>(nullptr), stream);
    return;
  }
  const Tensor trust =
      core::empty({static_cast<int64_t>(lists.params.size())}, TensorOptions(core::dtype_of<A>(), lists.device));
  const LambTrust<A> finish{
      .trust = trust.data<A>(), .trust_clip = static_cast<A>(o.trust_clip), .clip = std::isfinite(o.trust_clip)};
  launch_update_with_norms<T>(full_args, make_op.template operator()<LambPass::moments_and_norms>(nullptr), finish,
                              lists.device, stream);
  using ApplyTable = TensorTable<3, A, 2>;
  const auto apply_args = make_tensor_args<ApplyTable>(lists, {0, 2, 3}, scalars_of);  // p, m, v
  launch_update<T>(apply_args, make_op.template operator()<LambPass::apply_trust>(trust.data<A>()), stream);
}

void lamb_step_cuda(const MultiTensorLists& lists, const LambOptions& o) {
  COLOSSAL_CHECK(lists.state.size() >= 2, "lamb_step: expected the exp_avg and exp_avg_sq state lists, got {}",
                 lists.state.size());
  run_fused(
      lists, "lamb_step", [&]<class T>(const MultiTensorLists& typed) { lamb_typed<T>(typed, o); },
      [&](const MultiTensorLists& rest) { lamb_step_reference(rest, o); });
}

COLOSSAL_REGISTER_KERNEL(lamb_step_stub, core::DeviceType::cuda, lamb_step_cuda);

}  // namespace
}  // namespace colossal::optim
