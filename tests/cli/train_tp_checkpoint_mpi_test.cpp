// Layout-independent checkpoints under tensor parallelism, through the run assembly on MPI ranks:
// a tiny GPT-2 trained at parallel.tensor.size = 2 writes the file a serial run writes after the same
// steps (the serial names and shapes, the AdamW moments gathered too); that file resumes at tp = 1
// and (at 4 ranks) tp = 4, and a serial run's file resumes at tp = 2, each continuing with the
// uninterrupted run's losses; at 4 ranks dp2 x tp2 writes the serial file too; `colossal export` of
// the tp file writes the Hub names.
// Tolerance 1e-5 relative (the layout harness's f32 bound): the layouts sum the same products in
// another order (row-parallel partial sums, the vocab-parallel softmax), a few ulps per step.
#include <gtest/gtest.h>

#include <unistd.h>  // getpid

#include <CLI/CLI.hpp>
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
#include "colossal/cli/export.h"
#include "colossal/cli/train_command.h"  // toml_string
#include "colossal/comm/single_process_group.h"
#include "colossal/core/error.h"
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
  return testing::shared_run_dir(world(), "colossal_train_tp_checkpoint_mpi_test", [](const fs::path& dir) {
    testing::write_pattern_tokens(dir / "tokens.bin", 4000, 63);
    // Four heads split over 1, 2 and 4 ranks, 63 tokens padded to 64 there (the padding is in no
    // file: the checkpoint has the serial 63 rows, moments included); dropout off, since masks drawn per
    // tensor-parallel rank differ from the serial run's by design. AdamW's eps is 1e-6: the key
    // biases' gradient is zero but for rounding (softmax ignores a shift of every score), and with
    // eps = 1e-8 AdamW turns that noise into lr-sized steps whose sign depends on the summation
    // order, so the layouts' key biases would part by far more than rounding.
    std::ofstream(dir / "c.toml") << "[model]\nname = \"gpt2\"\n"
                                     "options = { n_layer = 2, n_embd = 16, n_head = 4, n_positions = 16, "
                                     "vocab_size = 63, dropout = 0.0 }\n"
                                     "[data]\ndataset = \"tokens\"\npath = \""
                                  << (dir / "tokens.bin").string()
                                  << "\"\nbatch_size = 4\nseq_len = 16\n"
                                     "[optimizer]\nname = \"adamw\"\nlr = 3e-3\neps = 1e-6\n"
                                     "[lr_scheduler]\nname = \"cosine\"\nwarmup_steps = 2\n"
                                     "[train]\nepochs = 0\nmax_steps = 6\ndevice = \"cpu\"\nprogress = false\n"
                                     "log_interval = 1\n";
  });
}

/// Trains the config with `overrides` over `group` (every rank of it calls this); returns the losses
/// by step that the group's rank 0 wrote (empty on the other ranks).
std::map<int64_t, double> train(const fs::path& dir, const std::shared_ptr<comm::ProcessGroup>& group,
                                const std::string& name, std::vector<std::string> overrides, int tensor_size = 0) {
  const fs::path metrics = dir / (name + ".jsonl");
  // The whole group is the tensor-parallel group unless said otherwise (the rest: data parallel).
  overrides.push_back("parallel.tensor.size=" + std::to_string(tensor_size > 0 ? tensor_size : group->size()));
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

/// Steps of `resumed` (those after the checkpoint) against the uninterrupted run's.
void expect_same_losses(const std::map<int64_t, double>& resumed, const std::map<int64_t, double>& full,
                        const std::string& what) {
  ASSERT_EQ(resumed.size(), 3u) << what;  // steps 4 to 6 after the checkpoint at step 3
  for (const auto& [step, loss] : resumed) {
    ASSERT_TRUE(full.contains(step)) << what << ": step " << step;
    EXPECT_LE(std::abs(loss - full.at(step)), kTolerance * std::abs(full.at(step)))
        << what << ": step " << step << " resumed " << loss << ", uninterrupted " << full.at(step);
  }
}

double relative_difference(const Tensor& a, const Tensor& b) {
  const Tensor x = a.to(DType::f64), y = b.to(DType::f64);
  const double norm = std::sqrt(ops::sum(ops::mul(y, y)).item<double>());
  const Tensor d = ops::sub(x, y);
  return std::sqrt(ops::sum(ops::mul(d, d)).item<double>()) / std::max(norm, 1e-30);
}

/// Both files hold the same tensors (names, dtypes, shapes), equal within the tolerance.
void expect_same_tensors(const fs::path& a, const fs::path& b, double tolerance = kTolerance) {
  const nn::SafetensorsFile x = nn::load_safetensors(a), y = nn::load_safetensors(b);
  ASSERT_EQ(x.tensors.keys(), y.tensors.keys()) << a << " against " << b;
  for (const auto& [name, tensor] : x.tensors) {
    const Tensor& other = y.tensors.at(name);
    ASSERT_EQ(tensor.dtype(), other.dtype()) << name;
    ASSERT_EQ(tensor.shape(), other.shape()) << name;
    // Step counts and hyper-parameters exactly, values within the tolerance.
    EXPECT_LE(relative_difference(tensor, other), core::is_floating(tensor.dtype()) ? tolerance : 0.0) << name;
  }
}

void run_export(const fs::path& checkpoint, const fs::path& output) {
  CLI::App app;
  add_export_command(app);
  app.parse("export " + checkpoint.string() + " -o " + output.string(), false);
}

TEST(TensorParallelCheckpoint, SavedAtOneLayoutResumesAtAnother) {
  const fs::path dir = shared_dir();
  const int rank = world().rank();
  const std::shared_ptr<comm::ProcessGroup> pair = world().split(rank < 2 ? 0 : comm::kNoColor, rank);
  const std::shared_ptr<comm::ProcessGroup> alone = comm::single_process_group(Device(core::DeviceType::cpu));
  const fs::path step3 = "epoch0-step3.safetensors", step6 = "epoch0-step6.safetensors";

  // The uninterrupted runs: serial on rank 0, tp = 2 on ranks 0 and 1, each saving after steps 3 and 6.
  std::map<int64_t, double> serial, tp2;
  if (rank == 0) serial = train(dir, alone, "serial", {checkpoint_dir(dir, "serial"), "train.checkpoint_steps=3"});
  if (pair) tp2 = train(dir, pair, "tp2", {checkpoint_dir(dir, "tp2"), "train.checkpoint_steps=3"});
  world().barrier();
  if (rank == 0) {
    ASSERT_EQ(serial.size(), 6u);
    ASSERT_EQ(tp2.size(), 6u);
    for (const auto& [step, loss] : serial) EXPECT_LE(std::abs(tp2.at(step) - loss), kTolerance * loss) << step;
    // The tp = 2 file is the serial run's: serial names and shapes, moments and all.
    expect_same_tensors(dir / "tp2" / step3, dir / "serial" / step3);
    expect_same_tensors(dir / "tp2" / step6, dir / "serial" / step6);
  }

  // tp = 2's checkpoint continues serially.
  if (rank == 0) {
    expect_same_losses(train(dir, alone, "tp2_to_tp1", {resume_from(dir / "tp2" / step3)}), serial, "tp2 -> tp1");
  }
  world().barrier();
  // The serial checkpoint continues at tp = 2.
  if (pair) {
    const std::map<int64_t, double> resumed = train(dir, pair, "tp1_to_tp2", {resume_from(dir / "serial" / step3)});
    if (rank == 0) expect_same_losses(resumed, serial, "tp1 -> tp2");
    // A model of another vocabulary: the tensor that does not fit is named, with the file.
    try {
      train(dir, pair, "mismatch", {resume_from(dir / "serial" / step3), "model.options.vocab_size=62"});
      ADD_FAILURE() << "a checkpoint of 63 tokens resumed a model of 62";
    } catch (const Error& e) {
      const std::string message = e.what();
      EXPECT_NE(message.find((dir / "serial" / step3).string()), std::string::npos) << message;
      EXPECT_NE(message.find("tensor \"model.wte.weight\" of shape [63, 16] cannot be split"), std::string::npos)
          << message;
    }
  }
  world().barrier();
  // tp = 2's checkpoint continues at tp = 4.
  if (world().size() == 4) {
    const std::shared_ptr<comm::ProcessGroup> all = world().split(0, rank);
    const std::map<int64_t, double> resumed = train(dir, all, "tp2_to_tp4", {resume_from(dir / "tp2" / step3)});
    if (rank == 0) expect_same_losses(resumed, serial, "tp2 -> tp4");
    // dp2 x tp2 over batches of 2 (the serial batch of 4 split): the writer's tensor group gathers,
    // and the file is again the serial run's.
    train(dir, all, "dp2_tp2", {"data.batch_size=2", checkpoint_dir(dir, "dp2_tp2"), "train.checkpoint_steps=3"}, 2);
    world().barrier();
    if (rank == 0) expect_same_tensors(dir / "dp2_tp2" / step3, dir / "serial" / step3);
  }

  // `colossal export` of the tp file: the Hub's names, the serial shapes, the serial run's values.
  if (rank == 0) {
    run_export(dir / "tp2" / step6, dir / "tp2_export.safetensors");
    run_export(dir / "serial" / step6, dir / "serial_export.safetensors");
    const nn::SafetensorsFile exported = nn::load_safetensors(dir / "tp2_export.safetensors");
    const Tensor* c_attn = exported.tensors.find("h.0.attn.c_attn.weight");
    ASSERT_NE(c_attn, nullptr);
    EXPECT_EQ(c_attn->shape(), (Shape{16, 48}));
    ASSERT_NE(exported.tensors.find("wte.weight"), nullptr);
    EXPECT_EQ(exported.tensors.find("wte.weight")->shape(), (Shape{63, 16}));
    expect_same_tensors(dir / "tp2_export.safetensors", dir / "serial_export.safetensors");
  }
  world().barrier();
  if (rank == 0) fs::remove_all(dir);
}

// Under bf16 mixed precision the fp32 master weights are sharded like their parameters and gathered
// too: the tp = 2 file has the serial bf16 run's tensors (amp.master.* and SGD's momentum buffers
// included), and resumes at tp = 1. Tolerance 3e-2, the layout harness's bf16 bound: the layouts
// round bf16 activations at different points, which moves the masters and the losses by a few bf16
// ulps. SGD with momentum rather than AdamW: AdamW's normalised steps turn the key biases' rounding
// noise (their exact gradient is zero) into lr-sized steps, larger under bf16 than its eps hides.
TEST(TensorParallelCheckpoint, MixedPrecisionMastersAreGatheredToo) {
  const fs::path dir = shared_dir();
  const int rank = world().rank();
  const std::shared_ptr<comm::ProcessGroup> pair = world().split(rank < 2 ? 0 : comm::kNoColor, rank);
  const std::shared_ptr<comm::ProcessGroup> alone = comm::single_process_group(Device(core::DeviceType::cpu));
  const fs::path step3 = "epoch0-step3.safetensors";
  constexpr double kBf16Tolerance = 3e-2;
  const std::vector<std::string> bf16_sgd = {"bf16=true", "optimizer.name=\"sgd\"", "optimizer.lr=0.1",
                                             "optimizer.momentum=0.9"};
  const auto with = [&](std::vector<std::string> more) {
    more.insert(more.begin(), bf16_sgd.begin(), bf16_sgd.end());
    return more;
  };
  std::map<int64_t, double> serial;
  if (rank == 0)
    serial = train(dir, alone, "serial", with({checkpoint_dir(dir, "serial"), "train.checkpoint_steps=3"}));
  if (pair) train(dir, pair, "tp2", with({checkpoint_dir(dir, "tp2"), "train.checkpoint_steps=3"}));
  world().barrier();
  if (rank == 0) {
    EXPECT_TRUE(nn::load_safetensors(dir / "tp2" / step3).tensors.contains("amp.master.h.0.attn.c_attn.weight"));
    expect_same_tensors(dir / "tp2" / step3, dir / "serial" / step3, kBf16Tolerance);
    const std::map<int64_t, double> resumed = train(dir, alone, "tp2_to_tp1", with({resume_from(dir / "tp2" / step3)}));
    ASSERT_EQ(resumed.size(), 3u);
    for (const auto& [step, loss] : resumed) {
      EXPECT_LE(std::abs(loss - serial.at(step)), kBf16Tolerance * std::abs(serial.at(step))) << "step " << step;
    }
  }
  world().barrier();
  if (rank == 0) fs::remove_all(dir);
}

// With dropout on, a tp = 2 run resumed at tp = 2 repeats its losses bit for bit: the checkpoint
// carries the tensor-parallel generator (the writer's), and each rank goes on with its own seed
// from that offset. Were rank 1 given rank 0's seed, its heads' masks would change and the loss too.
TEST(TensorParallelCheckpoint, DropoutResumesExactlyAtTheSameLayout) {
  const fs::path dir = shared_dir();
  const int rank = world().rank();
  const std::shared_ptr<comm::ProcessGroup> pair = world().split(rank < 2 ? 0 : comm::kNoColor, rank);
  if (pair) {
    const std::string dropout = "model.options.dropout=0.1";
    const std::map<int64_t, double> full =
        train(dir, pair, "full", {dropout, checkpoint_dir(dir, "ckpt"), "train.checkpoint_steps=3"});
    const fs::path file = dir / "ckpt" / "epoch0-step3.safetensors";
    const std::map<int64_t, double> resumed = train(dir, pair, "resumed", {dropout, resume_from(file)});
    if (rank == 0) {
      EXPECT_TRUE(nn::read_safetensors_header(file).metadata.contains("rng.tensor_parallel"));
      ASSERT_EQ(resumed.size(), 3u);
      for (const auto& [step, loss] : resumed) EXPECT_EQ(loss, full.at(step)) << "step " << step;
    }
  }
  world().barrier();
  if (rank == 0) fs::remove_all(dir);
}

}  // namespace
}  // namespace colossal::cli

int main(int argc, char** argv) {
  return colossal::comm::testing::run_mpi_tests(argc, argv);
}
