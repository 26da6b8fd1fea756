// Megatron's tensor-parallel communication pairs: each forward communicates through the group's
// collectives (which work along dim 0 on contiguous tensors) and records the adjoint collective.
#include "colossal/parallel/tp/mappings.h"

#include <vector>

#include "colossal/autograd/function.h"  // record
#include "colossal/autograd/node.h"      // exclusively_owned
#include "colossal/core/error.h"
#include "colossal/core/view.h"  // permute_raw, narrow_raw, contiguous_raw

namespace colossal::parallel::tp {

using autograd::Node;
using autograd::record;
using comm::ProcessGroup;
using comm::ReduceOp;

namespace {

using Grads = std::vector<Tensor>;

void check_input(const char* op, const Tensor& x, const ProcessGroup& group) {
  COLOSSAL_CHECK(x.defined(), "tp::{}: x is undefined [{}]", op, group.describe());
  COLOSSAL_CHECK(x.device() == group.device(),
                 "tp::{}: x (shape {}) is on {}, but the tensor-parallel group works on {}; the model's tensors and "
                 "the group must be on one device [{}]",
                 op, x.shape(), x.device(), group.device(), group.describe());
}

/// dim wrapped into [0, x.dim()), with the op named in the error.
int64_t wrap(const char* op, const Tensor& x, int64_t dim) {
  COLOSSAL_CHECK(x.dim() > 0, "tp::{}: x is 0-d; splitting or gathering needs a dimension to work along", op);
  return x.wrap_dim(dim, op);
}

void check_divisible(const char* op, const Tensor& x, int64_t dim, int64_t wrapped, const ProcessGroup& group) {
  COLOSSAL_CHECK(x.size(wrapped) % group.size() == 0,
                 "tp::{}: x of shape {} has size {} along dim {}, which does not split into the group's {} ranks; "
                 "the size along dim {} must be a multiple of {} [{}]",
                 op, x.shape(), x.size(wrapped), dim, group.size(), dim, group.size(), group.describe());
}

/// The permutation that brings dim d to the front and keeps the others in order: the layout in
/// which the collectives' dim-0 chunks are the chunks along d.
std::vector<int64_t> front_order(int64_t ndim, int64_t d) {
  std::vector<int64_t> order{d};
  for (int64_t i = 0; i < ndim; ++i) {
    if (i != d) order.push_back(i);
  }
  return order;
}

std::vector<int64_t> inverse(const std::vector<int64_t>& order) {
  std::vector<int64_t> inv(order.size());
  for (size_t i = 0; i < order.size(); ++i) inv[static_cast<size_t>(order[i])] = static_cast<int64_t>(i);
  return inv;
}

/// Every rank's x concatenated along d in rank order, as a new contiguous tensor.
Tensor all_gather_along(const Tensor& x, int64_t d, ProcessGroup& group) {
  const std::vector<int64_t> order = front_order(x.dim(), d);
  const Tensor x_front = core::permute_raw(x, order);
  Shape gathered_shape = x_front.shape();
  gathered_shape[0] *= group.size();
  const Tensor gathered = core::empty(gathered_shape, TensorOptions(x.dtype(), x.device()));
  // The collectives take this rank's input already at its chunk of the output, so x is copied
  // straight there (making it contiguous in front order on the way) rather than staged first.
  const int64_t length = x.size(d);
  const Tensor mine = core::narrow_raw(gathered, 0, group.rank() * length, length);
  mine.copy_(x_front);
  group.all_gather(gathered, mine);
  return core::contiguous_raw(core::permute_raw(gathered, inverse(order)));
}

/// Chunk rank() along d of the sum of every rank's x, as a new contiguous tensor.
Tensor reduce_scatter_along(const Tensor& x, int64_t d, ProcessGroup& group) {
  const std::vector<int64_t> order = front_order(x.dim(), d);
  // x itself when it is already contiguous in front order: the collective only reads its input.
  const Tensor x_front = core::contiguous_raw(core::permute_raw(x, order));
  Shape chunk_shape = x_front.shape();
  chunk_shape[0] /= group.size();
  const Tensor chunk = core::empty(chunk_shape, TensorOptions(x.dtype(), x.device()));
  group.reduce_scatter(chunk, x_front, ReduceOp::sum);
  return core::contiguous_raw(core::permute_raw(chunk, inverse(order)));
}

/// Chunk `index` of `parts` equal chunks of x along d: a view when it is contiguous, else a copy.
Tensor chunk_along(const Tensor& x, int64_t d, int64_t index, int64_t parts) {
  const int64_t length = x.size(d) / parts;
  return core::contiguous_raw(core::narrow_raw(x, d, index * length, length));
}

/// The sum over the group of g, in g's own buffer when it is exclusively owned (as Megatron
/// all-reduces the gradient in place), else in a copy; with `async`, valid once `work` is waited for.
Tensor all_reduce_sum(const Tensor& g, ProcessGroup& group, bool may_overwrite, comm::Work* work = nullptr) {
  Tensor sum = g;
  // The engine hands a node gradients no one else holds unless a hook, a retained .grad, the caller's
  // root gradient or another view shares them.
  if (!may_overwrite || !autograd::exclusively_owned(g)) {
    sum = core::empty(g.shape(), TensorOptions(g.dtype(), g.device()));
    sum.copy_(g);
  }
  comm::Work w = group.all_reduce(sum, ReduceOp::sum, /*async=*/work != nullptr);
  if (work != nullptr) *work = std::move(w);
  return sum;
}

/// The output of a mapping over one rank: x itself under a new handle, recorded so the graph has the
/// same nodes at every group size.
Tensor identity(const char* name, const Tensor& x) {
  Tensor y = x.detach();
  record(name, {x}, {y}, [](const Grads& g, const Node&) { return Grads{g[0]}; });
  return y;
}

}  // namespace

Tensor copy_to_region(const Tensor& x, ProcessGroup& group) {
  check_input("copy_to_region", x, group);
  if (group.size() == 1) return identity("tp::copy_to_region", x);
  Tensor y = x.detach();
  record("tp::copy_to_region", {x}, {y}, [group = &group](const Grads& g, const Node&) {
    return Grads{all_reduce_sum(g[0], *group, /*may_overwrite=*/true)};
  });
  return y;
}

Tensor reduce_from_region(const Tensor& x, ProcessGroup& group, bool consume_input) {
  PendingSum pending = reduce_from_region_async(x, group, consume_input);
  pending.done.wait();
  return pending.y;
}

PendingSum reduce_from_region_async(const Tensor& x, ProcessGroup& group, bool consume_input) {
  check_input("reduce_from_region", x, group);
  if (group.size() == 1) return {identity("tp::reduce_from_region", x), comm::Work()};
  // x belongs to the caller unless it gives it up: then the sum is taken in place (when no other
  // handle or view sees x's buffer), and y is a new handle on it.
  comm::Work done;
  Tensor y = all_reduce_sum(x, group, /*may_overwrite=*/consume_input, &done);
  if (y.impl() == x.impl()) y = y.detach();
  record("tp::reduce_from_region", {x}, {y}, [](const Grads& g, const Node&) { return Grads{g[0]}; });
  return {y, std::move(done)};
}

ops::InputGradHook all_reduce_input_grad(ProcessGroup& group) {
  if (group.size() == 1) return {};
  return [group = &group](const Tensor& grad_x) -> std::function<void()> {
    // grad_x is the linear's fresh GEMM output, held by nothing else: summed in place.
    comm::Work work = group->all_reduce(grad_x, ReduceOp::sum, /*async=*/true);
    return [work]() mutable { work.wait(); };
  };
}

Tensor scatter_to_region(const Tensor& x, int64_t dim, ProcessGroup& group) {
  constexpr const char* kOp = "scatter_to_region";
  check_input(kOp, x, group);
  const int64_t d = wrap(kOp, x, dim);
  check_divisible(kOp, x, dim, d, group);
  if (group.size() == 1) return identity("tp::scatter_to_region", x);
  Tensor y = chunk_along(x, d, group.rank(), group.size());
  record("tp::scatter_to_region", {x}, {y},
         [group = &group, d](const Grads& g, const Node&) { return Grads{all_gather_along(g[0], d, *group)}; });
  return y;
}

Tensor gather_from_region(const Tensor& x, int64_t dim, ProcessGroup& group) {
  constexpr const char* kOp = "gather_from_region";
  check_input(kOp, x, group);
  const int64_t d = wrap(kOp, x, dim);
  if (group.size() == 1) return identity("tp::gather_from_region", x);
  Tensor y = all_gather_along(x, d, group);
  record("tp::gather_from_region", {x}, {y},
         [rank = group.rank(), size = group.size(), d](const Grads& g, const Node&) {
           return Grads{chunk_along(g[0], d, rank, size)};
         });
  return y;
}

Tensor gather_from_sequence_region(const Tensor& x, int64_t dim, ProcessGroup& group) {
  constexpr const char* kOp = "gather_from_sequence_region";
  check_input(kOp, x, group);
  const int64_t d = wrap(kOp, x, dim);
  if (group.size() == 1) return identity("tp::gather_from_sequence_region", x);
  Tensor y = all_gather_along(x, d, group);
  record("tp::gather_from_sequence_region", {x}, {y},
         [group = &group, d](const Grads& g, const Node&) { return Grads{reduce_scatter_along(g[0], d, *group)}; });
  return y;
}

Tensor reduce_scatter_to_sequence_region(const Tensor& x, int64_t dim, ProcessGroup& group) {
  constexpr const char* kOp = "reduce_scatter_to_sequence_region";
  check_input(kOp, x, group);
  const int64_t d = wrap(kOp, x, dim);
  check_divisible(kOp, x, dim, d, group);
  if (group.size() == 1) return identity("tp::reduce_scatter_to_sequence_region", x);
  Tensor y = reduce_scatter_along(x, d, group);
  record("tp::reduce_scatter_to_sequence_region", {x}, {y},
         [group = &group, d](const Grads& g, const Node&) { return Grads{all_gather_along(g[0], d, *group)}; });
  return y;
}

}  // namespace colossal::parallel::tp
