// How GPT-2's layers split over the 1D tensor-parallel group: a plan per layer (column, row,
// replicate, vocab), made either by the built-in policy (Megatron's) or from per-parameter sharding
// specs (parallel.tensor.specs, Colossal-AI's "parallelize your training like Megatron" tutorial),
// and checked for whether the layers can compute it. ParallelGPT2 (gpt2_1d.h) builds the model a
// plan describes; `colossal describe` prints each parameter's resolved spec.
//
// What each split means for each layer (GPT-2's Conv1D weights are [in, out]):
//   c_attn      column: whole heads per rank (the fused q/k/v columns of its heads; the tutorial's
//                       ShardSpec([-1]) gathered after attention is the same function); replicate
//   attn.c_proj row (needs c_attn column); column (the heads' outputs gathered first when c_attn is
//               column; output gathered); replicate (heads gathered first when c_attn is column)
//   mlp.c_fc    column (GELU on this rank's features); replicate
//   mlp.c_proj  row (needs c_fc column); column (gathered before and after); replicate
//   wte         vocab (rows split: vocab-parallel embedding, head and loss; the logits stay split);
//               column (embedding dimension split, the tutorial's ShardSpec([-1]): the lookup
//               gathered, the tied head a row-parallel product summed over the group, the logits
//               whole); replicate
//   wpe         column (embedding dimension split, gathered); replicate
//   layer norms replicate only.
// A bias follows its weight (column: split with it; row: replicated, added after the sum).
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "colossal/config/train_config.h"  // TensorSplit, TensorSpecRule
#include "colossal/nn/models/gpt2.h"
#include "colossal/parallel/tp/spec_rules.h"  // ParameterSplit, split_name

namespace colossal::parallel::tp {

struct Gpt2BlockPlan {
  TensorSplit c_attn = TensorSplit::kColumn;
  TensorSplit attn_c_proj = TensorSplit::kRow;
  TensorSplit c_fc = TensorSplit::kColumn;
  TensorSplit mlp_c_proj = TensorSplit::kRow;
  friend bool operator==(const Gpt2BlockPlan&, const Gpt2BlockPlan&) = default;
  BlockSplits splits() const { return {c_attn, attn_c_proj, c_fc, mlp_c_proj}; }
};

struct Gpt2Plan {
  TensorSplit wte = TensorSplit::kVocab;
  TensorSplit wpe = TensorSplit::kReplicate;
  std::vector<Gpt2BlockPlan> blocks;  ///< one per layer

  /// The built-in policy (Megatron-LM's): heads and MLP column then row, wte by vocabulary rows,
  /// wpe and the layer norms replicated.
  static Gpt2Plan megatron(int64_t n_layer);
  bool is_megatron() const { return *this == megatron(static_cast<int64_t>(blocks.size())); }
  /// Whether the logits forward() returns are whole on every rank (not split by vocabulary).
  bool logits_whole() const { return wte != TensorSplit::kVocab; }
  friend bool operator==(const Gpt2Plan&, const Gpt2Plan&) = default;
};

struct ResolvedGpt2Plan {
  Gpt2Plan plan;
  std::vector<ParameterSplit> parameters;  ///< in the serial model's order
};

/// The plan that `rules` give a GPT-2 of `config` whose parameters are `parameter_names` (the serial
/// model's, in order), checked for `tensor_size` ranks (check_gpt2_plan). Each parameter takes the
/// first matching rule's spec; unmatched ones are replicated, but a bias follows its weight. Throws
/// naming the rule when it matches no parameter, and naming the parameter, its spec and what would
/// be valid when the assignment cannot be computed.
ResolvedGpt2Plan resolve_gpt2_specs(const std::vector<config::TensorSpecRule>& rules,
                                    const nn::models::GPT2Config& config,
                                    const std::vector<std::string>& parameter_names, int tensor_size);

/// The built-in policy for the parameters of a GPT-2, labelled so.
ResolvedGpt2Plan builtin_gpt2_plan(const nn::models::GPT2Config& config,
                                   const std::vector<std::string>& parameter_names);

/// Throws naming the parameter (h.0.attn.c_proj.weight), its spec and what would be valid when
/// the layers cannot compute `plan` at `tensor_size` ranks: a row split whose input is not split by
/// a column split before it, a column split of c_attn whose heads do not divide, features that do
/// not divide, a spec a layer does not take ("vocab" on a linear layer, "row" on an embedding).
void check_gpt2_plan(const Gpt2Plan& plan, const nn::models::GPT2Config& config, int tensor_size);

}  // namespace colossal::parallel::tp
