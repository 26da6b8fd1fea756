// `colossal train --config FILE`: a training run built from a TrainConfig (config/train_config.h):
// dataset -> model -> optimizer -> scheduler -> Engine -> Trainer.fit with the stock hooks.
#pragma once

#include <string>
#include <vector>

namespace colossal::cli {

/// Loads `path` with `overrides` ("key=value", as --set), trains on the CPU and, when
/// `metrics_path` is not empty, writes the per-epoch and summary JSONL there (MetricsJsonlHook).
/// Returns 0 on success; throws colossal::Error naming the config key of anything unsupported.
int train_from_config(const std::string& path, const std::vector<std::string>& overrides,
                      const std::string& metrics_path);

}  // namespace colossal::cli
