// bf16/f16 attention through cuDNN's fused flash-attention engine (the sm90 wgmma kernels that
// PyTorch's scaled_dot_product_attention runs on an H100), for attention_kernels.cu. cuDNN has no
// single attention call before 9.21: the engine is chosen for an operation graph of matmuls,
// pointwise ops and reductions that spells attention out, built here through the backend API
// (Note [cuDNN attention graphs] in attention_cudnn.cpp). Plans are built once per problem (shape,
// strides, dtype, mask, dropout) and cached per device; a problem the engine declines is remembered
// and left to our own kernels (or, with dropout, to the unfused composition of ops/attention.cpp).
#pragma once

#include <atomic>
#include <cstdint>

#include "colossal/core/tensor.h"
#include "colossal/ops/nn_kernels.h"

namespace colossal::ops::cuda {

/// Whether cuDNN may take the CUDA attention problems it supports (the default), or every problem
/// runs on our own kernels. The environment variable COLOSSAL_CUDNN_ATTENTION=0 sets the default off.
void set_cudnn_attention_enabled(bool enabled);
bool cudnn_attention_enabled();

/// Attention calls (forward or backward) that ran on cuDNN, for tests and benchmarks.
inline std::atomic<int64_t> cudnn_attention_counter{0};

/// Runs the forward on cuDNN and returns true, or returns false without touching anything when cuDNN
/// does not take the problem: not enabled, not bf16/f16, not [B, H, T, D] with unit last strides and
/// 16-byte aligned rows, Tq != Tk, head_dim != value_dim, a head dimension that is not a multiple of
/// 8 up to 128, a broadcast (stride 0) input, or an engine that declines the graph. `out` and `lse`
/// as the attention_forward_stub contract gives them.
bool cudnn_attention_forward(const Tensor& out, const Tensor& lse, const Tensor& q, const Tensor& k, const Tensor& v,
                             const AttentionParams& params);

/// With params.dropout_p in (0, 1) the forward drops probabilities inside the kernel, drawing the mask
/// from (params.dropout_seed, params.dropout_offset); see Note [cuDNN attention dropout].
///
/// For tests: the forward with dropout that also writes the mask it drew into `mask` (f32 [B, H, T,
/// T], contiguous on q's device; 1 kept, 0 dropped), through a plan that stores the RNG node's
/// output. Returns false as cudnn_attention_forward does, and also without dropout or for a mask of
/// another shape, dtype or layout.
bool cudnn_attention_forward_with_mask(const Tensor& out, const Tensor& lse, const Tensor& mask, const Tensor& q,
                                       const Tensor& k, const Tensor& v, const AttentionParams& params);

/// The backward under the same conditions (and those of grad_out and the gradients); with dropout
/// it needs the forward's params and draws the forward's mask again.
bool cudnn_attention_backward(const Tensor& grad_q, const Tensor& grad_k, const Tensor& grad_v, const Tensor& grad_out,
                              const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& out, const Tensor& lse,
                              const AttentionParams& params);

}  // namespace colossal::ops::cuda
