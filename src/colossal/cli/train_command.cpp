// `colossal train --config`: see train_command.h. The run itself is assembled by the initialize
// layer (initialize/training_run.h); this file only turns arguments into its inputs.
#include "colossal/cli/train_command.h"

#include <fmt/format.h>

#include "colossal/initialize/training_run.h"

namespace colossal::cli {

std::string toml_string(const std::string& text) {
  std::string out = "\"";
  for (const char ch : text) {
    if (ch == '"' || ch == '\\') {
      out += '\\';
      out += ch;
    } else if (static_cast<unsigned char>(ch) < 0x20 || ch == 0x7f) {
      out += fmt::format("\\u{:04X}", static_cast<unsigned>(static_cast<unsigned char>(ch)));
    } else {
      out += ch;
    }
  }
  return out + '"';
}

int train_from_config(const std::string& path, const std::vector<std::string>& overrides,
                      const std::string& metrics_path, const core::profiler::Options& profile) {
  initialize::RunOptions options;
  options.metrics_path = metrics_path;
  options.profile = profile;
  initialize::TrainingRun run(initialize::load_run_config(path, overrides), options);
  run.fit();
  return 0;
}

}  // namespace colossal::cli
