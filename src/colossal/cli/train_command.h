// `colossal train --config FILE`: the command's arguments handed to the run assembly
// (initialize/training_run.h), which builds and trains everything the config describes.
#pragma once

#include <string>
#include <vector>

#include "colossal/core/profiler.h"

namespace colossal::cli {

/// Loads `path` with `overrides` ("key=value", as --set), trains on train.device (the GPU under
/// "auto" when there is one), checkpointing into train.checkpoint_dir and continuing from
/// train.resume_from when set, and, when `metrics_path` is not empty, writes the step, epoch and
/// summary JSONL there (MetricsJsonlHook; appended to when resuming).
/// Returns 0 on success; throws colossal::Error naming the config key of anything unsupported.
/// `profile` (--profile, --profile-steps): the step profiler (core/profiler.h); an empty path leaves
/// it to COLOSSAL_PROFILE.
int train_from_config(const std::string& path, const std::vector<std::string>& overrides,
                      const std::string& metrics_path, const core::profiler::Options& profile = {});

/// `text` as a TOML basic string ("..." with quotes, backslashes and control characters escaped),
/// for building a --set override from a path.
std::string toml_string(const std::string& text);

}  // namespace colossal::cli
