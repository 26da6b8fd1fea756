// model.options.checkpoint_activations through the command line: `colossal train` of a GPT-2 with
// dropout 0.1 (serially, and under `colossal run` at tp 2, pp 2 interleaved and pp2 x tp2), of a
// ViT with dropout and drop path and of a ResNet gives the same loss at every step with the option
// on as off, and says in its log that it is on. The key is accepted by every model; a value that is not a boolean is an
// error naming the key, and Hugging Face's and Colossal-AI's names for the switch are pointed at ours.
//
// The losses are compared exactly: the metrics file writes each loss with all its digits, and the
// checkpointed run computes the same bits (tests/nn/activation_checkpoint_test.cpp says why).
#include <gtest/gtest.h>

#include <unistd.h>  // getpid

#include <cstdint>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <functional>
#include <map>
#include <stdexcept>
#include <string>
#include <vector>

#include "cli_runs.h"
#include "metrics_jsonl.h"

#include "colossal/config/train_config.h"  // parse_config
#include "colossal/core/error.h"
#include "colossal/initialize/builders.h"

namespace {

using colossal::testing::read_text;
using colossal::testing::run_logged;
using colossal::testing::step_losses;
using colossal::testing::write_tokens;
namespace fs = std::filesystem;

/// The colossal program of this build (tests/CMakeLists.txt names no COLOSSAL_BINARY for this test;
/// the build puts the program at src/colossal/cli/colossal beside tests/).
std::string colossal_binary() {
  const fs::path program =
      fs::read_symlink("/proc/self/exe").parent_path().parent_path() / "src" / "colossal" / "cli" / "colossal";
  if (!fs::exists(program)) throw std::runtime_error("build the colossal program first: " + program.string());
  return program.string();
}

fs::path fresh_dir(const std::string& name) {
  const fs::path dir =
      fs::temp_directory_path() / ("colossal_train_activation_checkpoint_" + name + "_" + std::to_string(::getpid()));
  fs::remove_all(dir);
  fs::create_directories(dir);
  return dir;
}

/// Trains `config` with the option off and on (`launcher` before the program: "" or a `colossal
/// run` prefix) and expects the same loss at every step, and the log line only when on.
void expect_same_losses(const fs::path& dir, const std::string& config, const std::string& launcher,
                        size_t expected_steps) {
  std::ofstream(dir / "c.toml") << config;
  const std::string bin = colossal_binary();
  std::map<std::string, std::map<int64_t, double>> losses;
  for (const std::string value : {"false", "true"}) {
    const fs::path log = dir / (value + ".log"), metrics = dir / (value + ".jsonl");
    ASSERT_EQ(run_logged(launcher + bin + " train --config " + (dir / "c.toml").string() +
                             " --set model.options.checkpoint_activations=" + value + " --metrics " + metrics.string(),
                         log),
              0)
        << read_text(log);
    EXPECT_EQ(read_text(log).find("activation checkpointing on") != std::string::npos, value == "true")
        << read_text(log);
    losses[value] = step_losses(metrics);
  }
  ASSERT_EQ(losses["false"].size(), expected_steps) << read_text(dir / "false.log");
  ASSERT_EQ(losses["true"].size(), expected_steps) << read_text(dir / "true.log");
  for (const auto& [step, loss] : losses["false"]) {
    EXPECT_EQ(losses["true"].at(step), loss) << "step " << step;
  }
}

std::string gpt2_config(const fs::path& tokens) {
  return R"(
gradient_accumulation = 2
clip_grad_norm = 1.0

[model]
name = "gpt2"
options = { n_layer = 2, n_embd = 32, n_head = 4, n_positions = 16, vocab_size = 256, dropout = 0.1 }

[data]
dataset = "tokens"
path = ")" +
         tokens.string() +
         R"("
batch_size = 4
seq_len = 16

[optimizer]
name = "adamw"
lr = 1e-3

[train]
epochs = 0
max_steps = 3
device = "cpu"
progress = false
log_interval = 1
)";
}

TEST(TrainActivationCheckpoint, Gpt2WithDropoutGivesTheSameLossesSeriallyAndAtTensorParallelTwo) {
  const fs::path dir = fresh_dir("gpt2");
  write_tokens(dir / "train.bin", 2000, 256);
  const std::string config = gpt2_config(dir / "train.bin");
  expect_same_losses(dir, config, "", 6);  // 3 updates of 2 micro-steps
  // Under tensor parallelism the blocks' all-reduces run again in the recompute.
  const fs::path tp = dir / "tp2";
  fs::create_directories(tp);
  expect_same_losses(tp, config + "\n[parallel]\ntensor = { mode = \"1d\", size = 2 }\n",
                     colossal_binary() + " run --nproc_per_node 2 -- ", 6);
}

TEST(TrainActivationCheckpoint, Gpt2WithDropoutGivesTheSameLossesThroughPipelines) {
  // The pipeline's stages are cut from the model's pieces, whose blocks carry the switch: 2 stages
  // interleaved (2 chunks each, 4 microbatches in flight before their backwards), and 2 stages of 2
  // tensor ranks, whose blocks become tensor-parallel ones that checkpoint as the serial ones did.
  const fs::path dir = fresh_dir("gpt2_pipeline");
  write_tokens(dir / "train.bin", 2000, 256);
  const std::string config = gpt2_config(dir / "train.bin");
  const std::string launcher = colossal_binary() + " run --nproc_per_node ";
  const fs::path interleaved = dir / "pp2v2", with_tensor = dir / "pp2_tp2";
  fs::create_directories(interleaved);
  fs::create_directories(with_tensor);
  expect_same_losses(interleaved, config + "\n[parallel]\npipeline = 2\nnum_microbatches = 2\nnum_chunks = 2\n",
                     launcher + "2 -- ", 6);
  expect_same_losses(
      with_tensor, config + "\n[parallel]\npipeline = 2\nnum_microbatches = 2\ntensor = { mode = \"1d\", size = 2 }\n",
      launcher + "4 -- ", 6);
}

TEST(TrainActivationCheckpoint, VitWithDropoutAndDropPathGivesTheSameLosses) {
  expect_same_losses(fresh_dir("vit"), R"(
[model]
name = "vit"
options = { patch_size = 4, embed_dim = 16, depth = 2, num_heads = 2, mlp_ratio = 2.0, dropout = 0.1, attn_drop_rate = 0.1, drop_path_rate = 0.2 }

[data]
dataset = "synthetic"
batch_size = 8
options = { size = 32, test_size = 8, image_size = 8, channels = 1, num_classes = 4 }

[optimizer]
name = "sgd"
lr = 0.05
momentum = 0.9

[train]
epochs = 1
device = "cpu"
progress = false
log_interval = 1
)",
                     "", 4);
}

TEST(TrainActivationCheckpoint, ResnetGivesTheSameLosses) {
  expect_same_losses(fresh_dir("resnet"), R"(
[model]
name = "resnet"
preset = "resnet18"
options = { layers = [1, 1, 1, 1], width = 4, cifar_stem = true }

[data]
dataset = "synthetic"
batch_size = 8
options = { size = 32, test_size = 8, image_size = 8, channels = 3, num_classes = 4 }

[optimizer]
name = "sgd"
lr = 0.05
momentum = 0.9

[train]
epochs = 1
device = "cpu"
progress = false
log_interval = 1
)",
                     "", 4);
}

/// Runs `f`, expecting colossal::Error whose message contains every one of `parts`.
void expect_error(const std::function<void()>& f, const std::vector<std::string>& parts) {
  try {
    f();
    ADD_FAILURE() << "no error; expected one containing \"" << parts.front() << "\"";
  } catch (const colossal::Error& e) {
    const std::string message = e.what();
    for (const std::string& part : parts) EXPECT_NE(message.find(part), std::string::npos) << message;
  }
}

colossal::config::TrainConfig parse(const std::string& toml) {
  return colossal::config::parse_config(toml, {}, "test.toml");
}

TEST(TrainActivationCheckpoint, TheOptionIsABooleanNamedInItsErrors) {
  using colossal::initialize::gpt2_config;
  EXPECT_TRUE(gpt2_config(parse("[model]\nname = \"gpt2\"\noptions = { checkpoint_activations = true }\n"))
                  .checkpoint_activations);
  EXPECT_FALSE(gpt2_config(parse("[model]\nname = \"gpt2\"\n")).checkpoint_activations);
  expect_error([] { gpt2_config(parse("[model]\nname = \"gpt2\"\noptions = { checkpoint_activations = 1 }\n")); },
               {"model.options.checkpoint_activations", "expected a boolean"});
  expect_error([] { gpt2_config(parse("[model]\nname = \"gpt2\"\noptions = { gradient_checkpointing = true }\n")); },
               {"model.options.gradient_checkpointing", "checkpoint_activations = true"});

  // The image models, through the program (their builders need the data's geometry).
  const fs::path dir = fresh_dir("errors");
  const std::string bin = colossal_binary();
  const std::string data =
      "\n[data]\ndataset = \"synthetic\"\nbatch_size = 4\noptions = { size = 8, test_size = 4, "
      "image_size = 8, channels = 3, num_classes = 4 }\n[train]\nepochs = 1\ndevice = \"cpu\"\n";
  const std::map<std::string, std::string> models = {
      {"vit",
       "[model]\nname = \"vit\"\noptions = { patch_size = 4, embed_dim = 8, depth = 1, num_heads = 2, "
       "checkpoint_activations = \"yes\" }\n"},
      {"resnet",
       "[model]\nname = \"resnet\"\npreset = \"resnet18\"\noptions = { layers = [1, 1, 1, 1], width = 4, "
       "checkpoint = true }\n"}};
  for (const auto& [name, model] : models) {
    std::ofstream(dir / (name + ".toml")) << model << data;
    const fs::path log = dir / (name + ".log");
    EXPECT_NE(run_logged(bin + " train --config " + (dir / (name + ".toml")).string(), log), 0) << read_text(log);
    const std::string expected = name == "vit" ? "model.options.checkpoint_activations = \"yes\": expected a boolean"
                                               : "model.options.checkpoint: colossal calls activation checkpointing "
                                                 "checkpoint_activations";
    EXPECT_NE(read_text(log).find(expected), std::string::npos) << read_text(log);
  }
}

}  // namespace
