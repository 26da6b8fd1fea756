// TransformerBlock: the pre-LayerNorm encoder block of ViT (timm's Block): x + drop_path(attn(
// norm1(x))), then x + drop_path(mlp(norm2(x))), under timm's names (norm1, attn, norm2, mlp).
#pragma once

#include <memory>

#include "colossal/nn/attention.h"
#include "colossal/nn/dropout.h"
#include "colossal/nn/layer_norm.h"
#include "colossal/nn/mlp.h"

namespace colossal::nn {

struct TransformerBlockOptions {
  /// Hidden width of the MLP as a multiple of dim (timm's mlp_ratio).
  double mlp_ratio = 4.0;
  bool qkv_bias = true;
  /// Dropout after the attention projection and inside the MLP (timm's proj_drop).
  double proj_dropout = 0.0;
  /// Dropout on attention probabilities (timm's attn_drop).
  double attn_dropout = 0.0;
  /// Stochastic depth probability of both residual branches (timm's drop_path).
  double drop_path = 0.0;
  /// LayerNorm epsilon; timm's ViT uses 1e-6 (PyTorch's LayerNorm default is 1e-5).
  double norm_eps = 1e-6;
  bool causal = false;
  ops::GeluApproximation activation = ops::GeluApproximation::none;
  /// Drives every dropout and drop path; nullptr means core::default_generator(). Must outlive the block.
  core::Generator* dropout_generator = nullptr;
  /// Recompute the block in backward while training instead of keeping its activations
  /// (autograd/checkpoint.h), with dropout_generator rewound so the masks repeat.
  bool checkpoint_activations = false;
};

class TransformerBlock : public Module {
 public:
  /// generator initialises the attention and MLP Linears.
  TransformerBlock(int64_t dim, int64_t num_heads, const TransformerBlockOptions& options = {},
                   core::Generator* generator = nullptr);
  /// x [B, N, dim] -> [B, N, dim].
  Tensor forward(const Tensor& x) override;

  bool checkpoint_activations() const { return checkpoint_activations_; }
  void set_checkpoint_activations(bool on) { checkpoint_activations_ = on; }
  core::Generator* dropout_generator() const { return dropout_generator_; }

  const std::shared_ptr<LayerNorm>& norm1() const { return norm1_; }
  const std::shared_ptr<MultiheadSelfAttention>& attn() const { return attn_; }
  const std::shared_ptr<LayerNorm>& norm2() const { return norm2_; }
  const std::shared_ptr<MLP>& mlp() const { return mlp_; }

 private:
  std::shared_ptr<LayerNorm> norm1_;
  std::shared_ptr<MultiheadSelfAttention> attn_;
  std::shared_ptr<DropPath> drop_path1_;
  std::shared_ptr<LayerNorm> norm2_;
  std::shared_ptr<MLP> mlp_;
  std::shared_ptr<DropPath> drop_path2_;
  core::Generator* dropout_generator_;
  bool checkpoint_activations_;

  Tensor forward_block(const Tensor& x);
};

}  // namespace colossal::nn
