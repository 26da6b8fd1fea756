// Layout-independent checkpoints under ZeRO, through the run assembly on MPI ranks: a tiny GPT-2
// trained with zero.stage = 2 at parallel.data = 2 (batches of 2, the serial batch of 4 split) gives
// the serial run's losses, and its checkpoint (every data rank takes part in the save: each holds a
// shard of the AdamW moments) is the file the serial run writes after the same steps; that file
// resumes at dp = 2 without ZeRO and under ZeRO-1, each continuing with the uninterrupted run's losses.
// The same with the optimizer on the host (zero.offload_optimizer: its masters and moments are host
// shards, gathered the same way), and under ZeRO over the data group of a dp2 x tp2 layout (tensor
// shards and ZeRO shards both gathered into the serial tensors; stages 2 and 3); the serial file resumes
// at dp = 1 with offload, and ZeRO-2's file of dp2 x tp2 under ZeRO-3 there.
// Tolerance 1e-5 relative (the layout harness's f32 bound: the same sums in another order).
#include <gtest/gtest.h>

#include <unistd.h>  // getpid

#include <cmath>
#include <filesystem>
#include <fstream>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "metrics_jsonl.h"
#include "shared_run_dir.h"

#include "../comm/mpi_test_main.h"
#include "colossal/cli/train_command.h"  // toml_string
#include "colossal/comm/single_process_group.h"
#include "colossal/initialize/training_run.h"
#include "colossal/nn/safetensors.h"
#include "colossal/ops/elementwise.h"
#include "colossal/ops/reduction.h"

namespace colossal::cli {
namespace {

using colossal::testing::step_losses;
using comm::testing::world;
namespace fs = std::filesystem;

constexpr double kTolerance = 1e-5;

/// A folder shared by the ranks (rank 0's name, broadcast) holding the token file and the config.
fs::path shared_dir() {
  return testing::shared_run_dir(world(), "colossal_train_zero_checkpoint_mpi_test", [](const fs::path& dir) {
    testing::write_pattern_tokens(dir / "tokens.bin", 4000, 64);
    // AdamW's eps is 1e-6 for the reason tests/cli/train_tp_checkpoint_mpi_test.cpp gives (the key
    // biases' gradients are rounding noise); clipping is on (accumulation: tests/parallel/zero/).
    std::ofstream(dir / "c.toml") << "clip_grad_norm = 0.5\n"
                                     "[model]\nname = \"gpt2\"\n"
                                     "options = { n_layer = 2, n_embd = 16, n_head = 4, n_positions = 16, "
                                     "vocab_size = 64, dropout = 0.0 }\n"
                                     "[data]\ndataset = \"tokens\"\npath = \""
                                  << (dir / "tokens.bin").string()
                                  << "\"\nbatch_size = 4\nseq_len = 16\n"
                                     "[optimizer]\nname = \"adamw\"\nlr = 3e-3\neps = 1e-6\n"
                                     "[lr_scheduler]\nname = \"cosine\"\nwarmup_steps = 2\n"
                                     "[train]\nepochs = 0\nmax_steps = 6\ndevice = \"cpu\"\nprogress = false\n"
                                     "log_interval = 1\n";
  });
}

/// Trains the config with `overrides` over `group` as its data-parallel ranks (every rank of it calls
/// this); returns the losses by update that the group's rank 0 wrote (empty on the other ranks).
/// `tensor` ranks of the group form each tensor-parallel group (the rest is data parallelism).
std::map<int64_t, double> train(const fs::path& dir, const std::shared_ptr<comm::ProcessGroup>& group,
                                const std::string& name, std::vector<std::string> overrides, int tensor = 1) {
  const fs::path metrics = dir / (name + ".jsonl");
  const int data = group->size() / tensor;
  overrides.push_back("parallel.data=" + std::to_string(data));
  overrides.push_back("parallel.tensor.size=" + std::to_string(tensor));
  overrides.push_back("data.batch_size=" + std::to_string(4 / data));
  {
    initialize::TrainingRun run(
        initialize::load_run_config(dir / "c.toml", overrides),
        initialize::RunOptions{.metrics_path = metrics.string(), .world = group, .verbose = false});
    run.fit();
  }
  return group->rank() == 0 ? step_losses(metrics) : std::map<int64_t, double>{};
}

std::string checkpoint_dir(const fs::path& dir, const std::string& name) {
  return "train.checkpoint_dir=" + toml_string((dir / name).string());
}

std::string resume_from(const fs::path& file) {
  return "train.resume_from=" + toml_string(file.string());
}

/// Every logged loss of `got` against the uninterrupted run's; `count` of them.
void expect_same_losses(const std::map<int64_t, double>& got, const std::map<int64_t, double>& full, size_t count,
                        const std::string& what) {
  ASSERT_EQ(got.size(), count) << what;
  for (const auto& [step, loss] : got) {
    ASSERT_TRUE(full.contains(step)) << what << ": step " << step;
    EXPECT_LE(std::abs(loss - full.at(step)), kTolerance * std::abs(full.at(step)))
        << what << ": step " << step << ": " << loss << ", uninterrupted " << full.at(step);
  }
}

double relative_difference(const Tensor& a, const Tensor& b) {
  const Tensor x = a.to(DType::f64), y = b.to(DType::f64);
  const double norm = std::sqrt(ops::sum(ops::mul(y, y)).item<double>());
  const Tensor d = ops::sub(x, y);
  return std::sqrt(ops::sum(ops::mul(d, d)).item<double>()) / std::max(norm, 1e-30);
}

void expect_same_tensors(const fs::path& a, const fs::path& b) {
  const nn::SafetensorsFile x = nn::load_safetensors(a), y = nn::load_safetensors(b);
  ASSERT_EQ(x.tensors.keys(), y.tensors.keys()) << a << " against " << b;
  for (const auto& [name, tensor] : x.tensors) {
    const Tensor& other = y.tensors.at(name);
    ASSERT_EQ(tensor.dtype(), other.dtype()) << name;
    ASSERT_EQ(tensor.shape(), other.shape()) << name;
    EXPECT_LE(relative_difference(tensor, other), core::is_floating(tensor.dtype()) ? kTolerance : 0.0) << name;
  }
}

TEST(ZeroCheckpoint, SavedUnderZeroResumesWithoutItAndTheReverse) {
  const fs::path dir = shared_dir();
  const int rank = world().rank();
  const std::shared_ptr<comm::ProcessGroup> pair = world().split(rank < 2 ? 0 : comm::kNoColor, rank);
  const std::shared_ptr<comm::ProcessGroup> alone = comm::single_process_group(Device(core::DeviceType::cpu));
  const fs::path step3 = "epoch0-step3.safetensors";
  const std::string every3 = "train.checkpoint_steps=3";

  // The uninterrupted runs: serial on rank 0, ZeRO-2 at dp = 2 on ranks 0 and 1, saving after update 3.
  std::map<int64_t, double> serial, zero2;
  if (rank == 0) serial = train(dir, alone, "serial", {checkpoint_dir(dir, "serial"), every3});
  if (pair) zero2 = train(dir, pair, "zero2", {checkpoint_dir(dir, "zero2"), every3, "zero.stage=2"});
  world().barrier();
  if (rank == 0) {
    ASSERT_EQ(serial.size(), 6u);
    expect_same_losses(zero2, serial, 6, "zero2 dp2");
    expect_same_tensors(dir / "zero2" / step3, dir / "serial" / step3);
  }
  world().barrier();
  // ZeRO's checkpoint continues at the same data-parallel size without ZeRO (plain data parallelism),
  // and under ZeRO-1. (The run refuses another data-parallel size on resume whatever ZeRO does: the
  // ranks' shares of each batch would change; the Engine-level resume across sizes is
  // tests/parallel/zero/zero_engine_mpi_test.cpp.)
  if (pair) {
    const auto plain = train(dir, pair, "zero2_to_dp2", {resume_from(dir / "zero2" / step3), "zero.stage=0"});
    if (rank == 0) expect_same_losses(plain, serial, 3, "zero2 dp2 -> dp2 without ZeRO");
    const auto zero1 = train(dir, pair, "zero2_to_zero1", {resume_from(dir / "zero2" / step3), "zero.stage=1"});
    if (rank == 0) expect_same_losses(zero1, serial, 3, "zero2 dp2 -> zero1 dp2");
  }
  world().barrier();
  if (rank == 0) fs::remove_all(dir);
}

TEST(ZeroCheckpoint, OffloadAndTensorParallelSaveTheSerialFile) {
  const fs::path dir = shared_dir();
  const int rank = world().rank();
  const std::shared_ptr<comm::ProcessGroup> pair = world().split(rank < 2 ? 0 : comm::kNoColor, rank);
  const std::shared_ptr<comm::ProcessGroup> alone = comm::single_process_group(Device(core::DeviceType::cpu));
  const fs::path step3 = "epoch0-step3.safetensors";
  const std::string every3 = "train.checkpoint_steps=3";

  std::map<int64_t, double> serial, offload;
  if (rank == 0) serial = train(dir, alone, "serial", {checkpoint_dir(dir, "serial"), every3});
  if (pair) {
    offload = train(dir, pair, "offload",
                    {checkpoint_dir(dir, "offload"), every3, "zero.stage=2", "zero.offload_optimizer=true"});
  }
  world().barrier();
  if (rank == 0) {
    expect_same_losses(offload, serial, 6, "zero2 offload dp2");
    expect_same_tensors(dir / "offload" / step3, dir / "serial" / step3);
  }
  world().barrier();
  if (pair) {
    // The offloaded run's file continues without ZeRO (the run keeps the data-parallel size).
    const auto plain = train(dir, pair, "offload_to_dp2", {resume_from(dir / "offload" / step3), "zero.stage=0"});
    if (rank == 0) expect_same_losses(plain, serial, 3, "zero2 offload dp2 -> dp2 without ZeRO");
  }
  if (rank == 0) {
    // One GPU's way: the serial file resumes at dp = 1 with the optimizer on the host.
    const auto one = train(dir, alone, "serial_to_offload",
                           {resume_from(dir / "serial" / step3), "zero.stage=1", "zero.offload_optimizer=true"});
    expect_same_losses(one, serial, 3, "serial -> zero1 offload dp1");
  }
  world().barrier();
  if (world().size() == 4) {
    // ZeRO-2 over the data group of dp2 x tp2: the same serial file; it resumes at dp2 without either.
    const std::shared_ptr<comm::ProcessGroup> all = world().split(0, rank);
    const auto tp = train(dir, all, "dp2_tp2_zero2", {checkpoint_dir(dir, "dp2_tp2_zero2"), every3, "zero.stage=2"},
                          /*tensor=*/2);
    if (rank == 0) {
      expect_same_losses(tp, serial, 6, "zero2 dp2 x tp2");
      expect_same_tensors(dir / "dp2_tp2_zero2" / step3, dir / "serial" / step3);
    }
    world().barrier();
    if (pair) {
      const auto back =
          train(dir, pair, "dp2_tp2_to_dp2", {resume_from(dir / "dp2_tp2_zero2" / step3), "zero.stage=0"});
      if (rank == 0) expect_same_losses(back, serial, 3, "zero2 dp2 x tp2 -> dp2");
    }
    world().barrier();
    // ZeRO-3 over the data group of dp2 x tp2 (chunks of each tensor rank's shards, in host memory):
    // the serial file again, which resumes at dp2 without either; and ZeRO-2's file of the layout resumes
    // under it.
    const std::vector<std::string> zero3 = {"zero.stage=3", "zero.chunk_size_mb=1", "zero.placement_policy=\"cpu\""};
    std::vector<std::string> overrides = {checkpoint_dir(dir, "dp2_tp2_zero3"), every3};
    overrides.insert(overrides.end(), zero3.begin(), zero3.end());
    const auto tp3 = train(dir, all, "dp2_tp2_zero3", overrides, /*tensor=*/2);
    if (rank == 0) {
      expect_same_losses(tp3, serial, 6, "zero3 dp2 x tp2");
      expect_same_tensors(dir / "dp2_tp2_zero3" / step3, dir / "serial" / step3);
    }
    world().barrier();
    if (pair) {
      const auto back =
          train(dir, pair, "dp2_tp2_zero3_to_dp2", {resume_from(dir / "dp2_tp2_zero3" / step3), "zero.stage=0"});
      if (rank == 0) expect_same_losses(back, serial, 3, "zero3 dp2 x tp2 -> dp2");
    }
    world().barrier();
    overrides = {resume_from(dir / "dp2_tp2_zero2" / step3)};
    overrides.insert(overrides.end(), zero3.begin(), zero3.end());
    const auto into = train(dir, all, "dp2_tp2_zero2_to_zero3", overrides, /*tensor=*/2);
    if (rank == 0) expect_same_losses(into, serial, 3, "zero2 dp2 x tp2 -> zero3 dp2 x tp2");
  }
  world().barrier();
  if (rank == 0) fs::remove_all(dir);
}

// ZeRO-3 (parameters sharded in chunks, here of 1 MiB with the shards in host memory): its checkpoint
// is the serial run's file after the same steps (the parameters gathered from the shards too), which
// resumes at dp = 2 without ZeRO and under ZeRO-2; and a checkpoint of plain data parallelism resumes
// under ZeRO-3 with "auto" placement, each continuing with the uninterrupted run's losses.
TEST(ZeroCheckpoint, Stage3SavesTheSerialFileAndResumesBothWays) {
  const fs::path dir = shared_dir();
  const int rank = world().rank();
  const std::shared_ptr<comm::ProcessGroup> pair = world().split(rank < 2 ? 0 : comm::kNoColor, rank);
  const std::shared_ptr<comm::ProcessGroup> alone = comm::single_process_group(Device(core::DeviceType::cpu));
  const fs::path step3 = "epoch0-step3.safetensors";
  const std::string every3 = "train.checkpoint_steps=3";
  const std::vector<std::string> zero3 = {"zero.stage=3", "zero.chunk_size_mb=1", "zero.placement_policy=\"cpu\""};

  std::map<int64_t, double> serial, sharded, plain;
  if (rank == 0) serial = train(dir, alone, "serial", {checkpoint_dir(dir, "serial"), every3});
  if (pair) {
    std::vector<std::string> overrides = zero3;
    overrides.insert(overrides.end(), {checkpoint_dir(dir, "zero3"), every3});
    sharded = train(dir, pair, "zero3", overrides);
    plain = train(dir, pair, "dp2", {checkpoint_dir(dir, "dp2"), every3});
  }
  world().barrier();
  if (rank == 0) {
    ASSERT_EQ(serial.size(), 6u);
    expect_same_losses(sharded, serial, 6, "zero3 dp2");
    expect_same_losses(plain, serial, 6, "dp2");
    expect_same_tensors(dir / "zero3" / step3, dir / "serial" / step3);
  }
  world().barrier();
  if (pair) {
    const auto back = train(dir, pair, "zero3_to_dp2", {resume_from(dir / "zero3" / step3), "zero.stage=0"});
    if (rank == 0) expect_same_losses(back, serial, 3, "zero3 dp2 -> dp2 without ZeRO");
    const auto zero2 = train(dir, pair, "zero3_to_zero2", {resume_from(dir / "zero3" / step3), "zero.stage=2"});
    if (rank == 0) expect_same_losses(zero2, serial, 3, "zero3 dp2 -> zero2 dp2");
    const auto into = train(dir, pair, "dp2_to_zero3",
                            {resume_from(dir / "dp2" / step3), "zero.stage=3", "zero.placement_policy=\"auto\""});
    if (rank == 0) expect_same_losses(into, serial, 3, "dp2 -> zero3 dp2 (auto)");
  }
  world().barrier();
  if (rank == 0) fs::remove_all(dir);
}

}  // namespace
}  // namespace colossal::cli

int main(int argc, char** argv) {
  return colossal::comm::testing::run_mpi_tests(argc, argv);
}
