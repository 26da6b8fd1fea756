// Kernel signatures of the reductions (ops/reduction.cpp). Inputs reach a kernel contiguous and
// viewed as [outer, reduce, inner]; the reduction runs over the middle dimension.
#pragma once

#include "colossal/core/dispatch.h"
#include "colossal/core/tensor.h"

namespace colossal::ops {

/// out[o, i] = sum_r in[o, r, i]; `out` contiguous [outer, inner] of in's dtype (or i64 for
/// integer inputs), accumulating in acc_t (f64 for f32 inputs: reductions are where rounding adds up).
using SumKernel = void(const Tensor& out, const Tensor& in, int64_t outer, int64_t reduce, int64_t inner);
/// values[o, i] = max_r in[o, r, i] and indices (i64) its first position; NaN wins.
using MaxKernel = void(const Tensor& values, const Tensor& indices, const Tensor& in, int64_t outer, int64_t reduce,
                       int64_t inner);
/// grad_in [outer, reduce, inner] (zeroed by the caller) gets grad[o, i] at indices[o, i].
using MaxBackwardKernel = void(const Tensor& grad_in, const Tensor& grad, const Tensor& indices, int64_t outer,
                               int64_t reduce, int64_t inner);

extern core::DispatchStub<SumKernel> sum_stub;
extern core::DispatchStub<MaxKernel> max_stub;
extern core::DispatchStub<MaxBackwardKernel> max_backward_stub;

}  // namespace colossal::ops
