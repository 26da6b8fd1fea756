// How the ViT's blocks split over the 1D tensor-parallel group: a plan per block, made by the
// built-in policy (Megatron's: qkv and fc1 column, proj and fc2 row) or from per-parameter sharding
// specs (parallel.tensor.specs, as for GPT-2 in gpt2_plan.h, against timm's names), and checked for
// whether the layers can compute it. ParallelViT (vit_1d.h) builds the model a plan describes;
// `colossal describe` prints each parameter's resolved spec.
//
// What each split means for each layer of block i (timm's nn.Linear weights are [out, in]):
//   blocks.i.attn.qkv   column: whole heads per rank (its heads' q, k and v); replicate
//   blocks.i.attn.proj  row (needs qkv column); column (the heads' outputs gathered first when qkv
//                       is column; output gathered); replicate (heads gathered first when qkv is column)
//   blocks.i.mlp.fc1    column (GELU and the MLP's first dropout on this rank's features); replicate
//   blocks.i.mlp.fc2    row (needs fc1 column); column (gathered before and after); replicate
// The patch embedding, the class token, the position embedding, the layer norms and the classifier
// head stay whole (vit_1d.h says why). A bias follows its weight (column: split with it; row:
// whole, added after the sum).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "colossal/config/train_config.h"  // TensorSpecRule
#include "colossal/nn/models/vit.h"
#include "colossal/parallel/tp/spec_rules.h"  // BlockSplits, ParameterSplit

namespace colossal::parallel::tp {

/// One block's splits: attn_in is qkv, attn_out proj, mlp_in fc1, mlp_out fc2.
using VitBlockPlan = BlockSplits;

struct VitPlan {
  std::vector<VitBlockPlan> blocks;  ///< one per block

  /// The built-in policy (Megatron's): heads and MLP column then row in every block.
  static VitPlan megatron(int64_t depth);
  bool is_megatron() const { return *this == megatron(static_cast<int64_t>(blocks.size())); }
  friend bool operator==(const VitPlan&, const VitPlan&) = default;
};

struct ResolvedVitPlan {
  VitPlan plan;
  std::vector<ParameterSplit> parameters;  ///< in the serial model's order
};

/// The plan that `rules` give a ViT of `config` whose parameters are `parameter_names` (the serial
/// model's, in order), checked for `tensor_size` ranks (check_vit_plan); as resolve_gpt2_specs.
ResolvedVitPlan resolve_vit_specs(const std::vector<config::TensorSpecRule>& rules, const nn::models::ViTConfig& config,
                                  const std::vector<std::string>& parameter_names, int tensor_size);

/// The built-in policy for the parameters of a ViT, labelled so.
ResolvedVitPlan builtin_vit_plan(const nn::models::ViTConfig& config, const std::vector<std::string>& parameter_names);

/// Throws naming the parameter (blocks.0.attn.proj.weight), its spec and what would be valid when the
/// layers cannot compute `plan` at `tensor_size` ranks (check_block_plan for every block).
void check_vit_plan(const VitPlan& plan, const nn::models::ViTConfig& config, int tensor_size);

}  // namespace colossal::parallel::tp
