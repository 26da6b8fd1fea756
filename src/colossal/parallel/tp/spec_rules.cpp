// Sharding specs resolved against a model's parameters, and a transformer block's checks: see spec_rules.h.
#include "colossal/parallel/tp/spec_rules.h"

#include <fmt/format.h>

#include <map>
#include <memory>

#include "colossal/core/error.h"

namespace colossal::parallel::tp {
namespace {

std::string quoted(TensorSplit split) {
  return fmt::format("\"{}\"", split_name(split));
}

/// The layer a parameter belongs to and which of its tensors it is: "h.0.mlp.c_fc" and "weight".
std::pair<std::string, std::string> split_name_parts(const std::string& name) {
  const size_t dot = name.rfind('.');
  if (dot == std::string::npos) return {"", name};
  return {name.substr(0, dot), name.substr(dot + 1)};
}

/// Whether a bias given `bias` agrees with its weight's `weight` split.
bool bias_agrees(TensorSplit weight, TensorSplit bias) {
  switch (weight) {
    case TensorSplit::kColumn:
      return bias == TensorSplit::kColumn;
    case TensorSplit::kRow:  // replicated, added once after the sum
      return bias == TensorSplit::kRow || bias == TensorSplit::kReplicate;
    default:
      return bias == TensorSplit::kReplicate;
  }
}

/// What the rules say, owned by the SourceOf that messages read it through.
struct RuleTable {
  std::vector<config::TensorSpecRule> rules;
  std::map<std::string, size_t> rule_of;  ///< parameter -> its first matching rule

  std::string text(size_t r) const {
    return fmt::format("parallel.tensor.specs[{}] {{ pattern = \"{}\", spec = {} }}", r, rules[r].pattern,
                       quoted(rules[r].spec));
  }
};

}  // namespace

std::string_view split_name(TensorSplit split) {
  return config::to_string(split);
}

std::optional<std::pair<size_t, std::string>> block_layer(const std::string& layer, std::string_view prefix,
                                                          size_t num_blocks) {
  if (!layer.starts_with(prefix)) return std::nullopt;
  const size_t dot = layer.find('.', prefix.size());
  if (dot == std::string::npos || dot == prefix.size()) return std::nullopt;
  size_t block = 0;
  for (size_t i = prefix.size(); i < dot; ++i) {
    if (layer[i] < '0' || layer[i] > '9') return std::nullopt;
    block = block * 10 + static_cast<size_t>(layer[i] - '0');
    if (block >= num_blocks) return std::nullopt;
  }
  return std::pair{block, layer.substr(dot + 1)};
}

std::string spec_of(const std::string& weight, TensorSplit split, const SourceOf& source) {
  return fmt::format("{}: spec {}{}", weight, quoted(split), source ? source(weight) : "");
}

std::vector<ParameterSplit> builtin_splits(const std::vector<std::string>& names, const SpecSlots& slots) {
  std::vector<ParameterSplit> parameters;
  for (const std::string& name : names) {
    const auto [layer, tensor] = split_name_parts(name);
    const TensorSplit* slot = slots.slot_of(layer);
    TensorSplit split = slot ? *slot : TensorSplit::kReplicate;
    if (tensor == "bias" && split == TensorSplit::kRow) split = TensorSplit::kReplicate;
    parameters.push_back({name, split, "built-in policy"});
  }
  return parameters;
}

AppliedSpecs apply_spec_rules(const std::vector<config::TensorSpecRule>& rules, const std::vector<std::string>& names,
                              const SpecSlots& slots) {
  // 1. Each parameter's first matching rule.
  auto table = std::make_shared<RuleTable>();
  table->rules = rules;
  std::vector<size_t> matched(rules.size(), 0), taken(rules.size(), 0);
  for (const std::string& name : names) {
    bool first = true;
    for (size_t r = 0; r < rules.size(); ++r) {
      if (!rules[r].matches(name)) continue;
      ++matched[r];
      if (first) {
        table->rule_of.emplace(name, r);
        ++taken[r];
        first = false;
      }
    }
  }
  for (size_t r = 0; r < rules.size(); ++r) {
    if (matched[r] == 0) {
      COLOSSAL_FAIL("{} matches no parameter of the model. {}{}", table->text(r), slots.names_like,
                    rules[r].pattern.starts_with("transformer.") ? " (without Hugging Face's \"transformer.\" prefix)"
                                                                 : "; `*` matches any characters, dots included");
    }
    COLOSSAL_CHECK(taken[r] > 0,
                   "{} takes no parameter: each of the {} it matches takes an earlier rule's spec (the first "
                   "matching rule wins); move it up or drop it",
                   table->text(r), matched[r]);
  }
  AppliedSpecs applied;
  applied.source = [table](const std::string& name) -> std::string {
    auto it = table->rule_of.find(name);
    return it == table->rule_of.end() ? std::string(" (no rule: replicated)")
                                      : fmt::format(" (from {})", table->text(it->second));
  };
  const SourceOf& source = applied.source;
  const auto explicit_split = [&](const std::string& name) -> const TensorSplit* {
    auto it = table->rule_of.find(name);
    return it == table->rule_of.end() ? nullptr : &rules[it->second].spec;
  };
  const auto rule_label = [&](const std::string& name) { return fmt::format("rule {}", table->rule_of.at(name)); };

  // 2. Each layer's split is its weight's; a bias follows it.
  for (const std::string& name : names) {
    const auto [layer, tensor] = split_name_parts(name);
    const TensorSplit* split = explicit_split(name);
    if (tensor != "weight" || split == nullptr) continue;
    if (TensorSplit* slot = slots.slot_of(layer)) *slot = *split;
  }
  for (const std::string& name : names) {
    const auto [layer, tensor] = split_name_parts(name);
    const TensorSplit* slot = slots.slot_of(layer);
    const TensorSplit* given = explicit_split(name);
    if (tensor == "weight" || slot == nullptr) {
      const TensorSplit split = given ? *given : TensorSplit::kReplicate;
      COLOSSAL_CHECK(split == TensorSplit::kReplicate || slot != nullptr, "{}: {}. Valid: \"replicate\"",
                     spec_of(name, split, source), slots.why_whole(name));
      applied.parameters.push_back({name, split, given ? rule_label(name) : "no rule"});
      continue;
    }
    // A bias: its weight's split, unless a rule says otherwise (then they must agree).
    const TensorSplit weight = *slot;
    const std::string weight_name = layer + ".weight";
    if (given != nullptr) {
      COLOSSAL_CHECK(bias_agrees(weight, *given),
                     "{} disagrees with its weight's: {} is {}{}. A bias follows its weight: split with a "
                     "\"column\" weight, whole (added after the sum) with a \"row\" one, whole with a "
                     "\"replicate\" one. Valid for {}: {}",
                     spec_of(name, *given, source), weight_name, quoted(weight), source(weight_name), name,
                     weight == TensorSplit::kColumn ? "\"column\""
                     : weight == TensorSplit::kRow  ? "\"row\" or \"replicate\""
                                                    : "\"replicate\"");
    }
    const TensorSplit split = weight == TensorSplit::kRow ? TensorSplit::kReplicate : weight;
    applied.parameters.push_back({name, split, given ? rule_label(name) : "follows " + weight_name});
  }
  return applied;
}

void check_block_plan(const BlockLayers& layers, const BlockSplits& splits, int tp, const SourceOf& source) {
  const auto divides = [&](const std::string& weight, TensorSplit split, int64_t features) {
    COLOSSAL_CHECK(features % tp == 0,
                   "{} splits the output features ({} of them) over parallel.tensor.size = {} ranks, which does not "
                   "divide {}; valid: \"replicate\", or a parallel.tensor.size that divides {}",
                   spec_of(weight, split, source), features, tp, features, features);
  };
  // A linear layer whose input is a layer norm's whole output: column or replicate.
  const auto first_of_pair = [&](const std::string& weight, TensorSplit split, const std::string& input,
                                 const char* column_meaning) {
    if (split == TensorSplit::kRow) {
      COLOSSAL_FAIL(
          "{} splits its input features, which must come split from a \"column\" split before it, but its input is "
          "{}'s whole output. Valid here: \"column\" ({}) or \"replicate\"",
          spec_of(weight, split, source), input, column_meaning);
    }
    if (split == TensorSplit::kVocab) {
      COLOSSAL_FAIL(
          "{}: \"vocab\" splits a vocabulary embedding's rows only (GPT-2's wte). Valid here: \"column\" ({}) or "
          "\"replicate\"",
          spec_of(weight, split, source), column_meaning);
    }
  };
  // The layer after it: row needs the first one split by column.
  const auto second_of_pair = [&](const std::string& weight, TensorSplit split, const std::string& before,
                                  TensorSplit before_split) {
    if (split == TensorSplit::kVocab) {
      COLOSSAL_FAIL(
          "{}: \"vocab\" splits a vocabulary embedding's rows only (GPT-2's wte). Valid here: \"row\" (after a "
          "\"column\" {}), \"column\" or "
          "\"replicate\"",
          spec_of(weight, split, source), before);
    }
    if (split == TensorSplit::kRow && before_split != TensorSplit::kColumn) {
      COLOSSAL_FAIL(
          "{} splits its input features, which must come split from a \"column\" split before it, but {} is {}{}. "
          "Valid: \"column\" or \"replicate\" for {}, or \"column\" for {}",
          spec_of(weight, split, source), before, quoted(before_split), source ? source(before) : "", weight, before);
    }
  };
  first_of_pair(layers.attn_in, splits.attn_in, layers.norm1, "whole heads per rank");
  if (splits.attn_in == TensorSplit::kColumn) {
    COLOSSAL_CHECK(layers.heads % tp == 0,
                   "{} splits attention by whole heads (each rank its heads' q, k and v), but {} = {} heads do "
                   "not split over parallel.tensor.size = {} ranks. Valid: \"replicate\", or a parallel.tensor.size "
                   "that divides {}",
                   spec_of(layers.attn_in, splits.attn_in, source), layers.heads_key, layers.heads, tp, layers.heads);
  }
  second_of_pair(layers.attn_out, splits.attn_out, layers.attn_in, splits.attn_in);
  if (splits.attn_out == TensorSplit::kColumn) divides(layers.attn_out, splits.attn_out, layers.width);
  first_of_pair(layers.mlp_in, splits.mlp_in, layers.norm2, "the hidden features");
  if (splits.mlp_in == TensorSplit::kColumn) divides(layers.mlp_in, splits.mlp_in, layers.hidden);
  second_of_pair(layers.mlp_out, splits.mlp_out, layers.mlp_in, splits.mlp_in);
  if (splits.mlp_out == TensorSplit::kColumn) divides(layers.mlp_out, splits.mlp_out, layers.width);
}

}  // namespace colossal::parallel::tp
