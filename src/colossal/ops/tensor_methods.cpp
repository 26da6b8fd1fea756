// Tensor's differentiable methods (declared in core/tensor.h) forward to the ops layer.
#include "colossal/core/tensor.h"
#include "colossal/ops/shape.h"

namespace colossal::core {

Tensor Tensor::view(const Shape& shape) const { return ops::view(*this, shape); }
Tensor Tensor::reshape(const Shape& shape) const { return ops::reshape(*this, shape); }
Tensor Tensor::permute(const std::vector<int64_t>& dims) const { return ops::permute(*this, dims); }
Tensor Tensor::transpose(int64_t dim0, int64_t dim1) const { return ops::transpose(*this, dim0, dim1); }
Tensor Tensor::narrow(int64_t dim, int64_t start, int64_t length) const { return ops::narrow(*this, dim, start, length); }
Tensor Tensor::slice(int64_t dim, int64_t start, int64_t end, int64_t step) const {
  return ops::slice(*this, dim, start, end, step);
}
Tensor Tensor::select(int64_t dim, int64_t index) const { return ops::select(*this, dim, index); }
Tensor Tensor::unsqueeze(int64_t dim) const { return ops::unsqueeze(*this, dim); }
Tensor Tensor::squeeze(int64_t dim) const { return ops::squeeze(*this, dim); }
Tensor Tensor::flatten(int64_t start_dim, int64_t end_dim) const { return ops::flatten(*this, start_dim, end_dim); }
Tensor Tensor::expand(const Shape& shape) const { return ops::expand(*this, shape); }
Tensor Tensor::contiguous() const { return ops::contiguous(*this); }
Tensor Tensor::to(DType dtype) const { return ops::to_dtype(*this, dtype); }
Tensor Tensor::to(Device device) const { return ops::to_device(*this, device); }
Tensor Tensor::clone() const { return ops::clone(*this); }

}  // namespace colossal::core
