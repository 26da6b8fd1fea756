// Neural-network functions with fused backward kernels: softmax, log_softmax, layer_norm,
// embedding, cross_entropy, dropout and scaled dot-product attention.
#pragma once

#include <optional>

#include "colossal/core/random.h"
#include "colossal/core/tensor.h"

namespace colossal::ops {

Tensor softmax(const Tensor& x, int64_t dim);
Tensor log_softmax(const Tensor& x, int64_t dim);

/// Normalises over the last normalized_shape.size() dimensions; weight and bias (either may be
/// undefined) have normalized_shape.
Tensor layer_norm(const Tensor& x, const Shape& normalized_shape, const Tensor& weight = Tensor(),
                  const Tensor& bias = Tensor(), double eps = 1e-5);

/// Rows of weight [num_embeddings, dim] picked by integer `indices` (any shape) -> [..., dim].
/// Rows equal to padding_idx (when >= 0) get no gradient.
Tensor embedding(const Tensor& indices, const Tensor& weight, int64_t padding_idx = -1);
/// Writes rows [..., dim] (the shape embedding(indices, weight) returns) into weight at `indices`, in
/// place: weight[indices[k]] <- rows[k]. Where an index repeats its rows must be equal (one of them
/// lands; the pipeline copies a table's rows from another copy this way). Not differentiable: weight
/// must not require a gradient. Throws naming an index out of range (on a GPU at a later host read,
/// without stopping the host here).
void embedding_put_(const Tensor& weight, const Tensor& indices, const Tensor& rows);

enum class Reduction { none, mean, sum };
struct CrossEntropyOptions {
  /// Targets equal to this contribute nothing (and are not counted by mean).
  int64_t ignore_index = -100;
  /// Mixes the one-hot target with the uniform distribution: (1 - s) * onehot + s / C.
  double label_smoothing = 0.0;
  Reduction reduction = Reduction::mean;
};
/// logits [N, C] (or [C]); target either class indices [N] (i32/i64) or class probabilities [N, C]
/// (soft targets, e.g. from mixup). Matches torch.nn.functional.cross_entropy, except that the loss
/// of f16/bf16 logits is returned in f32 (computed in f32 and never rounded to 16 bits, as torch's
/// autocast gets by running the whole op in f32, but without an f32 copy of the logits).
Tensor cross_entropy(const Tensor& logits, const Tensor& target, const CrossEntropyOptions& options = {});

/// Zeroes each element with probability p and scales the rest by 1 / (1 - p) when training. The
/// mask comes from the Philox stream (seed, offset): element i keeps iff uniform_float(word i % 4
/// of philox_block(seed, offset, i / 4)) >= p, the same on every device.
Tensor dropout(const Tensor& x, double p, bool training = true, core::Generator* generator = nullptr);
/// residual + dropout(x, p, training, generator) in one pass (the residual branch of a transformer
/// block), drawing the same mask as dropout would from the same generator state; the sum is rounded
/// once. x and residual: one shape, dtype and device. Outside training or with p == 0, residual + x.
Tensor dropout_add(const Tensor& x, const Tensor& residual, double p, bool training = true,
                   core::Generator* generator = nullptr);

struct AttentionOptions {
  bool causal = false;
  /// Scale of q k^T; default 1 / sqrt(head_dim).
  std::optional<double> scale;
  /// Dropout on the probabilities (torch's dropout_p), applied whenever > 0: pass 0 outside training.
  /// Kept probabilities are scaled by 1 / (1 - p).
  double dropout_p = 0.0;
  /// Draws the dropout mask; nullptr means core::default_generator().
  core::Generator* generator = nullptr;
};
/// softmax(q k^T * scale [+ causal mask]) v for q [..., Tq, D], k [..., Tk, D], v [..., Tk, Dv].
/// The causal mask lets query i see keys j <= i (+ Tk - Tq when lengths differ, as in flash attention
/// aligned to the bottom right). With dropout_p > 0, a problem the device's fused kernel takes (CUDA:
/// cuDNN's engine, bf16/f16) drops inside it, the mask drawn from the generator's Philox stream in
/// the kernel (Note [Attention dropout] in ops/attention.cpp); any other problem materialises the
/// probabilities and passes them through ops::dropout. The two paths draw different masks.
Tensor scaled_dot_product_attention(const Tensor& q, const Tensor& k, const Tensor& v,
                                    const AttentionOptions& options = {});
/// Multi-head self-attention on a fused projection: qkv [B, T, 3 * C] laid out as [B, T, 3, H, D]
/// (q, k, v, each head by head, as nn's fused qkv Linear and timm/HF produce), C = H * D. Returns
/// [B, T, C], the heads merged. The same function as splitting the heads, scaled_dot_product_attention
/// and merging them, but the kernels read q, k, v from qkv and write the merged output and the qkv
/// gradient in place: no transposing copies, forward or backward.
Tensor packed_qkv_attention(const Tensor& qkv, int64_t num_heads, const AttentionOptions& options = {});

}  // namespace colossal::ops
