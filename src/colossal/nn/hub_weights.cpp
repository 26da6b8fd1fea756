// Hub weights: see hub_weights.h.
#include "colossal/nn/hub_weights.h"

#include <fmt/format.h>

#include <regex>

#include "colossal/core/error.h"
#include "colossal/nn/safetensors.h"

namespace colossal::nn {
namespace {

constexpr std::string_view kTransformerPrefix = "transformer.";

bool any_key_starts_with(const StateDict& dict, std::string_view prefix) {
  for (const auto& [name, tensor] : dict) {
    if (name.starts_with(prefix)) return true;
  }
  return false;
}

bool same_values(const Tensor& a, const Tensor& b) {
  if (a.shape() != b.shape()) return false;
  return a.to(DType::f64).to_vector<double>() == b.to(DType::f64).to_vector<double>();
}

}  // namespace

StateDict hub_to_model_names(const Module& model, const StateDict& hub, HubImportReport* report) {
  const StateDict own = model.state_dict();
  const bool strip = !any_key_starts_with(own, kTransformerPrefix) && any_key_starts_with(hub, kTransformerPrefix);
  // GPT-2's causal mask, saved as buffers by older transformers releases.
  static const std::regex mask_buffer(R"((^|\.)h\.\d+\.attn\.(masked_)?bias$)");
  StateDict renamed;
  for (const auto& [name, tensor] : hub) {
    std::string ours = strip && name.starts_with(kTransformerPrefix) ? name.substr(kTransformerPrefix.size()) : name;
    if (!own.contains(ours) && std::regex_search(ours, mask_buffer)) {
      if (report != nullptr) report->dropped.push_back(name + " (attention mask buffer)");
      continue;
    }
    renamed.insert(std::move(ours), tensor);
  }
  if (const Tensor* head = renamed.find("lm_head.weight"); head != nullptr && !own.contains("lm_head.weight")) {
    const Tensor* wte = renamed.find("wte.weight");
    COLOSSAL_CHECK(wte != nullptr && same_values(*head, *wte),
                   "the weights have an lm_head.weight that differs from wte.weight, but this model ties its output "
                   "layer to the token embedding; it cannot hold an untied head");
    renamed.erase("lm_head.weight");
    if (report != nullptr) report->dropped.push_back("lm_head.weight (tied to wte.weight)");
  }
  if (report != nullptr) report->stripped_transformer_prefix = strip;
  return renamed;
}

HubImportReport import_hub_weights(Module& model, const std::filesystem::path& path) {
  SafetensorsFile file = load_safetensors(path);
  HubImportReport report;
  try {
    StateDict state = hub_to_model_names(model, file.tensors, &report);
    model.load_state_dict(state, /*strict=*/true);
  } catch (const Error& e) {
    COLOSSAL_FAIL("loading weights from {}: {}", path.string(), e.what());
  }
  return report;
}

void export_hub_weights(const StateDict& state, const std::filesystem::path& path, std::optional<DType> dtype) {
  StateDict out;
  for (const auto& [name, tensor] : state) {
    out.insert(name,
               dtype && core::is_floating(tensor.dtype()) && tensor.dtype() != *dtype ? tensor.to(*dtype) : tensor);
  }
  save_safetensors(path, out, {{"format", "pt"}});
}

}  // namespace colossal::nn
