// configs/gpt2_zero3.toml on one device with the optimizer on the host, as a one-GPU user runs it:
// `colossal train --config configs/gpt2_zero3.toml --set zero.offload_optimizer=true --set
// zero.placement_policy='"cpu"'` (the model shrunk by --set and f32, torch's fp16 autocast being a
// GPU mode; everything else the config's: ZeRO-3, accumulation 4, clipping, AdamW, the cosine warmup)
// gives the plain run's (zero.stage = 0) loss at every step; its checkpoint holds the plain run's
// tensors and resumes without ZeRO with the uninterrupted run's losses.
// Tolerance 1e-5 relative, the layout harness's f32 bound: ZeRO-3 at dp = 1 adds the same gradients,
// and the host step differs from the optimizer's own by a few f32 roundings per step
// (tests/optim/host_optimizer_test.cpp).
#include <gtest/gtest.h>

#include <unistd.h>  // getpid

#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>
#include <string>

#include "metrics_jsonl.h"
#include "shared_run_dir.h"  // write_pattern_tokens

#include "colossal/nn/safetensors.h"
#include "colossal/ops/elementwise.h"
#include "colossal/ops/reduction.h"

namespace {

using colossal::testing::step_losses;
namespace fs = std::filesystem;

const fs::path kConfig = fs::path(COLOSSAL_TEST_DATA_DIR) / ".." / ".." / "configs" / "gpt2_zero3.toml";
constexpr double kTolerance = 1e-5;

int run(const std::string& command, const fs::path& log) {
  return std::system((command + " > '" + log.string() + "' 2>&1").c_str());
}

std::string read(const fs::path& path) {
  std::ifstream in(path);
  return {std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
}

double relative_difference(const colossal::Tensor& a, const colossal::Tensor& b) {
  using namespace colossal;
  const Tensor x = a.to(DType::f64), y = b.to(DType::f64);
  const double norm = std::sqrt(ops::sum(ops::mul(y, y)).item<double>());
  const Tensor d = ops::sub(x, y);
  return std::sqrt(ops::sum(ops::mul(d, d)).item<double>()) / std::max(norm, 1e-30);
}

void expect_same_losses(const std::map<int64_t, double>& got, const std::map<int64_t, double>& want, size_t count,
                        const std::string& what) {
  ASSERT_EQ(got.size(), count) << what;
  for (const auto& [step, loss] : got) {
    ASSERT_TRUE(want.contains(step)) << what << ": step " << step;
    EXPECT_LE(std::abs(loss - want.at(step)), kTolerance * std::abs(want.at(step)))
        << what << ": step " << step << ": " << loss << ", plain " << want.at(step);
  }
}

TEST(Gpt2Zero3Config, OffloadOnOneDeviceGivesThePlainRunsLossesAndCheckpoint) {
  const fs::path dir = fs::temp_directory_path() / ("colossal_gpt2_zero3_config_test_" + std::to_string(::getpid()));
  fs::remove_all(dir);
  fs::create_directories(dir);
  colossal::testing::write_pattern_tokens(dir / "train.bin", 3000, 50257);
  colossal::testing::write_pattern_tokens(dir / "val.bin", 400, 50257);
  const std::string bin = COLOSSAL_BINARY;
  // Two layers 32 wide, 4 heads; 4 windows of 16 tokens a micro-batch, 4 updates of 4 micro-batches,
  // a checkpoint after update 2; chunks of 1 MiB, so the blocks and the embeddings are chunks apart.
  // AdamW's eps 1e-6 for the reason tests/cli/train_tp_checkpoint_mpi_test.cpp gives (the attention's
  // key biases have gradients of rounding noise, which a tiny eps turns into full-size updates).
  const std::string common =
      " train --config " + kConfig.string() + " --set train.device='\"cpu\"' --set data.path='\"" +
      (dir / "train.bin").string() + "\"' --set data.test_path='\"" + (dir / "val.bin").string() +
      "\"' --set data.batch_size=4 --set data.seq_len=16 --set model.options.n_layer=2"
      " --set model.options.n_embd=32 --set model.options.n_head=4 --set model.options.dropout=0.0"
      " --set data.options.test_num_samples=4 --set train.max_steps=4 --set train.log_interval=1"
      " --set train.progress=false --set lr_scheduler.warmup_steps=2 --set train.checkpoint_steps=2"
      " --set zero.chunk_size_mb=1 --set fp16.mode='\"off\"' --set optimizer.eps=1e-6 --set train.log_dir='\"" +
      (dir / "logs").string() + "\"'";
  const auto train = [&](const std::string& name, const std::string& overrides) {
    const int rc = run(bin + common + overrides + " --set train.checkpoint_dir='\"" + (dir / name).string() +
                           "\"' --metrics " + (dir / (name + ".jsonl")).string(),
                       dir / (name + ".log"));
    EXPECT_EQ(rc, 0) << read(dir / (name + ".log"));
    return step_losses(dir / (name + ".jsonl"));
  };
  const std::string no_zero = " --set zero.stage=0 --set zero.placement_policy='\"cuda\"'";
  const std::map<int64_t, double> plain = train("plain", no_zero);
  ASSERT_EQ(plain.size(), 16u) << read(dir / "plain.log");  // 4 updates of 4 micro-steps
  const std::map<int64_t, double> offload =
      train("offload", " --set zero.offload_optimizer=true --set zero.placement_policy='\"cpu\"'");
  expect_same_losses(offload, plain, 16, "zero3 offload cpu");
  EXPECT_NE(read(dir / "offload.log").find("host="), std::string::npos)
      << "the memory log reports the host bytes: " << read(dir / "offload.log");

  // The checkpoint after update 2 (micro-step 8) is the plain run's file.
  const fs::path step8 = "epoch0-step8.safetensors";
  const colossal::nn::SafetensorsFile a = colossal::nn::load_safetensors(dir / "offload" / step8);
  const colossal::nn::SafetensorsFile b = colossal::nn::load_safetensors(dir / "plain" / step8);
  ASSERT_EQ(a.tensors.keys(), b.tensors.keys());
  for (const auto& [name, tensor] : a.tensors) {
    ASSERT_EQ(tensor.shape(), b.tensors.at(name).shape()) << name;
    if (colossal::core::is_floating(tensor.dtype())) {
      EXPECT_LE(relative_difference(tensor, b.tensors.at(name)), kTolerance) << name;
    }
  }
  // It resumes without ZeRO and continues with the uninterrupted run's losses.
  const std::map<int64_t, double> resumed =
      train("resumed", no_zero + " --set train.resume_from='\"" + (dir / "offload" / step8).string() + "\"'");
  expect_same_losses(resumed, plain, 8, "zero3 offload checkpoint resumed without ZeRO");
  fs::remove_all(dir);
}

}  // namespace
