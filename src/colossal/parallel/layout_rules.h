// The rules of a dp x pp x tp layout, in one place with one wording: each mode's tensor size (2d a
// square, 2.5d depth*q*q, 3d a cube), the interleaved schedule's needs, the microbatch split of a
// batch, and, once the number of processes is known, data x pipeline x tensor = world. Config
// loading runs them through parallel_config_rule() (before anything is built); ParallelLayout runs
// them with the world size at launch. Each problem names the key, the values, the nearest valid
// sizes and, for the world rule, how to start the right number of processes.
#pragma once

#include <optional>
#include <string>
#include <vector>

#include "colossal/config/train_config.h"

namespace colossal::parallel {

struct LayoutProblem {
  std::string key;      ///< the dotted config key the problem is about ("parallel.tensor.size")
  std::string message;  ///< the rule broken, the values, and what would be valid
};

/// Every rule `config` breaks. `batch_size` (data.batch_size; 0: unknown) is checked against the
/// microbatch split under a pipeline; `world_size` (unknown before launch) against the layout's
/// product.
std::vector<LayoutProblem> check_layout(const config::ParallelConfig& config, int64_t batch_size,
                                        std::optional<int> world_size);

/// check_layout as a rule of config loading (config::load_config's `rules`): the world size is not
/// known there, so the world rule waits for launch.
config::ConfigRule layout_config_rule();

/// Throws colossal::Error listing every problem check_layout finds for `world_size` processes.
void require_layout(const config::ParallelConfig& config, int world_size, int64_t batch_size = 0);

}  // namespace colossal::parallel
