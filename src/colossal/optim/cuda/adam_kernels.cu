// The fused CUDA kernel of Adam and AdamW: adam_step_reference's update of every tensor of a group
// in one multi-tensor launch per ~70 tensors (see Note [Fused optimizer kernels]).
#include <cmath>

#include "colossal/optim/adam.h"                       // adam_step_stub, adam_step_reference
#include "colossal/optim/cuda/multi_tensor_apply.cuh"  // multi_tensor_kernel, run_fused

namespace colossal::optim {
namespace {

using namespace cuda_detail;

/// Columns: p, g, exp_avg m, exp_avg_sq v and, with AMSGrad, max_exp_avg_sq. Per tensor (from its
/// step count): the addcdiv_ value -lr / (1 - beta1^t) and 1 / sqrt(1 - beta2^t).
template <class T, int Depth>
struct AdamUpdate {
  using A = core::acc_t<T>;
  static constexpr int kDepth = Depth;
  static constexpr int kNorms = 0;
  static constexpr unsigned kWrites = Depth == 5 ? 0b11101u : 0b01101u;
  struct Context {
    A step_size, inverse_sqrt_bias_correction2, grad_scale;
  };

  A beta1, one_minus_beta1, beta2, one_minus_beta2, eps, weight_decay, decoupled_factor;
  bool decay, decoupled;
  /// MultiTensorLists::grad_scale (an f64 device scalar, rounded to A as optim::scale_for) or null.
  const double* grad_scale;

  __device__ Context context(int, const A* scalars) const {
    return {scalars[0], scalars[1], grad_scale != nullptr ? static_cast<A>(*grad_scale) : A(1)};
  }

  // Rounds where adam_step_reference writes a tensor; see Note [Fused optimizer rounding].
  __device__ void operator()(A (&x)[kDepth], const Context& c, NormSum (&)[2]) const {
    A p = x[0], g = x[1], m = x[2], v = x[3];
    if (grad_scale != nullptr) g = round_to<T>(g * c.grad_scale);  // ops::mul(grad, grad_scale)
    if (decay) {
      if (decoupled) {
        p = round_to<T>(p * decoupled_factor);
      } else {
        g = round_to<T>(g + weight_decay * p);
      }
    }
    m = round_to<T>(m * beta1);
    m = round_to<T>(m + one_minus_beta1 * g);
    v = round_to<T>(v * beta2);
    v = round_to<T>(v + one_minus_beta2 * g * g);
    A second_moment = v;
    if constexpr (kDepth == 5) {
      const A v_max = x[4];
      x[4] = (v_max != v_max) || v_max > v ? v_max : v;  // ops::maximum, NaN-propagating
      second_moment = x[4];
    }
    const A root = round_to<T>(sqrt(second_moment));
    const A denom = round_to<T>(round_to<T>(root * c.inverse_sqrt_bias_correction2) + eps);
    x[0] = round_to<T>(p + c.step_size * m / denom);
    x[2] = m;
    x[3] = v;
  }
};

template <class T, int Depth>
void adam_launch(const MultiTensorLists& lists, const AdamOptions& o, WeightDecayMode mode) {
  using A = core::acc_t<T>;
  using Table = TensorTable<Depth, A, 2>;
  const AdamUpdate<T, Depth> op{.beta1 = static_cast<A>(o.beta1),
                                .one_minus_beta1 = static_cast<A>(1.0 - o.beta1),
                                .beta2 = static_cast<A>(o.beta2),
                                .one_minus_beta2 = static_cast<A>(1.0 - o.beta2),
                                .eps = static_cast<A>(o.eps),
                                .weight_decay = static_cast<A>(o.weight_decay),
                                .decoupled_factor = static_cast<A>(1.0 - o.lr * o.weight_decay),
                                .decay = o.weight_decay != 0.0,
                                .decoupled = mode == WeightDecayMode::decoupled,
                                .grad_scale = lists.grad_scale.defined() ? lists.grad_scale.data<double>() : nullptr};
  std::array<int, Depth> columns;
  for (int k = 0; k < Depth; ++k) columns[k] = k;  // p, g, m, v[, v_max]
  // The scalars exactly as adam_step_reference computes them in double from the tensor's step.
  const auto args = make_tensor_args<Table>(lists, columns, [&](size_t i) {
    const auto step = static_cast<double>(lists.steps[i]);
    const double bias_correction1 = 1.0 - std::pow(o.beta1, step);
    const double bias_correction2 = 1.0 - std::pow(o.beta2, step);
    return std::array<A, 2>{static_cast<A>(-o.lr / bias_correction1),
                            static_cast<A>(1.0 / std::sqrt(bias_correction2))};
  });
  launch_update<T>(args, op, core::cuda_detail::stream_of(lists.params.front()));
}

void adam_step_cuda(const MultiTensorLists& lists, const AdamOptions& o, WeightDecayMode mode) {
  COLOSSAL_CHECK(lists.state.size() >= (o.amsgrad ? 3u : 2u),
                 "adam_step: expected the exp_avg, exp_avg_sq{} state lists, got {}",
                 o.amsgrad ? " and max_exp_avg_sq" : "", lists.state.size());
  run_fused(
      lists, "adam_step",
      [&]<class T>(const MultiTensorLists& typed) {
        if (o.amsgrad) {
          adam_launch<T, 5>(typed, o, mode);
        } else {
          adam_launch<T, 4>(typed, o, mode);
        }
      },
      [&](const MultiTensorLists& rest) { adam_step_reference(rest, o, mode); });
}

COLOSSAL_REGISTER_KERNEL(adam_step_stub, core::DeviceType::cuda, adam_step_cuda);

}  // namespace
}  // namespace colossal::optim
