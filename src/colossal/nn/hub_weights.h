// Weights in and out under the libraries' own names: a model's parameters as a safetensors file
// that Hugging Face transformers (GPT-2) or timm (ViT) load, and such files (the Hub's, or one a
// user saved with save_pretrained / safetensors.torch.save_file) loaded into our models. Our
// modules already use those names (h.0.attn.c_attn.weight, blocks.0.attn.qkv.weight, ...); what
// differs is packaging, handled here: the "transformer." prefix of GPT2LMHeadModel files, the
// tied lm_head.weight, and the causal-mask buffers older GPT-2 files carry.
//
// Dtypes: the Hub ships some models' weights in f16 or bf16, and widening those into an f32 (or
// f64) model is exact, so import_hub_weights does it, and lists every such cast in its report
// for the caller to print. Everything else must match: a narrowing cast (f32 weights into a
// bf16 model, f64 into f32) would change the values, and an integer tensor where a floating one
// belongs (or the reverse) means the file holds something else than its name says; both are
// errors naming the tensor, the file and the two dtypes. A training checkpoint is not a weights
// file: it is refused with `colossal export` as the way to get its weights (resuming from it
// goes through engine/checkpoint.h, which never casts).
#pragma once

#include <filesystem>
#include <functional>
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
  /// Tensors widened to the model's dtype, as "wte.weight F16 -> F32": exact, but the caller should
  /// say so, since the weights carry no more precision than the file had.
  std::vector<std::string> cast;
  bool stripped_transformer_prefix = false;
};

/// Maps a Hub-style state dict onto `model`'s names: strips "transformer." when the model's names
/// do not have it, drops lm_head.weight when the model has none and the file's equals its
/// wte.weight (tied), and drops GPT-2's attn.bias / attn.masked_bias mask buffers the model does
/// not have. Everything else is passed through unchanged.
StateDict hub_to_model_names(const Module& model, const StateDict& hub, HubImportReport* report = nullptr);

/// Loads the safetensors file at `path` into `model` (strict: every parameter and buffer must be
/// there with its shape, and with the model's dtype or one that widens to it exactly, f16/bf16 ->
/// f32/f64 or f32 -> f64, listed in the report's `cast`). Throws naming the file and every missing,
/// unexpected, misshapen or mistyped key, leaving the model unchanged, and names a colossal
/// training checkpoint as such (with `colossal export` to turn it into weights).
///
/// Note [Weights of the pieces held]
/// With `held`, only the tensors it names (the model's names) are read from the file and loaded: a
/// pipeline stage built with stand-ins for the other stages' pieces (Note [Pieces built] in
/// nn/models/layer_view.h) reads its own pieces' weights, not the whole model's. The file must still
/// hold every tensor of the model and nothing else (names only for those not held: their shapes are
/// the stage holding them to check); a tied lm_head is compared with wte where wte is held.
using HeldTensors = std::function<bool(const std::string& name)>;
HubImportReport import_hub_weights(Module& model, const std::filesystem::path& path, const HeldTensors& held = {});

/// Whether import_hub_weights takes a tensor stored as `stored` into one of dtype `model`: the same
/// dtype, or a floating one that converts exactly (every value of `stored` is one of `model`).
bool widens_exactly(DType stored, DType model);

/// Writes `state` (a model's state_dict) to `path` as a safetensors file with the metadata
/// {"format": "pt"} that transformers and timm expect, cast to `dtype` when given (floating tensors
/// only). Written under a temporary name and renamed.
void export_hub_weights(const StateDict& state, const std::filesystem::path& path,
                        std::optional<DType> dtype = std::nullopt);

}  // namespace colossal::nn
