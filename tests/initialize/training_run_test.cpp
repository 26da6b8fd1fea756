// The run assembly driven from C++ (initialize/training_run.h), without the command line: a config
// becomes a ParallelContext, an Engine holding it, loaders and hooks, and trains. And what a new user
// hit in the first hour, each fixed here: output paths checked before training (defect 1),
// train.max_steps a real bound that stops mid-epoch with the LR schedule that long (9), a run cut
// at max_steps that a resume extends (4), and a short run that does not spend its time testing (10).
#include "colossal/initialize/training_run.h"

#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <map>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "metrics_jsonl.h"

#include "colossal/core/error.h"
#include "colossal/ops/linalg.h"  // float32_matmul_precision
#include "colossal/parallel/layout_rules.h"

namespace colossal::initialize {
namespace {

using colossal::testing::read_jsonl;
using colossal::testing::step_losses;

namespace fs = std::filesystem;

// 64 samples in batches of 8: 8 steps an epoch.
constexpr const char* kConfig = R"(
[model]
name = "vit"
options = { patch_size = 4, embed_dim = 16, depth = 1, num_heads = 2, mlp_ratio = 2.0 }

[data]
dataset = "synthetic"
batch_size = 8
options = { size = 64, test_size = 16, image_size = 8, channels = 1, num_classes = 4 }

[optimizer]
name = "adamw"
lr = 1e-3

[train]
epochs = 1
device = "cpu"
progress = false
log_interval = 1
)";

config::TrainConfig make_config(const std::vector<std::string>& overrides) {
  return config::parse_config(kConfig, overrides, "test.toml", {parallel::layout_config_rule()});
}

fs::path fresh_dir(const std::string& name) {
  const fs::path dir = fs::temp_directory_path() / ("colossal_training_run_test_" + name);
  fs::remove_all(dir);
  fs::create_directories(dir);
  return dir;
}

std::string toml_path(const fs::path& p) {
  return "\"" + p.string() + "\"";
}

TEST(TrainingRun, TheProfilerWritesATraceOfItsWindowOfSteps) {
  // Steps 2, 3 and 4 of 6 (core/profiler.h): a Chrome trace whose host ranges are the trainer's and
  // the Engine's phases, three of each step-level range, each inside its step, and a complete file
  // (written to a temporary name, then renamed). On the CPU there are no device ranges.
  const fs::path dir = fresh_dir("profile");
  const fs::path trace = dir / "trace.json";
  RunOptions options{.verbose = false};
  options.profile = {.path = trace.string(), .first_step = 2, .num_steps = 3};
  TrainingRun run(make_config({"train.max_steps=6", "clip_grad_norm=1.0"}), options);
  run.fit();
  ASSERT_TRUE(fs::exists(trace));
  EXPECT_FALSE(fs::exists(trace.string() + ".tmp"));
  const nlohmann::json json = nlohmann::json::parse(std::ifstream(trace));
  std::map<std::string, int> count;
  double step_begin = -1, step_end = -1;
  for (const auto& event : json.at("traceEvents")) {
    if (event.at("ph") != "X") continue;
    EXPECT_EQ(event.at("pid"), 1) << "a CPU run has host ranges only";
    const std::string name = event.at("name");
    ++count[name];
    if (name == "train step" && step_begin < 0) {
      step_begin = event.at("ts");
      step_end = step_begin + event.at("dur").get<double>();
    }
  }
  for (const char* name : {"train step", "data: next batch", "forward", "loss", "backward", "update",
                           "update: gradient norm", "update: optimizer step", "hooks: after_train_iter"}) {
    EXPECT_EQ(count[name], 3) << name;
  }
  EXPECT_GT(step_end, step_begin);
  for (const auto& event : json.at("traceEvents")) {
    if (event.at("ph") != "X" || event.at("name") != "forward") continue;
    EXPECT_GE(event.at("ts").get<double>(), step_begin) << "the first forward lies inside the first step";
    EXPECT_LE(event.at("ts").get<double>() + event.at("dur").get<double>(), step_end);
    break;
  }
  // Off again afterwards: a second run without a profile path writes nothing.
  fs::remove(trace);
  TrainingRun quiet(make_config({"train.max_steps=6"}), RunOptions{.verbose = false});
  quiet.fit();
  EXPECT_FALSE(fs::exists(trace));
}

TEST(TrainingRun, AConfigTrainsFromCppWithTheContextInTheEngine) {
  TrainingRun run(make_config({"train.max_steps=3"}), RunOptions{.verbose = false});
  EXPECT_EQ(run.context().layout().data_size(), 1);
  EXPECT_EQ(run.context().world().size(), 1);
  EXPECT_EQ(&run.engine().context(), &run.context()) << "the Engine holds the run's ParallelContext";
  EXPECT_EQ(run.engine().gradient_handler(), nullptr) << "one data-parallel rank reduces nothing";
  EXPECT_EQ(run.engine().schedule().name(), "non-pipeline");
  const RunResult result = run.fit();
  EXPECT_EQ(result.updates, 3);
  EXPECT_EQ(result.steps, 3);
}

TEST(TrainingRun, Tf32IsTheConfigsChoice) {
  // train.tf32 sets how the process's f32 matrix products run on GPUs (the CPU's are f32 either way).
  {
    TrainingRun run(make_config({"train.tf32=false", "train.max_steps=1"}), RunOptions{.verbose = false});
    EXPECT_EQ(ops::float32_matmul_precision(), ops::Float32MatmulPrecision::highest);
  }
  TrainingRun run(make_config({"train.max_steps=1"}), RunOptions{.verbose = false});
  EXPECT_EQ(ops::float32_matmul_precision(), ops::Float32MatmulPrecision::high);
}

TEST(TrainingRun, ZeroStageReachesTheEngine) {
  // One data rank: stages 1 and 2 have nothing to shard and train without ZeRO (Note [ZeRO over one
  // data rank]); stage 3 and the optimizer on the host do something at any size and shard over a
  // group of one.
  for (const char* stage : {"zero.stage=1", "zero.stage=2"}) {
    TrainingRun run(make_config({stage, "train.max_steps=2"}), RunOptions{.verbose = false});
    EXPECT_EQ(run.engine().zero(), nullptr) << stage << " over one data rank";
    EXPECT_EQ(run.engine().gradient_handler(), nullptr) << stage << " over one data rank";
    EXPECT_EQ(run.fit().updates, 2) << stage;
  }
  for (const std::vector<std::string>& sets : std::vector<std::vector<std::string>>{
           {"zero.stage=3"},
           {"zero.stage=2", "zero.offload_optimizer=true"},
           {"zero.stage=3", "zero.offload_optimizer=true", "zero.placement_policy=\"cpu\""}}) {
    std::vector<std::string> overrides = sets;
    overrides.push_back("train.max_steps=2");
    TrainingRun run(make_config(overrides), RunOptions{.verbose = false});
    ASSERT_NE(run.engine().zero(), nullptr) << sets.front() << " makes the gradient handler ZeRO's";
    EXPECT_EQ(run.engine().zero()->stage(), sets.front().back() - '0') << sets.front();
    EXPECT_EQ(run.fit().updates, 2) << sets.front();
  }
  // What stage 3 cannot shard is refused when the run is built, naming the stages that can.
  try {
    TrainingRun refused(make_config({"zero.stage=3", "optimizer.name=\"lamb\""}), RunOptions{.verbose = false});
    ADD_FAILURE() << "built a ZeRO-3 run with LAMB";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("use zero.stage = 1 or 2"), std::string::npos) << e.what();
  }
  try {
    TrainingRun refused(make_config({"zero.stage=3", "parallel.tensor.size=2", "parallel.tensor.overlap_chunks=2"}),
                        RunOptions{.verbose = false});
    ADD_FAILURE() << "built a ZeRO-3 run with chunked tensor-parallel blocks";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("zero.stage = 3 with parallel.tensor.overlap_chunks = 2"), std::string::npos)
        << e.what();
  }
}

TEST(TrainingRun, LayoutRulesRunAtConfigLoadWithOneWording) {
  try {
    make_config({"parallel.tensor={size = 6, mode = \"2d\"}"});
    FAIL() << "loaded a 2d tensor size that is not a square";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("--set parallel.tensor"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("parallel.tensor.size = 6 does not suit parallel.tensor.mode = \"2d\""),
              std::string::npos)
        << e.what();
    EXPECT_NE(std::string(e.what()).find("nearest valid sizes 4 or 9"), std::string::npos) << e.what();
  }
  // The world rule waits for the processes; a single process asked for two data-parallel ranks is
  // told how to start them.
  try {
    TrainingRun run(make_config({"parallel.data=2"}), RunOptions{.verbose = false});
    FAIL() << "ran parallel.data = 2 in one process";
  } catch (const Error& e) {
    const std::string m = e.what();
    EXPECT_NE(m.find("needs 2 processes (data x pipeline x tensor), but this is a single process"), std::string::npos)
        << m;
    EXPECT_NE(m.find("colossal run --nproc_per_node 2 -- colossal train --config"), std::string::npos) << m;
  }
}

// Defect 1: an output path that cannot be written is found at start, naming the key and the reason,
// not at the first save after training for nothing (nor as an uncaught filesystem_error).
TEST(TrainingRun, OutputPathsAreCheckedBeforeTraining) {
  const fs::path dir = fresh_dir("outputs");
  const fs::path file = dir / "a_file";
  std::ofstream(file) << "x";
  const auto message = [&](const std::vector<std::string>& overrides, const std::string& metrics = "") {
    try {
      TrainingRun run(make_config(overrides), RunOptions{.metrics_path = metrics, .verbose = false});
      return std::string("no error");
    } catch (const Error& e) {
      return std::string(e.what());
    }
  };
  std::string m = message({"train.checkpoint_dir=" + toml_path(file)});
  EXPECT_NE(m.find("train.checkpoint_dir = \"" + file.string() + "\" cannot be written: it exists and is not a folder"),
            std::string::npos)
      << m;
  m = message({"train.checkpoint_dir=" + toml_path(file / "sub")});
  EXPECT_NE(m.find("train.checkpoint_dir = \"" + (file / "sub").string() + "\" cannot be written: Not a directory"),
            std::string::npos)
      << m;
  m = message({"train.log_dir=" + toml_path(file / "logs")});
  EXPECT_NE(m.find("train.log_dir = "), std::string::npos) << m;
  m = message({}, dir.string());
  EXPECT_NE(m.find("--metrics = \"" + dir.string() + "\" cannot be written: it is a folder"), std::string::npos) << m;
  m = message({}, (file / "m.jsonl").string());
  EXPECT_NE(m.find("its folder cannot be made"), std::string::npos) << m;
  // Writable paths are made (and nothing is left in them but what the run writes).
  TrainingRun ok(make_config({"train.checkpoint_dir=" + toml_path(dir / "new" / "ckpt")}),
                 RunOptions{.verbose = false});
  EXPECT_TRUE(fs::is_directory(dir / "new" / "ckpt"));
  EXPECT_TRUE(fs::is_empty(dir / "new" / "ckpt"));
  fs::remove_all(dir);
}

// Defect 9: max_steps bounds the run whatever the epochs: 12 updates with 8-step epochs is one epoch
// and a half, with epochs = 0 and with epochs = 3 alike; the LR schedule spans those 12.
TEST(TrainingRun, MaxStepsStopsMidEpochAndSetsTheScheduleLength) {
  for (const std::string epochs : {"0", "3"}) {
    const fs::path dir = fresh_dir("max_steps_" + epochs);
    TrainingRun run(make_config({"train.epochs=" + epochs, "train.max_steps=12", "lr_scheduler.name=\"linear\""}),
                    RunOptions{.metrics_path = (dir / "m.jsonl").string(), .verbose = false});
    EXPECT_EQ(run.plan().total_updates, 12);
    EXPECT_EQ(run.plan().epochs, 2);
    const RunResult result = run.fit();
    EXPECT_EQ(result.updates, 12) << "epochs = " << epochs;
    EXPECT_EQ(result.steps, 12) << "epochs = " << epochs;
    EXPECT_EQ(step_losses(dir / "m.jsonl").size(), 12u);
    // Linear decay to 0 at the schedule's end: the last update ran at a small positive rate and the
    // schedule is now at 0, not 4/16 of the way short.
    EXPECT_EQ(run.engine().optimizer().param_groups()[0].options.at("lr"), 0.0);
    fs::remove_all(dir);
  }
}

// Defects 4 and 9: a run cut at max_steps inside an epoch saves its state at the cut, and resuming
// with a larger max_steps continues from mid-epoch to the new bound with the uninterrupted run's
// losses.
TEST(TrainingRun, ResumeExtendsARunCutByMaxSteps) {
  const fs::path dir = fresh_dir("extend");
  const std::vector<std::string> base = {"train.epochs=0", "lr_scheduler.name=\"constant\""};
  const auto with = [&](std::vector<std::string> more) {
    std::vector<std::string> all = base;
    all.insert(all.end(), more.begin(), more.end());
    return make_config(all);
  };
  {
    TrainingRun full(with({"train.max_steps=11"}),
                     RunOptions{.metrics_path = (dir / "full.jsonl").string(), .verbose = false});
    full.fit();
  }
  {
    TrainingRun first(with({"train.max_steps=3", "train.checkpoint_dir=" + toml_path(dir / "ckpt")}),
                      RunOptions{.metrics_path = (dir / "first.jsonl").string(), .verbose = false});
    EXPECT_EQ(first.fit().updates, 3);
  }
  ASSERT_FALSE(fs::is_empty(dir / "ckpt")) << "the cut run saved no checkpoint";
  TrainingRun rest(with({"train.max_steps=11", "train.resume_from=" + toml_path(dir / "ckpt")}),
                   RunOptions{.metrics_path = (dir / "rest.jsonl").string(), .verbose = false});
  EXPECT_EQ(rest.start().epoch, 0);
  EXPECT_EQ(rest.start().iter, 3) << "resumes from mid-epoch";
  const RunResult result = rest.fit();
  EXPECT_EQ(result.updates, 11);
  const std::map<int64_t, double> full = step_losses(dir / "full.jsonl"), resumed = step_losses(dir / "rest.jsonl");
  ASSERT_EQ(resumed.size(), 8u);
  for (const auto& [step, loss] : resumed) EXPECT_EQ(loss, full.at(step)) << "step " << step;
  fs::remove_all(dir);
}

// Defect 10 (the last item): a 3-step run with the default test_interval no longer evaluates the
// whole test set after its 3 steps; an epoch cut short is not a test point. A run bounded by
// max_steps alone (epochs = 0) still tests at its end.
TEST(TrainingRun, AnEpochCutByMaxStepsIsNotTested) {
  const fs::path dir = fresh_dir("cut_test");
  const auto tested = [&](const std::vector<std::string>& overrides) {
    TrainingRun run(make_config(overrides), RunOptions{.metrics_path = (dir / "m.jsonl").string(), .verbose = false});
    run.fit();
    const std::vector<nlohmann::json> lines = read_jsonl(dir / "m.jsonl");
    fs::remove(dir / "m.jsonl");
    return !lines.back()["test_loss"].is_null();
  };
  EXPECT_FALSE(tested({"train.max_steps=3"}));
  EXPECT_TRUE(tested({"train.max_steps=3", "train.epochs=0"}));
  EXPECT_TRUE(tested({}));  // a whole epoch is tested
  fs::remove_all(dir);
}

}  // namespace
}  // namespace colossal::initialize
