// The fused CUDA kernel of Sgd: sgd_step_reference's update of every tensor of a group in one or
// two multi-tensor launches (see Note [Fused optimizer kernels]).
#include "colossal/optim/cuda/multi_tensor_apply.cuh"  // multi_tensor_kernel, run_fused
#include "colossal/optim/sgd.h"                        // sgd_step_stub, sgd_step_reference

namespace colossal::optim {
namespace {

using namespace cuda_detail;

/// Columns: p, g and, with momentum, the momentum buffer b. Per tensor: whether b was just created.
template <class T, int Depth>
struct SgdUpdate {
  using A = core::acc_t<T>;
  static constexpr int kDepth = Depth;
  static constexpr int kNorms = 0;
  static constexpr unsigned kWrites = Depth == 3 ? 0b101u : 0b001u;
  struct Context {
    bool buffer_created;
  };

  A weight_decay, momentum, one_minus_dampening, negative_lr;
  bool decay, nesterov;

  __device__ Context context(int, const A* scalars) const { return {scalars[0] != A(0)}; }

  // Rounds where sgd_step_reference writes a tensor; see Note [Fused optimizer rounding].
  __device__ void operator()(A (&x)[kDepth], const Context& c, NormSum (&)[2]) const {
    const A p = x[0];
    A d = x[1];
    if (decay) d = round_to<T>(d + weight_decay * p);
    if constexpr (kDepth == 3) {
      A b = x[2];
      if (c.buffer_created) {
        b = d;
      } else {
        b = round_to<T>(b * momentum);
        b = round_to<T>(b + one_minus_dampening * d);
      }
      x[2] = b;
      d = nesterov ? round_to<T>(d + momentum * b) : b;
    }
    x[0] = round_to<T>(p + negative_lr * d);
  }
};

template <class T, int Depth>
void sgd_launch(const MultiTensorLists& lists, const SgdOptions& o) {
  using A = core::acc_t<T>;
  using Table = TensorTable<Depth, A, 1>;
  const SgdUpdate<T, Depth> op{.weight_decay = static_cast<A>(o.weight_decay),
                               .momentum = static_cast<A>(o.momentum),
                               .one_minus_dampening = static_cast<A>(1.0 - o.dampening),
                               .negative_lr = static_cast<A>(-o.lr),
                               .decay = o.weight_decay != 0.0,
                               .nesterov = o.nesterov};
  std::array<int, Depth> columns;
  for (int k = 0; k < Depth; ++k) columns[k] = k;  // p, g[, state[0]]
  const auto args = make_tensor_args<Table>(
      lists, columns, [&](size_t i) { return std::array<A, 1>{lists.buffers_created[i] ? A(1) : A(0)}; });
  launch_update<T>(args, op, core::cuda_detail::stream_of(lists.params.front()));
}

void sgd_step_cuda(const MultiTensorLists& lists, const SgdOptions& o) {
  const bool momentum = o.momentum != 0.0;
  COLOSSAL_CHECK(!momentum || !lists.state.empty(), "sgd_step: momentum {} needs the momentum_buffer state list",
                 o.momentum);
  run_fused(
      lists, "sgd_step",
      [&]<class T>(const MultiTensorLists& typed) {
        if (momentum) {
          sgd_launch<T, 3>(typed, o);
        } else {
          sgd_launch<T, 2>(typed, o);
        }
      },
      [&](const MultiTensorLists& rest) { sgd_step_reference(rest, o); });
}

COLOSSAL_REGISTER_KERNEL(sgd_step_stub, core::DeviceType::cuda, sgd_step_cuda);

}  // namespace
}  // namespace colossal::optim
