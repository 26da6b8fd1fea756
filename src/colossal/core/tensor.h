// Tensor: a typed, strided view (shape, strides, offset) over ref-counted Storage, plus the
// autograd metadata (requires_grad, grad, grad_fn) the autograd layer reads and writes.
// Tensors are handles: copying one shares the same TensorImpl, as in PyTorch.
//
// Core owns the raw, non-differentiable primitives (see core/view.h). Methods such as view(),
// transpose() or to(dtype) record autograd and are defined by the ops layer (ops/tensor_methods.cpp);
// a program that calls them links colossal_ops.
#pragma once

#include <cstdint>
#include <functional>
#include <iosfwd>
#include <memory>
#include <string>
#include <vector>

#include "colossal/core/device.h"
#include "colossal/core/dtype.h"
#include "colossal/core/error.h"
#include "colossal/core/storage.h"

namespace colossal::autograd {
class Node;
}  // namespace colossal::autograd

namespace colossal::core {

using Shape = std::vector<int64_t>;

struct TensorOptions {
  DType dtype = DType::f32;
  Device device = kCpu;
  bool requires_grad = false;

  TensorOptions() = default;
  TensorOptions(DType d) : dtype(d) {}    // NOLINT: lets zeros({2}, DType::f64) read naturally
  TensorOptions(Device d) : device(d) {}  // NOLINT
  TensorOptions(DType t, Device d, bool rg = false) : dtype(t), device(d), requires_grad(rg) {}
  TensorOptions with_dtype(DType d) const {
    auto o = *this;
    o.dtype = d;
    return o;
  }
  TensorOptions with_device(Device d) const {
    auto o = *this;
    o.device = d;
    return o;
  }
  TensorOptions with_requires_grad(bool r) const {
    auto o = *this;
    o.requires_grad = r;
    return o;
  }
};

class TensorImpl;
struct AutogradMeta;

class Tensor {
 public:
  Tensor() = default;  ///< an undefined tensor (no storage); defined() is false
  explicit Tensor(std::shared_ptr<TensorImpl> impl) : impl_(std::move(impl)) {}

  bool defined() const { return impl_ != nullptr; }
  TensorImpl* impl() const { return impl_.get(); }
  const std::shared_ptr<TensorImpl>& shared_impl() const { return impl_; }
  bool is_same(const Tensor& other) const { return impl_ == other.impl_; }
  /// Handles sharing this TensorImpl (autograd uses it to decide whether a buffer can be reused).
  long use_count() const { return impl_.use_count(); }

  // ---- metadata
  const Shape& shape() const;
  const Shape& strides() const;
  int64_t dim() const;
  /// Size of dimension d; negative d counts from the end. Throws naming the valid range.
  int64_t size(int64_t d) const;
  int64_t stride(int64_t d) const;
  int64_t offset() const;
  int64_t numel() const;
  DType dtype() const;
  Device device() const;
  size_t element_size() const { return core::element_size(dtype()); }
  size_t nbytes() const { return static_cast<size_t>(numel()) * element_size(); }
  bool is_contiguous() const;
  const Storage& storage() const;
  /// Pointer to the first element (storage base + offset).
  void* raw_data() const;
  /// Typed pointer to the first element; throws if T is not this tensor's dtype.
  template <class T>
  T* data() const {
    COLOSSAL_CHECK(dtype_of<T>() == dtype(), "data<{}>() on a {} tensor", dtype_name(dtype_of<T>()), dtype());
    return static_cast<T*>(raw_data());
  }
  /// Wraps a negative dim and checks it against dim(); `op` names the caller in the error.
  int64_t wrap_dim(int64_t d, const char* op = "dim") const;

  // ---- element access (CPU; copies and casts)
  /// The single element of a one-element tensor, cast to T.
  template <class T>
  T item() const;
  /// All elements in row-major order, cast to T.
  template <class T>
  std::vector<T> to_vector() const;

  // ---- autograd state (the autograd layer builds graphs on it)
  bool requires_grad() const;
  /// Marks a leaf as needing gradients. Throws on a non-leaf or a non-floating tensor.
  Tensor& set_requires_grad(bool requires_grad = true);
  /// The accumulated gradient (undefined until a backward reaches this leaf).
  Tensor grad() const;
  void set_grad(const Tensor& grad);
  const std::shared_ptr<autograd::Node>& grad_fn() const;
  /// True for tensors not produced by a recorded op (user-created, parameters, detached).
  bool is_leaf() const { return grad_fn() == nullptr; }
  AutogradMeta& autograd_meta();  ///< creates the metadata on first use
  AutogradMeta* autograd_meta_if_exists() const;
  /// A new tensor sharing this one's storage, shape and strides, with no autograd history.
  Tensor detach() const;

  // ---- in-place, not recorded by autograd (optimizers, initialisation, gradient buffers). A
  // Tensor is a handle, so these are const: they change the elements, not the handle.
  const Tensor& fill_(double value) const;
  const Tensor& zero_() const { return fill_(0.0); }
  /// Copies src into this tensor, broadcasting src's shape and casting its dtype.
  const Tensor& copy_(const Tensor& src) const;

  // ---- differentiable shape methods; defined in ops/tensor_methods.cpp
  Tensor view(const Shape& shape) const;     ///< no copy; throws if the strides do not allow it
  Tensor reshape(const Shape& shape) const;  ///< view when possible, else a contiguous copy
  Tensor permute(const std::vector<int64_t>& dims) const;
  Tensor transpose(int64_t dim0, int64_t dim1) const;
  Tensor t() const { return transpose(0, 1); }
  Tensor narrow(int64_t dim, int64_t start, int64_t length) const;
  Tensor slice(int64_t dim, int64_t start, int64_t end, int64_t step = 1) const;
  Tensor select(int64_t dim, int64_t index) const;
  Tensor unsqueeze(int64_t dim) const;
  Tensor squeeze(int64_t dim) const;
  Tensor flatten(int64_t start_dim = 0, int64_t end_dim = -1) const;
  Tensor expand(const Shape& shape) const;
  Tensor contiguous() const;
  Tensor to(DType dtype) const;
  Tensor to(Device device) const;
  Tensor clone() const;

 private:
  std::shared_ptr<TensorImpl> impl_;
};

/// Gradient bookkeeping of one tensor. Lives in core so that Tensor can carry it; only the
/// autograd layer gives it meaning.
struct AutogradMeta {
  bool requires_grad = false;
  Tensor grad;
  /// The node that produced this tensor, or null for a leaf.
  std::shared_ptr<autograd::Node> grad_fn;
  /// Which output of grad_fn this tensor is.
  uint32_t output_nr = 0;
  /// A leaf's AccumulateGrad node, shared by every graph that uses the leaf.
  std::weak_ptr<autograd::Node> grad_accumulator;
  /// Leaf hooks run on the incoming gradient before it is accumulated; each may replace it.
  std::vector<std::function<Tensor(const Tensor&)>> grad_hooks;
  /// Leaf hooks run after the gradient was accumulated into .grad (DDP and ZeRO hang on these).
  std::vector<std::function<void(Tensor&)>> grad_ready_hooks;
  /// Optional name (parameters carry theirs) used in error messages.
  std::string name;
};

class TensorImpl {
 public:
  TensorImpl(Storage storage, Shape shape, Shape strides, int64_t offset, DType dtype);

  const Storage& storage() const { return storage_; }
  const Shape& shape() const { return shape_; }
  const Shape& strides() const { return strides_; }
  int64_t offset() const { return offset_; }
  int64_t numel() const { return numel_; }
  DType dtype() const { return dtype_; }
  Device device() const { return storage_.device(); }
  bool is_contiguous() const { return contiguous_; }

  AutogradMeta* autograd_meta() const { return autograd_.get(); }
  AutogradMeta& ensure_autograd_meta();

 private:
  Storage storage_;
  Shape shape_;
  Shape strides_;
  int64_t offset_ = 0;
  int64_t numel_ = 0;
  DType dtype_ = DType::f32;
  bool contiguous_ = true;
  std::unique_ptr<AutogradMeta> autograd_;
};

/// Row-major strides for a shape.
Shape contiguous_strides(const Shape& shape);
int64_t shape_numel(const Shape& shape);
/// Throws naming `what` and the shape if any size is negative, if the element count does not fit
/// in int64, or if the row-major strides would not (the sizes multiplied with zeros counted as 1:
/// [0, 2^40, 2^40] has no elements, but its first stride is 2^80).
void check_shape(const Shape& shape, const char* what);
/// The bytes a contiguous tensor of `shape` and `dtype` holds, after check_shape; throws naming
/// `what`, the shape and the dtype when they do not fit in int64 (a size_t product would wrap to a
/// small allocation for a huge tensor). What every allocating factory calls.
size_t checked_nbytes(const Shape& shape, DType dtype, const char* what);

// ---- factories
Tensor empty(const Shape& shape, TensorOptions options = {});
Tensor zeros(const Shape& shape, TensorOptions options = {});
Tensor ones(const Shape& shape, TensorOptions options = {});
Tensor full(const Shape& shape, double value, TensorOptions options = {});
Tensor empty_like(const Tensor& t);
Tensor zeros_like(const Tensor& t);
Tensor ones_like(const Tensor& t);
/// 0-dimensional tensor holding value.
Tensor scalar_tensor(double value, TensorOptions options = {});
/// [start, end) in steps of step.
Tensor arange(double start, double end, double step = 1.0, TensorOptions options = DType::i64);
/// Copies `values` (row-major) into a new CPU tensor of `shape` (then moved to options.device).
template <class T>
Tensor from_vector(const std::vector<T>& values, const Shape& shape, TensorOptions options = dtype_of<T>());

/// Prints shape, dtype, device and (for small tensors) the values.
std::ostream& operator<<(std::ostream& os, const Tensor& t);
std::string to_string(const Tensor& t, int64_t max_elements = 64);

// ---- element access implementations
namespace detail {
/// Reads element `flat_index` (row-major over the tensor's shape) as double; CPU only.
double element_as_double(const Tensor& t, int64_t flat_index);
void check_cpu_access(const Tensor& t, const char* what);
}  // namespace detail

template <class T>
T Tensor::item() const {
  COLOSSAL_CHECK(defined(), "item() on an undefined tensor");
  COLOSSAL_CHECK(numel() == 1, "item() needs a tensor with one element, got shape {}", shape());
  Tensor cpu_tensor = device().is_cpu() ? *this : to(kCpu);
  if constexpr (std::is_integral_v<T> && !std::is_same_v<T, bool>) {
    if (cpu_tensor.dtype() == DType::i64) return static_cast<T>(*static_cast<const int64_t*>(cpu_tensor.raw_data()));
  }
  return static_cast<T>(detail::element_as_double(cpu_tensor, 0));
}

}  // namespace colossal::core

namespace colossal {
// The core vocabulary is used everywhere; lift it into the top namespace.
using core::Device;
using core::DType;
using core::Shape;
using core::Tensor;
using core::TensorOptions;
}  // namespace colossal
