// `colossal export`: a training checkpoint's model weights as a safetensors file under the Hub's
// names, for transformers (GPT-2) and timm (ViT) to load.
#pragma once

namespace CLI {
class App;
}

namespace colossal::cli {

/// Registers `export` on `app` (options, help and the callback that runs it).
CLI::App* add_export_command(CLI::App& app);

}  // namespace colossal::cli
