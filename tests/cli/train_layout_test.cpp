// The same global batch whatever the layout, through the command line as a user runs it:
//   colossal run --nproc_per_node 2 -- colossal train --config C --set parallel.data=2 --set data.batch_size=8
// gives, step by step, the losses of
//   colossal train --config C --set data.batch_size=16
// (fp32; 1e-5 relative, the layout harness's f32 tolerance: the same sums in another order). The
// ranks take every other sample of the serial run's shuffled order, so global batch k holds the
// serial batch k's samples; a wrong split (another order, a rank's share twice) changes the loss by
// percents.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>
#include <string>

#include <nlohmann/json.hpp>

#include "cli_runs.h"
#include "metrics_jsonl.h"

namespace {

using colossal::testing::read_jsonl;
using colossal::testing::read_text;
using colossal::testing::run_logged;
using colossal::testing::step_losses;

namespace fs = std::filesystem;

constexpr const char* kConfig = R"(
[model]
name = "vit"
options = { patch_size = 4, embed_dim = 16, depth = 1, num_heads = 2, mlp_ratio = 2.0 }

[data]
dataset = "synthetic"
batch_size = 16
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
test_interval = 0
)";

TEST(TrainLayout, TwoDataParallelRanksGiveTheSerialRunsLosses) {
  const fs::path dir = fs::temp_directory_path() / ("colossal_train_layout_test_" + std::to_string(::getpid()));
  fs::remove_all(dir);
  fs::create_directories(dir);
  std::ofstream(dir / "c.toml") << kConfig;
  const std::string bin = COLOSSAL_BINARY;
  const std::string config = (dir / "c.toml").string();

  ASSERT_EQ(run_logged(bin + " train --config " + config + " --set data.batch_size=16 --metrics " +
                           (dir / "serial.jsonl").string(),
                       dir / "serial.log"),
            0)
      << read_text(dir / "serial.log");
  ASSERT_EQ(run_logged(bin + " run --nproc_per_node 2 -- " + bin + " train --config " + config +
                           " --set parallel.data=2 --set data.batch_size=8 --metrics " + (dir / "dp2.jsonl").string(),
                       dir / "dp2.log"),
            0)
      << read_text(dir / "dp2.log");

  const std::map<int64_t, double> serial = step_losses(dir / "serial.jsonl"), dp = step_losses(dir / "dp2.jsonl");
  ASSERT_EQ(serial.size(), 12u) << read_text(dir / "serial.log");  // 96 / 16 = 6 steps an epoch, 2 epochs
  ASSERT_EQ(dp.size(), serial.size()) << read_text(dir / "dp2.log");
  const double worst = colossal::testing::expect_losses_within(serial, dp, 1e-5, "dp2");
  std::printf("dp2 x B8 against B16: %zu steps, largest relative difference %.2e\n", serial.size(), worst);
  fs::remove_all(dir);
}

// Tensor parallelism through the command line: GPT-2 (1D: heads, MLP, vocab-parallel embedding and
// loss) at parallel.tensor.size = 2 gives the serial run's per-step losses (fp32, 1e-5), clipping and
// gradient accumulation on; the two ranks take the same batches (one data-parallel rank).
/// Trains the tiny GPT-2 config serially and on 2 ranks with `sets` (command-line --set options),
/// expecting every step's loss within 1e-5 relative (fp32); `name` names the files.
void expect_two_ranks_give_the_serial_losses(const std::string& sets, const std::string& name) {
  const fs::path dir =
      fs::temp_directory_path() / ("colossal_train_layout_test_" + name + "_" + std::to_string(::getpid()));
  fs::remove_all(dir);
  fs::create_directories(dir);
  {
    std::ofstream out(dir / "tokens.bin", std::ios::binary);
    for (int i = 0; i < 4000; ++i) {
      const auto t = static_cast<uint16_t>((i * 7 + i / 5 + (i * i) % 13) % 64);
      const char bytes[2] = {static_cast<char>(t & 0xFF), static_cast<char>(t >> 8)};
      out.write(bytes, 2);
    }
  }
  std::ofstream(dir / "c.toml")
      << "gradient_accumulation = 2\nclip_grad_norm = 0.5\n"
         "[model]\nname = \"gpt2\"\n"
         "options = { n_layer = 2, n_embd = 16, n_head = 4, n_positions = 16, vocab_size = 64, "
         "dropout = 0.0 }\n"
         "[data]\ndataset = \"tokens\"\npath = \"" +
             (dir / "tokens.bin").string() +
             "\"\nbatch_size = 4\nseq_len = 16\n"
             "[optimizer]\nname = \"adamw\"\nlr = 1e-3\n"
             "[train]\nepochs = 0\nmax_steps = 6\ndevice = \"cpu\"\nprogress = false\n"
             "log_interval = 1\n";
  const std::string bin = COLOSSAL_BINARY;
  const std::string config = (dir / "c.toml").string();
  ASSERT_EQ(run_logged(bin + " train --config " + config + " --metrics " + (dir / "serial.jsonl").string(),
                       dir / "serial.log"),
            0)
      << read_text(dir / "serial.log");
  ASSERT_EQ(run_logged(bin + " run --nproc_per_node 2 -- " + bin + " train --config " + config + " " + sets +
                           " --metrics " + (dir / (name + ".jsonl")).string(),
                       dir / (name + ".log")),
            0)
      << read_text(dir / (name + ".log"));
  const std::map<int64_t, double> serial = step_losses(dir / "serial.jsonl"), tp = step_losses(dir / (name + ".jsonl"));
  ASSERT_EQ(serial.size(), 12u) << read_text(dir / "serial.log");  // 6 updates of 2 micro-steps
  ASSERT_EQ(tp.size(), serial.size()) << read_text(dir / (name + ".log"));
  const double worst = colossal::testing::expect_losses_within(serial, tp, 1e-5, name);
  std::printf("%s against serial: %zu steps, largest relative difference %.2e\n", name.c_str(), serial.size(), worst);
  fs::remove_all(dir);
}

TEST(TrainLayout, TwoTensorParallelRanksGiveTheSerialRunsLosses) {
  expect_two_ranks_give_the_serial_losses("--set parallel.tensor.size=2", "tp2");
}

// Pipeline parallelism through the command line (initialize/pipeline_stage.h): GPT-2's pieces cut
// into 2 stages with 2 microbatches, the tied wte summed between the first and last stage and counted
// once in the clipping norm, gives the serial run's losses; so does the interleaved schedule.
TEST(TrainLayout, TwoPipelineStagesGiveTheSerialRunsLosses) {
  expect_two_ranks_give_the_serial_losses("--set parallel.pipeline=2 --set parallel.num_microbatches=2", "pp2");
  expect_two_ranks_give_the_serial_losses(
      "--set parallel.pipeline=2 --set parallel.num_microbatches=2 --set parallel.num_chunks=2", "pp2v2");
}

// ZeRO through the command line (parallel/zero/low_level_zero.h): two data-parallel ranks of 2
// samples each with zero.stage = 1 and 2 (optimizer states, and then gradients, sharded; buckets of
// 1 MiB hold the whole tiny GPT-2, so each rank owns half of every bucket) give the serial run's
// losses at batch 4, with the accumulation and clipping of the helper's config.
TEST(TrainLayout, TwoZeroRanksGiveTheSerialRunsLosses) {
  expect_two_ranks_give_the_serial_losses("--set parallel.data=2 --set data.batch_size=2 --set zero.stage=2",
                                          "dp2_zero2");
  expect_two_ranks_give_the_serial_losses(
      "--set parallel.data=2 --set data.batch_size=2 --set zero.stage=1 --set zero.reduce_bucket_mb=1", "dp2_zero1");
}

}  // namespace
