// Multi-head self-attention over [B, N, C] sequences with a fused qkv projection, under timm's
// names (qkv, proj); multihead_attention() is the head split / attend / merge core that GPT-2's
// Conv1D-based attention reuses.
#pragma once

#include <memory>

#include "colossal/core/random.h"
#include "colossal/nn/dropout.h"
#include "colossal/nn/linear.h"

namespace colossal::nn {

/// qkv [B, N, 3 C] (q, k, v concatenated along the last dimension, each C = heads * head_dim, as
/// both timm's qkv and GPT-2's c_attn produce) -> [B, N, C]: per head softmax(q k^T / sqrt(D)
/// [+ causal mask]) v, one ops::packed_qkv_attention call. Attention dropout (in training) runs
/// inside the fused kernel where the device has one that takes the problem, else on materialised
/// probabilities (Note [Attention dropout] in ops/attention.cpp), as torch's sdpa with dropout_p.
Tensor multihead_attention(const Tensor& qkv, int64_t num_heads, bool causal, double attn_dropout = 0.0,
                           bool training = false, core::Generator* dropout_generator = nullptr);

struct MultiheadSelfAttentionOptions {
  /// Bias in the qkv projection (timm's ViT default true).
  bool qkv_bias = true;
  /// Dropout on the attention probabilities (timm's attn_drop).
  double attn_dropout = 0.0;
  /// Dropout after the output projection (timm's proj_drop).
  double proj_dropout = 0.0;
  /// Each position attends only to itself and earlier ones (decoders).
  bool causal = false;
  /// Drives both dropouts; nullptr means core::default_generator(). Must outlive the module.
  core::Generator* dropout_generator = nullptr;
};

class MultiheadSelfAttention : public Module {
 public:
  /// dim must be divisible by num_heads. generator initialises qkv and proj.
  MultiheadSelfAttention(int64_t dim, int64_t num_heads, const MultiheadSelfAttentionOptions& options = {},
                         core::Generator* generator = nullptr);
  /// x [B, N, dim] -> [B, N, dim].
  Tensor forward(const Tensor& x) override;
  std::string extra_repr() const override;

  const std::shared_ptr<Linear>& qkv() const { return qkv_; }
  const std::shared_ptr<Linear>& proj() const { return proj_; }
  int64_t num_heads() const { return num_heads_; }

 private:
  int64_t dim_;
  int64_t num_heads_;
  MultiheadSelfAttentionOptions options_;
  std::shared_ptr<Linear> qkv_;
  std::shared_ptr<Linear> proj_;
  std::shared_ptr<Dropout> proj_drop_;
};

}  // namespace colossal::nn
