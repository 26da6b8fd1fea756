// Differentiable views and copies: each wraps its core/view.h primitive and records the adjoint.
#include "colossal/ops/shape.h"

#include <numeric>

#include "colossal/autograd/function.h"
#include "colossal/core/view.h"
#include "colossal/ops/reduction.h"

namespace colossal::ops {

using autograd::Node;
using autograd::record;

namespace {
/// A view of `a` that is a new handle even when the primitive returned `a` itself.
Tensor fresh(const Tensor& view, const Tensor& a) { return view.is_same(a) ? view.detach() : view; }

/// The adjoint of taking a sub-view: scatter the gradient into zeros of the input's shape.
Tensor embed_into_zeros(const Tensor& grad, const Shape& input_shape, const std::function<Tensor(const Tensor&)>& take_view) {
  Tensor full = core::zeros(input_shape, TensorOptions(grad.dtype(), grad.device()));
  Tensor part = take_view(full);
  part.copy_(grad);
  return full;
}
}  // namespace

Tensor view(const Tensor& a, const Shape& shape) {
  Tensor out = fresh(core::view_raw(a, shape), a);
  record("view", {a}, {out}, [input_shape = a.shape()](const std::vector<Tensor>& g, const Node&) {
    return std::vector<Tensor>{reshape(g[0], input_shape)};
  });
  return out;
}

Tensor reshape(const Tensor& a, const Shape& shape) {
  Tensor out = core::try_view(a, shape);
  out = out.defined() ? fresh(out, a) : core::view_raw(core::contiguous_raw(a), shape);
  record("reshape", {a}, {out}, [input_shape = a.shape()](const std::vector<Tensor>& g, const Node&) {
    return std::vector<Tensor>{reshape(g[0], input_shape)};
  });
  return out;
}

Tensor permute(const Tensor& a, const std::vector<int64_t>& dims) {
  Tensor out = core::permute_raw(a, dims);
  std::vector<int64_t> inverse(dims.size());
  for (size_t i = 0; i < dims.size(); ++i) inverse[a.wrap_dim(dims[i], "permute")] = static_cast<int64_t>(i);
  record("permute", {a}, {out}, [inverse](const std::vector<Tensor>& g, const Node&) {
    return std::vector<Tensor>{permute(g[0], inverse)};
  });
  return out;
}

Tensor transpose(const Tensor& a, int64_t dim0, int64_t dim1) {
  Tensor out = fresh(core::transpose_raw(a, dim0, dim1), a);
  record("transpose", {a}, {out}, [dim0, dim1](const std::vector<Tensor>& g, const Node&) {
    return std::vector<Tensor>{transpose(g[0], dim0, dim1)};
  });
  return out;
}

Tensor slice(const Tensor& a, int64_t dim, int64_t start, int64_t end, int64_t step) {
  Tensor out = core::slice_raw(a, dim, start, end, step);
  record("slice", {a}, {out}, [input_shape = a.shape(), dim, start, end, step](const std::vector<Tensor>& g, const Node&) {
    return std::vector<Tensor>{embed_into_zeros(g[0], input_shape, [&](const Tensor& full) {
      return core::slice_raw(full, dim, start, end, step);
    })};
  });
  return out;
}

Tensor narrow(const Tensor& a, int64_t dim, int64_t start, int64_t length) {
  core::narrow_raw(a, dim, start, length);  // validates the range with narrow's own message
  return slice(a, dim, start, start + length);
}

Tensor select(const Tensor& a, int64_t dim, int64_t index) {
  Tensor out = core::select_raw(a, dim, index);
  record("select", {a}, {out}, [input_shape = a.shape(), dim, index](const std::vector<Tensor>& g, const Node&) {
    return std::vector<Tensor>{embed_into_zeros(g[0], input_shape, [&](const Tensor& full) {
      return core::select_raw(full, dim, index);
    })};
  });
  return out;
}

Tensor unsqueeze(const Tensor& a, int64_t dim) {
  Tensor out = core::unsqueeze_raw(a, dim);
  record("unsqueeze", {a}, {out}, [input_shape = a.shape()](const std::vector<Tensor>& g, const Node&) {
    return std::vector<Tensor>{reshape(g[0], input_shape)};
  });
  return out;
}

Tensor squeeze(const Tensor& a, int64_t dim) {
  Tensor out = fresh(core::squeeze_raw(a, dim), a);
  record("squeeze", {a}, {out}, [input_shape = a.shape()](const std::vector<Tensor>& g, const Node&) {
    return std::vector<Tensor>{reshape(g[0], input_shape)};
  });
  return out;
}

Tensor flatten(const Tensor& a, int64_t start_dim, int64_t end_dim) {
  if (a.dim() == 0) return reshape(a, {1});
  const int64_t s = a.wrap_dim(start_dim, "flatten");
  const int64_t e = a.wrap_dim(end_dim, "flatten");
  COLOSSAL_CHECK(s <= e, "flatten: start_dim {} comes after end_dim {} for shape {}", start_dim, end_dim, a.shape());
  Shape shape(a.shape().begin(), a.shape().begin() + s);
  shape.push_back(std::accumulate(a.shape().begin() + s, a.shape().begin() + e + 1, int64_t{1}, std::multiplies<>()));
  shape.insert(shape.end(), a.shape().begin() + e + 1, a.shape().end());
  return reshape(a, shape);
}

Tensor expand(const Tensor& a, const Shape& shape) {
  Tensor out = fresh(core::expand_raw(a, shape), a);
  record("expand", {a}, {out}, [input_shape = a.shape()](const std::vector<Tensor>& g, const Node&) {
    return std::vector<Tensor>{sum_to(g[0], input_shape)};
  });
  return out;
}

Tensor contiguous(const Tensor& a) {
  if (a.is_contiguous()) return a;
  Tensor out = core::contiguous_raw(a);
  record("contiguous", {a}, {out}, [](const std::vector<Tensor>& g, const Node&) { return std::vector<Tensor>{g[0]}; });
  return out;
}

Tensor to_dtype(const Tensor& a, DType dtype) {
  if (a.dtype() == dtype) return a;
  Tensor out = core::cast_raw(a, dtype);
  record("to_dtype", {a}, {out}, [input_dtype = a.dtype()](const std::vector<Tensor>& g, const Node&) {
    return std::vector<Tensor>{core::cast_raw(g[0], input_dtype)};
  });
  return out;
}

Tensor to_device(const Tensor& a, Device device) {
  if (a.device() == device) return a;
  Tensor out = core::to_device_raw(a, device);
  record("to_device", {a}, {out}, [input_device = a.device()](const std::vector<Tensor>& g, const Node&) {
    return std::vector<Tensor>{core::to_device_raw(g[0], input_device)};
  });
  return out;
}

Tensor clone(const Tensor& a) {
  Tensor out = core::empty(a.shape(), TensorOptions(a.dtype(), a.device()));
  out.copy_(a);
  record("clone", {a}, {out}, [](const std::vector<Tensor>& g, const Node&) { return std::vector<Tensor>{g[0]}; });
  return out;
}

}  // namespace colossal::ops
