// `colossal train`'s command line: a TOML config (--config, with --set, --metrics and --resume) or,
// without --config, the built-in MLP demo (train_mlp.h) and its own flags. Kept apart from main()
// so that tests/cli can parse command lines and check what is refused.
#pragma once

#include <string>
#include <vector>

#include "colossal/cli/train_mlp.h"  // MlpTrainConfig
#include "colossal/core/profiler.h"

namespace CLI {
class App;
}  // namespace CLI

namespace colossal::cli {

/// What `colossal train` was asked for, filled in while parsing.
struct TrainArgs {
  std::string config_path;             ///< --config; empty: the built-in MLP demo
  std::vector<std::string> overrides;  ///< --set key=value, in order
  std::string metrics_path;            ///< --metrics
  std::string resume_path;             ///< --resume
  core::profiler::Options profile;     ///< --profile PATH, --profile-steps FIRST:COUNT
  MlpTrainConfig mlp;                  ///< the demo's --steps, --batch-size, --lr, --hidden, --seed, --log-every
};

/// Exit code of a command line that mixes the two modes, as main() returned for --set without
/// --config before: a usage error, not a failed run (1).
inline constexpr int kTrainUsageExitCode = 2;

/// Registers `train` on app. The MLP demo's flags are listed in their own help group. Parsing fails
/// with a CLI::ValidationError of exit code kTrainUsageExitCode, whose message names each offending
/// flag and what to use instead, when a demo flag comes with --config (a config never reads them:
/// `--lr 0.1` is `--set optimizer.lr=0.1` there) or --set, --metrics or --resume come without it.
CLI::App* add_train_command(CLI::App& app, TrainArgs& args);

}  // namespace colossal::cli
