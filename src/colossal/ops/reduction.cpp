// Reductions: normalise the dims, lay the input out as [outer, reduce, inner], run the kernel and
// record the adjoint (broadcast the gradient back over the reduced dims).
#include "colossal/ops/reduction.h"

#include <algorithm>
#include <numeric>

#include "colossal/autograd/function.h"
#include "colossal/autograd/grad_mode.h"
#include "colossal/core/view.h"
#include "colossal/ops/elementwise.h"
#include "colossal/ops/reduction_kernels.h"
#include "colossal/ops/shape.h"

namespace colossal::ops {

constinit core::DispatchStub<SumKernel> sum_stub("sum");
constinit core::DispatchStub<MaxKernel> max_stub("max");
constinit core::DispatchStub<MaxBackwardKernel> max_backward_stub("max_backward");

using autograd::Node;
using autograd::record;

namespace {

/// The reduction's geometry: which dims are reduced, and the input as [outer, reduce, inner].
struct ReduceLayout {
  std::vector<bool> reduced;  // per input dim
  Shape keepdim_shape;        // reduced dims kept as 1
  Shape out_shape;            // as requested (keepdim or not)
  Tensor input3d;             // contiguous, [outer, reduce, inner]
  int64_t outer = 1, reduce = 1, inner = 1;
};

ReduceLayout make_layout(const Tensor& a, const std::vector<int64_t>& dims, bool keepdim, const char* op) {
  ReduceLayout layout;
  const int64_t rank = a.dim();
  layout.reduced.assign(static_cast<size_t>(rank), dims.empty());
  for (int64_t d : dims) {
    const int64_t w = a.wrap_dim(d, op);
    COLOSSAL_CHECK(!layout.reduced[w], "{}: dimension {} listed twice in {}", op, w, dims);
    layout.reduced[w] = true;
  }
  for (int64_t d = 0; d < rank; ++d) {
    layout.keepdim_shape.push_back(layout.reduced[d] ? 1 : a.shape()[d]);
    if (!layout.reduced[d] || keepdim) layout.out_shape.push_back(layout.reduced[d] ? 1 : a.shape()[d]);
  }
  // The reduced dims, if they form one run, stay in place; otherwise they are moved to the end.
  int64_t first = -1, last = -1;
  for (int64_t d = 0; d < rank; ++d) {
    if (layout.reduced[d]) {
      if (first < 0) first = d;
      last = d;
    }
  }
  bool one_run = true;
  for (int64_t d = first; d >= 0 && d <= last; ++d) one_run = one_run && layout.reduced[d];
  Tensor arranged = a;
  if (!one_run) {
    std::vector<int64_t> order;
    for (int64_t d = 0; d < rank; ++d) if (!layout.reduced[d]) order.push_back(d);
    first = static_cast<int64_t>(order.size());
    for (int64_t d = 0; d < rank; ++d) if (layout.reduced[d]) order.push_back(d);
    last = rank - 1;
    arranged = core::permute_raw(a, order);
  }
  const Shape& s = arranged.shape();
  if (first < 0) {  // nothing reduced (rank 0)
    layout.outer = 1;
    layout.reduce = 1;
    layout.inner = std::max<int64_t>(a.numel(), 1);
  } else {
    layout.outer = std::accumulate(s.begin(), s.begin() + first, int64_t{1}, std::multiplies<>());
    layout.reduce = std::accumulate(s.begin() + first, s.begin() + last + 1, int64_t{1}, std::multiplies<>());
    layout.inner = std::accumulate(s.begin() + last + 1, s.end(), int64_t{1}, std::multiplies<>());
  }
  layout.input3d = core::contiguous_raw(arranged);
  return layout;
}

/// How many elements each output of a reduction over `dims` combines (validating the dims).
int64_t reduction_size(const Tensor& a, const std::vector<int64_t>& dims, const char* op) {
  if (dims.empty()) return a.numel();
  std::vector<bool> seen(static_cast<size_t>(std::max<int64_t>(a.dim(), 1)), false);
  int64_t count = 1;
  for (int64_t d : dims) {
    const int64_t w = a.wrap_dim(d, op);
    COLOSSAL_CHECK(!seen[w], "{}: dimension {} listed twice in {}", op, w, dims);
    seen[w] = true;
    count *= a.dim() == 0 ? 1 : a.shape()[w];
  }
  return count;
}

DType sum_dtype(DType in) { return core::is_floating(in) ? in : DType::i64; }

Tensor sum_forward(const ReduceLayout& layout, const Tensor& a) {
  Tensor out = core::empty(layout.out_shape, TensorOptions(sum_dtype(a.dtype()), a.device()));
  if (layout.reduce == 0 || a.numel() == 0) {
    out.fill_(0.0);
    return out;
  }
  sum_stub(a.device(), out, layout.input3d, layout.outer, layout.reduce, layout.inner);
  return out;
}

}  // namespace

Tensor sum(const Tensor& a, const std::vector<int64_t>& dims, bool keepdim) {
  ReduceLayout layout = make_layout(a, dims, keepdim, "sum");
  Tensor out = sum_forward(layout, a);
  record("sum", {a}, {out},
         [keepdim_shape = layout.keepdim_shape, input_shape = a.shape()](const std::vector<Tensor>& g, const Node&) {
           Tensor grad = core::expand_raw(reshape(g[0], keepdim_shape), input_shape);
           return std::vector<Tensor>{core::contiguous_raw(grad)};
         });
  return out;
}

Tensor mean(const Tensor& a, const std::vector<int64_t>& dims, bool keepdim) {
  COLOSSAL_CHECK(core::is_floating(a.dtype()), "mean: expected a floating tensor, got {}", a.dtype());
  const int64_t count = reduction_size(a, dims, "mean");
  COLOSSAL_CHECK(count > 0, "mean: reducing over an empty dimension of shape {}", a.shape());
  return div(sum(a, dims, keepdim), static_cast<double>(count));
}

Tensor var(const Tensor& a, const std::vector<int64_t>& dims, int64_t correction, bool keepdim) {
  COLOSSAL_CHECK(core::is_floating(a.dtype()), "var: expected a floating tensor, got {}", a.dtype());
  const int64_t count = reduction_size(a, dims, "var");
  COLOSSAL_CHECK(count - correction > 0, "var: {} elements with correction {} leave no degrees of freedom", count,
                 correction);
  // Two passes (mean, then squared deviations) rather than E[x^2] - E[x]^2, which cancels badly.
  Tensor centered = sub(a, mean(a, dims, true));
  return div(sum(mul(centered, centered), dims, keepdim), static_cast<double>(count - correction));
}

ValuesIndices max(const Tensor& a, int64_t dim, bool keepdim) {
  COLOSSAL_CHECK(a.numel() > 0, "max: empty tensor of shape {}", a.shape());
  ReduceLayout layout = make_layout(a, {dim}, keepdim, "max");
  COLOSSAL_CHECK(layout.reduce > 0, "max: dimension {} of shape {} is empty", dim, a.shape());
  ValuesIndices result;
  result.values = core::empty(layout.out_shape, TensorOptions(a.dtype(), a.device()));
  result.indices = core::empty(layout.out_shape, TensorOptions(DType::i64, a.device()));
  max_stub(a.device(), result.values, result.indices, layout.input3d, layout.outer, layout.reduce, layout.inner);
  record("max", {a}, {result.values, result.indices},
         [indices = result.indices.detach(), input_shape = a.shape(), layout_dims = std::vector<int64_t>{dim},
          outer = layout.outer, reduce = layout.reduce, inner = layout.inner](const std::vector<Tensor>& g, const Node&) {
           Tensor grad_in = core::zeros(input_shape, TensorOptions(g[0].dtype(), g[0].device()));
           max_backward_stub(grad_in.device(), grad_in, core::contiguous_raw(g[0]), core::contiguous_raw(indices), outer,
                             reduce, inner);
           return std::vector<Tensor>{grad_in};
         });
  return result;
}

Tensor max(const Tensor& a) {
  COLOSSAL_CHECK(a.numel() > 0, "max: empty tensor of shape {}", a.shape());
  ValuesIndices flat;
  {
    autograd::NoGradGuard no_grad_inside;  // the recorded node below is the whole op
    flat = max(core::view_raw(core::contiguous_raw(a), {a.numel()}), 0, false);
  }
  Tensor out = flat.values;
  record("max_all", {a}, {out}, [a = a.detach(), out = out.detach()](const std::vector<Tensor>& g, const Node&) {
    Tensor hits = core::cast_raw(eq(a, out), g[0].dtype());
    Tensor share = div(hits, sum(hits));
    return std::vector<Tensor>{mul(share, g[0])};
  });
  return out;
}

Tensor argmax(const Tensor& a, int64_t dim, bool keepdim) {
  autograd::NoGradGuard no_grad;
  return max(a, dim, keepdim).indices;
}

Tensor sum_to(const Tensor& grad, const Shape& shape) {
  if (grad.shape() == shape) return grad;
  const int64_t lead = grad.dim() - static_cast<int64_t>(shape.size());
  COLOSSAL_CHECK(lead >= 0, "sum_to: cannot reduce shape {} to the larger shape {}", grad.shape(), shape);
  std::vector<int64_t> dims;
  for (int64_t d = 0; d < grad.dim(); ++d) {
    if (d < lead) {
      dims.push_back(d);
    } else if (shape[d - lead] == 1 && grad.shape()[d] != 1) {
      dims.push_back(d);
    } else {
      COLOSSAL_CHECK(shape[d - lead] == grad.shape()[d], "sum_to: shape {} does not broadcast to {}", shape, grad.shape());
    }
  }
  if (dims.empty()) return reshape(grad, shape);
  return reshape(sum(grad, dims, true), shape);
}

}  // namespace colossal::ops
