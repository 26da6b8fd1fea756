// The tutorials' pipeline configs (configs/, issue 20) as a user runs them,
//   colossal run --nproc_per_node 2 -- colossal train --config configs/<tutorial>.toml
// on 2 CPU ranks at a reduced size: each config's parallel layout (stages, microbatches, chunks),
// optimizer, schedule kind, precision and transforms as written, the model shrunk (fewer and narrower
// layers, 16 x 16 images), the batch 16, 4 epochs of a small CIFAR-10 in the binary format whose
// images' brightness gives their class, the warmup one epoch. Each run's mean loss over its last
// epoch is below its first epoch's, and it prints its pipeline's bubble report. The hybrid config
// (vit_b16_hybrid_cifar10.toml, 2 stages of 2 tensor ranks) runs on 4 ranks. And every config of
// configs/ at its own size and layout passes `colossal describe`, which builds its model and checks
// it against the layout (heads that split over the tensor ranks, the pipeline's cut): the shrunk runs
// set their own heads, and vit_cifar10_hybrid.toml's 3 heads over 2 tensor ranks went unseen until a
// 4-GPU run.
#include <gtest/gtest.h>

#include <unistd.h>  // getpid

#include <cstdint>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>
#include <string>
#include <vector>

#include "metrics_jsonl.h"

namespace {

using colossal::testing::step_losses;
namespace fs = std::filesystem;

const fs::path kConfigs = fs::path(COLOSSAL_TEST_DATA_DIR) / ".." / ".." / "configs";
constexpr int kRecordsPerFile = 16;  // 5 training files: 80 images, 5 steps of 16 an epoch

int run(const std::string& command, const fs::path& log) {
  return std::system((command + " > '" + log.string() + "' 2>&1").c_str());
}

std::string read(const fs::path& path) {
  std::ifstream in(path);
  return {std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
}

/// CIFAR-10's binary files (a label byte, then 3 x 32 x 32 pixel bytes per record) of 4 of the 10
/// classes, each image a bright band of 8 rows across a dark ground at its class's height (a ripple on
/// top), which survives the crops and AutoAugment's colour operations (an inverted image keeps its
/// band): a small model learns them within a few epochs.
void write_cifar(const fs::path& dir) {
  fs::create_directories(dir);
  int index = 0;
  auto write = [&](const std::string& name) {
    std::ofstream out(dir / name, std::ios::binary);
    for (int r = 0; r < kRecordsPerFile; ++r, ++index) {
      const int label = index % 4;
      out.put(static_cast<char>(label));
      for (int p = 0; p < 3 * 32 * 32; ++p) {
        const int row = (p / 32) % 32;
        const int value = (row / 8 == label ? 200 : 30) + (p * 7 + index) % 9;
        out.put(static_cast<char>(static_cast<uint8_t>(value)));
      }
    }
  };
  for (int b = 1; b <= 5; ++b) write("data_batch_" + std::to_string(b) + ".bin");
  write("test_batch.bin");
}

class TutorialPipelineConfigs : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::temp_directory_path() / ("colossal_tutorial_pipeline_configs_test_" + std::to_string(::getpid()));
    fs::remove_all(dir_);
    write_cifar(dir_ / "cifar");
    ASSERT_EQ(::setenv("DATA", (dir_ / "cifar").c_str(), 1), 0);  // the configs' $DATA
  }
  void TearDown() override { fs::remove_all(dir_); }

  /// Runs `config` on `ranks` CPU ranks with `shrink` (its --set options) and expects its loss to fall.
  void expect_loss_falls(const std::string& config, const std::string& shrink, int ranks = 2) {
    SCOPED_TRACE(config);
    const std::string bin = COLOSSAL_BINARY;
    const fs::path metrics = dir_ / (config + ".jsonl"), log = dir_ / (config + ".log");
    const std::string common =
        " --set train.device='\"cpu\"' --set data.batch_size=16 --set data.num_workers=0 --set train.epochs=4"
        " --set train.progress=false --set train.log_interval=1 --set train.test_interval=0"
        " --set parallel.pipeline_report=3";
    ASSERT_EQ(run(bin + " run --nproc_per_node " + std::to_string(ranks) + " -- " + bin + " train --config " +
                      (kConfigs / config).string() + common + shrink + " --metrics " + metrics.string(),
                  log),
              0)
        << read(log);
    const std::map<int64_t, double> losses = step_losses(metrics);
    ASSERT_EQ(losses.size(), 20u) << read(log);  // 4 epochs of 5 steps
    double first = 0, last = 0;                  // the means of the first epoch's 5 steps and the last's
    int k = 0;
    for (const auto& [step, loss] : losses) {
      if (k < 5) first += loss / 5;
      if (k >= 15) last += loss / 5;
      ++k;
    }
    EXPECT_LT(last, first) << read(log);
    std::printf("%s: mean loss of the first epoch %.4f, of the last %.4f\n", config.c_str(), first, last);
    EXPECT_NE(read(log).find("pipeline bubble: 2 stages"), std::string::npos) << read(log);
  }

  fs::path dir_;
};

TEST_F(TutorialPipelineConfigs, EveryConfigDescribesAtItsOwnSizeAndLayout) {
  const std::string bin = COLOSSAL_BINARY;
  int described = 0;
  for (const fs::directory_entry& entry : fs::directory_iterator(kConfigs)) {
    if (entry.path().extension() != ".toml") continue;
    SCOPED_TRACE(entry.path().filename().string());
    const fs::path log = dir_ / (entry.path().filename().string() + ".describe.log");
    // data.path set for the configs that do not read $DATA (the CIFAR-10 ones; the token and
    // Fashion-MNIST ones are described without reading their data, or from Debian's package).
    const std::string text = read(entry.path());
    const bool cifar = text.find("\"cifar10\"") != std::string::npos;
    const std::string data = cifar ? " --set data.path='\"" + (dir_ / "cifar").string() + "\"'" : "";
    EXPECT_EQ(run(bin + " describe --config " + entry.path().string() + data, log), 0) << read(log);
    EXPECT_NE(read(log).find("# model \""), std::string::npos) << read(log);
    ++described;
  }
  EXPECT_GE(described, 14);

  // The mistake that test would have caught: heads that do not split, named with the key to change.
  const fs::path log = dir_ / "heads.describe.log";
  EXPECT_NE(run(bin + " describe --config " + (kConfigs / "vit_cifar10_hybrid.toml").string() + " --set data.path='\"" +
                    (dir_ / "cifar").string() + "\"' --set model.options.num_heads=3",
                log),
            0);
  EXPECT_NE(read(log).find("model.options.num_heads = 3: a ViT's heads do not split over parallel.tensor.size = 2"),
            std::string::npos)
      << read(log);
}

// ViT: 2 blocks 32 wide, 4 x 4 patches of 16 x 16 images.
const std::string kSmallVit =
    " --set data.options.resize=16 --set model.options.patch_size=4 --set model.options.embed_dim=32"
    " --set model.options.depth=2 --set model.options.num_heads=2 --set lr_scheduler.warmup_epochs=1";

TEST_F(TutorialPipelineConfigs, VitB16PipelineLossFalls) {
  expect_loss_falls("vit_b16_pipeline_cifar10.toml", kSmallVit);
}

TEST_F(TutorialPipelineConfigs, VitL16PipelineLossFalls) {
  expect_loss_falls("vit_l16_pipeline_cifar10.toml", kSmallVit.substr(0, kSmallVit.find(" --set lr_scheduler")));
}

// ResNet-50's bottleneck blocks, one per stage 8 wide, on 32 x 32 images.
const std::string kSmallResnet =
    " --set model.options.layers='[1, 1, 1, 1]' --set model.options.width=8 --set lr_scheduler.warmup_epochs=1";

// Each rank built its own stage's pieces only (Note [Stage pieces built alone]).
TEST_F(TutorialPipelineConfigs, Resnet50PipelineLossFalls) {
  expect_loss_falls("resnet50_pipeline_cifar10.toml", kSmallResnet);
  const std::string log = read(dir_ / "resnet50_pipeline_cifar10.toml.log");
  EXPECT_NE(log.find("stage 0 built alone: its "), std::string::npos) << log;
}

TEST_F(TutorialPipelineConfigs, Resnet50InterleavedLossFalls) {
  expect_loss_falls("resnet50_interleaved_cifar10.toml", kSmallResnet);
  const std::string log = read(dir_ / "resnet50_interleaved_cifar10.toml.log");
  EXPECT_NE(log.find("stage 0 built alone: its "), std::string::npos) << log;
}

// The hybrid config at its own layout, 2 stages of 2 tensor ranks: 4 CPU ranks.
TEST_F(TutorialPipelineConfigs, VitB16HybridLossFalls) {
  expect_loss_falls("vit_b16_hybrid_cifar10.toml", kSmallVit, 4);
}

}  // namespace
