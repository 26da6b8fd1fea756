// Multi-head self-attention: the head split/merge around ops::scaled_dot_product_attention, and an
// explicit softmax path for attention dropout, which the fused op does not do.
#include "colossal/nn/attention.h"

#include <cmath>
#include <limits>

#include <fmt/format.h>

#include "colossal/ops/elementwise.h"    // add, mul
#include "colossal/ops/linalg.h"         // matmul
#include "colossal/ops/nn_functional.h"  // scaled_dot_product_attention, softmax, dropout

namespace colossal::nn {

Tensor multihead_attention(const Tensor& qkv, int64_t num_heads, bool causal, double attn_dropout, bool training,
                           core::Generator* dropout_generator) {
  COLOSSAL_CHECK(qkv.dim() == 3, "multihead_attention: qkv must be [B, N, 3 * C], got shape {}", qkv.shape());
  COLOSSAL_CHECK(num_heads > 0, "multihead_attention: num_heads must be positive, got {}", num_heads);
  const int64_t batch = qkv.size(0), tokens = qkv.size(1), width = qkv.size(2);
  COLOSSAL_CHECK(width % (3 * num_heads) == 0,
                 "multihead_attention: qkv {} has a last dimension of {}, which is not 3 * num_heads ({}) * head_dim",
                 qkv.shape(), width, num_heads);
  const int64_t channels = width / 3, head_dim = channels / num_heads;
  if (attn_dropout == 0.0 || !training) return ops::packed_qkv_attention(qkv, num_heads, {.causal = causal});

  // Dropout on the probabilities needs them materialised: the unfused path.
  // [B, N, 3, H, D] -> [3, B, H, N, D]: the layout timm's Attention and HF's _split_heads produce.
  const Tensor heads = qkv.reshape({batch, tokens, 3, num_heads, head_dim}).permute({2, 0, 3, 1, 4});
  const Tensor q = heads.select(0, 0), k = heads.select(0, 1), v = heads.select(0, 2);
  Tensor scores = ops::mul(ops::matmul(q, k.transpose(-2, -1)), 1.0 / std::sqrt(static_cast<double>(head_dim)));
  if (causal) {
    // Query i sees keys j <= i: an additive mask of -inf above the diagonal.
    std::vector<double> mask(static_cast<size_t>(tokens * tokens), 0.0);
    for (int64_t i = 0; i < tokens; ++i) {
      for (int64_t j = i + 1; j < tokens; ++j) mask[i * tokens + j] = -std::numeric_limits<double>::infinity();
    }
    scores =
        ops::add(scores, core::from_vector(mask, {tokens, tokens}, TensorOptions(scores.dtype(), scores.device())));
  }
  const Tensor probs = ops::dropout(ops::softmax(scores, -1), attn_dropout, true, dropout_generator);
  return ops::matmul(probs, v).transpose(1, 2).reshape({batch, tokens, channels});
}

MultiheadSelfAttention::MultiheadSelfAttention(int64_t dim, int64_t num_heads,
                                               const MultiheadSelfAttentionOptions& options, core::Generator* generator)
    : Module("MultiheadSelfAttention"), dim_(dim), num_heads_(num_heads), options_(options) {
  COLOSSAL_CHECK(dim > 0 && num_heads > 0 && dim % num_heads == 0,
                 "MultiheadSelfAttention: dim {} must be a positive multiple of num_heads {}", dim, num_heads);
  COLOSSAL_CHECK(options.attn_dropout >= 0.0 && options.attn_dropout <= 1.0,
                 "MultiheadSelfAttention: attn_dropout must be in [0, 1], got {}", options.attn_dropout);
  qkv_ = register_module("qkv", std::make_shared<Linear>(dim, 3 * dim, options.qkv_bias, generator));
  proj_ = register_module("proj", std::make_shared<Linear>(dim, dim, true, generator));
  proj_drop_ = register_module("proj_drop", std::make_shared<Dropout>(options.proj_dropout, options.dropout_generator));
}

Tensor MultiheadSelfAttention::forward(const Tensor& x) {
  COLOSSAL_CHECK(x.dim() == 3 && x.size(2) == dim_, "MultiheadSelfAttention: expected x [B, N, {}], got shape {}", dim_,
                 x.shape());
  const Tensor attended = multihead_attention(qkv_->forward(x), num_heads_, options_.causal, options_.attn_dropout,
                                              is_training(), options_.dropout_generator);
  return proj_drop_->forward(proj_->forward(attended));
}

std::string MultiheadSelfAttention::extra_repr() const {
  return fmt::format("dim={}, num_heads={}, causal={}, attn_dropout={}", dim_, num_heads_, options_.causal,
                     options_.attn_dropout);
}

}  // namespace colossal::nn
