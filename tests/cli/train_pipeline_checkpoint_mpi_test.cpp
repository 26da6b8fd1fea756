// Layout-independent checkpoints under pipeline parallelism, through the run assembly on MPI ranks
// (engine/checkpoint_sharding.cpp, Note [Checkpoints of a pipeline]): a tiny GPT-2 (tied wte on the
// first and the last stage) trained at parallel.pipeline = 2 writes the file the serial run writes
// after the same steps (the serial names, the tied wte once, the AdamW moments by the serial
// optimizer's index, the scheduler, the position and the generators); that file resumes serially,
// and under the interleaved schedule (2 chunks a stage: another cut of the pieces); the serial file
// resumes at pp = 2; each resumed run continues with the uninterrupted serial run's losses. A pp = 2
// file resumed at pp = 2 repeats the uninterrupted pp = 2 run bit for bit (the same arithmetic on
// restored state). A ViT at pp = 2 resumes serially. At 4 ranks pp2 x tp2 and dp2 x pp2 write the
// serial file too.
// Tolerance 1e-5 relative (the layout harness's f32 bound): the pipeline sums the tied wte's two
// gradients and the microbatches' losses in another order than the serial model, a few ulps a step.
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

/// A folder shared by the ranks (rank 0's name, broadcast) holding the token file and the configs.
fs::path shared_dir() {
  return testing::shared_run_dir(world(), "colossal_train_pipeline_checkpoint_mpi_test", [](const fs::path& dir) {
    testing::write_pattern_tokens(dir / "tokens.bin", 4000, 64);
    // Two blocks: four pieces (embedding, h.0, h.1, head), so 2 stages of 2 chunks each get one.
    // Dropout off (a pipeline draws masks per microbatch, the serial run per batch); AdamW's eps is
    // 1e-6 for the reason tests/cli/train_tp_checkpoint_mpi_test.cpp gives; accumulation and
    // clipping on.
    std::ofstream(dir / "gpt2.toml") << "gradient_accumulation = 2\nclip_grad_norm = 0.5\n"
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
    std::ofstream(dir / "vit.toml") << "gradient_accumulation = 2\nclip_grad_norm = 0.5\n"
                                       "[model]\nname = \"vit\"\n"
                                       "options = { patch_size = 4, embed_dim = 16, depth = 2, num_heads = 4, "
                                       "mlp_ratio = 2.0 }\n"
                                       "[data]\ndataset = \"synthetic\"\nbatch_size = 8\n"
                                       "options = { size = 64, test_size = 0, image_size = 8, channels = 1, "
                                       "num_classes = 4 }\n"
                                       "[optimizer]\nname = \"sgd\"\nlr = 0.05\nmomentum = 0.9\n"
                                       "[train]\nepochs = 0\nmax_steps = 6\ndevice = \"cpu\"\nprogress = false\n"
                                       "log_interval = 1\n";
  });
}

/// Trains `config` with `overrides` over `group` (every rank of it calls this); returns the losses by
/// step that the group's rank 0 wrote (empty on the other ranks).
std::map<int64_t, double> train(const fs::path& dir, const char* config,
                                const std::shared_ptr<comm::ProcessGroup>& group, const std::string& name,
                                const std::vector<std::string>& overrides) {
  const fs::path metrics = dir / (name + ".jsonl");
  {
    initialize::TrainingRun run(
        initialize::load_run_config(dir / config, overrides),
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

const std::vector<std::string> kPipeline = {"parallel.pipeline=2", "parallel.num_microbatches=2"};

std::vector<std::string> with(std::vector<std::string> a, const std::vector<std::string>& b) {
  a.insert(a.end(), b.begin(), b.end());
  return a;
}

/// Every logged loss of `got` against the uninterrupted run's (`tolerance` relative; 0: the same
/// bits); `count` of them.
void expect_same_losses(const std::map<int64_t, double>& got, const std::map<int64_t, double>& full, size_t count,
                        const std::string& what, double tolerance = kTolerance) {
  ASSERT_EQ(got.size(), count) << what;
  double worst = 0;
  for (const auto& [step, loss] : got) {
    ASSERT_TRUE(full.contains(step)) << what << ": step " << step;
    const double error = std::abs(loss - full.at(step)) / std::abs(full.at(step));
    worst = std::max(worst, error);
    if (tolerance == 0) {
      EXPECT_EQ(loss, full.at(step)) << what << ": step " << step;
    } else {
      EXPECT_LE(error, tolerance) << what << ": step " << step << ": " << loss << ", uninterrupted " << full.at(step);
    }
  }
  std::printf("%s: %zu losses, largest relative difference %.2e\n", what.c_str(), got.size(), worst);
}

double relative_difference(const Tensor& a, const Tensor& b) {
  const Tensor x = a.to(DType::f64), y = b.to(DType::f64);
  const double norm = std::sqrt(ops::sum(ops::mul(y, y)).item<double>());
  const Tensor d = ops::sub(x, y);
  return std::sqrt(ops::sum(ops::mul(d, d)).item<double>()) / std::max(norm, 1e-30);
}

/// The same tensors under the same names in the same order, dtypes and shapes, values within the
/// tolerance (integers equal), and the same position and generator states; with `same_invariants` also
/// the same run invariants (a dp = 2 run records its data-parallel ranks and per-rank batch).
void expect_same_checkpoint(const fs::path& a, const fs::path& b, bool same_invariants = true) {
  const nn::SafetensorsFile x = nn::load_safetensors(a), y = nn::load_safetensors(b);
  ASSERT_EQ(x.tensors.keys(), y.tensors.keys()) << a << " against " << b;
  double worst = 0;
  for (const auto& [name, tensor] : x.tensors) {
    const Tensor& other = y.tensors.at(name);
    ASSERT_EQ(tensor.dtype(), other.dtype()) << name;
    ASSERT_EQ(tensor.shape(), other.shape()) << name;
    const double difference = relative_difference(tensor, other);
    worst = std::max(worst, difference);
    EXPECT_LE(difference, core::is_floating(tensor.dtype()) ? kTolerance : 0.0) << name;
  }
  for (const auto& [key, value] : y.metadata) {
    if (key == "extra.config") continue;  // the config names the layout
    if (!same_invariants && key.starts_with("extra.")) continue;
    ASSERT_TRUE(x.metadata.contains(key)) << a << " has no metadata " << key;
    EXPECT_EQ(x.metadata.at(key), value) << key;
  }
  EXPECT_EQ(x.metadata.size(), y.metadata.size());
  std::printf("%s against %s: %zu tensors, largest relative difference %.2e\n", a.parent_path().filename().c_str(),
              b.parent_path().filename().c_str(), x.tensors.size(), worst);
}

TEST(PipelineCheckpoint, Gpt2SavedAtTwoStagesResumesSeriallyInterleavedAndTheReverse) {
  const fs::path dir = shared_dir();
  const int rank = world().rank();
  const std::shared_ptr<comm::ProcessGroup> pair = world().split(rank < 2 ? 0 : comm::kNoColor, rank);
  const std::shared_ptr<comm::ProcessGroup> alone = comm::single_process_group(Device(core::DeviceType::cpu));
  const fs::path step3 = "epoch0-step6.safetensors";  // update 3 of 2 micro-steps
  const std::string every3 = "train.checkpoint_steps=3";

  // The uninterrupted runs, saving after update 3: serial on rank 0, pp = 2 on ranks 0 and 1.
  std::map<int64_t, double> serial, pp2;
  if (rank == 0) serial = train(dir, "gpt2.toml", alone, "serial", {checkpoint_dir(dir, "serial"), every3});
  if (pair) pp2 = train(dir, "gpt2.toml", pair, "pp2", with({checkpoint_dir(dir, "pp2"), every3}, kPipeline));
  world().barrier();
  if (rank == 0) {
    ASSERT_EQ(serial.size(), 12u);  // 6 updates of 2 micro-steps
    expect_same_losses(pp2, serial, 12, "gpt2 pp2 against serial");
    ASSERT_TRUE(fs::exists(dir / "pp2" / step3));
    expect_same_checkpoint(dir / "pp2" / step3, dir / "serial" / step3);
    // The tied wte once, under its serial name.
    const nn::SafetensorsFile file = nn::load_safetensors(dir / "pp2" / step3);
    EXPECT_TRUE(file.tensors.contains("model.wte.weight"));
    for (const std::string& key : file.tensors.keys()) EXPECT_FALSE(key.starts_with("model.0.")) << key;
  }
  // pp = 2 -> serial.
  if (rank == 0) {
    expect_same_losses(train(dir, "gpt2.toml", alone, "pp2_to_serial", {resume_from(dir / "pp2" / step3)}), serial, 6,
                       "gpt2 pp2 -> serial");
  }
  world().barrier();
  if (pair) {
    // serial -> pp = 2.
    const auto from_serial =
        train(dir, "gpt2.toml", pair, "serial_to_pp2", with({resume_from(dir / "serial" / step3)}, kPipeline));
    if (rank == 0) expect_same_losses(from_serial, serial, 6, "gpt2 serial -> pp2");
    // pp = 2 -> pp = 2 with 2 chunks a stage (the interleaved schedule: stage 0 holds the embedding
    // and h.1, stage 1 h.0 and the head).
    const auto interleaved = train(dir, "gpt2.toml", pair, "pp2_to_pp2v2",
                                   with({resume_from(dir / "pp2" / step3), "parallel.num_chunks=2"}, kPipeline));
    if (rank == 0) expect_same_losses(interleaved, serial, 6, "gpt2 pp2 -> pp2 interleaved");
    // pp = 2 -> the same cut: the uninterrupted pp = 2 run's bits.
    const auto same = train(dir, "gpt2.toml", pair, "pp2_to_pp2", with({resume_from(dir / "pp2" / step3)}, kPipeline));
    if (rank == 0) expect_same_losses(same, pp2, 6, "gpt2 pp2 -> pp2 (bit-equal)", 0.0);
  }
  world().barrier();
  if (world().size() == 4) {
    const std::shared_ptr<comm::ProcessGroup> all = world().split(0, rank);
    // pp2 x tp2: the tensor group's shards gathered, then the stages'.
    const auto pp2tp2 = train(dir, "gpt2.toml", all, "pp2tp2",
                              with({checkpoint_dir(dir, "pp2tp2"), every3, "parallel.tensor.size=2"}, kPipeline));
    // dp2 x pp2: the writer's replica saves.
    const auto dp2pp2 =
        train(dir, "gpt2.toml", all, "dp2pp2",
              with({checkpoint_dir(dir, "dp2pp2"), every3, "parallel.data=2", "data.batch_size=2"}, kPipeline));
    if (rank == 0) {
      expect_same_losses(pp2tp2, serial, 12, "gpt2 pp2 x tp2 against serial");
      expect_same_checkpoint(dir / "pp2tp2" / step3, dir / "serial" / step3);
      expect_same_losses(dp2pp2, serial, 12, "gpt2 dp2 x pp2 against serial");
      expect_same_checkpoint(dir / "dp2pp2" / step3, dir / "serial" / step3, /*same_invariants=*/false);
    }
    // The serial file resumed at pp2 x tp2.
    const auto resumed = train(dir, "gpt2.toml", all, "serial_to_pp2tp2",
                               with({resume_from(dir / "serial" / step3), "parallel.tensor.size=2"}, kPipeline));
    if (rank == 0) expect_same_losses(resumed, serial, 6, "gpt2 serial -> pp2 x tp2");
  }
  world().barrier();
  if (rank == 0) fs::remove_all(dir);
}

TEST(PipelineCheckpoint, VitSavedAtTwoStagesResumesSerially) {
  const fs::path dir = shared_dir();
  const int rank = world().rank();
  const std::shared_ptr<comm::ProcessGroup> pair = world().split(rank < 2 ? 0 : comm::kNoColor, rank);
  const std::shared_ptr<comm::ProcessGroup> alone = comm::single_process_group(Device(core::DeviceType::cpu));
  const fs::path step3 = "epoch0-step6.safetensors";  // update 3 of 2 micro-steps
  const std::string every3 = "train.checkpoint_steps=3";
  std::map<int64_t, double> serial, pp2;
  if (rank == 0) serial = train(dir, "vit.toml", alone, "serial", {checkpoint_dir(dir, "serial"), every3});
  if (pair) pp2 = train(dir, "vit.toml", pair, "pp2", with({checkpoint_dir(dir, "pp2"), every3}, kPipeline));
  world().barrier();
  if (rank == 0) {
    ASSERT_EQ(serial.size(), 12u);
    expect_same_losses(pp2, serial, 12, "vit pp2 against serial");
    expect_same_checkpoint(dir / "pp2" / step3, dir / "serial" / step3);
    expect_same_losses(train(dir, "vit.toml", alone, "pp2_to_serial", {resume_from(dir / "pp2" / step3)}), serial, 6,
                       "vit pp2 -> serial");
  }
  world().barrier();
  if (rank == 0) fs::remove_all(dir);
}

// A checkpoint of another model is named on every stage, with the tensor and the stage.
TEST(PipelineCheckpoint, AnotherModelsFileIsNamed) {
  const fs::path dir = shared_dir();
  const int rank = world().rank();
  const std::shared_ptr<comm::ProcessGroup> pair = world().split(rank < 2 ? 0 : comm::kNoColor, rank);
  const std::shared_ptr<comm::ProcessGroup> alone = comm::single_process_group(Device(core::DeviceType::cpu));
  if (rank == 0) {
    train(dir, "gpt2.toml", alone, "three_blocks",
          {checkpoint_dir(dir, "three_blocks"), "train.checkpoint_steps=1", "train.max_steps=1",
           "model.options.n_layer=3"});
  }
  world().barrier();
  if (pair) {
    try {
      train(dir, "gpt2.toml", pair, "wrong", with({resume_from(dir / "three_blocks")}, kPipeline));
      ADD_FAILURE() << "a three-block GPT-2's checkpoint resumed into a two-block one";
    } catch (const Error& e) {
      const std::string message = e.what();
      EXPECT_NE(message.find((dir / "three_blocks").string()), std::string::npos) << message;
      EXPECT_NE(message.find("tensor \"model.h.2."), std::string::npos) << message;
      EXPECT_NE(message.find("is none of the model's"), std::string::npos) << message;
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
