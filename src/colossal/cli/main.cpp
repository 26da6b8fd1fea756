// The colossal program. `colossal info` says what this build was compiled with; `colossal train`
// trains from a TOML config (or, without one, runs the built-in MLP demo of train_mlp.h); `run`
// launches ranks, `tokenize` and `export` prepare data and checkpoints, `describe` prints what a
// config trains (its keys, its model's parameters and their tensor-parallel specs).
#include <fmt/format.h>
#include <omp.h>
#include <unistd.h>  // execv

#include <CLI/CLI.hpp>
#include <cstdlib>
#include <exception>
#include <string>
#include <vector>

#include "colossal/cli/describe.h"
#include "colossal/cli/export.h"
#include "colossal/cli/run.h"
#include "colossal/cli/tokenize.h"
#include "colossal/cli/train_args.h"
#include "colossal/cli/train_command.h"
#include "colossal/cli/train_mlp.h"
#include "colossal/comm/library_versions.h"
#include "colossal/core/build_config.h"  // COLOSSAL_VERSION, COLOSSAL_WITH_*
#include "colossal/core/cuda_device.h"
#include "colossal/core/error.h"  // colossal::Error
#include "colossal/ops/library_versions.h"

namespace colossal::cli {
namespace {

const char* on_off(bool on) {
  return on ? "yes" : "no";
}

void print_info() {
  fmt::print("colossal {}\n", COLOSSAL_VERSION);
  fmt::print("engines: cpu yes, cuda {}, nccl {}, mpi {}\n", on_off(COLOSSAL_WITH_CUDA), on_off(COLOSSAL_WITH_NCCL),
             on_off(COLOSSAL_WITH_MPI));
  fmt::print("openmp threads: {} (wait policy {})\n", omp_get_max_threads(),
             std::getenv("OMP_WAIT_POLICY") ? std::getenv("OMP_WAIT_POLICY") : "default");
  fmt::print("blas: {}\n", colossal::ops::blas_version());
  const auto version = [](std::optional<int> v) {
    return v ? fmt::format("{}.{}", *v / 1000, *v % 1000 / 10) : std::string("none");
  };
  fmt::print("cuda: runtime {}, driver {}; cublasLt {}; cudnn {}\n", version(colossal::core::cuda::runtime_version()),
             version(colossal::core::cuda::driver_version()), colossal::ops::cublaslt_version(),
             colossal::ops::cudnn_version());
  fmt::print("nccl: {}\nmpi: {}\n", colossal::comm::nccl_version(), colossal::comm::mpi_version());
  const int gpus = colossal::core::cuda::device_count();
  fmt::print("gpus: {}\n", gpus);
  for (int d = 0; d < gpus; ++d) {
    const auto p = colossal::core::cuda::properties(d);
    fmt::print("  cuda:{} {} (sm_{}{}, {} SMs, {:.1f} GiB)\n", d, p.name, p.major, p.minor, p.multiprocessor_count,
               static_cast<double>(p.total_memory_bytes) / (1 << 30));
  }
}

void run_train(const MlpTrainConfig& config) {
  fmt::print(
      "train: 2-layer MLP {} -> {} -> {} on teacher-labelled Gaussian points; SGD lr {}, batch {}, {} steps, "
      "seed {}\n",
      config.input_dim, config.hidden, config.num_classes, config.lr, config.batch_size, config.steps, config.seed);
  const MlpTrainResult result =
      train_mlp(config, [](int64_t step, double loss) { fmt::print("step {:6d}  loss {:.4f}\n", step, loss); });
  fmt::print(
      "final: loss {:.4f} (first batch {:.4f}), held-out loss {:.4f}, accuracy {:.2f}% (majority class {:.2f}%), "
      "{:.2f} s\n",
      result.final_loss, result.first_loss, result.eval_loss, 100 * result.eval_accuracy,
      100 * result.majority_accuracy, result.seconds);
}

// Note [OpenMP wait policy]
// Our CPU kernels run OpenMP loops between OpenBLAS calls, and OpenBLAS (the pthreads build) has
// threads of its own. Under libgomp's default policy, OpenMP threads spin for a while after each
// loop, taking the cores from OpenBLAS and the data-loader threads: on a 2-core machine a small ViT
// step took 3.8x longer (610 ms against 161 ms with OMP_WAIT_POLICY=passive). libgomp reads the
// policy once, when it is loaded, so main() re-executes itself with the variable set when the user
// has not chosen one.
void ensure_passive_openmp_wait(char** argv) {
  if (std::getenv("OMP_WAIT_POLICY") != nullptr || std::getenv("GOMP_SPINCOUNT") != nullptr) return;
  setenv("OMP_WAIT_POLICY", "passive", 0);
  execv("/proc/self/exe", argv);
  // exec failed (no /proc): run on with the default policy.
}

}  // namespace
}  // namespace colossal::cli

int main(int argc, char** argv) {
  colossal::cli::ensure_passive_openmp_wait(argv);
  CLI::App app{"colossal: native C++ training of large neural networks"};
  app.require_subcommand(1);

  CLI::App* info = app.add_subcommand("info", "Print the version and the engines this build was compiled with");
  colossal::cli::add_tokenize_command(app);
  colossal::cli::add_export_command(app);
  colossal::cli::add_describe_command(app);
  colossal::cli::add_run_command(app);

  colossal::cli::TrainArgs train_args;
  CLI::App* train = colossal::cli::add_train_command(app, train_args);

  CLI11_PARSE(app, argc, argv);
  try {
    if (info->parsed()) colossal::cli::print_info();
    if (train->parsed()) {
      if (!train_args.config_path.empty()) {
        std::vector<std::string> overrides = train_args.overrides;
        if (!train_args.resume_path.empty()) {
          overrides.push_back("train.resume_from=" + colossal::cli::toml_string(train_args.resume_path));
        }
        return colossal::cli::train_from_config(train_args.config_path, overrides, train_args.metrics_path,
                                                train_args.profile);
      }
      colossal::cli::run_train(train_args.mlp);
    }
  } catch (const colossal::Error& e) {
    fmt::print(stderr, "colossal: {}\n", e.what());
    return 1;
  }
  return 0;
}
