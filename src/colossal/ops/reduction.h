// Reductions over dimensions, differentiable: sum, mean, max, var; argmax; and sum_to, which
// reduces a broadcast gradient back to an input's shape.
#pragma once

#include <vector>

#include "colossal/core/tensor.h"

namespace colossal::ops {

/// Sum over `dims` (all dimensions when empty). f16/bf16 accumulate in f32.
Tensor sum(const Tensor& a, const std::vector<int64_t>& dims = {}, bool keepdim = false);
Tensor mean(const Tensor& a, const std::vector<int64_t>& dims = {}, bool keepdim = false);
/// Variance over dims with Bessel's correction `correction` (1 = unbiased, 0 = population).
Tensor var(const Tensor& a, const std::vector<int64_t>& dims = {}, int64_t correction = 1, bool keepdim = false);

struct ValuesIndices {
  Tensor values;
  Tensor indices;  ///< i64
};
/// Maximum along dim with the index of its first occurrence; the gradient goes to that element.
ValuesIndices max(const Tensor& a, int64_t dim, bool keepdim = false);
/// Maximum over all elements; the gradient is shared evenly among tied maxima.
Tensor max(const Tensor& a);
Tensor argmax(const Tensor& a, int64_t dim, bool keepdim = false);

/// Sums `grad` over the dimensions that broadcasting added or expanded, giving `shape`.
Tensor sum_to(const Tensor& grad, const Shape& shape);

}  // namespace colossal::ops
