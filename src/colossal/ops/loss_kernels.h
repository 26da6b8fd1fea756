// Kernel signatures and dispatch stubs of embedding, cross_entropy and dropout, forward and
// backward, plus the dropout keep rule every backend shares. The CPU kernels live in
// ops/cpu/{embedding,cross_entropy,dropout}_kernels.cpp; a CUDA backend registers its own.
#pragma once

#include <cmath>
#include <cstdint>

#include "colossal/core/dispatch.h"
#include "colossal/core/philox.h"  // philox_block, COLOSSAL_HOST_DEVICE
#include "colossal/core/tensor.h"
#include "colossal/ops/nn_functional.h"  // Reduction

namespace colossal::ops {

// ---- embedding
// indices: contiguous i32/i64 of any shape (n elements); weight [num_embeddings, dim] with any
// strides. Kernels validate the indices themselves: on the CPU that is one cheap serial pass, and a
// device kernel can check where the data already lives instead of copying it to the host.

/// out [n, dim] (contiguous, weight's dtype) <- weight[indices[k]] for every k; throws naming the
/// offending index value, its position in `indices` and num_embeddings.
using EmbeddingForwardKernel = void(const Tensor& out, const Tensor& indices, const Tensor& weight);
/// grad_weight [num_embeddings, dim] (contiguous, written in full) <- the sum over k with
/// indices[k] == row of grad_out[k] (grad_out contiguous [n, dim]); rows equal to padding_idx (when
/// >= 0) stay zero. With `accumulate`, grad_weight holds a gradient already and each row some index
/// names becomes old + sum (the sum taken from zero in the accumulation type, then added to the old
/// value there and rounded once); the padding row and rows no index names are left as they are, so
/// nothing is written over the whole table (Note [Gradient accumulation in the op] in
/// autograd/engine.cpp). Must be deterministic: the sum order of a row may not depend on threads.
using EmbeddingBackwardKernel = void(const Tensor& grad_weight, const Tensor& grad_out, const Tensor& indices,
                                     int64_t padding_idx, bool accumulate);

/// weight[indices[k]] <- rows[k] (rows contiguous [n, dim], weight's dtype) for every k, the
/// forward's adjoint without the sum: an index named twice must come with equal rows (one of them
/// lands). Rows no index names are left as they are. Throws as the forward does.
using EmbeddingPutKernel = void(const Tensor& weight, const Tensor& indices, const Tensor& rows);

extern core::DispatchStub<EmbeddingForwardKernel> embedding_forward_stub;
extern core::DispatchStub<EmbeddingBackwardKernel> embedding_backward_stub;
extern core::DispatchStub<EmbeddingPutKernel> embedding_put_stub;

// ---- cross_entropy
// logits: contiguous [N, C]. target: contiguous [N] i32/i64 class indices (hard) or [N, C] of
// logits' dtype (soft, class probabilities). Row i's loss is sum_c q_ic (lse_i - x_ic) with q the
// (smoothed) target distribution: q = (1 - s) onehot(y) + s / C for hard targets, (1 - s) t + s / C
// for soft ones; hard rows whose target is ignore_index have loss 0 and weight 0.

struct CrossEntropyParams {
  int64_t ignore_index = -100;
  double label_smoothing = 0.0;
  Reduction reduction = Reduction::mean;
  bool soft_target = false;  ///< target holds probabilities [N, C] rather than class indices [N]
};

/// out: [N] for Reduction::none, else a 0-d tensor (sum, or sum / total_weight for mean), in the
/// accumulation dtype (f32 for f16/bf16 logits). lse: [N] row logsumexps in the accumulation dtype
/// (f64 for f64 logits, f32 otherwise), all the backward needs besides the inputs. total_weight: 0-d
/// f64 (a count can pass 2^24 rows), the number of rows not ignored (N for soft targets). A hard
/// target outside [0, C) that is not ignore_index raises an error naming it, its row and C: at once on
/// the CPU, at the next deferred check on CUDA (Note [Deferred device checks] in core/cuda_device.h).
using CrossEntropyForwardKernel = void(const Tensor& out, const Tensor& lse, const Tensor& total_weight,
                                       const Tensor& logits, const Tensor& target, const CrossEntropyParams& params);
/// grad_logits [N, C] <- (softmax(x_i) * sum_c q_ic - q_i) * g_i, with g_i the upstream gradient of
/// row i's loss (grad_out[i] for none, grad_out for sum, grad_out / total_weight for mean; 0 for
/// ignored rows); grad_out has out's accumulation dtype. grad_target [N, C] (soft targets only) <-
/// g_i (1 - s) (lse_i - x_ic). Either may be undefined (not wanted); both are contiguous of logits'
/// dtype.
using CrossEntropyBackwardKernel = void(const Tensor& grad_logits, const Tensor& grad_target, const Tensor& grad_out,
                                        const Tensor& logits, const Tensor& target, const Tensor& lse,
                                        const Tensor& total_weight, const CrossEntropyParams& params);

extern core::DispatchStub<CrossEntropyForwardKernel> cross_entropy_forward_stub;
extern core::DispatchStub<CrossEntropyBackwardKernel> cross_entropy_backward_stub;

// ---- vocab-parallel cross_entropy (parallel/tp/cross_entropy.h): one rank's slice of the classes
// logits: contiguous [N, L], this rank's L columns of a vocabulary split over the tensor-parallel
// group; column c is class class_start + c for c < real_columns, padding after it (the last ranks'
// slices of a vocabulary padded to a multiple of the group). target: contiguous [N] i32/i64 class
// indices of the whole vocabulary (or ignore_index). The ranks combine their rows' statistics with two
// small all-reduces; the kernels read the logits once in the forward and once in the backward.

struct VocabShardParams {
  int64_t class_start = 0;   ///< the class of column 0
  int64_t real_columns = 0;  ///< columns [0, real_columns) are classes, the rest padding
  int64_t classes = 0;       ///< the whole vocabulary: label smoothing's uniform share is s / classes
  int64_t ignore_index = -100;
  double label_smoothing = 0.0;
};

/// stats: contiguous [3, N] in the accumulation dtype (f32 for 16-bit logits, f64 for f64): row 0 the
/// logsumexp of each row's real columns, row 1 the target's logit where this slice holds the target
/// (else 0), row 2 the sum of the real columns when label_smoothing > 0 (else 0). Targets are not
/// range-checked here (the caller checks them against the whole vocabulary).
using VocabShardForwardKernel = void(const Tensor& stats, const Tensor& logits, const Tensor& target,
                                     const VocabShardParams& params);
/// grad_logits [N, L] (logits' dtype) <- (exp(x - lse_i) - q_ic) * scale_i on real columns and 0 on
/// padding, with q_ic = s / classes + (1 - s) [class_start + c == target_i] and lse [N] the whole
/// vocabulary's logsumexp; scale [N] (accumulation dtype) carries the upstream gradient, the mean's
/// divisor and 0 for ignored rows.
using VocabShardBackwardKernel = void(const Tensor& grad_logits, const Tensor& logits, const Tensor& target,
                                      const Tensor& lse, const Tensor& scale, const VocabShardParams& params);

extern core::DispatchStub<VocabShardForwardKernel> vocab_shard_cross_entropy_forward_stub;
extern core::DispatchStub<VocabShardBackwardKernel> vocab_shard_cross_entropy_backward_stub;

// ---- dropout
// See Note [Dropout mask]: element i keeps iff uniform_float(word i % 4 of philox_block(seed,
// offset, i / 4)) >= p. uniform_float(bits) is exactly (bits >> 8) * 2^-24, so the test is the
// integer comparison (bits >> 8) >= ceil(p * 2^24): the host computes that threshold once, and every
// device then decides identically without comparing floats of different widths.

struct DropoutParams {
  uint64_t seed = 0;
  uint64_t offset = 0;
  uint32_t keep_threshold = 0;  ///< ceil(p * 2^24); 2^24 (p == 1) keeps nothing
  double scale = 1.0;           ///< 1 / (1 - p), or 0 when p == 1
};

inline DropoutParams make_dropout_params(double p, uint64_t seed, uint64_t offset) {
  DropoutParams params;
  params.seed = seed;
  params.offset = offset;
  params.keep_threshold = static_cast<uint32_t>(std::ceil(p * 16777216.0));  // p * 2^24 is exact in double
  params.scale = p < 1.0 ? 1.0 / (1.0 - p) : 0.0;
  return params;
}

/// Whether element `index` (row-major) survives, given word index % 4 of its Philox block.
COLOSSAL_HOST_DEVICE inline bool dropout_keeps(uint32_t philox_word, uint32_t keep_threshold) {
  return (philox_word >> 8) >= keep_threshold;
}

/// out <- residual[i] + (keep(i) ? x[i] * scale : 0) for contiguous out, x and (when defined)
/// residual of one floating dtype and shape; an undefined residual adds nothing (plain dropout).
/// The sum is taken in the accumulation type and rounded once. Dropout is linear in x with the
/// mask fixed, so the backward is this same kernel, without a residual, applied to the output
/// gradient with the same params.
using DropoutKernel = void(const Tensor& out, const Tensor& x, const Tensor& residual, const DropoutParams& params);

extern core::DispatchStub<DropoutKernel> dropout_stub;

}  // namespace colossal::ops
