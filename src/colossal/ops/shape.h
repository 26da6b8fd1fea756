// Differentiable views and copies: the autograd-recording versions of core/view.h. Tensor's
// methods (t.view(...), t.transpose(...), t.to(dtype)) call these.
#pragma once

#include <vector>

#include "colossal/core/tensor.h"

namespace colossal::ops {

Tensor view(const Tensor& a, const Shape& shape);
Tensor reshape(const Tensor& a, const Shape& shape);
Tensor permute(const Tensor& a, const std::vector<int64_t>& dims);
Tensor transpose(const Tensor& a, int64_t dim0, int64_t dim1);
Tensor slice(const Tensor& a, int64_t dim, int64_t start, int64_t end, int64_t step = 1);
Tensor narrow(const Tensor& a, int64_t dim, int64_t start, int64_t length);
Tensor select(const Tensor& a, int64_t dim, int64_t index);
Tensor unsqueeze(const Tensor& a, int64_t dim);
Tensor squeeze(const Tensor& a, int64_t dim);
Tensor flatten(const Tensor& a, int64_t start_dim = 0, int64_t end_dim = -1);
Tensor expand(const Tensor& a, const Shape& shape);
Tensor contiguous(const Tensor& a);
Tensor to_dtype(const Tensor& a, DType dtype);
Tensor to_device(const Tensor& a, Device device);
Tensor clone(const Tensor& a);

}  // namespace colossal::ops
