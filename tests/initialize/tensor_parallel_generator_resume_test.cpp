// The tensor-parallel generator in checkpoints (parallel/tp/random.h, initialize/training_run.cpp):
// every run's checkpoint carries its state ("rng.tensor_parallel"), and a checkpoint written before
// that generator existed (no such entry) still resumes, with the losses of the uninterrupted run
// (here a serial ViT, which never draws from it).
#include <gtest/gtest.h>

#include <filesystem>
#include <map>
#include <string>
#include <vector>

#include "metrics_jsonl.h"

#include "colossal/initialize/training_run.h"
#include "colossal/nn/safetensors.h"
#include "colossal/parallel/layout_rules.h"

namespace colossal::initialize {
namespace {

using colossal::testing::step_losses;
namespace fs = std::filesystem;

// 64 samples in batches of 8: 8 steps an epoch; dropout on, so the generators' states matter.
constexpr const char* kConfig = R"(
[model]
name = "vit"
options = { patch_size = 4, embed_dim = 16, depth = 1, num_heads = 2, mlp_ratio = 2.0, dropout = 0.1 }

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
test_interval = 0
)";

std::map<int64_t, double> train(const fs::path& metrics, const std::vector<std::string>& overrides) {
  TrainingRun run(config::parse_config(kConfig, overrides, "test.toml", {parallel::layout_config_rule()}),
                  RunOptions{.metrics_path = metrics.string(), .verbose = false});
  run.fit();
  return step_losses(metrics);
}

TEST(TensorParallelGeneratorResume, ACheckpointWithoutItsStateStillResumes) {
  const fs::path dir = fs::temp_directory_path() / "colossal_tensor_parallel_generator_resume_test";
  fs::remove_all(dir);
  fs::create_directories(dir);
  const std::map<int64_t, double> full = train(
      dir / "full.jsonl", {"train.checkpoint_steps=4", "train.checkpoint_dir=\"" + (dir / "ckpt").string() + "\""});
  ASSERT_EQ(full.size(), 8u);
  const fs::path saved = dir / "ckpt" / "epoch0-step4.safetensors";
  nn::SafetensorsFile file = nn::load_safetensors(saved);
  ASSERT_TRUE(file.metadata.contains("rng.tensor_parallel"));

  // The same file as an older build wrote it.
  file.metadata.erase("rng.tensor_parallel");
  const fs::path old = dir / "old.safetensors";
  nn::save_safetensors(old, file.tensors, file.metadata);
  const std::map<int64_t, double> resumed =
      train(dir / "resumed.jsonl", {"train.resume_from=\"" + old.string() + "\""});
  ASSERT_EQ(resumed.size(), 4u);
  for (const auto& [step, loss] : resumed) EXPECT_EQ(loss, full.at(step)) << "step " << step;
  fs::remove_all(dir);
}

}  // namespace
}  // namespace colossal::initialize
