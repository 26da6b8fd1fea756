// The fused CUDA kernel of Adam and AdamW: adam_step_reference's update of every tensor of a group
// in one multi-tensor launch per ~70 tensors (see Note [Fused optimizer kernels]), and its mixed
// form for amp's f32 masters: a 16-bit gradient read and the 16-bit model parameter written in the
// same pass (Note [Fused mixed-precision step] in amp/mixed_precision_optimizer.cpp).
#include <cmath>
#include <type_traits>

#include "colossal/optim/adam.h"                       // adam_step_stub, adam_step_reference
#include "colossal/optim/cuda/multi_tensor_apply.cuh"  // multi_tensor_kernel, run_fused

namespace colossal::optim {
namespace {

using namespace cuda_detail;

/// Columns: p, g, exp_avg m, exp_avg_sq v, with AMSGrad max_exp_avg_sq, and with a write-through
/// copy (W not void) the copy last. Per tensor (from its step count): the addcdiv_ value
/// -lr / (1 - beta1^t) and 1 / sqrt(1 - beta2^t). T is the parameter's and state's dtype; G the
/// gradient's and W the copy's, which only multi_tensor_mixed_kernel reads as such (T = f32 there:
/// Note [Fused mixed-precision step] in amp/mixed_precision_optimizer.cpp).
template <class T, int Depth, class G = T, class W = void>
struct AdamUpdate {
  using A = core::acc_t<T>;
  static constexpr bool kWriteThrough = !std::is_void_v<W>;
  static constexpr int kDepth = Depth + (kWriteThrough ? 1 : 0);
  static constexpr int kNorms = 0;
  static constexpr unsigned kReads = (1u << Depth) - 1u;  // not the copy
  static constexpr unsigned kWrites = (Depth == 5 ? 0b11101u : 0b01101u) | (kWriteThrough ? 1u << Depth : 0u);
  static_assert((kReads & kWrites) == (kWrites & ~(1u << Depth)), "every column written is read, except the copy");
  template <int K>
  using Column = std::conditional_t<K == 1, G, std::conditional_t<kWriteThrough && K == Depth, W, T>>;
  struct Context {
    A step_size, inverse_sqrt_bias_correction2, grad_scale;
  };

  A beta1, one_minus_beta1, beta2, one_minus_beta2, eps, weight_decay, decoupled_factor;
  /// MultiTensorLists::grad_unscale converted to A, applied where `unscale`.
  A grad_unscale;
  bool decay, decoupled, unscale;
  /// MultiTensorLists::grad_scale (an f64 device scalar, rounded to A as optim::scale_for) or null.
  const double* grad_scale;

  __device__ Context context(int, const A* scalars) const {
    return {scalars[0], scalars[1], grad_scale != nullptr ? static_cast<A>(*grad_scale) : A(1)};
  }

  // Rounds where adam_step_reference writes a tensor; see Note [Fused optimizer rounding].
  __device__ void operator()(A (&x)[kDepth], const Context& c, NormSum (&)[2]) const {
    A p = x[0], g = x[1], m = x[2], v = x[3];                      // g: a 16-bit gradient read as f32, exactly
    if (unscale) g = round_to<T>(g * grad_unscale);                // ops::mul(grad, grad_unscale)
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
    if constexpr (Depth == 5) {
      const A v_max = x[4];
      x[4] = (v_max != v_max) || v_max > v ? v_max : v;  // ops::maximum, NaN-propagating
      second_moment = x[4];
    }
    const A root = round_to<T>(sqrt(second_moment));
    const A denom = round_to<T>(round_to<T>(root * c.inverse_sqrt_bias_correction2) + eps);
    x[0] = round_to<T>(p + c.step_size * m / denom);
    x[2] = m;
    x[3] = v;
    if constexpr (kWriteThrough) x[Depth] = x[0];  // stored as W, rounded to nearest even (multi_tensor_copy)
  }
};

template <class T, int Depth, class G, class W>
AdamUpdate<T, Depth, G, W> make_adam_update(const MultiTensorLists& lists, const AdamOptions& o, WeightDecayMode mode) {
  using A = core::acc_t<T>;
  return {.beta1 = static_cast<A>(o.beta1),
          .one_minus_beta1 = static_cast<A>(1.0 - o.beta1),
          .beta2 = static_cast<A>(o.beta2),
          .one_minus_beta2 = static_cast<A>(1.0 - o.beta2),
          .eps = static_cast<A>(o.eps),
          .weight_decay = static_cast<A>(o.weight_decay),
          .decoupled_factor = static_cast<A>(1.0 - o.lr * o.weight_decay),
          .grad_unscale = static_cast<A>(lists.grad_unscale),
          .decay = o.weight_decay != 0.0,
          .decoupled = mode == WeightDecayMode::decoupled,
          .unscale = lists.grad_unscale != 1.0,
          .grad_scale = lists.grad_scale.defined() ? lists.grad_scale.data<double>() : nullptr};
}

/// The tensors' arguments: columns p, g, m, v[, v_max][, copy], and the scalars exactly as
/// adam_step_reference computes them in double from the tensor's step.
template <class Table>
std::vector<TensorArgs<Table>> adam_tensor_args(const MultiTensorLists& lists, const AdamOptions& o, int depth) {
  using A = typename Table::Scalar;
  std::array<int, Table::kDepth> columns;
  for (int k = 0; k < Table::kDepth; ++k) columns[k] = k < depth ? k : kWriteThroughColumn;
  return make_tensor_args<Table>(lists, columns, [&](size_t i) {
    const auto step = static_cast<double>(lists.steps[i]);
    const double bias_correction1 = 1.0 - std::pow(o.beta1, step);
    const double bias_correction2 = 1.0 - std::pow(o.beta2, step);
    return std::array<A, 2>{static_cast<A>(-o.lr / bias_correction1),
                            static_cast<A>(1.0 / std::sqrt(bias_correction2))};
  });
}

template <class T, int Depth>
void adam_launch(const MultiTensorLists& lists, const AdamOptions& o, WeightDecayMode mode) {
  using Table = TensorTable<Depth, core::acc_t<T>, 2>;
  launch_update<T>(adam_tensor_args<Table>(lists, o, Depth), make_adam_update<T, Depth, T, void>(lists, o, mode),
                   core::cuda_detail::stream_of(lists.params.front()));
}

/// f32 parameters and state with a G gradient and a W copy (void: none).
template <class G, class W, int Depth>
void adam_launch_mixed(const MultiTensorLists& lists, const AdamOptions& o, WeightDecayMode mode) {
  using Op = AdamUpdate<float, Depth, G, W>;
  using Table = TensorTable<Op::kDepth, float, 2>;
  launch_mixed_update(adam_tensor_args<Table>(lists, o, Depth), make_adam_update<float, Depth, G, W>(lists, o, mode),
                      core::cuda_detail::stream_of(lists.params.front()));
}

/// Calls f.template operator()<C>() for the 16-bit and f32 dtypes a mixed column may have.
template <class F>
void dispatch_mixed_column(DType dtype, F&& f) {
  switch (dtype) {
    case DType::f32:
      f.template operator()<float>();
      return;
    case DType::bf16:
      f.template operator()<core::BFloat16>();
      return;
    case DType::f16:
      f.template operator()<core::Half>();
      return;
    default:
      COLOSSAL_FAIL("adam_step: a mixed-precision column must be f32, bf16 or f16, got {}", dtype);
  }
}

/// The sub-list's kernel: one dtype throughout, or (T = f32) the mixed one for its gradient's and
/// copy's dtypes (run_fused gives a sub-list one of each, or no copies).
template <class T, int Depth>
void adam_launch_any(const MultiTensorLists& lists, const AdamOptions& o, WeightDecayMode mode) {
  if constexpr (std::is_same_v<T, float>) {
    const DType grad = lists.grads.front().dtype();
    const Tensor copy = write_through_of(lists, 0);
    if (grad != DType::f32 || copy.defined()) {
      dispatch_mixed_column(grad, [&]<class G>() {
        if (!copy.defined()) {
          adam_launch_mixed<G, void, Depth>(lists, o, mode);
        } else {
          dispatch_mixed_column(copy.dtype(), [&]<class W>() { adam_launch_mixed<G, W, Depth>(lists, o, mode); });
        }
      });
      return;
    }
  }
  adam_launch<T, Depth>(lists, o, mode);
}

void adam_step_cuda(const MultiTensorLists& lists, const AdamOptions& o, WeightDecayMode mode) {
  COLOSSAL_CHECK(lists.state.size() >= (o.amsgrad ? 3u : 2u),
                 "adam_step: expected the exp_avg, exp_avg_sq{} state lists, got {}",
                 o.amsgrad ? " and max_exp_avg_sq" : "", lists.state.size());
  run_fused(
      lists, "adam_step",
      [&]<class T>(const MultiTensorLists& typed) {
        if (o.amsgrad) {
          adam_launch_any<T, 5>(typed, o, mode);
        } else {
          adam_launch_any<T, 4>(typed, o, mode);
        }
      },
      [&](const MultiTensorLists& rest) { adam_step_reference(rest, o, mode); }, /*mixed=*/true);
}

COLOSSAL_REGISTER_KERNEL(adam_step_stub, core::DeviceType::cuda, adam_step_cuda);

}  // namespace
}  // namespace colossal::optim
