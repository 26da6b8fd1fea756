// The run assembly (Colossal-AI's launch + initialize): a TrainConfig becomes, in order, the process
// groups of the launcher's processes -> the ParallelContext (the dp x pp x tp layout, checked by the
// parallel layer's rules) -> this rank's model (built for its place in the layout), optimizer and
// LR scheduler -> the schedule, gradient handler and mixed precision inside the Engine -> the data
// loaders (this rank's share of every global batch) -> the hooks (logs, metrics, checkpoints) and
// the Trainer. `colossal train --config` is this plus argument parsing (cli/train_command.cpp); a
// C++ program or a test runs a config through it without the command line.
#pragma once

#include <cstdint>
#include <filesystem>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "colossal/comm/process_group.h"
#include "colossal/config/train_config.h"
#include "colossal/core/profiler.h"
#include "colossal/core/random.h"
#include "colossal/data/data_loader.h"
#include "colossal/engine/checkpoint.h"  // NamedGenerators
#include "colossal/engine/engine.h"
#include "colossal/engine/hook.h"
#include "colossal/engine/pipeline_schedule.h"
#include "colossal/engine/trainer.h"
#include "colossal/initialize/builders.h"
#include "colossal/initialize/run_plan.h"
#include "colossal/parallel/parallel_context.h"
#include "colossal/parallel/pp/partition.h"  // StageParts

namespace colossal::initialize {

/// The config at `path` with `overrides` (as `--set`), checked by config's own rules and the rules
/// other layers own (the parallel layout's: parallel/layout_rules.h), all before anything is built.
config::TrainConfig load_run_config(const std::filesystem::path& path, const std::vector<std::string>& overrides = {});

struct RunOptions {
  /// JSON-lines metrics (a line every train.log_interval steps, per epoch, a summary; `--metrics`);
  /// empty: none. Written by the data-parallel group's rank 0, appended to when resuming.
  std::string metrics_path;
  /// The processes of this run; null: those the launcher started (comm/bootstrap.h), a single
  /// process when there was no launcher.
  std::shared_ptr<comm::ProcessGroup> world;
  /// Print the run's description and the closing line on stdout (rank 0 only either way).
  bool verbose = true;
  /// The step profiler (core/profiler.h; `--profile`, or COLOSSAL_PROFILE in the environment when
  /// this path is empty): a Chrome trace of a window of steps and a summary on stderr. With more than
  /// one rank, each writes its own trace, its rank before the extension (trace.rank1.json).
  core::profiler::Options profile;
};

/// What fit() did.
struct RunResult {
  int64_t steps = 0;    ///< training iterations run (this call, plus those before a resume point)
  int64_t updates = 0;  ///< optimizer updates (the engine's count: a resumed checkpoint's included)
  double seconds = 0;   ///< wall time of fit()
};

class TrainingRun {
 public:
  /// Assembles everything for `config` (which load_run_config checked; the layout's world rule is
  /// checked here, now that the processes are known). Every rank of the world must construct it.
  /// Throws colossal::Error naming the config key of anything it cannot do, before training starts:
  /// an output path that cannot be written (train.checkpoint_dir, train.log_dir, the metrics file),
  /// a layout this build does not support yet, a checkpoint that does not match.
  TrainingRun(config::TrainConfig config, RunOptions options = {});
  ~TrainingRun();
  TrainingRun(const TrainingRun&) = delete;
  TrainingRun& operator=(const TrainingRun&) = delete;

  /// Trains to the end of the plan (train.epochs, cut at train.max_steps), testing after completed
  /// epochs every train.test_interval (and at the end of a run bounded by max_steps alone).
  RunResult fit();

  const config::TrainConfig& config() const { return config_; }
  const parallel::ParallelContext& context() const { return *context_; }
  const RunPlan& plan() const { return plan_; }
  Device device() const { return device_; }
  nn::Module& model() { return *model_; }
  engine::Engine& engine() { return *engine_; }
  engine::Trainer& trainer() { return *trainer_; }
  data::DataLoader& train_loader() { return *train_loader_; }
  /// Whether this rank writes the logs, metrics and checkpoints (rank 0 of the world; under tensor
  /// parallelism the other ranks of its tensor group take part in each save).
  bool writer() const { return writer_; }
  /// The position fit() starts from: a resumed checkpoint's, else the start.
  const engine::TrainPosition& start() const { return start_; }

 private:
  void assemble();
  engine::NamedGenerators named_generators() const;
  void check_outputs() const;
  void build_data_and_model();
  void build_engine();
  void resume();
  void build_hooks();
  void add_checkpoint_hook();

  config::TrainConfig config_;
  RunOptions options_;
  std::shared_ptr<const parallel::ParallelContext> context_;
  Device device_;
  bool writer_ = false;
  Datasets datasets_;
  /// dropout_generator_ draws the masks of replicated activations (the same on every tensor rank),
  /// tensor_generator_ those of activations split over the tensor group (parallel/tp/random.h).
  std::unique_ptr<core::Generator> init_generator_, dropout_generator_, tensor_generator_;
  std::shared_ptr<nn::Module> model_;
  /// Under a pipeline, the cut made before the model was built (plan_before_building), when it was.
  std::optional<parallel::pp::StageParts> planned_cut_;
  std::vector<double> planned_times_;  // a measured planned cut's times per piece
  /// Under parallel.pipeline > 1: the schedule of this rank's stage (model_ holds its chunks).
  std::shared_ptr<engine::PipelineSchedule> pipeline_schedule_;
  /// Under a pipeline, the serial names of the stage's tensors (EngineOptions::serial_names).
  std::shared_ptr<const engine::SerialNames> serial_names_;
  std::shared_ptr<data::Sampler> sampler_;
  RunPlan plan_;
  std::unique_ptr<data::DataLoader> train_loader_, test_loader_;
  std::unique_ptr<engine::Engine> engine_;
  std::unique_ptr<engine::Trainer> trainer_;
  std::map<std::string, std::string> invariants_;
  std::vector<std::shared_ptr<engine::Hook>> hooks_;
  engine::TrainPosition start_;
  bool resumed_ = false;
};

}  // namespace colossal::initialize
