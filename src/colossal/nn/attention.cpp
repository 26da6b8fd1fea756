// Multi-head self-attention: ops::packed_qkv_attention (the head split/merge, attention dropout
// included) around the qkv and output projections.
#include "colossal/nn/attention.h"

#include <fmt/format.h>

#include "colossal/ops/nn_functional.h"  // packed_qkv_attention

namespace colossal::nn {

Tensor multihead_attention(const Tensor& qkv, int64_t num_heads, bool causal, double attn_dropout, bool training,
                           core::Generator* dropout_generator) {
  COLOSSAL_CHECK(qkv.dim() == 3, "multihead_attention: qkv must be [B, N, 3 * C], got shape {}", qkv.shape());
  COLOSSAL_CHECK(num_heads > 0, "multihead_attention: num_heads must be positive, got {}", num_heads);
  const int64_t width = qkv.size(2);
  COLOSSAL_CHECK(width % (3 * num_heads) == 0,
                 "multihead_attention: qkv {} has a last dimension of {}, which is not 3 * num_heads ({}) * head_dim",
                 qkv.shape(), width, num_heads);
  const bool dropout = training && attn_dropout > 0.0;
  return ops::packed_qkv_attention(
      qkv, num_heads, {.causal = causal, .dropout_p = dropout ? attn_dropout : 0.0, .generator = dropout_generator});
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
