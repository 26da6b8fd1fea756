// Raw views, broadcasting rules and device/dtype conversion.
#include "colossal/core/view.h"

#include <algorithm>
#include <numeric>

namespace colossal::core {

constinit DispatchStub<CopyKernel> copy_stub("copy");
constinit DispatchStub<FillKernel> fill_stub("fill");
constinit DispatchStub<AccumulateKernel> accumulate_stub("accumulate");
constinit DispatchStub<AccumulateManyKernel> accumulate_many_stub("accumulate_many");
constinit DispatchStub<CrossDeviceCopyKernel> cross_device_copy_stub("cross_device_copy");

Tensor as_strided(const Tensor& t, const Shape& shape, const Shape& strides, int64_t offset) {
  COLOSSAL_CHECK(shape.size() == strides.size(), "as_strided: shape {} and strides {} differ in rank", shape, strides);
  check_shape(shape, "as_strided");
  // The furthest element reached must lie inside the storage.
  if (shape_numel(shape) > 0) {
    int64_t last = offset;
    for (size_t d = 0; d < shape.size(); ++d) last += (shape[d] - 1) * strides[d];
    const int64_t capacity = static_cast<int64_t>(t.storage().nbytes() / t.element_size());
    COLOSSAL_CHECK(offset >= 0 && last < capacity,
                   "as_strided: view (shape {}, strides {}, offset {}) reaches element {} of a storage of {} elements",
                   shape, strides, offset, last, capacity);
  }
  return Tensor(std::make_shared<TensorImpl>(t.storage(), shape, strides, offset, t.dtype()));
}

Shape infer_shape(const Shape& shape, int64_t numel) {
  Shape out = shape;
  int64_t infer_at = -1;
  int64_t known = 1;
  for (size_t d = 0; d < out.size(); ++d) {
    if (out[d] == -1) {
      COLOSSAL_CHECK(infer_at < 0, "shape {}: only one dimension can be -1", shape);
      infer_at = static_cast<int64_t>(d);
    } else {
      COLOSSAL_CHECK(out[d] >= 0, "shape {}: sizes must be >= 0 or -1", shape);
      COLOSSAL_CHECK(!__builtin_mul_overflow(known, out[d], &known),
                     "shape {} is invalid for a tensor of {} elements (its sizes multiply past 64 bits)", shape, numel);
    }
  }
  if (infer_at >= 0) {
    COLOSSAL_CHECK(known != 0 && numel % known == 0, "shape {} is invalid for a tensor of {} elements", shape, numel);
    out[infer_at] = numel / known;
  }
  check_shape(out, "view");  // a tensor without elements viewed as [0, 2^40, 2^40]: strides past 64 bits
  COLOSSAL_CHECK(shape_numel(out) == numel, "shape {} is invalid for a tensor of {} elements", shape, numel);
  return out;
}

Tensor try_view(const Tensor& t, const Shape& requested) {
  const Shape shape = infer_shape(requested, t.numel());
  if (t.is_contiguous()) return as_strided(t, shape, contiguous_strides(shape), t.offset());
  // Match groups of old dimensions that are contiguous among themselves against groups of new ones
  // with the same element count (the rule PyTorch's view uses).
  const Shape& old_shape = t.shape();
  const Shape& old_strides = t.strides();
  Shape new_strides(shape.size(), 0);
  int64_t view_d = static_cast<int64_t>(shape.size()) - 1;
  int64_t chunk_base_stride = old_strides.empty() ? 1 : old_strides.back();
  int64_t tensor_numel = 1;
  int64_t view_numel = 1;
  for (int64_t d = static_cast<int64_t>(old_shape.size()) - 1; d >= 0; --d) {
    tensor_numel *= old_shape[d];
    if (d == 0 || (old_shape[d - 1] != 1 && old_strides[d - 1] != tensor_numel * chunk_base_stride)) {
      while (view_d >= 0 && (view_numel < tensor_numel || shape[view_d] == 1)) {
        new_strides[view_d] = view_numel * chunk_base_stride;
        view_numel *= shape[view_d];
        --view_d;
      }
      if (view_numel != tensor_numel) return Tensor();
      if (d > 0) {
        chunk_base_stride = old_strides[d - 1];
        tensor_numel = 1;
        view_numel = 1;
      }
    }
  }
  if (view_d != -1) return Tensor();
  return as_strided(t, shape, new_strides, t.offset());
}

Tensor view_raw(const Tensor& t, const Shape& shape) {
  Tensor v = try_view(t, shape);
  COLOSSAL_CHECK(v.defined(),
                 "view: cannot view a tensor of shape {} and strides {} as {} without copying; use reshape() or "
                 "contiguous() first",
                 t.shape(), t.strides(), shape);
  return v;
}

Tensor permute_raw(const Tensor& t, const std::vector<int64_t>& dims) {
  COLOSSAL_CHECK(static_cast<int64_t>(dims.size()) == t.dim(), "permute: {} dims given for a tensor of shape {}",
                 dims.size(), t.shape());
  Shape shape(dims.size()), strides(dims.size());
  std::vector<bool> seen(dims.size(), false);
  for (size_t i = 0; i < dims.size(); ++i) {
    const int64_t d = t.wrap_dim(dims[i], "permute");
    COLOSSAL_CHECK(!seen[d], "permute: dimension {} repeats in {}", d, dims);
    seen[d] = true;
    shape[i] = t.shape()[d];
    strides[i] = t.strides()[d];
  }
  return as_strided(t, shape, strides, t.offset());
}

Tensor transpose_raw(const Tensor& t, int64_t dim0, int64_t dim1) {
  std::vector<int64_t> dims(static_cast<size_t>(t.dim()));
  std::iota(dims.begin(), dims.end(), 0);
  if (t.dim() == 0) return t.detach();
  std::swap(dims[t.wrap_dim(dim0, "transpose")], dims[t.wrap_dim(dim1, "transpose")]);
  return permute_raw(t, dims);
}

Tensor slice_raw(const Tensor& t, int64_t dim, int64_t start, int64_t end, int64_t step) {
  COLOSSAL_CHECK(t.dim() > 0, "slice: cannot slice a 0-d tensor");
  const int64_t d = t.wrap_dim(dim, "slice");
  COLOSSAL_CHECK(step > 0, "slice: step must be positive, got {}", step);
  const int64_t size = t.shape()[d];
  if (start < 0) start += size;
  if (end < 0) end += size;
  start = std::clamp<int64_t>(start, 0, size);
  end = std::clamp<int64_t>(end, start, size);
  Shape shape = t.shape();
  Shape strides = t.strides();
  shape[d] = (end - start + step - 1) / step;
  strides[d] *= step;
  return as_strided(t, shape, strides, t.offset() + start * t.strides()[d]);
}

Tensor narrow_raw(const Tensor& t, int64_t dim, int64_t start, int64_t length) {
  COLOSSAL_CHECK(t.dim() > 0, "narrow: cannot narrow a 0-d tensor");
  const int64_t d = t.wrap_dim(dim, "narrow");
  const int64_t size = t.shape()[d];
  COLOSSAL_CHECK(start >= 0 && length >= 0 && start + length <= size,
                 "narrow: [{}, {}) is out of range for dimension {} of size {} (shape {})", start, start + length, d,
                 size, t.shape());
  return slice_raw(t, d, start, start + length);
}

Tensor select_raw(const Tensor& t, int64_t dim, int64_t index) {
  COLOSSAL_CHECK(t.dim() > 0, "select: cannot select from a 0-d tensor");
  const int64_t d = t.wrap_dim(dim, "select");
  const int64_t size = t.shape()[d];
  COLOSSAL_CHECK(index >= -size && index < size, "select: index {} is out of range for dimension {} of size {}", index,
                 d, size);
  if (index < 0) index += size;
  Shape shape = t.shape();
  Shape strides = t.strides();
  const int64_t offset = t.offset() + index * strides[d];
  shape.erase(shape.begin() + d);
  strides.erase(strides.begin() + d);
  return as_strided(t, shape, strides, offset);
}

Tensor unsqueeze_raw(const Tensor& t, int64_t dim) {
  const int64_t rank = t.dim();
  COLOSSAL_CHECK(dim >= -(rank + 1) && dim <= rank,
                 "unsqueeze: dimension {} out of range for shape {} (valid: {} to {})", dim, t.shape(), -(rank + 1),
                 rank);
  if (dim < 0) dim += rank + 1;
  Shape shape = t.shape();
  Shape strides = t.strides();
  const int64_t stride = dim < rank ? strides[dim] * shape[dim] : 1;
  shape.insert(shape.begin() + dim, 1);
  strides.insert(strides.begin() + dim, stride);
  return as_strided(t, shape, strides, t.offset());
}

Tensor squeeze_raw(const Tensor& t, int64_t dim) {
  if (t.dim() == 0) return t.detach();
  const int64_t d = t.wrap_dim(dim, "squeeze");
  if (t.shape()[d] != 1) return as_strided(t, t.shape(), t.strides(), t.offset());
  Shape shape = t.shape();
  Shape strides = t.strides();
  shape.erase(shape.begin() + d);
  strides.erase(strides.begin() + d);
  return as_strided(t, shape, strides, t.offset());
}

Tensor expand_raw(const Tensor& t, const Shape& requested) {
  const int64_t rank = static_cast<int64_t>(requested.size());
  COLOSSAL_CHECK(rank >= t.dim(), "expand: cannot expand shape {} to fewer dimensions {}", t.shape(), requested);
  Shape shape(rank), strides(rank);
  const int64_t lead = rank - t.dim();
  for (int64_t d = 0; d < rank; ++d) {
    const int64_t want = requested[d];
    if (d < lead) {
      COLOSSAL_CHECK(want >= 0, "expand: size -1 is not allowed for a new leading dimension in {}", requested);
      shape[d] = want;
      strides[d] = 0;
      continue;
    }
    const int64_t have = t.shape()[d - lead];
    if (want == -1 || want == have) {
      shape[d] = have;
      strides[d] = t.strides()[d - lead];
    } else {
      COLOSSAL_CHECK(have == 1, "expand: shape {} cannot be broadcast to {} (dimension {} has size {}, not 1)",
                     t.shape(), requested, d - lead, have);
      shape[d] = want;
      strides[d] = 0;
    }
  }
  return as_strided(t, shape, strides, t.offset());
}

Shape broadcast_shapes(const Shape& a, const Shape& b, const char* op) {
  const size_t rank = std::max(a.size(), b.size());
  Shape out(rank);
  for (size_t i = 0; i < rank; ++i) {
    const int64_t da = i < rank - a.size() ? 1 : a[i - (rank - a.size())];
    const int64_t db = i < rank - b.size() ? 1 : b[i - (rank - b.size())];
    COLOSSAL_CHECK(da == db || da == 1 || db == 1,
                   "{}: shapes {} and {} cannot be broadcast together (dimension {}: {} vs {})", op, a, b, i, da, db);
    out[i] = da == 1 ? db : da;
  }
  return out;
}

Tensor contiguous_raw(const Tensor& t) {
  if (t.is_contiguous()) return t;
  Tensor out = empty(t.shape(), TensorOptions(t.dtype(), t.device()));
  copy_stub(t.device(), out, t);
  return out;
}

Tensor cast_raw(const Tensor& t, DType dtype) {
  if (t.dtype() == dtype && t.is_contiguous()) return t;
  Tensor out = empty(t.shape(), TensorOptions(dtype, t.device()));
  if (t.numel() > 0) copy_stub(t.device(), out, t);
  return out;
}

Tensor to_device_raw(const Tensor& t, Device device) {
  if (t.device() == device) return t;
  Tensor out = empty(t.shape(), TensorOptions(t.dtype(), device));
  out.copy_(t);
  return out;
}

void accumulate_(const Tensor& dst, const Tensor& src) {
  COLOSSAL_CHECK(dst.shape() == src.shape() && dst.dtype() == src.dtype() && dst.device() == src.device(),
                 "accumulate: destination (shape {}, {}, {}) and source (shape {}, {}, {}) must match", dst.shape(),
                 dst.dtype(), dst.device(), src.shape(), src.dtype(), src.device());
  if (dst.numel() > 0) accumulate_stub(dst.device(), dst, src);
}

void accumulate_many_(const std::vector<Tensor>& dst, const std::vector<Tensor>& src) {
  COLOSSAL_CHECK(dst.size() == src.size(), "accumulate_many: {} destinations and {} sources", dst.size(), src.size());
  std::vector<const void*> seen;
  seen.reserve(dst.size());
  for (size_t i = 0; i < dst.size(); ++i) {
    const Tensor& d = dst[i];
    const Tensor& s = src[i];
    COLOSSAL_CHECK(d.shape() == s.shape() && d.dtype() == s.dtype() && d.device() == s.device(),
                   "accumulate_many: pair {}: destination (shape {}, {}, {}) and source (shape {}, {}, {}) must match",
                   i, d.shape(), d.dtype(), d.device(), s.shape(), s.dtype(), s.device());
    if (d.numel() > 0) seen.push_back(d.raw_data());
  }
  std::sort(seen.begin(), seen.end());
  COLOSSAL_CHECK(std::adjacent_find(seen.begin(), seen.end()) == seen.end(),
                 "accumulate_many: two destinations are the same tensor; add their sources first");
  // The pairs a backend takes in one launch, by device and dtype; the rest one by one.
  struct Batch {
    Device device;
    DType dtype;
    std::vector<Tensor> dst, src;
  };
  std::vector<Batch> batches;
  for (size_t i = 0; i < dst.size(); ++i) {
    const Tensor& d = dst[i];
    const Tensor& s = src[i];
    if (d.numel() == 0) continue;
    if (!accumulate_many_stub.supports(d.device().type) || !d.is_contiguous() || !s.is_contiguous()) {
      accumulate_stub(d.device(), d, s);
      continue;
    }
    auto it = std::find_if(batches.begin(), batches.end(),
                           [&](const Batch& b) { return b.device == d.device() && b.dtype == d.dtype(); });
    if (it == batches.end()) it = batches.insert(batches.end(), Batch{d.device(), d.dtype(), {}, {}});
    it->dst.push_back(d);
    it->src.push_back(s);
  }
  for (const Batch& b : batches) accumulate_many_stub(b.device, b.dst, b.src);
}

}  // namespace colossal::core
