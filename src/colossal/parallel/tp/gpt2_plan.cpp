// GPT-2's tensor-parallel plan from the built-in policy or per-parameter specs: see gpt2_plan.h.
#include "colossal/parallel/tp/gpt2_plan.h"

#include <fmt/format.h>

#include <functional>
#include <map>
#include <optional>

#include "colossal/core/error.h"

namespace colossal::parallel::tp {
namespace {

/// Where a parameter's spec came from, for messages: " (rule 1: \"h.*\")" or "".
using SourceOf = std::function<std::string(const std::string& parameter)>;

std::string quoted(TensorSplit split) {
  return fmt::format("\"{}\"", split_name(split));
}

/// "column", "row" ... of a layer's spec in messages: `name`'s weight with its source.
std::string spec_of(const std::string& weight, TensorSplit split, const SourceOf& source) {
  return fmt::format("{}: spec {}{}", weight, quoted(split), source ? source(weight) : "");
}

void check_plan(const Gpt2Plan& plan, const nn::models::GPT2Config& config, int tp, const SourceOf& source) {
  COLOSSAL_CHECK(static_cast<int64_t>(plan.blocks.size()) == config.n_layer,
                 "tensor-parallel GPT-2: a plan for {} blocks, the model has n_layer = {}", plan.blocks.size(),
                 config.n_layer);
  const auto divides = [&](const std::string& weight, TensorSplit split, int64_t features, const char* what) {
    COLOSSAL_CHECK(features % tp == 0,
                   "{} splits the {} ({} of them) over parallel.tensor.size = {} ranks, which does not divide {}; "
                   "valid: \"replicate\", or a parallel.tensor.size that divides {}",
                   spec_of(weight, split, source), what, features, tp, features, features);
  };
  // The embeddings.
  if (plan.wte == TensorSplit::kRow) {
    COLOSSAL_FAIL(
        "{} splits a linear layer's input features; to split the embedding's rows (the vocabulary) use \"vocab\". "
        "Valid for wte: \"vocab\", \"column\" (the embedding dimension) or \"replicate\"",
        spec_of("wte.weight", plan.wte, source));
  }
  if (plan.wte == TensorSplit::kColumn) divides("wte.weight", plan.wte, config.n_embd, "embedding dimension");
  if (plan.wpe == TensorSplit::kRow || plan.wpe == TensorSplit::kVocab) {
    COLOSSAL_FAIL(
        "{}: the position embedding splits along its embedding dimension only. Valid for wpe: \"column\" or "
        "\"replicate\"",
        spec_of("wpe.weight", plan.wpe, source));
  }
  if (plan.wpe == TensorSplit::kColumn) divides("wpe.weight", plan.wpe, config.n_embd, "embedding dimension");

  for (size_t i = 0; i < plan.blocks.size(); ++i) {
    const Gpt2BlockPlan& b = plan.blocks[i];
    const std::string h = fmt::format("h.{}.", i);
    const std::string c_attn = h + "attn.c_attn.weight", attn_proj = h + "attn.c_proj.weight";
    const std::string c_fc = h + "mlp.c_fc.weight", mlp_proj = h + "mlp.c_proj.weight";
    // A linear layer whose input is a layer norm's whole output: column or replicate.
    const auto first_of_pair = [&](const std::string& weight, TensorSplit split, const char* input,
                                   const char* column_meaning) {
      if (split == TensorSplit::kRow) {
        COLOSSAL_FAIL(
            "{} splits its input features, which must come split from a \"column\" split before it, but its input is "
            "{}'s whole output. Valid here: \"column\" ({}) or \"replicate\"",
            spec_of(weight, split, source), input, column_meaning);
      }
      if (split == TensorSplit::kVocab) {
        COLOSSAL_FAIL("{}: \"vocab\" splits wte's rows only. Valid here: \"column\" ({}) or \"replicate\"",
                      spec_of(weight, split, source), column_meaning);
      }
    };
    // The layer after it: row needs the first one split by column.
    const auto second_of_pair = [&](const std::string& weight, TensorSplit split, const std::string& before,
                                    TensorSplit before_split) {
      if (split == TensorSplit::kVocab) {
        COLOSSAL_FAIL(
            "{}: \"vocab\" splits wte's rows only. Valid here: \"row\" (after a \"column\" {}), "
            "\"column\" or \"replicate\"",
            spec_of(weight, split, source), before);
      }
      if (split == TensorSplit::kRow && before_split != TensorSplit::kColumn) {
        COLOSSAL_FAIL(
            "{} splits its input features, which must come split from a \"column\" split before it, but {} is {}{}. "
            "Valid: \"column\" or \"replicate\" for {}, or \"column\" for {}",
            spec_of(weight, split, source), before, quoted(before_split), source ? source(before) : "", weight, before);
      }
    };
    first_of_pair(c_attn, b.c_attn, (h + "ln_1").c_str(), "whole heads per rank");
    if (b.c_attn == TensorSplit::kColumn) {
      COLOSSAL_CHECK(config.n_head % tp == 0,
                     "{} splits attention by whole heads (each rank its heads' q, k and v), but n_head = {} heads do "
                     "not split over parallel.tensor.size = {} ranks. Valid: \"replicate\", or a parallel.tensor.size "
                     "that divides {}",
                     spec_of(c_attn, b.c_attn, source), config.n_head, tp, config.n_head);
    }
    second_of_pair(attn_proj, b.attn_c_proj, c_attn, b.c_attn);
    if (b.attn_c_proj == TensorSplit::kColumn) divides(attn_proj, b.attn_c_proj, config.n_embd, "output features");
    first_of_pair(c_fc, b.c_fc, (h + "ln_2").c_str(), "the hidden features");
    if (b.c_fc == TensorSplit::kColumn) divides(c_fc, b.c_fc, 4 * config.n_embd, "output features");
    second_of_pair(mlp_proj, b.mlp_c_proj, c_fc, b.c_fc);
    if (b.mlp_c_proj == TensorSplit::kColumn) divides(mlp_proj, b.mlp_c_proj, config.n_embd, "output features");
  }
}

/// The layer a parameter belongs to and which of its tensors it is: "h.0.mlp.c_fc" and "weight".
std::pair<std::string, std::string> split_name_parts(const std::string& name) {
  const size_t dot = name.rfind('.');
  if (dot == std::string::npos) return {"", name};
  return {name.substr(0, dot), name.substr(dot + 1)};
}

/// The plan's slot for a layer, or null for one that only replicates (layer norms).
TensorSplit* slot_of(Gpt2Plan& plan, const std::string& layer) {
  if (layer == "wte") return &plan.wte;
  if (layer == "wpe") return &plan.wpe;
  int64_t block = -1;
  char rest[64] = {};
  if (std::sscanf(layer.c_str(), "h.%ld.%63s", &block, rest) != 2 || block < 0 ||
      block >= static_cast<int64_t>(plan.blocks.size())) {
    return nullptr;
  }
  Gpt2BlockPlan& b = plan.blocks[static_cast<size_t>(block)];
  const std::string part = rest;
  if (part == "attn.c_attn") return &b.c_attn;
  if (part == "attn.c_proj") return &b.attn_c_proj;
  if (part == "mlp.c_fc") return &b.c_fc;
  if (part == "mlp.c_proj") return &b.mlp_c_proj;
  return nullptr;
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

}  // namespace

std::string_view split_name(TensorSplit split) {
  return config::to_string(split);
}

Gpt2Plan Gpt2Plan::megatron(int64_t n_layer) {
  Gpt2Plan plan;
  plan.blocks.assign(static_cast<size_t>(n_layer), Gpt2BlockPlan{});
  return plan;
}

void check_gpt2_plan(const Gpt2Plan& plan, const nn::models::GPT2Config& config, int tensor_size) {
  check_plan(plan, config, tensor_size, nullptr);
}

ResolvedGpt2Plan builtin_gpt2_plan(const nn::models::GPT2Config& config,
                                   const std::vector<std::string>& parameter_names) {
  ResolvedGpt2Plan resolved;
  resolved.plan = Gpt2Plan::megatron(config.n_layer);
  for (const std::string& name : parameter_names) {
    const auto [layer, tensor] = split_name_parts(name);
    TensorSplit* slot = slot_of(resolved.plan, layer);
    TensorSplit split = slot ? *slot : TensorSplit::kReplicate;
    if (tensor == "bias" && split == TensorSplit::kRow) split = TensorSplit::kReplicate;
    resolved.parameters.push_back({name, split, "built-in policy"});
  }
  return resolved;
}

ResolvedGpt2Plan resolve_gpt2_specs(const std::vector<config::TensorSpecRule>& rules,
                                    const nn::models::GPT2Config& config,
                                    const std::vector<std::string>& parameter_names, int tensor_size) {
  // 1. Each parameter's first matching rule.
  std::map<std::string, size_t> rule_of;  // parameter -> rule index
  std::vector<size_t> matched(rules.size(), 0), taken(rules.size(), 0);
  for (const std::string& name : parameter_names) {
    bool first = true;
    for (size_t r = 0; r < rules.size(); ++r) {
      if (!rules[r].matches(name)) continue;
      ++matched[r];
      if (first) {
        rule_of.emplace(name, r);
        ++taken[r];
        first = false;
      }
    }
  }
  const auto rule_text = [&](size_t r) {
    return fmt::format("parallel.tensor.specs[{}] {{ pattern = \"{}\", spec = {} }}", r, rules[r].pattern,
                       quoted(rules[r].spec));
  };
  for (size_t r = 0; r < rules.size(); ++r) {
    if (matched[r] == 0) {
      COLOSSAL_FAIL("{} matches no parameter of the model. GPT-2's parameters are named like {}, {} and {}{}",
                    rule_text(r), "\"wte.weight\"", "\"h.0.attn.c_attn.weight\"", "\"h.11.mlp.c_proj.bias\"",
                    rules[r].pattern.starts_with("transformer.") ? " (without Hugging Face's \"transformer.\" prefix)"
                                                                 : "; `*` matches any characters, dots included");
    }
    COLOSSAL_CHECK(taken[r] > 0,
                   "{} takes no parameter: each of the {} it matches takes an earlier rule's spec (the first "
                   "matching rule wins); move it up or drop it",
                   rule_text(r), matched[r]);
  }
  const SourceOf source = [&](const std::string& name) -> std::string {
    auto it = rule_of.find(name);
    return it == rule_of.end() ? std::string(" (no rule: replicated)")
                               : fmt::format(" (from {})", rule_text(it->second));
  };

  // 2. Each layer's split is its weight's; a bias follows it.
  ResolvedGpt2Plan resolved;
  resolved.plan.wte = resolved.plan.wpe = TensorSplit::kReplicate;
  resolved.plan.blocks.assign(static_cast<size_t>(config.n_layer),
                              Gpt2BlockPlan{TensorSplit::kReplicate, TensorSplit::kReplicate, TensorSplit::kReplicate,
                                            TensorSplit::kReplicate});
  std::map<std::string, TensorSplit> explicit_split;
  for (const auto& [name, r] : rule_of) explicit_split.emplace(name, rules[r].spec);
  for (const std::string& name : parameter_names) {
    const auto [layer, tensor] = split_name_parts(name);
    if (tensor != "weight") continue;
    auto it = explicit_split.find(name);
    if (it == explicit_split.end()) continue;
    TensorSplit* slot = slot_of(resolved.plan, layer);
    if (slot == nullptr) {
      COLOSSAL_CHECK(it->second == TensorSplit::kReplicate,
                     "{}: {} stays whole in 1D tensor parallelism (layer norms hold a scale and a shift per "
                     "feature of an unsplit activation). Valid: \"replicate\"",
                     spec_of(name, it->second, source), layer);
      continue;
    }
    *slot = it->second;
  }
  for (const std::string& name : parameter_names) {
    const auto [layer, tensor] = split_name_parts(name);
    TensorSplit* slot = slot_of(resolved.plan, layer);
    const TensorSplit weight = slot ? *slot : TensorSplit::kReplicate;
    auto it = explicit_split.find(name);
    if (tensor == "weight" || slot == nullptr) {
      const TensorSplit split = it == explicit_split.end() ? TensorSplit::kReplicate : it->second;
      COLOSSAL_CHECK(split == TensorSplit::kReplicate || slot != nullptr,
                     "{}: {} stays whole in 1D tensor parallelism (layer norms hold a scale and a shift per feature "
                     "of an unsplit activation). Valid: \"replicate\"",
                     spec_of(name, split, source), layer);
      resolved.parameters.push_back(
          {name, split, it == explicit_split.end() ? "no rule" : fmt::format("rule {}", rule_of.at(name))});
      continue;
    }
    // A bias: its weight's split, unless a rule says otherwise (then they must agree).
    const std::string weight_name = layer + ".weight";
    if (it != explicit_split.end()) {
      COLOSSAL_CHECK(bias_agrees(weight, it->second),
                     "{} disagrees with its weight's: {} is {}{}. A bias follows its weight: split with a "
                     "\"column\" weight, whole (added after the sum) with a \"row\" one, whole with a "
                     "\"replicate\" one. Valid for {}: {}",
                     spec_of(name, it->second, source), weight_name, quoted(weight), source(weight_name), name,
                     weight == TensorSplit::kColumn ? "\"column\""
                     : weight == TensorSplit::kRow  ? "\"row\" or \"replicate\""
                                                    : "\"replicate\"");
    }
    const TensorSplit split = weight == TensorSplit::kRow ? TensorSplit::kReplicate : weight;
    resolved.parameters.push_back(
        {name, split,
         it != explicit_split.end() ? fmt::format("rule {}", rule_of.at(name)) : "follows " + weight_name});
  }
  check_plan(resolved.plan, config, tensor_size, source);
  return resolved;
}

}  // namespace colossal::parallel::tp
