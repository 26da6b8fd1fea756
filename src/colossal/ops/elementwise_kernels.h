// Kernel signatures and stubs of the elementwise ops (ops/elementwise.cpp). Operands reach a kernel
// already broadcast to the output's shape (core::expand_raw) and converted to the compute dtype;
// strides are arbitrary, so kernels iterate with core::for_each_strided.
#pragma once

#include "colossal/core/dispatch.h"
#include "colossal/core/tensor.h"

namespace colossal::ops {

enum class BinaryOp { add, sub, mul, div, pow, maximum, minimum, eq, ne, lt, le, gt, ge };
enum class UnaryOp { neg, exp, log, tanh, sqrt, rsqrt, abs, relu, sigmoid, silu, gelu, gelu_tanh, pow_scalar, clamp, affine };
enum class TernaryOp { addcmul, addcdiv };

/// out = a op (alpha * b) for add/sub, a op b otherwise. Comparisons write bool outputs.
using BinaryKernel = void(BinaryOp op, const Tensor& out, const Tensor& a, const Tensor& b, double alpha);
/// out = f(x); p0/p1 are the op's scalars (pow_scalar: exponent; clamp: min, max; affine: x * p0 + p1).
using UnaryKernel = void(UnaryOp op, const Tensor& out, const Tensor& x, double p0, double p1);
/// grad_x = grad_y * f'(x), given x and y = f(x) (each kernel uses whichever is cheaper).
using UnaryBackwardKernel = void(UnaryOp op, const Tensor& grad_x, const Tensor& grad_y, const Tensor& x, const Tensor& y,
                                 double p0, double p1);
/// out += value * (b * c) for addcmul, out += value * (b / c) for addcdiv.
using TernaryKernel = void(TernaryOp op, const Tensor& out, const Tensor& b, const Tensor& c, double value);

extern core::DispatchStub<BinaryKernel> binary_stub;
extern core::DispatchStub<UnaryKernel> unary_stub;
extern core::DispatchStub<UnaryBackwardKernel> unary_backward_stub;
extern core::DispatchStub<TernaryKernel> ternary_stub;

}  // namespace colossal::ops
