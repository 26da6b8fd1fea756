// Tensor metadata, autograd state accessors, factories and printing.
#include "colossal/core/tensor.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <ostream>
#include <sstream>

#include "colossal/core/view.h"

namespace colossal::core {

Shape contiguous_strides(const Shape& shape) {
  Shape strides(shape.size(), 1);
  int64_t running = 1;
  for (int64_t d = static_cast<int64_t>(shape.size()) - 1; d >= 0; --d) {
    strides[d] = running;
    running *= std::max<int64_t>(shape[d], 1);
  }
  return strides;
}

int64_t shape_numel(const Shape& shape) {
  int64_t n = 1;
  for (int64_t s : shape) n *= s;
  return n;
}

void check_shape(const Shape& shape, const char* what) {
  int64_t n = 1;
  int64_t span = 1;  // zeros counted as 1: the largest stride times its size, what contiguous_strides reaches
  for (int64_t s : shape) {
    COLOSSAL_CHECK(s >= 0, "{}: negative size in shape {}", what, shape);
    COLOSSAL_CHECK(!__builtin_mul_overflow(n, s, &n), "{}: shape {} has more elements than fit in 64 bits", what,
                   shape);
    COLOSSAL_CHECK(!__builtin_mul_overflow(span, std::max<int64_t>(s, 1), &span),
                   "{}: shape {} has no elements, but its other sizes multiply past 64 bits, so its strides "
                   "cannot be represented",
                   what, shape);
  }
}

size_t checked_nbytes(const Shape& shape, DType dtype, const char* what) {
  check_shape(shape, what);
  int64_t nbytes = 0;
  COLOSSAL_CHECK(!__builtin_mul_overflow(shape_numel(shape), static_cast<int64_t>(element_size(dtype)), &nbytes),
                 "{}: shape {} of {} needs {} elements of {} bytes, more bytes than fit in 64 bits", what, shape, dtype,
                 shape_numel(shape), element_size(dtype));
  return static_cast<size_t>(nbytes);
}

TensorImpl::TensorImpl(Storage storage, Shape shape, Shape strides, int64_t offset, DType dtype)
    : storage_(std::move(storage)),
      shape_(std::move(shape)),
      strides_(std::move(strides)),
      offset_(offset),
      dtype_(dtype) {
  numel_ = shape_numel(shape_);
  int64_t expected = 1;
  contiguous_ = true;
  // A tensor without elements has no layout to violate (row-major strides of [3, 0] are [1, 1]).
  for (int64_t d = static_cast<int64_t>(shape_.size()) - 1; d >= 0 && numel_ != 0; --d) {
    if (shape_[d] == 1) continue;
    if (strides_[d] != expected) {
      contiguous_ = false;
      break;
    }
    expected *= shape_[d];
  }
}

AutogradMeta& TensorImpl::ensure_autograd_meta() {
  if (!autograd_) autograd_ = std::make_unique<AutogradMeta>();
  return *autograd_;
}

namespace {
const TensorImpl& checked(const std::shared_ptr<TensorImpl>& impl) {
  COLOSSAL_CHECK(impl != nullptr, "use of an undefined tensor");
  return *impl;
}
}  // namespace

const Shape& Tensor::shape() const {
  return checked(impl_).shape();
}
const Shape& Tensor::strides() const {
  return checked(impl_).strides();
}
int64_t Tensor::dim() const {
  return static_cast<int64_t>(shape().size());
}
int64_t Tensor::wrap_dim(int64_t d, const char* op) const {
  const int64_t rank = dim();
  // A 0-d tensor accepts dim 0 and -1, as in PyTorch.
  const int64_t bound = std::max<int64_t>(rank, 1);
  COLOSSAL_CHECK(d >= -bound && d < bound, "{}: dimension {} out of range for a tensor of shape {} (valid: {} to {})",
                 op, d, shape(), -bound, bound - 1);
  return d < 0 ? d + bound : d;
}
int64_t Tensor::size(int64_t d) const {
  COLOSSAL_CHECK(dim() > 0, "size: a 0-d tensor has no dimension {}", d);
  return shape()[wrap_dim(d, "size")];
}
int64_t Tensor::stride(int64_t d) const {
  COLOSSAL_CHECK(dim() > 0, "stride: a 0-d tensor has no dimension {}", d);
  return strides()[wrap_dim(d, "stride")];
}
int64_t Tensor::offset() const {
  return checked(impl_).offset();
}
int64_t Tensor::numel() const {
  return checked(impl_).numel();
}
DType Tensor::dtype() const {
  return checked(impl_).dtype();
}
Device Tensor::device() const {
  return checked(impl_).device();
}
bool Tensor::is_contiguous() const {
  return checked(impl_).is_contiguous();
}
const Storage& Tensor::storage() const {
  return checked(impl_).storage();
}
void* Tensor::raw_data() const {
  const auto& impl = checked(impl_);
  return static_cast<char*>(impl.storage().data()) +
         impl.offset() * static_cast<int64_t>(core::element_size(impl.dtype()));
}

bool Tensor::requires_grad() const {
  const AutogradMeta* meta = autograd_meta_if_exists();
  return meta != nullptr && (meta->requires_grad || meta->grad_fn != nullptr);
}

Tensor& Tensor::set_requires_grad(bool requires_grad) {
  COLOSSAL_CHECK(is_leaf(),
                 "set_requires_grad: only leaf tensors can be marked; this tensor of shape {} was produced by {}",
                 shape(), "an op (use detach() to make a leaf)");
  COLOSSAL_CHECK(!requires_grad || is_floating(dtype()),
                 "set_requires_grad: only floating tensors can require gradients, got {}", dtype());
  if (requires_grad || autograd_meta_if_exists()) autograd_meta().requires_grad = requires_grad;
  return *this;
}

Tensor Tensor::grad() const {
  const AutogradMeta* meta = autograd_meta_if_exists();
  return meta ? meta->grad : Tensor();
}

void Tensor::set_grad(const Tensor& grad) {
  if (grad.defined()) {
    COLOSSAL_CHECK(grad.shape() == shape(), "set_grad: gradient shape {} does not match the tensor's shape {}",
                   grad.shape(), shape());
  }
  autograd_meta().grad = grad;
}

const std::shared_ptr<autograd::Node>& Tensor::grad_fn() const {
  static const std::shared_ptr<autograd::Node> kNone;
  const AutogradMeta* meta = autograd_meta_if_exists();
  return meta ? meta->grad_fn : kNone;
}

AutogradMeta& Tensor::autograd_meta() {
  COLOSSAL_CHECK(impl_ != nullptr, "autograd on an undefined tensor");
  return impl_->ensure_autograd_meta();
}
AutogradMeta* Tensor::autograd_meta_if_exists() const {
  return impl_ ? impl_->autograd_meta() : nullptr;
}

Tensor Tensor::detach() const {
  const auto& impl = checked(impl_);
  return Tensor(
      std::make_shared<TensorImpl>(impl.storage(), impl.shape(), impl.strides(), impl.offset(), impl.dtype()));
}

const Tensor& Tensor::fill_(double value) const {
  checked(impl_);
  if (numel() > 0) fill_stub(device(), *this, value);
  return *this;
}

const Tensor& Tensor::copy_(const Tensor& src) const {
  checked(impl_);
  COLOSSAL_CHECK(src.defined(), "copy_: source tensor is undefined");
  Tensor expanded = expand_raw(src, shape());
  if (numel() == 0) return *this;
  if (src.device() == device()) {
    copy_stub(device(), *this, expanded);
    return *this;
  }
  // Across devices: bring src over contiguous in its own dtype, then copy/cast on this device.
  Tensor staged = contiguous_raw(expanded);
  Tensor landing = empty(shape(), TensorOptions(staged.dtype(), device()));
  const Device kernel_device = device().is_cuda() ? device() : src.device();
  cross_device_copy_stub(kernel_device, landing, staged);
  copy_stub(device(), *this, landing);
  return *this;
}

Tensor empty(const Shape& shape, TensorOptions options) {
  Storage storage(checked_nbytes(shape, options.dtype, "empty"), options.device);
  Tensor t(std::make_shared<TensorImpl>(std::move(storage), shape, contiguous_strides(shape), 0, options.dtype));
  if (options.requires_grad) t.set_requires_grad(true);
  return t;
}

Tensor full(const Shape& shape, double value, TensorOptions options) {
  const bool requires_grad = options.requires_grad;
  Tensor t = empty(shape, options.with_requires_grad(false));
  t.fill_(value);
  if (requires_grad) t.set_requires_grad(true);
  return t;
}
Tensor zeros(const Shape& shape, TensorOptions options) {
  return full(shape, 0.0, options);
}
Tensor ones(const Shape& shape, TensorOptions options) {
  return full(shape, 1.0, options);
}
Tensor empty_like(const Tensor& t) {
  return empty(t.shape(), TensorOptions(t.dtype(), t.device()));
}
Tensor zeros_like(const Tensor& t) {
  return zeros(t.shape(), TensorOptions(t.dtype(), t.device()));
}
Tensor ones_like(const Tensor& t) {
  return ones(t.shape(), TensorOptions(t.dtype(), t.device()));
}
Tensor scalar_tensor(double value, TensorOptions options) {
  return full({}, value, options);
}

Tensor arange(double start, double end, double step, TensorOptions options) {
  COLOSSAL_CHECK(step != 0.0, "arange: step must be non-zero");
  const auto n = static_cast<int64_t>(std::max(0.0, std::ceil((end - start) / step)));
  Tensor cpu = empty({n}, DType::f64);
  auto* p = cpu.data<double>();
  for (int64_t i = 0; i < n; ++i) p[i] = start + static_cast<double>(i) * step;
  Tensor out = empty({n}, options.with_requires_grad(false));
  out.copy_(cpu);
  if (options.requires_grad) out.set_requires_grad(true);
  return out;
}

template <class T>
Tensor from_vector(const std::vector<T>& values, const Shape& shape, TensorOptions options) {
  check_shape(shape, "from_vector");
  COLOSSAL_CHECK(static_cast<int64_t>(values.size()) == shape_numel(shape),
                 "from_vector: {} values do not fill shape {} ({} elements)", values.size(), shape, shape_numel(shape));
  Tensor cpu = empty(shape, dtype_of<T>());
  if (!values.empty()) {
    if constexpr (std::is_same_v<T, bool>) {
      auto* p = cpu.data<bool>();
      for (size_t i = 0; i < values.size(); ++i) p[i] = values[i];
    } else {
      std::memcpy(cpu.raw_data(), values.data(), values.size() * sizeof(T));
    }
  }
  Tensor out =
      (options.dtype == cpu.dtype() && options.device.is_cpu()) ? cpu : empty(shape, options.with_requires_grad(false));
  if (!out.is_same(cpu)) out.copy_(cpu);
  if (options.requires_grad) out.set_requires_grad(true);
  return out;
}

template <class T>
std::vector<T> Tensor::to_vector() const {
  COLOSSAL_CHECK(defined(), "to_vector() on an undefined tensor");
  Tensor staged = empty(shape(), dtype_of<T>());
  staged.copy_(*this);
  std::vector<T> out(static_cast<size_t>(numel()));
  const T* p = staged.data<T>();
  for (size_t i = 0; i < out.size(); ++i) out[i] = p[i];
  return out;
}

#define COLOSSAL_INSTANTIATE(T)                                                       \
  template Tensor from_vector<T>(const std::vector<T>&, const Shape&, TensorOptions); \
  template std::vector<T> Tensor::to_vector<T>() const;
COLOSSAL_INSTANTIATE(float)
COLOSSAL_INSTANTIATE(double)
COLOSSAL_INSTANTIATE(Half)
COLOSSAL_INSTANTIATE(BFloat16)
COLOSSAL_INSTANTIATE(int32_t)
COLOSSAL_INSTANTIATE(int64_t)
COLOSSAL_INSTANTIATE(uint8_t)
COLOSSAL_INSTANTIATE(bool)
#undef COLOSSAL_INSTANTIATE

namespace detail {
void check_cpu_access(const Tensor& t, const char* what) {
  COLOSSAL_CHECK(t.device().is_cpu(), "{}: tensor is on {}; move it to the CPU first", what, t.device());
}

double element_as_double(const Tensor& t, int64_t flat_index) {
  check_cpu_access(t, "element access");
  int64_t offset = 0;
  int64_t rest = flat_index;
  for (int64_t d = t.dim() - 1; d >= 0; --d) {
    offset += (rest % t.shape()[d]) * t.strides()[d];
    rest /= t.shape()[d];
  }
  return dispatch_all(t.dtype(), [&]<class T>() { return static_cast<double>(static_cast<T*>(t.raw_data())[offset]); });
}
}  // namespace detail

std::string to_string(const Tensor& t, int64_t max_elements) {
  if (!t.defined()) return "Tensor(undefined)";
  std::ostringstream os;
  os << "Tensor(shape=" << fmt::format("{}", t.shape()) << ", dtype=" << dtype_name(t.dtype())
     << ", device=" << t.device().str();
  if (t.requires_grad()) os << ", requires_grad";
  if (t.numel() <= max_elements) {
    Tensor cpu = t.device().is_cpu() ? t : to_device_raw(t, kCpu);
    os << ", values=[";
    for (int64_t i = 0; i < cpu.numel(); ++i) os << (i ? ", " : "") << detail::element_as_double(cpu, i);
    os << "]";
  }
  os << ")";
  return os.str();
}

std::ostream& operator<<(std::ostream& os, const Tensor& t) {
  return os << to_string(t);
}

}  // namespace colossal::core
