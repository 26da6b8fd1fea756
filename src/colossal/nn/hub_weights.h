// Weights in and out under the libraries' own names: a model's parameters as a safetensors file
// that Hugging Face transformers (GPT-2) or timm (ViT) load, and such files (the Hub's, or one a
// user saved with save_pretrained / safetensors.torch.save_file) loaded into our models. Our
// modules already use those names (h.0.attn.c_attn.weight, blocks.0.attn.qkv.weight, ...); what
// differs is packaging, handled here: the "transformer." prefix of GPT2LMHeadModel files, the
// tied lm_head.weight, and the causal-mask buffers older GPT-2 files carry.
#pragma once

#include <filesystem>
#include <optional>
#include <string>
#include <vector>

#include "colossal/core/dtype.h"
#include "colossal/nn/module.h"
#include "colossal/nn/state_dict.h"

namespace colossal::nn {

/// What import_hub_weights left out of the file, and why (for a log line).
struct HubImportReport {
  std::vector<std::string> dropped;  ///< "lm_head.weight (tied to wte.weight)", "h.0.attn.bias (mask buffer)"
  bool stripped_transformer_prefix = false;
};

/// Maps a Hub-style state dict onto `model`'s names: strips "transformer." when the model's names
/// do not have it, drops lm_head.weight when the model has none and the file's equals its
/// wte.weight (tied), and drops GPT-2's attn.bias / attn.masked_bias mask buffers the model does
/// not have. Everything else is passed through unchanged.
StateDict hub_to_model_names(const Module& model, const StateDict& hub, HubImportReport* report = nullptr);

/// Loads the safetensors file at `path` into `model` (strict: every parameter and buffer must be
/// there with its shape; dtypes are cast to the model's). Throws naming the file and every missing,
/// unexpected or misshapen key, leaving the model unchanged.
HubImportReport import_hub_weights(Module& model, const std::filesystem::path& path);

/// Writes `state` (a model's state_dict) to `path` as a safetensors file with the metadata
/// {"format": "pt"} that transformers and timm expect, cast to `dtype` when given (floating tensors
/// only). Written under a temporary name and renamed.
void export_hub_weights(const StateDict& state, const std::filesystem::path& path,
                        std::optional<DType> dtype = std::nullopt);

}  // namespace colossal::nn
