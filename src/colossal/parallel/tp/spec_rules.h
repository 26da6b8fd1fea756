// Per-parameter sharding specs (parallel.tensor.specs) resolved against any model's parameters, and
// the checks a transformer block's four linear layers share: the model-independent half of the plans
// of GPT-2 (gpt2_plan.h) and the ViT (vit_plan.h).
//
// A model says which of its layers can split (a slot per layer that takes a spec: "h.0.mlp.c_fc"),
// and why the others stay whole; apply_spec_rules gives every parameter the first matching rule's
// spec, fills each layer's slot from its weight's, lets a bias follow its weight (whole after a "row"
// weight, added once after the sum) and says for every parameter where its spec came from. The
// model's plan checks the result (check_block_plan for each block) with messages that name the
// parameter, its spec, the rule it came from and what would be valid.
#pragma once

#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "colossal/config/train_config.h"  // TensorSplit, TensorSpecRule

namespace colossal::parallel::tp {

using config::TensorSplit;

/// One parameter's resolved spec and where it came from, for messages and `colossal describe`.
struct ParameterSplit {
  std::string name;
  TensorSplit split = TensorSplit::kReplicate;
  std::string source;  ///< "rule 2", "follows h.0.mlp.c_fc.weight", "no rule", "built-in policy"
};

/// Where a parameter's spec came from, for messages: " (from parallel.tensor.specs[1] {...})", or "".
using SourceOf = std::function<std::string(const std::string& parameter)>;

/// What a model offers the rules.
struct SpecSlots {
  /// The plan's slot for the layer named `layer` ("h.0.mlp.c_fc", a parameter's name without its last
  /// part), or null for a layer that only replicates.
  std::function<TensorSplit*(const std::string& layer)> slot_of;
  /// Why the parameter named `name` (of a layer without a slot) stays whole, for the error a split
  /// spec on it gives.
  std::function<std::string(const std::string& name)> why_whole;
  /// "GPT-2's parameters are named like ...": the model and three example names, for a rule that
  /// matches nothing.
  std::string names_like;
};

struct AppliedSpecs {
  std::vector<ParameterSplit> parameters;  ///< in `names`' order
  SourceOf source;                         ///< for the plan's checks; owns what it reads
};

/// Applies `rules` to the parameters `names` (the serial model's, in order): each layer's slot (set
/// to "replicate" by the caller first) takes its weight's first matching rule's spec; unmatched
/// parameters are replicated, but a bias follows its weight. Throws naming the rule when it matches
/// no parameter or takes none (an earlier rule wins every one), and naming the parameter, its spec
/// and what would be valid when a whole layer's parameter is split or a bias disagrees with its weight.
AppliedSpecs apply_spec_rules(const std::vector<config::TensorSpecRule>& rules, const std::vector<std::string>& names,
                              const SpecSlots& slots);

/// Every parameter of `names` with its layer's slot's split (a "row" layer's bias whole), labelled
/// "built-in policy": what the built-in plan the slots hold gives.
std::vector<ParameterSplit> builtin_splits(const std::vector<std::string>& names, const SpecSlots& slots);

/// Block `i` and the rest of a layer's name under `prefix` ("h." or "blocks."): "h.3.mlp.c_fc" gives 3
/// and "mlp.c_fc"; nothing for another name or a block past `num_blocks`.
std::optional<std::pair<size_t, std::string>> block_layer(const std::string& layer, std::string_view prefix,
                                                          size_t num_blocks);

/// "column", "row", ...
std::string_view split_name(TensorSplit split);

/// "h.0.attn.c_proj.weight: spec \"row\" (from ...)" for messages.
std::string spec_of(const std::string& weight, TensorSplit split, const SourceOf& source);

/// A transformer block's four linear layers by their weights' names, in compute order, and the sizes
/// their splits must divide.
struct BlockLayers {
  std::string attn_in;       ///< the fused q/k/v projection (c_attn, qkv)
  std::string attn_out;      ///< attention's output projection (attn.c_proj, proj)
  std::string mlp_in;        ///< the MLP's first layer (c_fc, fc1)
  std::string mlp_out;       ///< its second (mlp.c_proj, fc2)
  std::string norm1, norm2;  ///< the layer norms before attention and before the MLP
  int64_t heads = 0;
  std::string heads_key;  ///< how the user sets the heads: "n_head", "the ViT's num_heads"
  int64_t width = 0;      ///< the block's features (n_embd, embed_dim)
  int64_t hidden = 0;     ///< the MLP's hidden features
};

struct BlockSplits {
  TensorSplit attn_in = TensorSplit::kColumn;
  TensorSplit attn_out = TensorSplit::kRow;
  TensorSplit mlp_in = TensorSplit::kColumn;
  TensorSplit mlp_out = TensorSplit::kRow;
  friend bool operator==(const BlockSplits&, const BlockSplits&) = default;
};

/// Throws naming the parameter, its spec (with `source`) and what would be valid when the block's
/// layers cannot compute `splits` over `tensor_size` ranks: a "row" split whose input does not come
/// split by a "column" layer before it, a "column" q/k/v projection whose heads do not divide, a
/// "column" layer whose output features do not, a "vocab" spec on a linear layer.
void check_block_plan(const BlockLayers& layers, const BlockSplits& splits, int tensor_size, const SourceOf& source);

}  // namespace colossal::parallel::tp
