// configs/gpt2_tp_specs.toml, as a user runs it: it loads with the tutorial's six rules, and
// `colossal run --nproc_per_node 2 -- colossal train --config configs/gpt2_tp_specs.toml` on CPU ranks
// (the model shrunk by --set, everything else the config's: accumulation 4, clipping, AdamW, the
// cosine warmup, the padded 50304-entry vocabulary) gives, step by step, the serial run's losses and
// configs/gpt2_tp.toml's (the built-in policy) at 2 ranks; its checkpoint holds the serial tensors
// and resumes under the built-in policy with the uninterrupted run's losses;
// `colossal describe` prints each parameter's resulting spec.
// Tolerance 1e-5 relative, the layout harness's f32 bound: the same sums in another order.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>
#include <stdexcept>
#include <string>
#include <vector>

#include "cli_runs.h"
#include "metrics_jsonl.h"

#include "colossal/initialize/training_run.h"  // load_run_config
#include "colossal/nn/safetensors.h"

namespace {

using colossal::testing::read_text;
using colossal::testing::run_logged;
using colossal::testing::step_losses;
namespace fs = std::filesystem;

const fs::path kConfigs = fs::path(COLOSSAL_TEST_DATA_DIR) / ".." / ".." / "configs";

/// The colossal program of this build (tests/CMakeLists.txt names no COLOSSAL_BINARY for this test;
/// the build puts the program at src/colossal/cli/colossal beside tests/).
std::string colossal_binary() {
  const fs::path program =
      fs::read_symlink("/proc/self/exe").parent_path().parent_path() / "src" / "colossal" / "cli" / "colossal";
  if (!fs::exists(program)) throw std::runtime_error("build the colossal program first: " + program.string());
  return program.string();
}

TEST(Gpt2TpSpecsConfig, LoadsWithTheTutorialsRules) {
  const colossal::config::TrainConfig c = colossal::initialize::load_run_config(kConfigs / "gpt2_tp_specs.toml");
  EXPECT_EQ(c.model.name, colossal::config::ModelName::kGpt2);
  EXPECT_EQ(c.parallel.tensor.size, 2);
  ASSERT_EQ(c.parallel.tensor.specs.size(), 6u);
  EXPECT_EQ(c.parallel.tensor.specs[1],
            (colossal::config::TensorSpecRule{"h.*.mlp.c_proj.weight", colossal::config::TensorSplit::kRow}));
}

TEST(Gpt2TpSpecsConfig, TwoCpuRanksGiveTheSerialRunsAndTheBuiltInPolicysLosses) {
  const fs::path dir = colossal::testing::token_run_dir("colossal_gpt2_tp_specs_config_test");
  const std::string bin = colossal_binary();
  // The tiny GPT-2, as gpt2_tp_config_test: 4 windows a micro-batch, 3 updates of 4 micro-batches.
  const std::string tiny =
      std::string(colossal::testing::kTinyGpt2Sets) + " --set data.batch_size=4 --set train.checkpoint_steps=1";
  const auto train = [&](const std::string& config, const std::string& name, const std::string& extra) {
    return " train --config " + (kConfigs / config).string() + tiny + extra + " --set train.checkpoint_dir='\"" +
           (dir / name).string() + "\"' --metrics " + (dir / (name + ".jsonl")).string();
  };
  ASSERT_EQ(
      run_logged(bin + train("gpt2_tp_specs.toml", "serial", " --set parallel.tensor.size=1"), dir / "serial.log"), 0)
      << read_text(dir / "serial.log");
  ASSERT_EQ(run_logged(bin + " run --nproc_per_node 2 -- " + bin + train("gpt2_tp_specs.toml", "specs", ""),
                       dir / "specs.log"),
            0)
      << read_text(dir / "specs.log");
  ASSERT_EQ(
      run_logged(bin + " run --nproc_per_node 2 -- " + bin + train("gpt2_tp.toml", "builtin", ""), dir / "builtin.log"),
      0)
      << read_text(dir / "builtin.log");
  EXPECT_NE(read_text(dir / "specs.log").find("tensor parallel: 2 ranks (6 rules of parallel.tensor.specs)"),
            std::string::npos)
      << read_text(dir / "specs.log");

  const std::map<int64_t, double> serial = step_losses(dir / "serial.jsonl"), specs = step_losses(dir / "specs.jsonl"),
                                  builtin = step_losses(dir / "builtin.jsonl");
  ASSERT_EQ(serial.size(), 12u) << read_text(dir / "serial.log");  // 3 updates of 4 micro-steps
  ASSERT_EQ(specs.size(), serial.size()) << read_text(dir / "specs.log");
  ASSERT_EQ(builtin.size(), serial.size()) << read_text(dir / "builtin.log");
  double worst = 0;
  for (const auto& [step, loss] : serial) {
    const double against_serial = std::abs(specs.at(step) - loss) / std::abs(loss);
    const double against_builtin = std::abs(specs.at(step) - builtin.at(step)) / std::abs(builtin.at(step));
    worst = std::max({worst, against_serial, against_builtin});
    EXPECT_LE(against_serial, 1e-5) << "step " << step << ": specs " << specs.at(step) << ", serial " << loss;
    EXPECT_LE(against_builtin, 1e-5) << "step " << step << ": specs " << specs.at(step) << ", gpt2_tp.toml "
                                     << builtin.at(step);
  }
  std::printf(
      "configs/gpt2_tp_specs.toml at tp2 against serial and gpt2_tp.toml: %zu steps, largest relative "
      "difference %.2e\n",
      serial.size(), worst);

  // The checkpoint is the serial one: same names, the whole padded vocabulary.
  const colossal::nn::SafetensorsFile a = colossal::nn::load_safetensors(dir / "specs" / "epoch0-step12.safetensors");
  const colossal::nn::SafetensorsFile b = colossal::nn::load_safetensors(dir / "serial" / "epoch0-step12.safetensors");
  EXPECT_EQ(a.tensors.keys(), b.tensors.keys());
  ASSERT_NE(a.tensors.find("model.wte.weight"), nullptr);
  EXPECT_EQ(a.tensors.at("model.wte.weight").shape(), (colossal::Shape{50304, 32}));

  // The specs run's checkpoint after 2 updates resumes under the built-in policy (another split of
  // every layer but the layer norms) with the uninterrupted serial run's losses.
  ASSERT_EQ(run_logged(bin + " run --nproc_per_node 2 -- " + bin +
                           train("gpt2_tp.toml", "specs_to_builtin",
                                 " --set train.resume_from='\"" +
                                     (dir / "specs" / "epoch0-step8.safetensors").string() + "\"'"),
                       dir / "specs_to_builtin.log"),
            0)
      << read_text(dir / "specs_to_builtin.log");
  const std::map<int64_t, double> resumed = step_losses(dir / "specs_to_builtin.jsonl");
  ASSERT_EQ(resumed.size(), 4u) << read_text(dir / "specs_to_builtin.log");  // steps 9 to 12
  for (const auto& [step, loss] : resumed) {
    EXPECT_LE(std::abs(loss - serial.at(step)), 1e-5 * std::abs(serial.at(step)))
        << "resumed under the built-in policy: step " << step << " " << loss << ", uninterrupted " << serial.at(step);
  }

  // `colossal describe` names each parameter's spec and its rule.
  ASSERT_EQ(
      run_logged(bin + " describe --config " + (kConfigs / "gpt2_tp_specs.toml").string() + tiny, dir / "describe.log"),
      0)
      << read_text(dir / "describe.log");
  const std::string text = read_text(dir / "describe.log");
  const auto line_of = [&](const std::string& name) {
    const size_t at = text.find("\n" + name + " ");
    return at == std::string::npos ? std::string() : text.substr(at + 1, text.find('\n', at + 1) - at - 1);
  };
  for (const auto& [name, want] : std::map<std::string, std::vector<std::string>>{
           {"wte.weight", {"[50304, 32]", "column", "ShardSpec([-1])", "[50304, 16]", "rule 2 \"wte.weight\""}},
           {"h.1.attn.c_attn.bias", {"column", "[48]"}},
           {"h.1.mlp.c_proj.weight", {"[128, 32]", "row", "ShardSpec([0])", "[64, 32]", "rule 1"}},
           {"h.1.mlp.c_proj.bias", {"replicate", "whole", "follows h.1.mlp.c_proj.weight"}},
           {"ln_f.weight", {"replicate", "no rule"}}}) {
    const std::string line = line_of(name);
    for (const std::string& part : want) EXPECT_NE(line.find(part), std::string::npos) << name << ": " << line;
  }
  ASSERT_EQ(::unsetenv("DATA"), 0);
  // And a pipeline's stages as colossal train cuts them (initialize/pipeline_stage.h): the embedding's
  // pieces, blocks and head balanced by parameters, the tied wte counted once (in the head, whose GEMM
  // it is).
  ASSERT_EQ(run_logged(bin + " describe --config " + (kConfigs / "gpt2_tp.toml").string() + tiny +
                           " --set parallel.tensor.size=1 --set parallel.pipeline=2 --set parallel.num_microbatches=2",
                       dir / "describe_pp.log"),
            0)
      << read_text(dir / "describe_pp.log");
  const std::string pp = read_text(dir / "describe_pp.log");
  EXPECT_NE(pp.find("# pipeline: 2 stages x 1 chunk(s), 4 pieces balanced by parameters, 2 microbatches"),
            std::string::npos)
      << pp;
  EXPECT_NE(pp.find("stage 0 chunk 0: pieces [0, "), std::string::npos) << pp;
  EXPECT_NE(pp.find("GPT2Head ("), std::string::npos) << pp;
  fs::remove_all(dir);
}

}  // namespace
