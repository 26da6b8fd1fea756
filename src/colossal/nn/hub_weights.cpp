// Hub weights: see hub_weights.h.
#include "colossal/nn/hub_weights.h"

#include <fmt/format.h>
#include <fmt/ranges.h>  // join

#include <optional>
#include <regex>
#include <set>
#include <string>
#include <vector>

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

namespace {

/// Whether the file's names carry GPT2LMHeadModel's "transformer." prefix and the model's do not.
template <typename Names>
bool strips_prefix(const StateDict& own, const Names& hub_names) {
  if (any_key_starts_with(own, kTransformerPrefix)) return false;
  for (const std::string& name : hub_names) {
    if (name.starts_with(kTransformerPrefix)) return true;
  }
  return false;
}

/// The model's name for a file's tensor, or none for a GPT-2 attention mask buffer the model does
/// not have (said in the report).
std::optional<std::string> model_name_of(const std::string& name, bool strip, const StateDict& own,
                                         HubImportReport* report) {
  // GPT-2's causal mask, saved as buffers by older transformers releases.
  static const std::regex mask_buffer(R"((^|\.)h\.\d+\.attn\.(masked_)?bias$)");
  std::string ours = strip && name.starts_with(kTransformerPrefix) ? name.substr(kTransformerPrefix.size()) : name;
  if (!own.contains(ours) && std::regex_search(ours, mask_buffer)) {
    if (report != nullptr) report->dropped.push_back(name + " (attention mask buffer)");
    return std::nullopt;
  }
  return ours;
}

}  // namespace

StateDict hub_to_model_names(const Module& model, const StateDict& hub, HubImportReport* report) {
  const StateDict own = model.state_dict();
  const bool strip = strips_prefix(own, hub.keys());
  StateDict renamed;
  for (const auto& [name, tensor] : hub) {
    if (std::optional<std::string> ours = model_name_of(name, strip, own, report)) renamed.insert(*ours, tensor);
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

bool widens_exactly(DType stored, DType model) {
  if (stored == model) return true;
  // f16 and bf16 each fit in f32 (and f64) exactly, f32 in f64; nothing else converts without loss.
  switch (model) {
    case DType::f64:
      return stored == DType::f32 || stored == DType::f16 || stored == DType::bf16;
    case DType::f32:
      return stored == DType::f16 || stored == DType::bf16;
    default:
      return false;
  }
}

namespace {

/// import_hub_weights' state dict when only the `held` tensors are wanted (Note [Weights of the pieces
/// held]): those read from the file and named as the model names them; every other tensor the file
/// holds under one of the model's names maps to a copy of the model's own (loading it changes
/// nothing, and its shape, a stand-in's, is not compared); a file name the model does not have stays in, so
/// that the strict load names it, as one the file lacks is named.
StateDict held_state(const Module& model, const std::filesystem::path& path, const SafetensorsHeader& header,
                     const HeldTensors& held, HubImportReport* report) {
  const StateDict own = model.state_dict();
  std::vector<std::string> hub_names;
  for (const SafetensorsEntry& entry : header.entries) hub_names.push_back(entry.name);
  const bool strip = strips_prefix(own, hub_names);
  const bool tied_head = !own.contains("lm_head.weight");
  std::set<std::string> wanted;  // the file's names of what is read
  StateDict state;
  for (const SafetensorsEntry& entry : header.entries) {
    const std::optional<std::string> ours = model_name_of(entry.name, strip, own, report);
    if (!ours) continue;
    if (*ours == "lm_head.weight" && tied_head) {
      // Compared with wte where this rank holds it (hub_to_model_names' check); dropped either way.
      if (held("wte.weight")) {
        wanted.insert(entry.name);
      } else if (report != nullptr) {
        report->dropped.push_back("lm_head.weight (tied to wte.weight)");
      }
      continue;
    }
    if (held(*ours)) {
      wanted.insert(entry.name);
    } else if (const Tensor* mine = own.find(*ours)) {
      state.insert(*ours, mine->clone());  // a stand-in's: tiny
    } else {
      state.insert(*ours, Tensor());  // unexpected: the strict load names it
    }
  }
  const SafetensorsFile file =
      load_safetensors(path, [&wanted](const std::string& name) { return wanted.contains(name); });
  for (auto& [name, tensor] : hub_to_model_names(model, file.tensors, report)) state.insert(name, tensor);
  return state;
}

}  // namespace

HubImportReport import_hub_weights(Module& model, const std::filesystem::path& path, const HeldTensors& held) {
  // The header first: a training checkpoint is told apart before gigabytes of optimizer state are read.
  const SafetensorsHeader header = read_safetensors_header(path);
  if (auto format = header.metadata.find("format");
      format != header.metadata.end() && format->second == kCheckpointFormat) {
    COLOSSAL_FAIL(
        "model.weights {} is a colossal training checkpoint (model, optimizer and scheduler state), not a weights "
        "file; write its weights with `colossal export {} -o model.safetensors` and set model.weights to that file, "
        "or continue that run with --resume {}",
        path.string(), path.string(), path.string());
  }
  HubImportReport report;
  try {
    StateDict state;
    if (!held) {
      state = hub_to_model_names(model, load_safetensors(path).tensors, &report);
    } else {
      state = held_state(model, path, header, held, &report);
    }
    // Dtypes before anything is loaded (load_state_dict would cast whatever it is given).
    const StateDict own = model.state_dict();
    std::vector<std::string> mistyped;
    for (const auto& [name, tensor] : state) {
      const Tensor* dst = own.find(name);
      if (dst == nullptr || tensor.dtype() == dst->dtype()) continue;
      const std::string change = fmt::format("{} {} -> {}", name, safetensors_dtype_name(tensor.dtype()),
                                             safetensors_dtype_name(dst->dtype()));
      if (widens_exactly(tensor.dtype(), dst->dtype())) {
        report.cast.push_back(change);
      } else {
        mistyped.push_back(fmt::format("\n  '{}' is stored as {} but the model holds {}", name,
                                       safetensors_dtype_name(tensor.dtype()), safetensors_dtype_name(dst->dtype())));
      }
    }
    if (!mistyped.empty()) {
      COLOSSAL_FAIL(
          "{} tensor(s) of another dtype than the model's, and no exact conversion exists (only f16/bf16 -> f32/f64 "
          "and f32 -> f64 are taken); nothing was loaded. Convert the file to the model's dtype first, or check that "
          "it holds the weights its name says:{}",
          mistyped.size(), fmt::join(mistyped, ""));
    }
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
