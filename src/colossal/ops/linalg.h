// Matrix products: OpenBLAS on the CPU (f16/bf16 computed in f32), cuBLASLt on the GPU (f16/bf16
// accumulated in f32, f32 in TF32 unless asked otherwise, f64 in f64).
#pragma once

#include <functional>

#include "colossal/core/tensor.h"

namespace colossal::ops {

/// torch.matmul semantics: 1-D x 1-D dot, 2-D x 2-D, and batched with broadcast batch dimensions
/// (a 1-D operand is promoted to a matrix and the added dimension removed afterwards).
Tensor matmul(const Tensor& a, const Tensor& b);
/// Batched [B, M, K] x [B, K, N] -> [B, M, N], no broadcasting.
Tensor bmm(const Tensor& a, const Tensor& b);
/// Called by linear's (and linear_gelu's) backward with the input's gradient as soon as it is
/// computed, before the weight's and the bias's: it may start asynchronous work on it in place (tensor
/// parallelism's all-reduce, Megatron's overlap of that all-reduce with the weight-gradient GEMM) and
/// returns what to run once those are computed (waiting for that work), or nothing.
using InputGradHook = std::function<std::function<void()>(const Tensor& grad_x)>;
/// x [..., in] times weight [out, in] transposed, plus bias [out] when defined.
Tensor linear(const Tensor& x, const Tensor& weight, const Tensor& bias = Tensor(), InputGradHook hook = {});
/// linear(x, weight) without a bias, its GEMM run as `blocks` GEMMs over consecutive blocks of the
/// rows of x flattened to [rows, in] (as equal as the rows allow); `on_block` gets each block of the
/// output, a contiguous [block rows, out] view of the flattened result, as soon as its GEMM is
/// enqueued (on the current stream) and may start asynchronous work on it in place: tensor
/// parallelism's row layer all-reduces each block while the next one's GEMM runs (Note [Row blocks
/// of a linear's output] in ops/linalg.cpp). Recorded as one linear: the same backward.
Tensor linear_in_row_blocks(const Tensor& x, const Tensor& weight, int64_t blocks,
                            const std::function<void(const Tensor& block)>& on_block);
/// Rank `part` of `parts` of a row-parallel linear layer whose outputs the group sums, with the bias
/// [out] (optional) and the residual [..., out] (the output's shape) that follow the sum folded in:
/// x W^T, plus bias + residual in the part-th of `parts` equal blocks of the rows only, so that the
/// group's sum is residual + bias + sum_r x_r W_r^T (Note [A row-parallel layer's residual in its
/// GEMM]). Backward: x's and weight's gradients as linear's; bias and residual, replicated over the
/// group, get the whole output gradient (its column sums, and itself) on every rank.
/// With `blocks` > 1 the GEMMs run over that many blocks of rows, and `on_block` gets each finished
/// block as linear_in_row_blocks does (tensor parallelism's row blocks, each all-reduced while the
/// next one's GEMM runs); the result is the same.
Tensor linear_add_part(const Tensor& x, const Tensor& weight, const Tensor& bias, const Tensor& residual, int64_t part,
                       int64_t parts, int64_t blocks = 1,
                       const std::function<void(const Tensor& block)>& on_block = {});
/// gelu(linear(x, weight, bias)) with the tanh approximation (GPT-2's MLP). On the GPU one cuBLASLt
/// GEMM whose epilogue adds the bias, applies GELU and keeps the pre-activation for backward.
Tensor linear_gelu(const Tensor& x, const Tensor& weight, const Tensor& bias = Tensor(), InputGradHook hook = {});
/// linear(linear_gelu(x, fc_weight, fc_bias), proj_weight, proj_bias): a transformer's MLP with
/// weights [hidden, in] and [out, hidden] (transposed views of [in, out] tensors, as GPT-2's Conv1D
/// holds them, are read in place) and optional biases. One autograd node, saving what the two ops
/// would (x, the pre-activation, the activation, the weights). On the GPU its backward applies the
/// GELU derivative in the epilogue of the cuBLASLt GEMM that computes the hidden gradient; elsewhere
/// (the CPU, f64) it runs the two ops' backward kernels, giving the same values.
Tensor gelu_mlp(const Tensor& x, const Tensor& fc_weight, const Tensor& fc_bias, const Tensor& proj_weight,
                const Tensor& proj_bias);

/// How f32 matrix products on the GPU may trade precision for speed, as
/// torch.set_float32_matmul_precision. The CPU always computes f32 products in f32.
enum class Float32MatmulPrecision {
  highest,  ///< f32 products and sums
  high,     ///< inputs rounded to TF32 (10-bit mantissa, relative 2^-11), f32 sums: about 7x the f32 rate on H100
};
/// Process-wide; the default is high.
void set_float32_matmul_precision(Float32MatmulPrecision precision);
Float32MatmulPrecision float32_matmul_precision();

}  // namespace colossal::ops
