// The Vision Transformer split Megatron-style over the tensor-parallel group (Colossal-AI's 1D ViT),
// built from a serial nn::models::VisionTransformer. In each block the attention holds whole heads
// per rank (timm's fused qkv split so each rank holds its heads' q, k and v: a column-parallel
// layer, then the row-parallel proj) and the MLP is a column-parallel fc1, GELU on this rank's
// hidden features, a row-parallel fc2: two all-reduces forward and two backward per block.
//
// Replicated on every rank (what Colossal-AI's 1D ViT and Megatron's ViT backbone keep whole): the
// patch embedding (a convolution over the image, a few percent of the FLOPs), the class token and
// the position embedding, the layer norms, and the classifier head, so the logits [B, num_classes]
// are whole and equal on every rank and the serial criterion (label smoothing, mixup's soft
// targets) and top-k accuracy apply to them unchanged. Splitting the head (Colossal-AI's
// Classifier1D) would save num_classes x embed_dim parameters per rank and need a gather of the
// logits; at ImageNet's 1000 classes that is under 1% of ViT-B's parameters.
//
// Dropout follows Megatron's RNG tracker (random.h): the attention probabilities (this rank's
// heads) and the MLP's dropout after the activation (this rank's hidden features) draw from the
// tensor-parallel generator; the position, projection, MLP-output and head dropouts and drop path
// (whole activations, after a row-parallel all-reduce) from the data generator.
//
// Sequence parallelism (ParallelViTOptions::sequence_parallel, parallel.tensor.sequence_parallel):
// between the tensor-parallel regions each rank keeps only its share of the tokens, as GPT-2's does
// (Note [Token shards] in gpt2_1d.cpp: the batch's share where B divides by the group's size, else the
// sequence's where the tokens do, else the batch's padded with zero rows): the tokens are split after the position
// embedding and its dropout (replicated), the blocks' layer norms, residual adds, projection and MLP-output dropouts
// and drop path work on the shards (those dropouts then drawing from the tensor-parallel generator: each rank's tokens
// are its own), qkv and fc1 all-gather their input and proj and fc2 reduce-scatter their output, and the final norm's
// output is all-gathered before the class token is taken, so the head and the logits are whole and replicated as
// without it.
//
// Other layouts (ParallelViTOptions::plan, vit_plan.h): each block's qkv, proj, fc1 and fc2
// column-split, row-split or replicated, as per-parameter sharding specs (parallel.tensor.specs)
// ask. Where a split activation meets a layer that needs it whole (a column-split qkv before a
// column-split or replicated proj, a column-split fc1 before such an fc2), the parts are gathered
// (gather_from_region); dropout on split features draws from the tensor-parallel generator, on whole
// ones from the data generator. Sequence parallelism takes the built-in plan only.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>

#include "colossal/comm/process_group.h"
#include "colossal/config/train_config.h"  // TensorSplit
#include "colossal/nn/activation.h"
#include "colossal/nn/dropout.h"
#include "colossal/nn/layer_norm.h"
#include "colossal/nn/linear.h"
#include "colossal/nn/models/vit.h"
#include "colossal/nn/module.h"
#include "colossal/nn/patch_embedding.h"
#include "colossal/parallel/tp/linear_1d.h"
#include "colossal/parallel/tp/random.h"
#include "colossal/parallel/tp/vit_plan.h"

namespace colossal::parallel::tp {

struct ParallelViTOptions {
  /// Where dropout draws its masks (random.h; the file's head).
  DropoutGenerators dropout;
  /// Megatron's sequence parallelism (the file's head).
  bool sequence_parallel = false;
  /// How each block splits (vit_plan.h); empty: the built-in policy (VitPlan::megatron).
  std::optional<VitPlan> plan;
  /// Set by ParallelViT for its layers (leave it empty): which tokens the shards hold in the current
  /// forward (Note [Token shards] in gpt2_1d.cpp).
  std::shared_ptr<SequenceShard> sequence_shard;
};

/// timm's Attention with num_heads / tp heads on each rank: qkv column-parallel (this rank's heads'
/// q, k and v), proj row-parallel; or as `plan` splits them (every head on every rank when qkv is
/// replicated).
class ParallelViTAttention : public nn::Module {
 public:
  /// Throws naming both when num_heads does not divide by the group's size and qkv splits.
  ParallelViTAttention(const nn::MultiheadSelfAttention& serial, const nn::models::ViTConfig& config,
                       std::shared_ptr<comm::ProcessGroup> group, const ParallelViTOptions& options = {},
                       const VitBlockPlan& plan = {});
  /// x [B, N, embed_dim], the same on every rank -> [B, N, embed_dim], the same on every rank.
  Tensor forward(const Tensor& x) override;

  /// The layers as the plan made them: the typed ones null where the plan chose another split.
  std::shared_ptr<ColumnParallelLinear> qkv() const { return std::dynamic_pointer_cast<ColumnParallelLinear>(qkv_); }
  std::shared_ptr<RowParallelLinear> proj() const { return std::dynamic_pointer_cast<RowParallelLinear>(proj_); }
  core::Generator* attn_dropout_generator() const { return attn_dropout_generator_; }

 private:
  std::shared_ptr<comm::ProcessGroup> group_;
  int64_t local_heads_;
  bool gather_heads_;  ///< qkv split by heads, proj wanting its whole input
  double attn_dropout_;
  core::Generator* attn_dropout_generator_;
  std::shared_ptr<nn::Module> qkv_;
  std::shared_ptr<nn::Module> proj_;
  std::shared_ptr<nn::Dropout> proj_drop_;
};

/// timm's Mlp: fc1 column-parallel, exact GELU and drop1 on this rank's hidden features, fc2
/// row-parallel, drop2; or as `plan` splits them.
class ParallelViTMLP : public nn::Module {
 public:
  ParallelViTMLP(const nn::MLP& serial, const nn::models::ViTConfig& config, std::shared_ptr<comm::ProcessGroup> group,
                 const ParallelViTOptions& options = {}, const VitBlockPlan& plan = {});
  Tensor forward(const Tensor& x) override;

  std::shared_ptr<ColumnParallelLinear> fc1() const { return std::dynamic_pointer_cast<ColumnParallelLinear>(fc1_); }
  std::shared_ptr<RowParallelLinear> fc2() const { return std::dynamic_pointer_cast<RowParallelLinear>(fc2_); }

 private:
  std::shared_ptr<comm::ProcessGroup> group_;
  bool gather_hidden_;  ///< fc1 column-split, fc2 wanting its whole input
  std::shared_ptr<nn::Module> fc1_;
  std::shared_ptr<nn::GELU> act_;
  std::shared_ptr<nn::Dropout> drop1_;
  std::shared_ptr<nn::Module> fc2_;
  std::shared_ptr<nn::Dropout> drop2_;
};

/// timm's Block: x + drop_path(attn(norm1(x))), then + drop_path(mlp(norm2(.))), under its names.
/// Checkpointed as the serial block is (its checkpoint_activations), as ParallelGPT2Block: both
/// dropout generators rewound, the block's all-reduces issued again in backward.
class ParallelViTBlock : public nn::Module {
 public:
  /// `drop_path`: this block's stochastic depth (the serial model's rule: drop_path_rate * i / (depth - 1)).
  ParallelViTBlock(const nn::TransformerBlock& serial, const nn::models::ViTConfig& config, double drop_path,
                   std::shared_ptr<comm::ProcessGroup> group, const ParallelViTOptions& options = {},
                   const VitBlockPlan& plan = {});
  Tensor forward(const Tensor& x) override;

  bool checkpoint_activations() const { return checkpoint_activations_; }
  void set_checkpoint_activations(bool on) { checkpoint_activations_ = on; }

  const std::shared_ptr<ParallelViTAttention>& attn() const { return attn_; }
  const std::shared_ptr<ParallelViTMLP>& mlp() const { return mlp_; }

 private:
  std::shared_ptr<nn::LayerNorm> norm1_;
  std::shared_ptr<ParallelViTAttention> attn_;
  std::shared_ptr<nn::DropPath> drop_path1_;
  std::shared_ptr<nn::LayerNorm> norm2_;
  std::shared_ptr<ParallelViTMLP> mlp_;
  std::shared_ptr<nn::DropPath> drop_path2_;
  DropoutGenerators dropout_;
  bool checkpoint_activations_;

  Tensor forward_block(const Tensor& x);
};

/// The whole ViT over the tensor-parallel group, with the serial model's parameter names (timm's):
/// blocks split as above, everything else replicated (the file's head). forward() returns the whole
/// logits [B, num_classes] on every rank.
class ParallelViT : public nn::Module {
 public:
  /// Throws naming both when the heads do not split over the group, or the MLP's hidden width does not.
  /// A plan the layers cannot compute is an error naming the parameter (check_vit_plan), as is sequence
  /// parallelism with a plan other than the built-in one.
  ParallelViT(const nn::models::VisionTransformer& serial, std::shared_ptr<comm::ProcessGroup> group,
              ParallelViTOptions options = {});
  /// images [B, in_chans, img_size, img_size] -> logits [B, num_classes], the same on every rank.
  /// Under sequence parallelism a batch that does not divide by the group's size, with a token count
  /// (patches + 1) that does not either, is padded for the blocks (the file's head).
  Tensor forward(const Tensor& images) override;
  /// Every block's activation checkpointing on or off (built as the serial model's blocks are).
  void set_checkpoint_activations(bool on);

  const nn::models::ViTConfig& config() const { return config_; }
  const VitPlan& plan() const { return plan_; }
  const std::shared_ptr<nn::ModuleList>& blocks() const { return blocks_; }
  const std::shared_ptr<nn::Linear>& head() const { return head_; }

 private:
  nn::models::ViTConfig config_;
  std::shared_ptr<comm::ProcessGroup> group_;
  bool sequence_parallel_;
  std::shared_ptr<SequenceShard> shard_;
  VitPlan plan_;
  Tensor* cls_token_;
  Tensor* pos_embed_;
  std::shared_ptr<nn::PatchEmbedding> patch_embed_;
  std::shared_ptr<nn::Dropout> pos_drop_;
  std::shared_ptr<nn::ModuleList> blocks_;
  std::shared_ptr<nn::LayerNorm> norm_;
  std::shared_ptr<nn::Dropout> head_drop_;
  std::shared_ptr<nn::Linear> head_;
};

}  // namespace colossal::parallel::tp
