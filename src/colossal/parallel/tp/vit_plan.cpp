// The ViT's tensor-parallel plan from the built-in policy or per-parameter specs: see vit_plan.h.
#include "colossal/parallel/tp/vit_plan.h"

#include <fmt/format.h>

#include "colossal/core/error.h"

namespace colossal::parallel::tp {
namespace {

void check_plan(const VitPlan& plan, const nn::models::ViTConfig& config, int tp, const SourceOf& source) {
  COLOSSAL_CHECK(static_cast<int64_t>(plan.blocks.size()) == config.depth,
                 "tensor-parallel ViT: a plan for {} blocks, the model has depth = {}", plan.blocks.size(),
                 config.depth);
  for (size_t i = 0; i < plan.blocks.size(); ++i) {
    const std::string b = fmt::format("blocks.{}.", i);
    const BlockLayers layers{.attn_in = b + "attn.qkv.weight",
                             .attn_out = b + "attn.proj.weight",
                             .mlp_in = b + "mlp.fc1.weight",
                             .mlp_out = b + "mlp.fc2.weight",
                             .norm1 = b + "norm1",
                             .norm2 = b + "norm2",
                             .heads = config.num_heads,
                             .heads_key = "the ViT's num_heads",
                             .width = config.embed_dim,
                             .hidden = config.mlp_hidden()};
    check_block_plan(layers, plan.blocks[i], tp, source);
  }
}

/// The ViT's layers that take a spec: each block's four linear layers.
SpecSlots vit_slots(VitPlan& plan) {
  SpecSlots slots;
  slots.slot_of = [&plan](const std::string& layer) -> TensorSplit* {
    const auto found = block_layer(layer, "blocks.", plan.blocks.size());
    if (!found) return nullptr;
    VitBlockPlan& b = plan.blocks[found->first];
    const std::string& part = found->second;
    if (part == "attn.qkv") return &b.attn_in;
    if (part == "attn.proj") return &b.attn_out;
    if (part == "mlp.fc1") return &b.mlp_in;
    if (part == "mlp.fc2") return &b.mlp_out;
    return nullptr;
  };
  slots.why_whole = [](const std::string& name) -> std::string {
    if (name.starts_with("patch_embed.")) {
      return "the patch embedding stays whole in the ViT's 1D tensor parallelism (a convolution over the whole image, "
             "a few percent of the FLOPs, replicated as in Colossal-AI's and Megatron's ViT)";
    }
    if (name == "cls_token" || name == "pos_embed") {
      return fmt::format("{} stays whole in the ViT's 1D tensor parallelism (added to whole tokens before the blocks)",
                         name);
    }
    if (name.starts_with("head.")) {
      return "the classifier head stays whole in the ViT's 1D tensor parallelism, so the logits are whole on every "
             "rank for the serial criterion and top-k accuracy";
    }
    return fmt::format(
        "{} stays whole in 1D tensor parallelism (layer norms hold a scale and a shift per feature of an unsplit "
        "activation)",
        name.substr(0, name.rfind('.')));
  };
  slots.names_like =
      "The ViT's parameters are named as timm's: \"blocks.0.attn.qkv.weight\", \"blocks.0.mlp.fc1.bias\" "
      "and \"blocks.11.mlp.fc2.weight\"";
  return slots;
}

}  // namespace

VitPlan VitPlan::megatron(int64_t depth) {
  VitPlan plan;
  plan.blocks.assign(static_cast<size_t>(depth), VitBlockPlan{});
  return plan;
}

void check_vit_plan(const VitPlan& plan, const nn::models::ViTConfig& config, int tensor_size) {
  check_plan(plan, config, tensor_size, nullptr);
}

ResolvedVitPlan builtin_vit_plan(const nn::models::ViTConfig& config, const std::vector<std::string>& parameter_names) {
  ResolvedVitPlan resolved;
  resolved.plan = VitPlan::megatron(config.depth);
  resolved.parameters = builtin_splits(parameter_names, vit_slots(resolved.plan));
  return resolved;
}

ResolvedVitPlan resolve_vit_specs(const std::vector<config::TensorSpecRule>& rules, const nn::models::ViTConfig& config,
                                  const std::vector<std::string>& parameter_names, int tensor_size) {
  ResolvedVitPlan resolved;
  const TensorSplit r = TensorSplit::kReplicate;
  resolved.plan.blocks.assign(static_cast<size_t>(config.depth), VitBlockPlan{r, r, r, r});
  AppliedSpecs applied = apply_spec_rules(rules, parameter_names, vit_slots(resolved.plan));
  resolved.parameters = std::move(applied.parameters);
  check_plan(resolved.plan, config, tensor_size, applied.source);
  return resolved;
}

}  // namespace colossal::parallel::tp
