// Joining, splitting and indexing ops: shape rules, checks with messages that name the shapes,
// and autograd. cat writes each input into a slice of the output with copy_, split returns views
// (through narrow), index_select is gather with the index broadcast along the other dims, and
// gather and scatter_add are each other's adjoint.
#include "colossal/ops/indexing.h"
#include "colossal/ops/autocast.h"

#include <string>

#include "colossal/autograd/function.h"  // record
#include "colossal/core/view.h"          // narrow_raw, expand_raw, as_strided, ...
#include "colossal/ops/indexing_kernels.h"
#include "colossal/ops/reduction.h"  // sum_to
#include "colossal/ops/shape.h"      // narrow, unsqueeze

namespace colossal::ops {

constinit core::DispatchStub<CheckIndexKernel> check_index_stub("check_index");
constinit core::DispatchStub<WhereKernel> where_stub("where");
constinit core::DispatchStub<GatherKernel> gather_stub("gather");
constinit core::DispatchStub<ScatterAddKernel> scatter_add_stub("scatter_add");

namespace {

using autograd::Node;

/// The shapes of a list of tensors as "[2, 3], [2, 4]", for messages.
std::string shapes_of(const std::vector<Tensor>& tensors) {
  std::string text;
  for (size_t i = 0; i < tensors.size(); ++i) text += fmt::format("{}{}", i ? ", " : "", tensors[i].shape());
  return text;
}

void check_index_tensor(const char* op, const Tensor& index) {
  COLOSSAL_CHECK(index.defined(), "{}: index is undefined", op);
  COLOSSAL_CHECK(index.dtype() == DType::i64 || index.dtype() == DType::i32,
                 "{}: index must be i64 or i32, got {} of shape {}", op, index.dtype(), index.shape());
}

/// Checks the gather/scatter shape rule: index has `a`'s rank and is no larger than `a` along every
/// dim but `dim`.
void check_gather_shapes(const char* op, const Tensor& a, int64_t dim, const Tensor& index, const char* a_name) {
  COLOSSAL_CHECK(index.dim() == a.dim(), "{}: index {} must have the rank of {} {}", op, index.shape(), a_name,
                 a.shape());
  for (int64_t d = 0; d < a.dim(); ++d) {
    COLOSSAL_CHECK(d == dim || index.shape()[d] <= a.shape()[d],
                   "{}: index {} is larger than {} {} in dim {} (only dim {} may differ)", op, index.shape(), a_name,
                   a.shape(), d, dim);
  }
  COLOSSAL_CHECK(index.device() == a.device(), "{}: index is on {} but {} is on {}", op, index.device(), a_name,
                 a.device());
}

/// scatter_add of src into a zero tensor of `shape`, without recording (for backward passes).
Tensor scatter_add_into_zeros(const Shape& shape, const Tensor& like, int64_t dim, const Tensor& index,
                              const Tensor& src) {
  Tensor out = core::zeros(shape, TensorOptions(like.dtype(), like.device()));
  if (index.numel() > 0) scatter_add_stub(like.device(), out, dim, index, src);
  return out;
}

Tensor gather_raw(const Tensor& a, int64_t dim, const Tensor& index) {
  Tensor out = core::empty(index.shape(), TensorOptions(a.dtype(), a.device()));
  if (out.numel() > 0) gather_stub(a.device(), out, a, dim, index);
  return out;
}

/// index (1-D, n entries) broadcast to `shape` (a's shape with n along dim), for gather.
Tensor broadcast_index(const Tensor& index, const Shape& shape, int64_t dim) {
  Shape strides(shape.size(), 0);
  strides[dim] = index.strides()[0];
  return core::as_strided(index, shape, strides, index.offset());
}

/// where without autograd: a and b already share a dtype and a device.
Tensor where_raw(const Tensor& condition, const Tensor& a, const Tensor& b) {
  const Shape shape = core::broadcast_shapes(core::broadcast_shapes(condition.shape(), a.shape()), b.shape());
  Tensor out = core::empty(shape, TensorOptions(a.dtype(), a.device()));
  if (out.numel() > 0) {
    where_stub(a.device(), out, core::expand_raw(condition, shape), core::expand_raw(a, shape),
               core::expand_raw(b, shape));
  }
  return out;
}

void check_condition(const char* op, const char* name, const Tensor& condition, const Tensor& a) {
  COLOSSAL_CHECK(condition.defined(), "{}: {} is undefined", op, name);
  COLOSSAL_CHECK(condition.dtype() == DType::boolean, "{}: {} must be bool, got {} of shape {}", op, name,
                 condition.dtype(), condition.shape());
  COLOSSAL_CHECK(condition.device() == a.device(), "{}: {} is on {} but the input is on {}", op, name,
                 condition.device(), a.device());
}

}  // namespace

Tensor cat(const std::vector<Tensor>& tensors, int64_t dim) {
  COLOSSAL_CHECK(!tensors.empty(), "cat: expected at least one tensor");
  if (autocast_dtype()) {
    // Autocast mixes dtypes (an f32 parameter beside an f16 activation): cat promotes to the widest,
    // as torch.autocast's "promote" ops do. Outside autocast mixed dtypes stay an error.
    std::optional<DType> widest;
    bool mixed = false;
    for (const Tensor& t : tensors) {
      if (!t.defined() || !core::is_floating(t.dtype())) continue;
      mixed = mixed || (widest && *widest != t.dtype());
      widest = widest ? core::promote_types(*widest, t.dtype()) : t.dtype();
    }
    if (mixed) {
      std::vector<Tensor> promoted;
      for (const Tensor& t : tensors) promoted.push_back(t.defined() ? to_dtype(t, *widest) : t);
      const AutocastGuard off(std::nullopt);
      return cat(promoted, dim);
    }
  }
  const Tensor& first = tensors[0];
  for (size_t i = 0; i < tensors.size(); ++i) {
    COLOSSAL_CHECK(tensors[i].defined(), "cat: tensor {} is undefined", i);
  }
  COLOSSAL_CHECK(first.dim() > 0, "cat: zero-dimensional tensors cannot be concatenated (shapes {}); use stack",
                 shapes_of(tensors));
  dim = first.wrap_dim(dim, "cat");
  Shape out_shape = first.shape();
  out_shape[dim] = 0;
  for (size_t i = 0; i < tensors.size(); ++i) {
    const Tensor& t = tensors[i];
    COLOSSAL_CHECK(t.dtype() == first.dtype(), "cat: tensor {} is {} but tensor 0 is {} (shapes {})", i, t.dtype(),
                   first.dtype(), shapes_of(tensors));
    COLOSSAL_CHECK(t.device() == first.device(), "cat: tensor {} is on {} but tensor 0 is on {}", i, t.device(),
                   first.device());
    bool compatible = t.dim() == first.dim();
    for (int64_t d = 0; compatible && d < t.dim(); ++d) compatible = d == dim || t.shape()[d] == first.shape()[d];
    COLOSSAL_CHECK(compatible, "cat: shapes {} differ outside dim {}; every tensor must match tensor 0 {} there",
                   shapes_of(tensors), dim, first.shape());
    out_shape[dim] += t.shape()[dim];
  }
  Tensor out = core::empty(out_shape, TensorOptions(first.dtype(), first.device()));
  std::vector<int64_t> sizes;
  int64_t start = 0;
  for (const Tensor& t : tensors) {
    const int64_t size = t.shape()[dim];
    if (t.numel() > 0) core::narrow_raw(out, dim, start, size).copy_(t);
    sizes.push_back(size);
    start += size;
  }
  autograd::record("cat", tensors, {out}, [sizes, dim](const std::vector<Tensor>& g, const Node& node) {
    std::vector<Tensor> grads(sizes.size());
    int64_t offset = 0;
    for (size_t i = 0; i < sizes.size(); ++i) {
      if (node.needs_input_grad(i)) grads[i] = core::narrow_raw(g[0], dim, offset, sizes[i]);
      offset += sizes[i];
    }
    return grads;
  });
  return out;
}

Tensor stack(const std::vector<Tensor>& tensors, int64_t dim) {
  COLOSSAL_CHECK(!tensors.empty(), "stack: expected at least one tensor");
  for (size_t i = 0; i < tensors.size(); ++i) {
    COLOSSAL_CHECK(tensors[i].defined(), "stack: tensor {} is undefined", i);
    COLOSSAL_CHECK(tensors[i].shape() == tensors[0].shape(),
                   "stack: every tensor must have one shape, but tensor {} is {} and tensor 0 is {} (shapes {})", i,
                   tensors[i].shape(), tensors[0].shape(), shapes_of(tensors));
  }
  const int64_t rank = tensors[0].dim() + 1;
  COLOSSAL_CHECK(dim >= -rank && dim < rank, "stack: dim {} is out of range for {} tensors of rank {} (valid: {}..{})",
                 dim, tensors.size(), rank - 1, -rank, rank - 1);
  if (dim < 0) dim += rank;
  std::vector<Tensor> expanded;
  expanded.reserve(tensors.size());
  for (const Tensor& t : tensors) expanded.push_back(unsqueeze(t, dim));
  return cat(expanded, dim);
}

std::vector<Tensor> split(const Tensor& a, int64_t split_size, int64_t dim) {
  COLOSSAL_CHECK(a.defined(), "split: input is undefined");
  COLOSSAL_CHECK(a.dim() > 0, "split: cannot split a zero-dimensional tensor");
  dim = a.wrap_dim(dim, "split");
  const int64_t size = a.shape()[dim];
  COLOSSAL_CHECK(split_size > 0 || (split_size == 0 && size == 0),
                 "split: split_size must be positive, got {} for shape {} along dim {}", split_size, a.shape(), dim);
  std::vector<int64_t> sizes;
  for (int64_t start = 0; start < size; start += split_size) sizes.push_back(std::min(split_size, size - start));
  if (sizes.empty()) sizes.push_back(0);
  return split(a, sizes, dim);
}

std::vector<Tensor> split(const Tensor& a, const std::vector<int64_t>& sizes, int64_t dim) {
  COLOSSAL_CHECK(a.defined(), "split: input is undefined");
  COLOSSAL_CHECK(a.dim() > 0, "split: cannot split a zero-dimensional tensor");
  dim = a.wrap_dim(dim, "split");
  int64_t total = 0;
  for (int64_t s : sizes) {
    COLOSSAL_CHECK(s >= 0, "split: sizes {} contain a negative entry", sizes);
    total += s;
  }
  COLOSSAL_CHECK(total == a.shape()[dim], "split: sizes {} add up to {} but shape {} has {} along dim {}", sizes, total,
                 a.shape(), a.shape()[dim], dim);
  std::vector<Tensor> parts;
  int64_t start = 0;
  for (int64_t s : sizes) {
    parts.push_back(narrow(a, dim, start, s));
    start += s;
  }
  return parts;
}

Tensor gather(const Tensor& a, int64_t dim, const Tensor& index) {
  COLOSSAL_CHECK(a.defined(), "gather: input is undefined");
  check_index_tensor("gather", index);
  COLOSSAL_CHECK(a.dim() > 0, "gather: input must have at least one dim, got shape {}", a.shape());
  dim = a.wrap_dim(dim, "gather");
  check_gather_shapes("gather", a, dim, index, "input");
  if (index.numel() > 0) check_index_stub(a.device(), "gather", index, dim, a.shape()[dim]);
  Tensor out = gather_raw(a, dim, index);
  autograd::record("gather", {a}, {out},
                   [shape = a.shape(), dim, saved_index = index.detach()](const std::vector<Tensor>& g, const Node&) {
                     return std::vector<Tensor>{scatter_add_into_zeros(shape, g[0], dim, saved_index, g[0])};
                   });
  return out;
}

Tensor index_select(const Tensor& a, int64_t dim, const Tensor& index) {
  COLOSSAL_CHECK(a.defined(), "index_select: input is undefined");
  check_index_tensor("index_select", index);
  COLOSSAL_CHECK(index.dim() <= 1, "index_select: index must be 1-D, got shape {}", index.shape());
  COLOSSAL_CHECK(a.dim() > 0, "index_select: input must have at least one dim, got shape {}", a.shape());
  COLOSSAL_CHECK(index.device() == a.device(), "index_select: index is on {} but input is on {}", index.device(),
                 a.device());
  dim = a.wrap_dim(dim, "index_select");
  const Tensor index_1d = index.dim() == 0 ? core::view_raw(index, {1}) : index;
  Shape out_shape = a.shape();
  out_shape[dim] = index_1d.numel();
  if (index_1d.numel() > 0) check_index_stub(a.device(), "index_select", index_1d, dim, a.shape()[dim]);
  const Tensor broadcast = broadcast_index(index_1d, out_shape, dim);
  Tensor out = core::empty(out_shape, TensorOptions(a.dtype(), a.device()));
  if (out.numel() > 0) gather_stub(a.device(), out, a, dim, broadcast);
  autograd::record("index_select", {a}, {out},
                   [shape = a.shape(), dim, saved = broadcast.detach()](const std::vector<Tensor>& g, const Node&) {
                     return std::vector<Tensor>{scatter_add_into_zeros(shape, g[0], dim, saved, g[0])};
                   });
  return out;
}

Tensor scatter_add(const Tensor& a, int64_t dim, const Tensor& index, const Tensor& src) {
  COLOSSAL_CHECK(a.defined() && src.defined(), "scatter_add: input and src must be defined");
  check_index_tensor("scatter_add", index);
  COLOSSAL_CHECK(a.dim() > 0, "scatter_add: input must have at least one dim, got shape {}", a.shape());
  dim = a.wrap_dim(dim, "scatter_add");
  COLOSSAL_CHECK(src.dtype() == a.dtype(), "scatter_add: src is {} of shape {} but input is {} of shape {}",
                 src.dtype(), src.shape(), a.dtype(), a.shape());
  COLOSSAL_CHECK(src.device() == a.device(), "scatter_add: src is on {} but input is on {}", src.device(), a.device());
  check_gather_shapes("scatter_add", a, dim, index, "input");
  COLOSSAL_CHECK(src.dim() == index.dim(), "scatter_add: src {} must have the rank of index {}", src.shape(),
                 index.shape());
  for (int64_t d = 0; d < src.dim(); ++d) {
    COLOSSAL_CHECK(index.shape()[d] <= src.shape()[d], "scatter_add: index {} is larger than src {} in dim {}",
                   index.shape(), src.shape(), d);
  }
  if (index.numel() > 0) check_index_stub(a.device(), "scatter_add", index, dim, a.shape()[dim]);
  Tensor out = core::empty(a.shape(), TensorOptions(a.dtype(), a.device()));  // never written into a
  if (out.numel() > 0) out.copy_(a);
  if (index.numel() > 0) scatter_add_stub(a.device(), out, dim, index, src);
  autograd::record(
      "scatter_add", {a, src}, {out},
      [dim, saved_index = index.detach(), src_shape = src.shape()](const std::vector<Tensor>& g, const Node& node) {
        std::vector<Tensor> grads(2);
        if (node.needs_input_grad(0)) grads[0] = g[0];
        if (node.needs_input_grad(1)) {
          Tensor gathered = gather_raw(g[0], dim, saved_index);
          if (gathered.shape() == src_shape) {
            grads[1] = gathered;
          } else {  // src positions outside index's extent received nothing
            grads[1] = core::zeros(src_shape, TensorOptions(gathered.dtype(), gathered.device()));
            Tensor region = grads[1];
            for (int64_t d = 0; d < gathered.dim(); ++d) region = core::narrow_raw(region, d, 0, gathered.shape()[d]);
            region.copy_(gathered);
          }
        }
        return grads;
      });
  return out;
}

Tensor where(const Tensor& condition, const Tensor& a, const Tensor& b) {
  COLOSSAL_CHECK(a.defined() && b.defined(), "where: a and b must be defined");
  check_condition("where", "condition", condition, a);
  COLOSSAL_CHECK(a.dtype() == b.dtype(), "where: a is {} of shape {} but b is {} of shape {}; cast one first",
                 a.dtype(), a.shape(), b.dtype(), b.shape());
  COLOSSAL_CHECK(a.device() == b.device(), "where: a is on {} but b is on {}", a.device(), b.device());
  Tensor out = where_raw(condition, a, b);
  autograd::record("where", {a, b}, {out},
                   [saved = condition.detach(), a_shape = a.shape(), b_shape = b.shape()](const std::vector<Tensor>& g,
                                                                                          const Node& node) {
                     std::vector<Tensor> grads(2);
                     const Tensor zero = core::zeros({}, TensorOptions(g[0].dtype(), g[0].device()));
                     if (node.needs_input_grad(0)) grads[0] = sum_to(where_raw(saved, g[0], zero), a_shape);
                     if (node.needs_input_grad(1)) grads[1] = sum_to(where_raw(saved, zero, g[0]), b_shape);
                     return grads;
                   });
  return out;
}

Tensor masked_fill(const Tensor& a, const Tensor& mask, double value) {
  COLOSSAL_CHECK(a.defined(), "masked_fill: input is undefined");
  check_condition("masked_fill", "mask", mask, a);
  const Shape shape = core::broadcast_shapes(mask.shape(), a.shape());
  COLOSSAL_CHECK(shape == a.shape(), "masked_fill: mask {} must broadcast to the input's shape {}", mask.shape(),
                 a.shape());
  const Tensor fill = core::full({}, value, TensorOptions(a.dtype(), a.device()));
  Tensor out = where_raw(mask, fill, a);
  autograd::record("masked_fill", {a}, {out}, [saved = mask.detach()](const std::vector<Tensor>& g, const Node&) {
    const Tensor zero = core::zeros({}, TensorOptions(g[0].dtype(), g[0].device()));
    return std::vector<Tensor>{where_raw(saved, zero, g[0])};
  });
  return out;
}

}  // namespace colossal::ops
