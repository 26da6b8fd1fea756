// ViT under 1D tensor parallelism through the command line: `colossal run --nproc_per_node 2 --
// colossal train --set parallel.tensor.size=2` on CPU ranks (heads and MLP split, patch embedding,
// tokens, norms and head replicated: parallel/tp/vit_1d.h) gives the serial run's loss at every
// step, with gradient accumulation and clipping on; the logits are whole on every rank, so the
// accuracy hook reports the serial run's test accuracy; the checkpoint holds the serial tensors
// under timm's names and resumes serially (and the serial file at tp2) with the uninterrupted run's
// losses; so does the run with sequence parallelism. Heads that do not split are an error naming both.
// Per-parameter sharding specs from the config (parallel.tensor.specs against timm's names) give the
// serial run's losses too, their checkpoint resumes serially, and `colossal describe` prints each
// parameter's spec and rule.
// Tolerance 1e-5 relative, the layout harness's f32 bound: the same sums in another order.
#include <gtest/gtest.h>

#include <unistd.h>  // getpid

#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>
#include <stdexcept>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "metrics_jsonl.h"

#include "colossal/nn/safetensors.h"

namespace {

using colossal::testing::read_jsonl;
using colossal::testing::step_losses;
namespace fs = std::filesystem;

// Four heads (split over 2 ranks), dropout off (the tensor ranks draw their own attention masks).
constexpr const char* kConfig = R"(
gradient_accumulation = 2
clip_grad_norm = 0.5

[model]
name = "vit"
options = { patch_size = 4, embed_dim = 16, depth = 2, num_heads = 4, mlp_ratio = 2.0 }

[data]
dataset = "synthetic"
batch_size = 8
options = { size = 48, test_size = 16, image_size = 8, channels = 1, num_classes = 4 }

[optimizer]
name = "sgd"
lr = 0.05
momentum = 0.9

[train]
epochs = 2
device = "cpu"
progress = false
log_interval = 1
test_interval = 1
checkpoint_steps = 6
)";

/// The colossal program of this build (tests/CMakeLists.txt names no COLOSSAL_BINARY for this test;
/// the build puts the program at src/colossal/cli/colossal beside tests/).
std::string colossal_binary() {
  const fs::path program =
      fs::read_symlink("/proc/self/exe").parent_path().parent_path() / "src" / "colossal" / "cli" / "colossal";
  if (!fs::exists(program)) throw std::runtime_error("build the colossal program first: " + program.string());
  return program.string();
}

int run(const std::string& command, const fs::path& log) {
  return std::system((command + " > '" + log.string() + "' 2>&1").c_str());
}

std::string read(const fs::path& path) {
  std::ifstream in(path);
  return {std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
}

/// The value under `key` of every epoch line, in order.
std::vector<double> per_epoch(const fs::path& path, const char* key) {
  std::vector<double> out;
  for (const nlohmann::json& j : read_jsonl(path)) {
    if (j["event"] == "epoch" && j.contains(key)) out.push_back(j[key].get<double>());
  }
  return out;
}

TEST(TrainVitTp, TwoTensorParallelRanksGiveTheSerialRunsLossesAndAccuracy) {
  const fs::path dir = fs::temp_directory_path() / ("colossal_train_vit_tp_test_" + std::to_string(::getpid()));
  fs::remove_all(dir);
  fs::create_directories(dir);
  std::ofstream(dir / "c.toml") << kConfig;
  const std::string bin = colossal_binary();
  const std::string common = " train --config " + (dir / "c.toml").string();
  ASSERT_EQ(run(bin + common + " --set train.checkpoint_dir='\"" + (dir / "serial").string() + "\"' --metrics " +
                    (dir / "serial.jsonl").string(),
                dir / "serial.log"),
            0)
      << read(dir / "serial.log");
  ASSERT_EQ(run(bin + " run --nproc_per_node 2 -- " + bin + common +
                    " --set parallel.tensor.size=2 --set train.checkpoint_dir='\"" + (dir / "tp2").string() +
                    "\"' --metrics " + (dir / "tp2.jsonl").string(),
                dir / "tp2.log"),
            0)
      << read(dir / "tp2.log");

  const std::map<int64_t, double> serial = step_losses(dir / "serial.jsonl"), tp = step_losses(dir / "tp2.jsonl");
  ASSERT_EQ(serial.size(), 12u) << read(dir / "serial.log");  // 48 / 8 = 6 micro-steps an epoch, 2 epochs
  ASSERT_EQ(tp.size(), serial.size()) << read(dir / "tp2.log");
  double worst = 0;
  for (const auto& [step, loss] : serial) {
    const double error = std::abs(tp.at(step) - loss) / std::abs(loss);
    worst = std::max(worst, error);
    EXPECT_LE(error, 1e-5) << "step " << step << ": tp2 " << tp.at(step) << ", serial " << loss;
  }
  std::printf("ViT tp2 against serial: %zu steps, largest relative difference %.2e\n", serial.size(), worst);

  // The same with sequence parallelism (parallel.tensor.sequence_parallel): the norms, residuals and
  // drop path on each rank's half of the batch between the tensor-parallel regions.
  ASSERT_EQ(run(bin + " run --nproc_per_node 2 -- " + bin + common +
                    " --set parallel.tensor.size=2 --set parallel.tensor.sequence_parallel=true"
                    " --set train.checkpoint_dir='\"\"' --metrics " +
                    (dir / "sp.jsonl").string(),
                dir / "sp.log"),
            0)
      << read(dir / "sp.log");
  const std::map<int64_t, double> sp = step_losses(dir / "sp.jsonl");
  ASSERT_EQ(sp.size(), serial.size()) << read(dir / "sp.log");
  for (const auto& [step, loss] : serial) {
    EXPECT_LE(std::abs(sp.at(step) - loss), 1e-5 * std::abs(loss)) << "step " << step << ": sequence parallel";
  }
  EXPECT_EQ(per_epoch(dir / "sp.jsonl", "test_accuracy"), per_epoch(dir / "serial.jsonl", "test_accuracy"));

  // Test accuracy is reported under tensor parallelism and is the serial run's, as is the test loss.
  const std::vector<double> serial_accuracy = per_epoch(dir / "serial.jsonl", "test_accuracy");
  ASSERT_EQ(serial_accuracy.size(), 2u) << read(dir / "serial.jsonl");
  EXPECT_EQ(per_epoch(dir / "tp2.jsonl", "test_accuracy"), serial_accuracy) << read(dir / "tp2.jsonl");
  const std::vector<double> serial_test_loss = per_epoch(dir / "serial.jsonl", "test_loss"),
                            tp_test_loss = per_epoch(dir / "tp2.jsonl", "test_loss");
  ASSERT_EQ(tp_test_loss.size(), serial_test_loss.size()) << read(dir / "tp2.jsonl");
  for (size_t i = 0; i < serial_test_loss.size(); ++i) {
    EXPECT_LE(std::abs(tp_test_loss[i] - serial_test_loss[i]), 1e-5 * serial_test_loss[i]) << "epoch " << i + 1;
  }

  // The checkpoint is the serial one: timm's names, whole tensors.
  const colossal::nn::SafetensorsFile a = colossal::nn::load_safetensors(dir / "tp2" / "epoch2-step12.safetensors");
  const colossal::nn::SafetensorsFile b = colossal::nn::load_safetensors(dir / "serial" / "epoch2-step12.safetensors");
  EXPECT_EQ(a.tensors.keys(), b.tensors.keys());
  ASSERT_NE(a.tensors.find("model.blocks.0.attn.qkv.weight"), nullptr);
  EXPECT_EQ(a.tensors.at("model.blocks.0.attn.qkv.weight").shape(), (colossal::Shape{48, 16}));
  const colossal::Tensor& qa = a.tensors.at("model.blocks.0.attn.qkv.weight");
  const colossal::Tensor& qb = b.tensors.at("model.blocks.0.attn.qkv.weight");
  const std::vector<float> va = qa.contiguous().to_vector<float>(), vb = qb.contiguous().to_vector<float>();
  double diff = 0, norm = 0;
  for (size_t i = 0; i < vb.size(); ++i) {
    diff += (va[i] - vb[i]) * (va[i] - vb[i]);
    norm += vb[i] * vb[i];
  }
  EXPECT_LE(std::sqrt(diff / norm), 1e-5) << "qkv.weight in the tp2 checkpoint is not the serial one (q/k/v order?)";

  // Layout-independent checkpoints: the tp2 file of epoch 1 resumes serially, and the serial one at
  // tp2, each going on with the uninterrupted serial run's losses (steps 7 to 12; momentum, position
  // and generators included).
  const auto expect_resumed = [&](const std::string& launcher, const std::string& extra, const std::string& from,
                                  const std::string& name) {
    ASSERT_EQ(run(launcher + bin + common + extra + " --set train.resume_from='\"" +
                      (dir / from / "epoch1-step6.safetensors").string() + "\"' --metrics " +
                      (dir / (name + ".jsonl")).string(),
                  dir / (name + ".log")),
              0)
        << read(dir / (name + ".log"));
    const std::map<int64_t, double> resumed = step_losses(dir / (name + ".jsonl"));
    ASSERT_EQ(resumed.size(), 6u) << read(dir / (name + ".log"));
    for (const auto& [step, loss] : resumed) {
      EXPECT_LE(std::abs(loss - serial.at(step)), 1e-5 * std::abs(serial.at(step)))
          << name << ": step " << step << " resumed " << loss << ", uninterrupted " << serial.at(step);
    }
  };
  expect_resumed("", "", "tp2", "tp2_to_serial");
  expect_resumed(bin + " run --nproc_per_node 2 -- ", " --set parallel.tensor.size=2", "serial", "serial_to_tp2");

  // Three heads do not split over two ranks: the error names both.
  ASSERT_NE(run(bin + " run --nproc_per_node 2 -- " + bin + common +
                    " --set parallel.tensor.size=2 --set model.options.num_heads=2 --set model.options.embed_dim=12"
                    " --set model.options.num_heads=3",
                dir / "heads.log"),
            0);
  const std::string heads = read(dir / "heads.log");
  EXPECT_NE(heads.find("num_heads = 3"), std::string::npos) << heads;
  EXPECT_NE(heads.find("parallel.tensor.size = 2"), std::string::npos) << heads;
  fs::remove_all(dir);
}

/// Block 0: heads split and gathered before a column-split proj, a replicated fc1 before a
/// column-split fc2; block 1: the MLP only, column then row.
constexpr const char* kMixedSpecs =
    R"(parallel.tensor.specs=[{ pattern = "blocks.0.attn.*", spec = "column" }, )"
    R"({ pattern = "blocks.0.mlp.fc2.*", spec = "column" }, { pattern = "blocks.1.mlp.fc1.*", spec = "column" }, )"
    R"({ pattern = "blocks.1.mlp.fc2.weight", spec = "row" }])";

TEST(TrainVitTp, SpecsFromTheConfigGiveTheSerialRunsLosses) {
  const fs::path dir = fs::temp_directory_path() / ("colossal_train_vit_specs_test_" + std::to_string(::getpid()));
  fs::remove_all(dir);
  fs::create_directories(dir);
  std::ofstream(dir / "c.toml") << kConfig;
  const std::string bin = colossal_binary();
  const std::string common = " train --config " + (dir / "c.toml").string();
  const std::string specs = std::string(" --set '") + kMixedSpecs + "'";
  ASSERT_EQ(run(bin + common + " --set train.checkpoint_dir='\"\"' --metrics " + (dir / "serial.jsonl").string(),
                dir / "serial.log"),
            0)
      << read(dir / "serial.log");
  ASSERT_EQ(run(bin + " run --nproc_per_node 2 -- " + bin + common + " --set parallel.tensor.size=2" + specs +
                    " --set train.checkpoint_dir='\"" + (dir / "specs").string() + "\"' --metrics " +
                    (dir / "specs.jsonl").string(),
                dir / "specs.log"),
            0)
      << read(dir / "specs.log");
  const std::map<int64_t, double> serial = step_losses(dir / "serial.jsonl"), split = step_losses(dir / "specs.jsonl");
  ASSERT_EQ(serial.size(), 12u) << read(dir / "serial.log");
  ASSERT_EQ(split.size(), serial.size()) << read(dir / "specs.log");
  double worst = 0;
  for (const auto& [step, loss] : serial) {
    const double error = std::abs(split.at(step) - loss) / std::abs(loss);
    worst = std::max(worst, error);
    EXPECT_LE(error, 1e-5) << "step " << step << ": specs " << split.at(step) << ", serial " << loss;
  }
  std::printf("ViT tp2 by specs against serial: %zu steps, largest relative difference %.2e\n", serial.size(), worst);
  EXPECT_EQ(per_epoch(dir / "specs.jsonl", "test_accuracy"), per_epoch(dir / "serial.jsonl", "test_accuracy"));

  // The specs run's checkpoint of epoch 1 resumes serially with the uninterrupted run's losses.
  ASSERT_EQ(run(bin + common + " --set train.checkpoint_dir='\"\"' --set train.resume_from='\"" +
                    (dir / "specs" / "epoch1-step6.safetensors").string() + "\"' --metrics " +
                    (dir / "resumed.jsonl").string(),
                dir / "resumed.log"),
            0)
      << read(dir / "resumed.log");
  const std::map<int64_t, double> resumed = step_losses(dir / "resumed.jsonl");
  ASSERT_EQ(resumed.size(), 6u) << read(dir / "resumed.log");
  for (const auto& [step, loss] : resumed) {
    EXPECT_LE(std::abs(loss - serial.at(step)), 1e-5 * std::abs(serial.at(step))) << "resumed step " << step;
  }

  // `colossal describe` names each parameter's spec and its rule.
  ASSERT_EQ(run(bin + " describe --config " + (dir / "c.toml").string() + " --set parallel.tensor.size=2" + specs,
                dir / "describe.log"),
            0)
      << read(dir / "describe.log");
  const std::string text = read(dir / "describe.log");
  const auto line_of = [&](const std::string& name) {
    const size_t at = text.find("\n" + name + " ");
    return at == std::string::npos ? std::string() : text.substr(at + 1, text.find('\n', at + 1) - at - 1);
  };
  EXPECT_NE(text.find("1D tensor parallelism over 2 ranks, 4 rules of parallel.tensor.specs"), std::string::npos)
      << text;
  for (const auto& [name, want] : std::map<std::string, std::vector<std::string>>{
           {"blocks.0.attn.qkv.weight", {"[48, 16]", "column", "[24, 16]", "rule 0 \"blocks.0.attn.*\""}},
           {"blocks.0.mlp.fc1.weight", {"replicate", "no rule"}},
           {"blocks.0.mlp.fc2.bias", {"column", "[8]", "rule 1"}},
           {"blocks.1.mlp.fc2.weight", {"[16, 32]", "row", "[16, 16]", "rule 3"}},
           {"blocks.1.mlp.fc2.bias", {"replicate", "follows blocks.1.mlp.fc2.weight"}},
           {"head.weight", {"replicate", "no rule"}}}) {
    const std::string line = line_of(name);
    for (const std::string& part : want) EXPECT_NE(line.find(part), std::string::npos) << name << ": " << line;
  }

  // A spec on a layer that stays whole is refused naming the parameter and the reason.
  ASSERT_NE(run(bin + " describe --config " + (dir / "c.toml").string() +
                    " --set parallel.tensor.size=2 --set 'parallel.tensor.specs=[{ pattern = \"head.*\", spec = "
                    "\"column\" }]'",
                dir / "head.log"),
            0);
  EXPECT_NE(read(dir / "head.log").find("head.weight: spec \"column\""), std::string::npos) << read(dir / "head.log");
  EXPECT_NE(read(dir / "head.log").find("the classifier head stays whole"), std::string::npos);
  fs::remove_all(dir);
}

}  // namespace
