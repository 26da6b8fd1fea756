// Matrix products through BLAS (OpenBLAS on the CPU; f16/bf16 computed in f32).
#pragma once

#include "colossal/core/tensor.h"

namespace colossal::ops {

/// torch.matmul semantics: 1-D x 1-D dot, 2-D x 2-D, and batched with broadcast batch dimensions
/// (a 1-D operand is promoted to a matrix and the added dimension removed afterwards).
Tensor matmul(const Tensor& a, const Tensor& b);
/// Batched [B, M, K] x [B, K, N] -> [B, M, N], no broadcasting.
Tensor bmm(const Tensor& a, const Tensor& b);
/// x [..., in] times weight [out, in] transposed, plus bias [out] when defined.
Tensor linear(const Tensor& x, const Tensor& weight, const Tensor& bias = Tensor());

}  // namespace colossal::ops
