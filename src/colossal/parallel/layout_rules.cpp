// The layout rules: see layout_rules.h.
#include "colossal/parallel/layout_rules.h"

#include <fmt/format.h>

#include <cmath>
#include <cstdint>

#include "colossal/core/error.h"

namespace colossal::parallel {
namespace {

using config::TensorParallelMode;

/// "4 or 9": the members of the increasing sequence f(1), f(2), ... on either side of value.
template <class F>
std::string nearest_in_sequence(int64_t value, F f) {
  int64_t below = 0;
  int64_t n = 1;
  while (f(n) < value) below = f(n++);
  if (below == 0) return fmt::format("{}", f(n));
  return fmt::format("{} or {}", below, f(n));
}

/// "8 or 12": the multiples of m on either side of value (value is not one).
std::string nearest_multiple(int64_t value, int64_t m) {
  const int64_t below = value / m * m;
  if (below == 0) return fmt::format("{}", m);
  return fmt::format("{} or {}", below, below + m);
}

bool is_power(int64_t value, int n) {
  const auto root = static_cast<int64_t>(std::llround(std::pow(static_cast<double>(value), 1.0 / n)));
  int64_t power = 1;
  for (int i = 0; i < n; ++i) power *= root;
  return power == value;
}

/// How to start `n` processes, for the world rule's message.
std::string how_to_start(int64_t n) {
  return fmt::format(
      "start {} process{}: `colossal run --nproc_per_node {} -- colossal train --config ...` (or mpirun "
      "-np {}, torchrun --nproc_per_node {}, srun -n {})",
      n, n == 1 ? "" : "es", n, n, n, n);
}

}  // namespace

std::vector<LayoutProblem> check_layout(const config::ParallelConfig& config, int64_t batch_size,
                                        std::optional<int> world_size) {
  std::vector<LayoutProblem> problems;
  const auto fail = [&](std::string key, std::string message) {
    problems.push_back({std::move(key), std::move(message)});
  };
  // Ranges first: the rules below divide by these.
  const config::TensorParallelConfig& tensor = config.tensor;
  if (config.data < 0)
    fail("parallel.data", fmt::format("parallel.data = {} must be >= 0 (0: all the processes "
                                      "not used by pipeline and tensor)",
                                      config.data));
  if (config.pipeline < 1)
    fail("parallel.pipeline", fmt::format("parallel.pipeline = {} must be >= 1", config.pipeline));
  if (tensor.size < 1) fail("parallel.tensor.size", fmt::format("parallel.tensor.size = {} must be >= 1", tensor.size));
  if (tensor.mode == TensorParallelMode::k2p5d && tensor.depth < 1)
    fail("parallel.tensor.depth", fmt::format("parallel.tensor.depth = {} must be >= 1", tensor.depth));
  if (config.num_microbatches < 1) {
    fail("parallel.num_microbatches",
         fmt::format("parallel.num_microbatches = {} must be >= 1", config.num_microbatches));
  }
  if (config.num_chunks < 1)
    fail("parallel.num_chunks", fmt::format("parallel.num_chunks = {} must be >= 1", config.num_chunks));
  if (!problems.empty()) return problems;

  // Each tensor mode's rule on the number of ranks (a size of 1 splits nothing and suits any mode).
  const int64_t size = tensor.size;
  if (size > 1) {
    const auto bad_size = [&](std::string_view needs, std::string nearest) {
      fail("parallel.tensor.size",
           fmt::format("parallel.tensor.size = {} does not suit parallel.tensor.mode = \"{}\", which needs {}: "
                       "nearest valid sizes {}",
                       size, config::to_string(tensor.mode), needs, nearest));
    };
    switch (tensor.mode) {
      case TensorParallelMode::k1d:
        break;
      case TensorParallelMode::k2d:
        if (!is_power(size, 2)) bad_size("a square (q*q)", nearest_in_sequence(size, [](int64_t q) { return q * q; }));
        break;
      case TensorParallelMode::k2p5d: {
        const int64_t depth = tensor.depth;
        if (size % depth != 0 || !is_power(size / depth, 2)) {
          bad_size(fmt::format("depth * q * q with parallel.tensor.depth = {}", depth),
                   nearest_in_sequence(size, [depth](int64_t q) { return depth * q * q; }));
        }
        break;
      }
      case TensorParallelMode::k3d:
        if (!is_power(size, 3)) {
          bad_size("a cube (d*d*d)", nearest_in_sequence(size, [](int64_t d) { return d * d * d; }));
        }
        break;
    }
  }

  // Pipelines: the interleaved schedule hands microbatches to stages in rounds of pp, and a batch
  // splits into equal microbatches.
  if (config.num_chunks > 1) {
    if (config.pipeline == 1) {
      fail("parallel.num_chunks",
           fmt::format("parallel.num_chunks = {} selects the interleaved pipeline schedule, which needs "
                       "parallel.pipeline > 1",
                       config.num_chunks));
    } else if (config.num_microbatches % config.pipeline != 0) {
      fail("parallel.num_microbatches",
           fmt::format("parallel.num_microbatches = {} must be a multiple of parallel.pipeline = {} for the "
                       "interleaved schedule (parallel.num_chunks = {}): nearest valid {}",
                       config.num_microbatches, config.pipeline, config.num_chunks,
                       nearest_multiple(config.num_microbatches, config.pipeline)));
    }
  }
  if (config.pipeline > 1 && batch_size > 0 && batch_size % config.num_microbatches != 0) {
    const int64_t m = config.num_microbatches;
    fail("data.batch_size", fmt::format("data.batch_size = {} does not split into parallel.num_microbatches = {} "
                                        "equal microbatches: nearest valid batch sizes {}",
                                        batch_size, m, nearest_multiple(batch_size, m)));
  }

  // The world: data x pipeline x tensor processes, data derived when 0.
  if (world_size) {
    const int64_t world = *world_size;
    const int64_t model = static_cast<int64_t>(config.pipeline) * size;
    const std::string started =
        world == 1 ? "this is a single process" : fmt::format("{} processes were started", world);
    if (config.data > 0 && config.data * model != world) {
      const int64_t needed = config.data * model;
      fail("parallel.data",
           fmt::format("parallel.data = {} with parallel.pipeline = {} and parallel.tensor.size = {} needs {} "
                       "processes (data x pipeline x tensor), but {}: {}{}",
                       config.data, config.pipeline, size, needed, started, how_to_start(needed),
                       world % model == 0 ? fmt::format(", or set parallel.data = {} (or 0: derived from the "
                                                        "processes started)",
                                                        world / model)
                                          : ""));
    } else if (world % model != 0) {
      fail(size > 1 ? "parallel.tensor.size" : "parallel.pipeline",
           fmt::format("the processes form data x pipeline x tensor, so their number must be a multiple of "
                       "parallel.pipeline * parallel.tensor.size = {} * {} = {}, but {}: {} (nearest valid: {}), or "
                       "choose pipeline and tensor sizes whose product divides {}",
                       config.pipeline, size, model, started, how_to_start(model * std::max<int64_t>(1, world / model)),
                       nearest_multiple(world, model), world));
    }
  }
  return problems;
}

config::ConfigRule layout_config_rule() {
  return [](const config::TrainConfig& c, const std::function<void(std::string_view, std::string)>& report) {
    for (LayoutProblem& p : check_layout(c.parallel, c.data.batch_size, std::nullopt)) {
      report(p.key, std::move(p.message));
    }
  };
}

void require_layout(const config::ParallelConfig& config, int world_size, int64_t batch_size) {
  const std::vector<LayoutProblem> problems = check_layout(config, batch_size, world_size);
  if (problems.empty()) return;
  if (problems.size() == 1) throw Error(problems.front().message);
  std::string message = fmt::format("{} problems with the parallel layout:", problems.size());
  for (const LayoutProblem& p : problems) message += "\n  " + p.message;
  throw Error(message);
}

}  // namespace colossal::parallel
