// `colossal export`: see export.h.
#include "colossal/cli/export.h"

#include <fmt/format.h>

#include <CLI/CLI.hpp>
#include <cstdlib>
#include <memory>
#include <optional>
#include <string>

#include "colossal/core/dtype.h"
#include "colossal/core/error.h"
#include "colossal/engine/checkpoint.h"
#include "colossal/nn/hub_weights.h"

namespace colossal::cli {
namespace {

struct ExportOptions {
  std::string checkpoint;
  std::string output;
  std::string dtype;
};

/// --dtype: empty keeps the trained dtypes; otherwise a floating dtype (core::parse_dtype's spellings).
std::optional<DType> export_dtype(const std::string& name) {
  if (name.empty()) return std::nullopt;
  const DType dtype = core::parse_dtype(name);
  COLOSSAL_CHECK(core::is_floating(dtype), "export: --dtype {} is not a floating dtype (f32, bf16, f16, f64)", name);
  return dtype;
}

void run_export(const ExportOptions& o) {
  const std::filesystem::path checkpoint = engine::find_checkpoint(o.checkpoint, "export");
  const nn::StateDict state = engine::load_checkpoint_model_state(checkpoint);
  nn::export_hub_weights(state, o.output, export_dtype(o.dtype));
  int64_t elements = 0;
  for (const auto& [name, tensor] : state) elements += tensor.numel();
  fmt::print("export: {} tensors ({} values) from {} -> {}\n", state.size(), elements, checkpoint.string(), o.output);
}

}  // namespace

CLI::App* add_export_command(CLI::App& app) {
  auto options = std::make_shared<ExportOptions>();
  CLI::App* cmd =
      app.add_subcommand("export", "Write a checkpoint's model weights as safetensors under Hugging Face / timm names");
  cmd->add_option("checkpoint", options->checkpoint,
                  "A checkpoint file, or a checkpoint folder (its newest checkpoint is taken)")
      ->required();
  cmd->add_option("-o,--output", options->output, "The safetensors file to write (replaced if it exists)")->required();
  cmd->add_option("--dtype", options->dtype, "Cast floating tensors to f32, bf16, f16 or f64 (default: as trained)");
  cmd->footer(
      "GPT-2 weights load with transformers' GPT2LMHeadModel.from_pretrained (after saving the file as\n"
      "model.safetensors beside a config.json) or load_state_dict(strict=False) (the head is tied);\n"
      "ViT weights with timm's model.load_state_dict(safetensors.torch.load_file(...)).\n"
      "The reverse: set model.weights = \"FILE.safetensors\" in a training config.");
  cmd->callback([options] {
    try {
      run_export(*options);
    } catch (const Error& e) {
      // Messages about the checkpoint argument already start with "export: " (find_checkpoint's purpose).
      const std::string message = e.what();
      fmt::print(stderr, "colossal {}{}\n", message.starts_with("export: ") ? "" : "export: ", message);
      std::exit(1);
    }
  });
  return cmd;
}

}  // namespace colossal::cli
