// Vision Transformer (timm's VisionTransformer with a class token): patch embedding, class token
// and learned position embedding, pre-LN blocks, a final LayerNorm and a linear head on the class
// token. Parameters carry timm's names (patch_embed.proj.weight, cls_token, pos_embed,
// blocks.0.attn.qkv.weight, norm.bias, head.weight) and layouts, so timm checkpoints load through
// load_state_dict as they are, and initialisation is timm's.
#pragma once

#include <memory>
#include <string_view>
#include <vector>

#include "colossal/core/random.h"
#include "colossal/nn/dropout.h"
#include "colossal/nn/layer_norm.h"
#include "colossal/nn/linear.h"
#include "colossal/nn/models/layer_view.h"
#include "colossal/nn/patch_embedding.h"
#include "colossal/nn/transformer_block.h"

namespace colossal::nn::models {

struct ViTConfig {
  int64_t img_size = 224;   ///< square images of img_size x img_size pixels
  int64_t patch_size = 16;  ///< square patches; must divide img_size
  int64_t in_chans = 3;     ///< image channels
  int64_t num_classes = 1000;
  int64_t embed_dim = 768;  ///< token width
  int64_t depth = 12;       ///< transformer blocks
  int64_t num_heads = 12;   ///< must divide embed_dim
  double mlp_ratio = 4.0;   ///< MLP hidden width as a multiple of embed_dim
  bool qkv_bias = true;
  double norm_eps = 1e-6;       ///< timm's ViT LayerNorm epsilon (PyTorch's default would be 1e-5)
  double drop_rate = 0.0;       ///< dropout before the head (timm's drop_rate)
  double pos_drop_rate = 0.0;   ///< dropout after adding the position embedding
  double proj_drop_rate = 0.0;  ///< dropout after each attention projection and in each MLP
  double attn_drop_rate = 0.0;  ///< dropout on the attention probabilities
  /// Stochastic depth at the last block; block i gets drop_path_rate * i / (depth - 1) (timm).
  double drop_path_rate = 0.0;
  /// Start the head at zero (weight and bias), as timm's 'jax' init and most fine-tuning recipes,
  /// so the first logits are uniform. Off: trunc_normal(std 0.02) like every other Linear.
  bool zero_head_init = false;
  /// Recompute each block in backward while training instead of keeping its activations (timm's
  /// set_grad_checkpointing(), model.options.checkpoint_activations); dropout and drop path draw
  /// the same masks in the recompute, so losses and gradients are unchanged.
  bool checkpoint_activations = false;

  int64_t num_patches() const { return (img_size / patch_size) * (img_size / patch_size); }
  /// The MLP's hidden features: embed_dim x mlp_ratio, truncated as timm does.
  int64_t mlp_hidden() const;
  /// The model's parameter count, computed without building it.
  int64_t num_parameters() const;
  /// Throws naming the field when a size is not positive, patch_size does not divide img_size,
  /// num_heads does not divide embed_dim, or a probability is outside [0, 1].
  void validate() const;

  // timm's presets: 224 x 224 images in 16 x 16 patches.
  static ViTConfig vit_tiny_patch16_224(int64_t num_classes = 1000);   ///< 192 wide, 12 deep, 3 heads
  static ViTConfig vit_small_patch16_224(int64_t num_classes = 1000);  ///< 384 wide, 12 deep, 6 heads
  static ViTConfig vit_base_patch16_224(int64_t num_classes = 1000);   ///< 768 wide, 12 deep, 12 heads
  static ViTConfig vit_large_patch16_224(int64_t num_classes = 1000);  ///< 1024 wide, 24 deep, 16 heads
  // Small images in 4 x 4 patches with ViT-Tiny's width (Colossal-AI's CIFAR-10 and MNIST examples).
  static ViTConfig vit_tiny_patch4_32(int64_t num_classes = 10);  ///< 32 x 32 RGB (CIFAR): 64 patches
  static ViTConfig vit_tiny_patch4_28(int64_t num_classes = 10);  ///< 28 x 28 grey (MNIST): 49 patches

  /// From a JSON object with timm's VisionTransformer argument names (img_size, patch_size,
  /// in_chans, num_classes, embed_dim, depth, num_heads, mlp_ratio, qkv_bias, drop_rate,
  /// pos_drop_rate, proj_drop_rate, attn_drop_rate, drop_path_rate); absent keys keep the defaults.
  static ViTConfig from_json(std::string_view json);
};

class VisionTransformer : public Module {
 public:
  /// generator draws the initial weights; dropout_generator (nullptr = core::default_generator())
  /// drives every dropout and drop path and must outlive the model. Initialised as timm's
  /// init_weights(''): pos_embed trunc_normal(std 0.02), cls_token normal(std 1e-6), every Linear
  /// trunc_normal(std 0.02) with zero bias (the head zero with zero_head_init), the patch
  /// projection PyTorch's Conv2d default, LayerNorms one and zero.
  /// build: the pieces of layers() built at full size, the others as stand-ins (Note [Pieces
  /// built]).
  explicit VisionTransformer(const ViTConfig& config, core::Generator* generator = nullptr,
                             core::Generator* dropout_generator = nullptr, const PieceFilter& build = {});

  /// images [B, in_chans, img_size, img_size] -> logits [B, num_classes].
  Tensor forward(const Tensor& images) override;
  /// The model as pieces for pipeline parallelism (Note [Pipeline layers]): "embed" (images ->
  /// tokens [B, 1 + num_patches, embed_dim]: patch_embed, cls_token, pos_embed, pos_drop), one
  /// piece per block blocks.<i>, and "head" (tokens -> logits: norm, class-token pooling, head).
  std::vector<std::shared_ptr<Module>> layers();
  /// Every block's activation checkpointing on or off (and config().checkpoint_activations).
  void set_checkpoint_activations(bool on);

  const ViTConfig& config() const { return config_; }
  const std::shared_ptr<PatchEmbedding>& patch_embed() const { return patch_embed_; }
  const Tensor& cls_token() const { return *cls_token_; }  ///< [1, 1, embed_dim]
  const Tensor& pos_embed() const { return *pos_embed_; }  ///< [1, 1 + num_patches, embed_dim]
  const std::shared_ptr<ModuleList>& blocks() const { return blocks_; }
  const std::shared_ptr<LayerNorm>& norm() const { return norm_; }
  const std::shared_ptr<Linear>& head() const { return head_; }

 private:
  ViTConfig config_;
  Tensor* cls_token_;
  Tensor* pos_embed_;
  std::shared_ptr<PatchEmbedding> patch_embed_;
  std::shared_ptr<Dropout> pos_drop_;
  std::shared_ptr<ModuleList> blocks_;
  std::shared_ptr<LayerNorm> norm_;
  std::shared_ptr<Dropout> head_drop_;
  std::shared_ptr<Linear> head_;
};

}  // namespace colossal::nn::models
