// Kernel signature and dispatch stub of the batched matrix product behind matmul, bmm and linear
// (and their backward). The CPU kernel is OpenBLAS (ops/cpu/linalg_kernels.cpp); a CUDA backend
// registers cuBLASLt.
#pragma once

#include "colossal/core/dispatch.h"
#include "colossal/core/tensor.h"

namespace colossal::ops {

/// out[i] = a[i] b[i] + beta * out[i] for every batch index i, where a is [..., M, K], b is
/// [..., K, N] and out is a contiguous [..., M, N], all with the same batch shape and dtype.
/// a and b may have any strides (0 on broadcast batch dimensions, swapped strides for a
/// transposed view); beta is 0 (out is overwritten, its old contents ignored) or 1 (accumulate).
using BatchedGemmKernel = void(const Tensor& out, const Tensor& a, const Tensor& b, double beta);

extern core::DispatchStub<BatchedGemmKernel> batched_gemm_stub;

}  // namespace colossal::ops
