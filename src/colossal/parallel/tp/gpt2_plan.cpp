// GPT-2's tensor-parallel plan from the built-in policy or per-parameter specs: see gpt2_plan.h.
#include "colossal/parallel/tp/gpt2_plan.h"

#include <fmt/format.h>

#include "colossal/core/error.h"

namespace colossal::parallel::tp {
namespace {

void check_plan(const Gpt2Plan& plan, const nn::models::GPT2Config& config, int tp, const SourceOf& source) {
  COLOSSAL_CHECK(static_cast<int64_t>(plan.blocks.size()) == config.n_layer,
                 "tensor-parallel GPT-2: a plan for {} blocks, the model has n_layer = {}", plan.blocks.size(),
                 config.n_layer);
  const auto divides = [&](const std::string& weight, TensorSplit split) {
    COLOSSAL_CHECK(config.n_embd % tp == 0,
                   "{} splits the embedding dimension ({} of them) over parallel.tensor.size = {} ranks, which does "
                   "not divide {}; valid: \"replicate\", or a parallel.tensor.size that divides {}",
                   spec_of(weight, split, source), config.n_embd, tp, config.n_embd, config.n_embd);
  };
  // The embeddings.
  if (plan.wte == TensorSplit::kRow) {
    COLOSSAL_FAIL(
        "{} splits a linear layer's input features; to split the embedding's rows (the vocabulary) use \"vocab\". "
        "Valid for wte: \"vocab\", \"column\" (the embedding dimension) or \"replicate\"",
        spec_of("wte.weight", plan.wte, source));
  }
  if (plan.wte == TensorSplit::kColumn) divides("wte.weight", plan.wte);
  if (plan.wpe == TensorSplit::kRow || plan.wpe == TensorSplit::kVocab) {
    COLOSSAL_FAIL(
        "{}: the position embedding splits along its embedding dimension only. Valid for wpe: \"column\" or "
        "\"replicate\"",
        spec_of("wpe.weight", plan.wpe, source));
  }
  if (plan.wpe == TensorSplit::kColumn) divides("wpe.weight", plan.wpe);

  for (size_t i = 0; i < plan.blocks.size(); ++i) {
    const std::string h = fmt::format("h.{}.", i);
    const BlockLayers layers{.attn_in = h + "attn.c_attn.weight",
                             .attn_out = h + "attn.c_proj.weight",
                             .mlp_in = h + "mlp.c_fc.weight",
                             .mlp_out = h + "mlp.c_proj.weight",
                             .norm1 = h + "ln_1",
                             .norm2 = h + "ln_2",
                             .heads = config.n_head,
                             .heads_key = "n_head",
                             .width = config.n_embd,
                             .hidden = 4 * config.n_embd};
    check_block_plan(layers, plan.blocks[i].splits(), tp, source);
  }
}

/// GPT-2's layers that take a spec: the embeddings and each block's four linear layers.
SpecSlots gpt2_slots(Gpt2Plan& plan) {
  SpecSlots slots;
  slots.slot_of = [&plan](const std::string& layer) -> TensorSplit* {
    if (layer == "wte") return &plan.wte;
    if (layer == "wpe") return &plan.wpe;
    const auto found = block_layer(layer, "h.", plan.blocks.size());
    if (!found) return nullptr;
    Gpt2BlockPlan& b = plan.blocks[found->first];
    const std::string& part = found->second;
    if (part == "attn.c_attn") return &b.c_attn;
    if (part == "attn.c_proj") return &b.attn_c_proj;
    if (part == "mlp.c_fc") return &b.c_fc;
    if (part == "mlp.c_proj") return &b.mlp_c_proj;
    return nullptr;
  };
  slots.why_whole = [](const std::string& name) {
    return fmt::format(
        "{} stays whole in 1D tensor parallelism (layer norms hold a scale and a shift per feature of an unsplit "
        "activation)",
        name.substr(0, name.rfind('.')));
  };
  slots.names_like =
      "GPT-2's parameters are named like \"wte.weight\", \"h.0.attn.c_attn.weight\" and "
      "\"h.11.mlp.c_proj.bias\"";
  return slots;
}

}  // namespace

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
  resolved.parameters = builtin_splits(parameter_names, gpt2_slots(resolved.plan));
  return resolved;
}

ResolvedGpt2Plan resolve_gpt2_specs(const std::vector<config::TensorSpecRule>& rules,
                                    const nn::models::GPT2Config& config,
                                    const std::vector<std::string>& parameter_names, int tensor_size) {
  ResolvedGpt2Plan resolved;
  resolved.plan.wte = resolved.plan.wpe = TensorSplit::kReplicate;
  const TensorSplit r = TensorSplit::kReplicate;
  resolved.plan.blocks.assign(static_cast<size_t>(config.n_layer), Gpt2BlockPlan{r, r, r, r});
  AppliedSpecs applied = apply_spec_rules(rules, parameter_names, gpt2_slots(resolved.plan));
  resolved.parameters = std::move(applied.parameters);
  check_plan(resolved.plan, config, tensor_size, applied.source);
  return resolved;
}

}  // namespace colossal::parallel::tp
