// configs/gpt2_tokens.toml, as a user runs it for data parallelism:
//   colossal run --nproc_per_node 2 -- colossal train --config configs/gpt2_tokens.toml
// shards the optimizer over the two ranks (the config's zero.stage = 1) and gives, step by step, the
// losses of one process with the two ranks' batches together, which trains without ZeRO (Note [ZeRO
// over one data rank]: nothing to shard) and says so, as does a pipeline of the two ranks. The model is shrunk by
// --set; everything else is the config's: accumulation 4, clipping 1.0, AdamW, the cosine warmup, the padded
// 50304-entry vocabulary. Tolerance 1e-5 relative, the layout harness's f32 bound: the same sums in another order.
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

namespace {

using colossal::testing::read_text;
using colossal::testing::run_logged;
using colossal::testing::step_losses;
namespace fs = std::filesystem;

const fs::path kConfig = fs::path(COLOSSAL_TEST_DATA_DIR) / ".." / ".." / "configs" / "gpt2_tokens.toml";
constexpr const char* kNothingToShard = "nothing to shard, trained without ZeRO";

TEST(Gpt2TokensConfig, ShardsTheOptimizerOverTheDataParallelRanks) {
  const colossal::config::TrainConfig c = colossal::initialize::load_run_config(kConfig);
  EXPECT_EQ(c.zero.stage, 1);
  EXPECT_FALSE(c.zero.offload_optimizer);
}

TEST(Gpt2TokensConfig, TwoCpuRanksGiveTheOneProcessRunsLosses) {
  const fs::path dir = colossal::testing::token_run_dir("colossal_gpt2_tokens_config_test");
  const std::string bin = COLOSSAL_BINARY;
  // The tiny GPT-2: 3 updates of 4 micro-steps.
  const std::string tiny = std::string(colossal::testing::kTinyGpt2Sets) + " --set train.checkpoint_dir='\"\"'";
  const std::string common = " train --config " + kConfig.string() + tiny;
  ASSERT_EQ(
      run_logged(bin + common + " --set data.batch_size=4 --metrics " + (dir / "one.jsonl").string(), dir / "one.log"),
      0)
      << read_text(dir / "one.log");
  ASSERT_EQ(run_logged(bin + " run --nproc_per_node 2 -- " + bin + common + " --set data.batch_size=2 --metrics " +
                           (dir / "dp2.jsonl").string(),
                       dir / "dp2.log"),
            0)
      << read_text(dir / "dp2.log");
  // A pipeline of the two ranks has one data rank too: nothing to shard, so the config's zero.stage = 1
  // is no obstacle to parallel.pipeline = 2.
  ASSERT_EQ(run_logged(bin + " run --nproc_per_node 2 -- " + bin + common +
                           " --set data.batch_size=4 --set parallel.pipeline=2 --set parallel.num_microbatches=2 "
                           "--metrics " +
                           (dir / "pp2.jsonl").string(),
                       dir / "pp2.log"),
            0)
      << read_text(dir / "pp2.log");
  EXPECT_NE(read_text(dir / "pp2.log").find(kNothingToShard), std::string::npos) << read_text(dir / "pp2.log");
  EXPECT_NE(read_text(dir / "one.log").find(kNothingToShard), std::string::npos) << read_text(dir / "one.log");
  EXPECT_EQ(read_text(dir / "dp2.log").find(kNothingToShard), std::string::npos)
      << "two ranks shard: " << read_text(dir / "dp2.log");

  const std::map<int64_t, double> one = step_losses(dir / "one.jsonl"), dp = step_losses(dir / "dp2.jsonl");
  ASSERT_EQ(one.size(), 12u) << read_text(dir / "one.log");  // 3 updates of 4 micro-steps
  ASSERT_EQ(dp.size(), one.size()) << read_text(dir / "dp2.log");
  const double worst = colossal::testing::expect_losses_within(one, dp, 1e-5, "dp2 (ZeRO-1)");
  const std::map<int64_t, double> pp = step_losses(dir / "pp2.jsonl");
  ASSERT_EQ(pp.size(), one.size()) << read_text(dir / "pp2.log");
  const double worst_pp = colossal::testing::expect_losses_within(one, pp, 1e-5, "pp2");
  EXPECT_NE(one.begin()->second, one.rbegin()->second) << "the steps should train";
  std::printf(
      "configs/gpt2_tokens.toml at dp2 (ZeRO-1) and pp2 against one process: %zu steps, largest relative "
      "differences %.2e and %.2e\n",
      one.size(), worst, worst_pp);
  ASSERT_EQ(::unsetenv("DATA"), 0);
  fs::remove_all(dir);
}

}  // namespace
