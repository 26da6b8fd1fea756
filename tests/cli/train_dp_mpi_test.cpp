// `colossal train --config` under mpirun (2 and 4 ranks): data parallelism from the launcher's
// environment. Rank 0 alone writes the metrics and the checkpoints; a run resumed from a checkpoint
// taken inside an epoch repeats the uninterrupted data-parallel run's losses exactly; a parallel.data
// that does not match the processes started is refused naming the key.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <map>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "metrics_jsonl.h"

#include "../comm/mpi_test_main.h"
#include "colossal/cli/train_command.h"
#include "colossal/core/error.h"

namespace colossal::cli {
namespace {

using colossal::testing::read_jsonl;
using colossal::testing::step_losses;

namespace fs = std::filesystem;
using comm::testing::world;

constexpr const char* kConfig = R"(
[model]
name = "vit"
options = { patch_size = 4, embed_dim = 16, depth = 1, num_heads = 2, mlp_ratio = 2.0, dropout = 0.1 }

[data]
dataset = "synthetic"
batch_size = 4
options = { size = 96, test_size = 16, image_size = 8, channels = 1, num_classes = 4 }

[optimizer]
name = "adamw"
lr = 2e-3

[lr_scheduler]
name = "cosine"
warmup_steps = 2

[train]
epochs = 2
device = "cpu"
progress = false
log_interval = 1
)";

/// A folder shared by the ranks of this run (rank 0's name, broadcast).
fs::path shared_dir(const std::string& name) {
  Tensor stamp = core::from_vector<int64_t>({::testing::UnitTest::GetInstance()->random_seed()}, {1});
  world().broadcast(stamp, 0);
  const fs::path dir =
      fs::temp_directory_path() / ("colossal_train_dp_mpi_test_" + name + "_" + std::to_string(stamp.item<int64_t>()) +
                                   "_" + std::to_string(world().size()));
  if (world().rank() == 0) {
    fs::remove_all(dir);
    fs::create_directories(dir);
    std::ofstream(dir / "config.toml") << kConfig;
  }
  world().barrier();
  return dir;
}

TEST(TrainDataParallel, RankZeroWritesAndResumeRepeatsTheLosses) {
  const fs::path dir = shared_dir("resume");
  const int rank = world().rank(), size = world().size();
  const fs::path metrics = dir / ("full_rank" + std::to_string(rank) + ".jsonl");
  const std::vector<std::string> run = {"train.checkpoint_steps=2",
                                        "train.checkpoint_dir=" + toml_string((dir / "ckpt").string())};
  ASSERT_EQ(train_from_config((dir / "config.toml").string(), run, metrics.string()), 0);
  world().barrier();
  // 96 samples / size ranks / 4 per batch steps per epoch, 2 epochs.
  const int64_t steps = 2 * (96 / size / 4);
  if (rank == 0) {
    EXPECT_EQ(step_losses(metrics).size(), static_cast<size_t>(steps));
    EXPECT_TRUE(fs::exists(dir / "ckpt" / "epoch0-step2.safetensors"));
  } else {
    EXPECT_FALSE(fs::exists(metrics)) << "rank " << rank << " wrote metrics";
  }

  // Resume every rank from the checkpoint after step 2 (inside epoch 0).
  const fs::path resumed_metrics = dir / ("resumed_rank" + std::to_string(rank) + ".jsonl");
  const std::vector<std::string> resume = {"train.resume_from=" +
                                           toml_string((dir / "ckpt" / "epoch0-step2.safetensors").string())};
  ASSERT_EQ(train_from_config((dir / "config.toml").string(), resume, resumed_metrics.string()), 0);
  world().barrier();
  if (rank == 0) {
    const std::map<int64_t, double> full = step_losses(metrics), resumed = step_losses(resumed_metrics);
    ASSERT_EQ(resumed.size(), static_cast<size_t>(steps - 2));
    for (const auto& [step, loss] : resumed) EXPECT_EQ(loss, full.at(step)) << "step " << step;
  }
  world().barrier();
  if (rank == 0) fs::remove_all(dir);
}

TEST(TrainDataParallel, ParallelDataMustMatchTheProcesses) {
  const fs::path dir = shared_dir("mismatch");
  try {
    train_from_config((dir / "config.toml").string(), {"parallel.data=" + std::to_string(world().size() + 1)}, "");
    FAIL() << "trained with a parallel.data that does not match";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("parallel.data = " + std::to_string(world().size() + 1)), std::string::npos)
        << e.what();
  }
  world().barrier();
  if (world().rank() == 0) fs::remove_all(dir);
}

}  // namespace
}  // namespace colossal::cli

int main(int argc, char** argv) {
  return colossal::comm::testing::run_mpi_tests(argc, argv);
}
