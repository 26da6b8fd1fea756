// `colossal describe --config C [--set key=value ...]`: what a config trains, without training: the
// effective config (every key, as TOML), then the model's parameters with their shapes and, under
// tensor parallelism, how each lives on the tensor group (its spec, ShardSpec dimension, per-rank
// shape and the rule or policy that gave it): the place to check parallel.tensor.specs.
#pragma once

namespace CLI {
class App;
}

namespace colossal::cli {

/// Registers `describe` on `app` (options, help and the callback that runs it).
CLI::App* add_describe_command(CLI::App& app);

}  // namespace colossal::cli
