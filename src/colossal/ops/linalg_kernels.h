// Kernel signatures and dispatch stubs of the matrix products behind matmul, bmm, linear,
// linear_gelu and gelu_mlp (and their backward). The CPU kernel is OpenBLAS
// (ops/cpu/linalg_kernels.cpp); the CUDA backend registers cuBLASLt (ops/cuda/linalg_kernels.cpp),
// which also fuses epilogues.
#pragma once

#include <atomic>
#include <cstdint>

#include "colossal/core/dispatch.h"
#include "colossal/core/tensor.h"

namespace colossal::ops {

/// out[i] = a[i] b[i] + beta * out[i] for every batch index i, where a is [..., M, K], b is
/// [..., K, N] and out is a contiguous [..., M, N], all with the same batch shape and dtype.
/// a and b may have any strides (0 on broadcast batch dimensions, swapped strides for a
/// transposed view); beta is 0 (out is overwritten, its old contents ignored) or 1 (accumulate).
using BatchedGemmKernel = void(const Tensor& out, const Tensor& a, const Tensor& b, double beta);

extern core::DispatchStub<BatchedGemmKernel> batched_gemm_stub;

/// What a fused GEMM does to the product before storing it (cuBLASLt epilogues). Either the
/// forward part (bias, addend, gelu_tanh, pre_activation) or the backward part
/// (gelu_grad_pre_activation, bias_grad), not both.
struct GemmEpilogue {
  /// [N], contiguous: added to every row of the product when defined.
  Tensor bias;
  /// [M, N], contiguous, not the output: added to the product when defined (cuBLASLt's C with beta
  /// = 1, read while the output is written). Not with gelu_tanh.
  Tensor addend;
  /// GELU with the tanh approximation after the bias (GPT-2's "gelu_new").
  bool gelu_tanh = false;
  /// With gelu_tanh: when not null, receives the pre-activation a @ b + bias, [M, N], freshly
  /// allocated by the kernel (its row stride may be padded past N).
  Tensor* pre_activation = nullptr;
  /// Backward of linear_gelu through the next layer, when defined: the pre-activation [M, N] that
  /// the forward's epilogue kept (pre_activation above), whose row stride must be a multiple of 8
  /// with unit column stride. The product is multiplied elementwise by the tanh-GELU derivative at
  /// it: out = (a @ b) * gelu_tanh'(gelu_grad_pre_activation). With a = grad of the next layer's
  /// output and b = its weight this is the gradient of the pre-activation.
  Tensor gelu_grad_pre_activation;
  /// Contiguous, receives a bias gradient when defined. Without gelu_grad_pre_activation: [M], the
  /// row sums of a, sum_k a[m, k]; with a = grad^T and b = input this is the weight gradient of
  /// linear together with its bias gradient. With gelu_grad_pre_activation: [N], the column sums
  /// of out, sum_m out[m, n], the gradient of linear_gelu's bias.
  Tensor bias_grad;
  /// Contiguous [N], receives the column sums of b, sum_k b[k, n], when defined (not with bias_grad
  /// or gelu_grad_pre_activation): with a = input^T and b = grad this is the weight gradient in the
  /// [in, out] layout (nn::Conv1D's) together with linear's bias gradient.
  Tensor bias_grad_of_b;
  /// Backward only: out += the product (beta = 1) instead of out = the product; the bias gradients
  /// are still written, not added.
  bool accumulate = false;
};

/// out = epilogue(a @ b) for a 2-D a [M, K] (any strides), b [K, N] (any strides) and contiguous
/// out [M, N], all of one dtype and device. Returns false, having written nothing, when the backend
/// has no fused kernel for this case (dtype, layout, epilogue); callers then compose the parts.
/// Backends without fused kernels (the CPU) register nothing.
using FusedGemmKernel = bool(const Tensor& out, const Tensor& a, const Tensor& b, const GemmEpilogue& epilogue);

extern core::DispatchStub<FusedGemmKernel> fused_gemm_stub;

/// GEMM problems the CUDA backend has autotuned in this process (see Note [GEMM autotuning] in
/// ops/cuda/linalg_kernels.cpp): a test hook showing that a shape is timed once, then cached. Stays
/// 0 without CUDA; defined here so that builds without CUDA still link the tests that read it.
inline std::atomic<int64_t> gemm_autotune_counter{0};
inline int64_t gemm_autotune_count() {
  return gemm_autotune_counter.load(std::memory_order_relaxed);
}

/// GEMM problems whose algorithm came from the tuning file (Note [GEMM tuning file] in
/// ops/gemm_tuning_file.cpp) instead of a tuning in this process: a test hook, as above.
inline std::atomic<int64_t> gemm_tuning_file_counter{0};
inline int64_t gemm_tuning_file_count() {
  return gemm_tuning_file_counter.load(std::memory_order_relaxed);
}

/// Makes the CUDA backend forget the algorithms it chose for GEMM problems in this process, so
/// that each is asked of the tuning file, or tuned, again at its next call (a test hook; the choices
/// in the tuning file stay).
inline std::atomic<int64_t> gemm_algo_generation{0};
inline void forget_gemm_algos() {
  gemm_algo_generation.fetch_add(1, std::memory_order_relaxed);
}

/// Backward passes of gelu_mlp (ops/linalg.h) in this process whose GELU gradient ran inside the
/// GEMM, through gelu_grad_pre_activation: a test hook showing that the fused path is taken where
/// expected. Stays 0 without a backend that fuses it.
inline std::atomic<int64_t> fused_gelu_backward_counter{0};
inline int64_t fused_gelu_backward_count() {
  return fused_gelu_backward_counter.load(std::memory_order_relaxed);
}

}  // namespace colossal::ops
