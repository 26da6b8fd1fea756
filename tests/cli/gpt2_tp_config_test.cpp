// configs/gpt2_tp.toml, as a user runs it: it loads with the built-in 1D policy over 2 tensor ranks,
// and `colossal run --nproc_per_node 2 -- colossal train --config configs/gpt2_tp.toml` on CPU ranks
// (the model shrunk by --set, everything else the config's: accumulation 4, clipping, AdamW, the
// cosine warmup, the padded 50304-entry vocabulary) gives the serial run's loss at every step, and
// its checkpoint holds the serial tensors; so does the run with parallel.tensor.sequence_parallel.
// Tolerance 1e-5 relative, the layout harness's f32 bound:
// the same sums in another order.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>
#include <string>

#include "cli_runs.h"
#include "metrics_jsonl.h"

#include "colossal/initialize/training_run.h"  // load_run_config
#include "colossal/nn/safetensors.h"

namespace {

using colossal::testing::read_text;
using colossal::testing::run_logged;
using colossal::testing::step_losses;
namespace fs = std::filesystem;

const fs::path kConfig = fs::path(COLOSSAL_TEST_DATA_DIR) / ".." / ".." / "configs" / "gpt2_tp.toml";

TEST(Gpt2TpConfig, LoadsWithTheBuiltInPolicyOverTwoRanks) {
  const colossal::config::TrainConfig c = colossal::initialize::load_run_config(kConfig);
  EXPECT_EQ(c.model.name, colossal::config::ModelName::kGpt2);
  EXPECT_EQ(c.parallel.tensor.mode, colossal::config::TensorParallelMode::k1d);
  EXPECT_EQ(c.parallel.tensor.size, 2);
}

TEST(Gpt2TpConfig, TwoCpuRanksGiveTheSerialRunsLosses) {
  const fs::path dir = colossal::testing::token_run_dir("colossal_gpt2_tp_config_test");
  const std::string bin = COLOSSAL_BINARY;
  // The tiny GPT-2 (4 heads where the config's 12 would not divide a width of 32); 4 windows a
  // micro-batch, 3 updates of 4 micro-batches.
  const std::string tiny =
      std::string(colossal::testing::kTinyGpt2Sets) + " --set data.batch_size=4 --set train.checkpoint_steps=3";
  const std::string common = " train --config " + kConfig.string() + tiny;
  ASSERT_EQ(run_logged(bin + common + " --set parallel.tensor.size=1 --set train.checkpoint_dir='\"" +
                           (dir / "serial").string() + "\"' --metrics " + (dir / "serial.jsonl").string(),
                       dir / "serial.log"),
            0)
      << read_text(dir / "serial.log");
  ASSERT_EQ(run_logged(bin + " run --nproc_per_node 2 -- " + bin + common + " --set train.checkpoint_dir='\"" +
                           (dir / "tp2").string() + "\"' --metrics " + (dir / "tp2.jsonl").string(),
                       dir / "tp2.log"),
            0)
      << read_text(dir / "tp2.log");

  const std::map<int64_t, double> serial = step_losses(dir / "serial.jsonl"), tp = step_losses(dir / "tp2.jsonl");
  ASSERT_EQ(serial.size(), 12u) << read_text(dir / "serial.log");  // 3 updates of 4 micro-steps
  ASSERT_EQ(tp.size(), serial.size()) << read_text(dir / "tp2.log");
  const double worst = colossal::testing::expect_losses_within(serial, tp, 1e-5, "tp2");
  std::printf("configs/gpt2_tp.toml at tp2 against serial: %zu steps, largest relative difference %.2e\n",
              serial.size(), worst);

  // The same with, each switched on from the command line: sequence parallelism; the blocks' batch in 2
  // chunks whose all-reduces overlap (parallel.tensor.overlap_chunks); each row-parallel GEMM in 3 blocks
  // of rows, each all-reduced as it is made (parallel.tensor.row_blocks); the residual and c_proj's bias
  // added after the all-reduce rather than in the row layers' GEMMs (the default run's way).
  const std::pair<const char*, const char*> variants[] = {{"sp", "parallel.tensor.sequence_parallel=true"},
                                                          {"chunks", "parallel.tensor.overlap_chunks=2"},
                                                          {"rows", "parallel.tensor.row_blocks=3"},
                                                          {"unfused", "parallel.tensor.fused_residual=false"}};
  for (const auto& [name, setting] : variants) {
    const fs::path log = dir / (std::string(name) + ".log"), metrics = dir / (std::string(name) + ".jsonl");
    ASSERT_EQ(
        run_logged(bin + " run --nproc_per_node 2 -- " + bin + common + " --set " + setting +
                       " --set train.checkpoint_dir='\"" + (dir / name).string() + "\"' --metrics " + metrics.string(),
                   log),
        0)
        << read_text(log);
    const std::map<int64_t, double> losses = step_losses(metrics);
    ASSERT_EQ(losses.size(), serial.size()) << read_text(log);
    for (const auto& [step, loss] : serial) {
      EXPECT_LE(std::abs(losses.at(step) - loss), 1e-5 * std::abs(loss)) << "step " << step << ": " << setting;
    }
  }

  // The copy engines asked for where there are none (CPU ranks talk through MPI): refused before any
  // step, naming the key, why, and what would do.
  const fs::path refused = dir / "copy_engines.log";
  EXPECT_NE(run_logged(bin + " run --nproc_per_node 2 -- " + bin + common +
                           " --set 'parallel.tensor.all_reduce=\"copy_engines\"' --set 'train.checkpoint_dir=\"\"'",
                       refused),
            0);
  const std::string said = read_text(refused);
  EXPECT_NE(said.find("parallel.tensor.all_reduce = \"copy_engines\" needs a tensor group of two GPUs"),
            std::string::npos)
      << said;
  EXPECT_NE(said.find("not NCCL on a GPU"), std::string::npos) << said;
  EXPECT_NE(said.find("\"nccl\""), std::string::npos) << said;

  // The tensor-parallel checkpoint is the serial one: same names, the whole padded vocabulary.
  const colossal::nn::SafetensorsFile a = colossal::nn::load_safetensors(dir / "tp2" / "epoch0-step12.safetensors");
  const colossal::nn::SafetensorsFile b = colossal::nn::load_safetensors(dir / "serial" / "epoch0-step12.safetensors");
  EXPECT_EQ(a.tensors.keys(), b.tensors.keys());
  ASSERT_NE(a.tensors.find("model.wte.weight"), nullptr);
  EXPECT_EQ(a.tensors.at("model.wte.weight").shape(), (colossal::Shape{50304, 32}));
  ASSERT_EQ(::unsetenv("DATA"), 0);
  fs::remove_all(dir);
}

}  // namespace
