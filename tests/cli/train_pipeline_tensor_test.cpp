// A pipeline of tensor-parallel stages through the command line (Note [Pipeline of tensor-parallel
// stages] in initialize/pipeline_stage.h):
//   colossal run --nproc_per_node 4 -- colossal train --config C --set parallel.pipeline=2 --set parallel.tensor.size=2
// gives, step by step, the serial run's losses for a tiny GPT-2 (the tied wte summed between the first
// and last stage per tensor rank, accumulation and clipping on; 1F1B and interleaved) and a tiny ViT;
// and dp2 x pp2 on 4 ranks and dp2 x pp2 x tp2 on 8 (GPT-2, each replica half of every batch) give them
// too; so does a ResNet over 2 stages, each rank having built its own stage's pieces only. fp32; 1e-5
// relative, the layout harness's f32 tolerance (the same sums in another order: microbatches, split
// GEMMs, the tensor group's all-reduces). Each loss is of the model after the previous steps' updates, so equal
// losses over 6 updates mean equal parameters.
#include <gtest/gtest.h>

#include <unistd.h>  // getpid

#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>
#include <sstream>
#include <string>
#include <vector>

#include "metrics_jsonl.h"

namespace {

using colossal::testing::step_losses;
namespace fs = std::filesystem;

int run(const std::string& command, const fs::path& log) {
  return std::system((command + " > '" + log.string() + "' 2>&1").c_str());
}

std::string read(const fs::path& path) {
  std::ifstream in(path);
  return {std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
}

class TrainPipelineTensor : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::temp_directory_path() / ("colossal_train_pipeline_tensor_test_" + std::to_string(::getpid()));
    fs::remove_all(dir_);
    fs::create_directories(dir_);
    std::ofstream out(dir_ / "tokens.bin", std::ios::binary);
    for (int i = 0; i < 4000; ++i) {
      const auto t = static_cast<uint16_t>((i * 7 + i / 5 + (i * i) % 13) % 64);
      const char bytes[2] = {static_cast<char>(t & 0xFF), static_cast<char>(t >> 8)};
      out.write(bytes, 2);
    }
  }
  void TearDown() override { fs::remove_all(dir_); }

  /// GPT-2 of 2 blocks 16 wide (4 heads: 2 per tensor rank), batch 8 of 16 tokens, 2 accumulated
  /// micro-steps an update, clipping at 0.5 (below the gradients' norm), 6 updates.
  fs::path gpt2_config() {
    std::ofstream(dir_ / "gpt2.toml") << "gradient_accumulation = 2\nclip_grad_norm = 0.5\n"
                                         "[model]\nname = \"gpt2\"\n"
                                         "options = { n_layer = 2, n_embd = 16, n_head = 4, n_positions = 16, "
                                         "vocab_size = 64, dropout = 0.0 }\n"
                                         "[data]\ndataset = \"tokens\"\npath = \""
                                      << (dir_ / "tokens.bin").string()
                                      << "\"\nbatch_size = 8\nseq_len = 16\n"
                                         "[optimizer]\nname = \"adamw\"\nlr = 1e-3\n"
                                         "[train]\nepochs = 0\nmax_steps = 6\ndevice = \"cpu\"\nprogress = false\n"
                                         "log_interval = 1\n";
    return dir_ / "gpt2.toml";
  }

  /// ViT of 2 blocks 16 wide (2 heads) on 8 x 8 synthetic images, batch 8, 12 steps.
  fs::path vit_config() {
    std::ofstream(dir_ / "vit.toml")
        << "[model]\nname = \"vit\"\n"
           "options = { patch_size = 4, embed_dim = 16, depth = 2, num_heads = 2, mlp_ratio = 2.0 }\n"
           "[data]\ndataset = \"synthetic\"\nbatch_size = 8\n"
           "options = { size = 96, test_size = 16, image_size = 8, channels = 1, num_classes = 4 }\n"
           "[optimizer]\nname = \"adamw\"\nlr = 2e-3\n"
           "[train]\nepochs = 1\ndevice = \"cpu\"\nprogress = false\nlog_interval = 1\ntest_interval = 0\n";
    return dir_ / "vit.toml";
  }

  /// ResNet of basic blocks [1, 2, 1, 1] 4 wide (CIFAR stem, zero_init_residual) on 8 x 8 synthetic
  /// images, batch 8, 12 steps: 8 pieces whose parameters differ block to block.
  fs::path resnet_config() {
    std::ofstream(dir_ / "resnet.toml")
        << "[model]\nname = \"resnet\"\npreset = \"resnet18\"\n"
           "options = { cifar_stem = true, width = 4, layers = [1, 3, 1, 1], zero_init_residual = true }\n"
           "[data]\ndataset = \"synthetic\"\nbatch_size = 8\n"
           "options = { size = 96, test_size = 16, image_size = 8, channels = 1, num_classes = 4 }\n"
           "[optimizer]\nname = \"adamw\"\nlr = 2e-3\n"
           "[train]\nepochs = 1\ndevice = \"cpu\"\nprogress = false\nlog_interval = 1\ntest_interval = 0\n";
    return dir_ / "resnet.toml";
  }

  /// Trains `config` serially and on `ranks` ranks with `sets`, expecting every step's loss within 1e-5.
  void expect_serial_losses(const fs::path& config, int ranks, const std::string& sets, const std::string& name) {
    SCOPED_TRACE(name);
    const std::string bin = COLOSSAL_BINARY;
    const fs::path serial_metrics = dir_ / (config.stem().string() + "_serial.jsonl");
    if (!fs::exists(serial_metrics)) {
      ASSERT_EQ(run(bin + " train --config " + config.string() + " --metrics " + serial_metrics.string(),
                    dir_ / "serial.log"),
                0)
          << read(dir_ / "serial.log");
    }
    const fs::path metrics = dir_ / (name + ".jsonl"), log = dir_ / (name + ".log");
    ASSERT_EQ(run(bin + " run --nproc_per_node " + std::to_string(ranks) + " -- " + bin + " train --config " +
                      config.string() + " " + sets + " --metrics " + metrics.string(),
                  log),
              0)
        << read(log);
    const std::map<int64_t, double> serial = step_losses(serial_metrics), got = step_losses(metrics);
    ASSERT_GE(serial.size(), 12u);
    ASSERT_EQ(got.size(), serial.size()) << read(log);
    double worst = 0;
    for (const auto& [step, loss] : serial) {
      const double error = std::abs(got.at(step) - loss) / std::abs(loss);
      worst = std::max(worst, error);
      EXPECT_LE(error, 1e-5) << "step " << step << ": " << name << " " << got.at(step) << ", serial " << loss;
    }
    std::printf("%s against serial: %zu steps, largest relative difference %.2e\n", name.c_str(), serial.size(), worst);
  }

  /// Run `name` was cut by measured times, and each rank built its own stage's pieces only.
  void expect_measured_before_building(const std::string& name) {
    const std::string log = read(dir_ / (name + ".log"));
    EXPECT_NE(log.find("balanced by measured times"), std::string::npos) << log;
    EXPECT_NE(log.find("stage 0 built alone: its "), std::string::npos) << log;
  }

  fs::path dir_;
};

TEST_F(TrainPipelineTensor, Gpt2AtPp2Tp2GivesTheSerialLosses) {
  const fs::path config = gpt2_config();
  expect_serial_losses(config, 4,
                       "--set parallel.pipeline=2 --set parallel.tensor.size=2 --set parallel.num_microbatches=2",
                       "gpt2_pp2_tp2");
  // Each rank built its own stage's pieces only (Note [Stage pieces built alone]), and the losses
  // above are the serial run's: the pieces built drew the serial weights.
  EXPECT_NE(read(dir_ / "gpt2_pp2_tp2.log").find("stage 0 built alone: its "), std::string::npos)
      << read(dir_ / "gpt2_pp2_tp2.log");
  expect_serial_losses(config, 4,
                       "--set parallel.pipeline=2 --set parallel.tensor.size=2 --set parallel.num_microbatches=2 "
                       "--set parallel.num_chunks=2",
                       "gpt2_pp2v2_tp2");
  // Cut by the measured times of the stages' tensor-parallel blocks (each tensor rank times its part,
  // its all-reduces included): another cut, the same losses.
  expect_serial_losses(config, 4,
                       "--set parallel.pipeline=2 --set parallel.tensor.size=2 --set parallel.num_microbatches=2 "
                       "--set 'parallel.partition=\"measured\"'",
                       "gpt2_pp2_tp2_measured");
  // Measured on a probe before the model was built (the embedding, block 0 in its tensor-parallel
  // form, the head), so each rank built its own stage's pieces only here too.
  expect_measured_before_building("gpt2_pp2_tp2_measured");
}

TEST_F(TrainPipelineTensor, Gpt2AtPp2FromModelWeightsReadsEachStagesOwnPieces) {
  // Weights written by `colossal export` after two steps; a run from them at pp=2 builds each stage
  // alone and reads only its own pieces' tensors (Note [Weights of the pieces held] in
  // nn/hub_weights.h), with the serial run's losses from the same file.
  const std::string bin = COLOSSAL_BINARY;
  const fs::path config = gpt2_config(), checkpoints = dir_ / "weights_ckpt", weights = dir_ / "weights.safetensors";
  ASSERT_EQ(run(bin + " train --config " + config.string() + " --set train.max_steps=2 --set 'train.checkpoint_dir=\"" +
                    checkpoints.string() + "\"'",
                dir_ / "weights_train.log"),
            0)
      << read(dir_ / "weights_train.log");
  ASSERT_EQ(run(bin + " export " + checkpoints.string() + " -o " + weights.string(), dir_ / "export.log"), 0)
      << read(dir_ / "export.log");
  std::string text = read(config);
  text.replace(text.find("[model]\n"), 8, "[model]\nweights = \"" + weights.string() + "\"\n");
  const fs::path from_weights = dir_ / "gpt2_from_weights.toml";
  std::ofstream(from_weights) << text;
  expect_serial_losses(from_weights, 2, "--set parallel.pipeline=2 --set parallel.num_microbatches=2",
                       "gpt2_pp2_weights");
  const std::string log = read(dir_ / "gpt2_pp2_weights.log");
  EXPECT_NE(log.find("model.weights: loaded"), std::string::npos) << log;
  EXPECT_NE(log.find("stage 0 built alone: its "), std::string::npos) << log;
}

TEST_F(TrainPipelineTensor, VitAtPp2Tp2GivesTheSerialLosses) {
  expect_serial_losses(vit_config(), 4,
                       "--set parallel.pipeline=2 --set parallel.tensor.size=2 --set parallel.num_microbatches=4",
                       "vit_pp2_tp2");
  // A measured cut of a ViT, from a probe of it timed before it is built.
  expect_serial_losses(vit_config(), 2,
                       "--set parallel.pipeline=2 --set parallel.num_microbatches=4 "
                       "--set 'parallel.partition=\"measured\"'",
                       "vit_pp2_measured");
  expect_measured_before_building("vit_pp2_measured");
}

TEST_F(TrainPipelineTensor, ResnetAtPp2BuiltAloneGivesTheSerialLosses) {
  // A ResNet's stages are cut before it is built too, from the pieces' computed parameter counts, and
  // each rank builds its own stage's pieces only (Note [Stage pieces built alone]). One microbatch,
  // since BatchNorm normalises each microbatch by its own statistics: the serial run's batch.
  const fs::path config = resnet_config();
  expect_serial_losses(config, 2, "--set parallel.pipeline=2 --set parallel.num_microbatches=1", "resnet_pp2");
  const std::string log = read(dir_ / "resnet_pp2.log");
  EXPECT_NE(log.find("8 pieces balanced by parameters"), std::string::npos) << log;
  EXPECT_NE(log.find("stage 0 built alone: its "), std::string::npos) << log;
  // Another cut, listed: stage 0 holds the stem alone, stage 1 the blocks and the head.
  expect_serial_losses(config, 2,
                       "--set parallel.pipeline=2 --set parallel.num_microbatches=1 "
                       "--set 'parallel.partition_sizes=[1, 7]'",
                       "resnet_pp2_listed");
  const std::string listed = read(dir_ / "resnet_pp2_listed.log");
  EXPECT_NE(listed.find("stage 0: [0, 1); stage 1: [1, 8); stage 0 built alone: its "), std::string::npos) << listed;
  // Cut by measured times, from a probe of the stem, each stage's first two blocks and the head.
  expect_serial_losses(config, 2,
                       "--set parallel.pipeline=2 --set parallel.num_microbatches=1 "
                       "--set 'parallel.partition=\"measured\"'",
                       "resnet_pp2_measured");
  expect_measured_before_building("resnet_pp2_measured");
  // The probe timed stage 2's first two blocks (pieces 2 and 3); its third (piece 4) is charged the
  // second's time.
  const std::string measured = read(dir_ / "resnet_pp2_measured.log");
  const std::string key = "measured ms per piece (forward and backward of one microbatch): [";
  const size_t at = measured.find(key);
  ASSERT_NE(at, std::string::npos) << measured;
  std::vector<std::string> times;
  std::stringstream list(measured.substr(at + key.size(), measured.find(']', at) - at - key.size()));
  for (std::string t; std::getline(list, t, ',');) times.push_back(t);
  ASSERT_EQ(times.size(), 8u) << measured;
  EXPECT_EQ(times[4], times[3]) << measured;
}

TEST_F(TrainPipelineTensor, Gpt2AtDp2Pp2AndDp2Pp2Tp2GivesTheSerialLosses) {
  // Each data-parallel replica takes half of the serial batch of 8; the tied wte's copies are
  // averaged over the replicas, then summed between the stages (Note [Tied parameters across stages]).
  const fs::path config = gpt2_config();
  expect_serial_losses(config, 4,
                       "--set parallel.data=2 --set data.batch_size=4 --set parallel.pipeline=2 "
                       "--set parallel.num_microbatches=2",
                       "gpt2_dp2_pp2");
  expect_serial_losses(config, 8,
                       "--set parallel.data=2 --set data.batch_size=4 --set parallel.pipeline=2 "
                       "--set parallel.tensor.size=2 --set parallel.num_microbatches=2",
                       "gpt2_dp2_pp2_tp2");
}

}  // namespace
