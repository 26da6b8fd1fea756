// TransformerBlock: submodule wiring and the two pre-norm residual branches, checkpointed on request.
#include "colossal/nn/transformer_block.h"

#include <cmath>

#include "colossal/autograd/checkpoint.h"  // checkpoint
#include "colossal/ops/elementwise.h"      // add

namespace colossal::nn {

TransformerBlock::TransformerBlock(int64_t dim, int64_t num_heads, const TransformerBlockOptions& options,
                                   core::Generator* generator)
    : Module("TransformerBlock"),
      dropout_generator_(options.dropout_generator),
      checkpoint_activations_(options.checkpoint_activations) {
  COLOSSAL_CHECK(options.mlp_ratio > 0.0, "TransformerBlock: mlp_ratio must be positive, got {}", options.mlp_ratio);
  norm1_ = register_module("norm1", std::make_shared<LayerNorm>(dim, options.norm_eps));
  attn_ = register_module("attn", std::make_shared<MultiheadSelfAttention>(
                                      dim, num_heads,
                                      MultiheadSelfAttentionOptions{.qkv_bias = options.qkv_bias,
                                                                    .attn_dropout = options.attn_dropout,
                                                                    .proj_dropout = options.proj_dropout,
                                                                    .causal = options.causal,
                                                                    .dropout_generator = options.dropout_generator},
                                      generator));
  drop_path1_ = register_module("drop_path1", std::make_shared<DropPath>(options.drop_path, options.dropout_generator));
  norm2_ = register_module("norm2", std::make_shared<LayerNorm>(dim, options.norm_eps));
  // timm: int(dim * mlp_ratio), truncating.
  const auto hidden = static_cast<int64_t>(static_cast<double>(dim) * options.mlp_ratio);
  mlp_ = register_module("mlp", std::make_shared<MLP>(dim, hidden,
                                                      MLPOptions{.activation = options.activation,
                                                                 .dropout = options.proj_dropout,
                                                                 .dropout_generator = options.dropout_generator},
                                                      generator));
  drop_path2_ = register_module("drop_path2", std::make_shared<DropPath>(options.drop_path, options.dropout_generator));
}

Tensor TransformerBlock::forward(const Tensor& x) {
  if (!checkpoint_activations_ || !is_training()) return forward_block(x);
  return autograd::checkpoint([this](const Tensor& in) { return forward_block(in); }, x,
                              {.generators = {dropout_generator_}});
}

Tensor TransformerBlock::forward_block(const Tensor& x) {
  const Tensor h = ops::add(x, drop_path1_->forward(attn_->forward(norm1_->forward(x))));
  return ops::add(h, drop_path2_->forward(mlp_->forward(norm2_->forward(h))));
}

}  // namespace colossal::nn
