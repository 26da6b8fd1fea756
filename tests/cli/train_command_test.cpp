// Tests of `colossal train --config` (cli/train_command.h): a tiny ViT on synthetic images runs a few
// steps and writes a metrics summary with finite numbers; a run resumed from its checkpoints repeats
// the uninterrupted run's losses exactly; unsupported keys fail naming the key.
#include "colossal/cli/train_command.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

#include <fmt/format.h>
#include <CLI/CLI.hpp>

#include "colossal/cli/export.h"
#include "colossal/core/error.h"
#include "colossal/engine/checkpoint.h"
#include "colossal/nn/safetensors.h"

namespace colossal::cli {
namespace {

namespace fs = std::filesystem;

constexpr const char* kTinyConfig = R"(
[model]
name = "vit"
options = { patch_size = 4, embed_dim = 16, depth = 1, num_heads = 2, mlp_ratio = 2.0 }

[data]
dataset = "synthetic"
batch_size = 8
options = { size = 64, test_size = 16, image_size = 8, channels = 1, num_classes = 4 }

[optimizer]
name = "adamw"
lr = 1e-3

[lr_scheduler]
name = "cosine"
warmup_steps = 1

[train]
epochs = 0  # bounded by max_steps alone: 5 steps, then the test pass at the end
max_steps = 5
)";

fs::path write_config(const std::string& name) {
  const fs::path path = fs::temp_directory_path() / name;
  std::ofstream(path) << kTinyConfig;
  return path;
}

/// The JSON objects of a metrics file, one per line.
std::vector<nlohmann::json> read_jsonl(const fs::path& path) {
  std::ifstream in(path);
  std::vector<nlohmann::json> lines;
  for (std::string line; std::getline(in, line);) lines.push_back(nlohmann::json::parse(line));
  return lines;
}

/// The "step" lines of a metrics file by step number.
std::map<int64_t, nlohmann::json> step_lines(const std::vector<nlohmann::json>& lines) {
  std::map<int64_t, nlohmann::json> steps;
  for (const nlohmann::json& line : lines) {
    if (line["event"] == "step") steps[line["step"].get<int64_t>()] = line;
  }
  return steps;
}

fs::path temp_path(const std::string& name) {
  return fs::temp_directory_path() / ("colossal_cli_train_config_test_" +
                                      std::to_string(::testing::UnitTest::GetInstance()->random_seed()) + "_" + name);
}

TEST(TrainConfig, synthetic_vit_writes_a_finite_summary) {
  const fs::path config = write_config("colossal_cli_train_config_test.toml");
  const fs::path metrics = temp_path("summary.jsonl");
  fs::remove(metrics);
  ASSERT_EQ(train_from_config(config.string(), {"train.log_interval=2"}, metrics.string()), 0);

  const std::vector<nlohmann::json> lines = read_jsonl(metrics);
  fs::remove(metrics);
  ASSERT_FALSE(lines.empty());
  const nlohmann::json& summary = lines.back();
  SCOPED_TRACE(summary.dump());
  ASSERT_EQ(summary["event"], "summary");
  for (const char* key : {"train_loss", "test_loss", "test_accuracy", "samples_per_s", "wall_s"}) {
    ASSERT_TRUE(summary[key].is_number()) << key;
    EXPECT_TRUE(std::isfinite(summary[key].get<double>())) << key;
  }
  EXPECT_GT(summary["train_loss"].get<double>(), 0.0);
  EXPECT_EQ(summary["steps"].get<int64_t>(), 5);
  EXPECT_EQ(step_lines(lines).size(), 2u);  // steps 2 and 4
}

// A run with checkpoints every 3 optimizer steps and at each epoch's end; resuming from a
// checkpoint inside epoch 0 and from the end of epoch 0 repeats the uninterrupted run's step losses
// exactly (the JSON numbers round-trip doubles). Dropout makes the generator state matter.
TEST(TrainConfig, resume_repeats_the_uninterrupted_losses_bit_for_bit) {
  const fs::path config = write_config("colossal_cli_train_config_test_resume.toml");
  const fs::path dir = temp_path("checkpoints");
  fs::remove_all(dir);
  const std::vector<std::string> run = {"train.epochs=2",
                                        "train.max_steps=0",
                                        "train.log_interval=1",
                                        "train.checkpoint_steps=3",
                                        "train.progress=false",
                                        "model.options.dropout=0.2",
                                        "train.checkpoint_dir=\"" + dir.string() + "\""};
  const fs::path full_metrics = temp_path("full.jsonl");
  ASSERT_EQ(train_from_config(config.string(), run, full_metrics.string()), 0);
  const std::map<int64_t, nlohmann::json> full = step_lines(read_jsonl(full_metrics));
  ASSERT_EQ(full.size(), 16u);  // 64 samples in batches of 8, 2 epochs
  for (const char* name : {"epoch0-step3.safetensors", "epoch0-step6.safetensors", "epoch1-step8.safetensors",
                           "epoch1-step15.safetensors", "epoch2-step16.safetensors"}) {
    EXPECT_TRUE(fs::exists(dir / name)) << name;
  }

  for (const auto& [name, first_step] : {std::pair{"epoch0-step6.safetensors", 7}, {"epoch1-step8.safetensors", 9}}) {
    SCOPED_TRACE(name);
    std::vector<std::string> resume = run;
    resume.back() = "train.checkpoint_dir=\"\"";
    resume.push_back("train.resume_from=" + toml_string((dir / name).string()));
    const fs::path metrics = temp_path("resumed.jsonl");
    fs::remove(metrics);
    ASSERT_EQ(train_from_config(config.string(), resume, metrics.string()), 0);
    const std::map<int64_t, nlohmann::json> resumed = step_lines(read_jsonl(metrics));
    fs::remove(metrics);
    ASSERT_EQ(resumed.size(), static_cast<size_t>(16 - first_step + 1));
    for (const auto& [step, line] : resumed) {
      ASSERT_EQ(line["loss"].get<double>(), full.at(step)["loss"].get<double>()) << "step " << step;
      ASSERT_EQ(line["lr"].get<double>(), full.at(step)["lr"].get<double>()) << "step " << step;
    }
  }

  // Another batch size would make the data position mean other samples.
  std::vector<std::string> bad = run;
  bad.back() = "train.resume_from=" + toml_string(dir.string());
  bad.push_back("data.batch_size=16");
  try {
    train_from_config(config.string(), bad, "");
    FAIL() << "resumed with another batch size";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("data.batch_size = 8"), std::string::npos) << e.what();
  }
  fs::remove(full_metrics);
  fs::remove_all(dir);
}

// `colossal export` writes a checkpoint's model under its own (Hub) names, and model.weights starts
// a run from such a file.
TEST(TrainConfig, export_writes_the_model_and_model_weights_starts_from_it) {
  const fs::path config = write_config("colossal_cli_train_config_test_export.toml");
  const fs::path dir = temp_path("export_checkpoints");
  fs::remove_all(dir);
  ASSERT_EQ(train_from_config(config.string(),
                              {"train.progress=false", "train.checkpoint_dir=" + toml_string(dir.string())}, ""),
            0);
  const fs::path weights = temp_path("weights.safetensors");
  CLI::App app;
  add_export_command(app);
  app.parse(fmt::format("export {} -o {}", dir.string(), weights.string()), false);
  const nn::SafetensorsFile exported = nn::load_safetensors(weights);
  EXPECT_EQ(exported.metadata.at("format"), "pt");
  const nn::StateDict trained = engine::load_checkpoint_model_state(engine::find_checkpoint(dir));
  ASSERT_EQ(exported.tensors.size(), trained.size());
  for (const auto& [name, tensor] : trained) {
    ASSERT_TRUE(exported.tensors.contains(name)) << name;  // "cls_token", "blocks.0.attn.qkv.weight", ...
    EXPECT_EQ(exported.tensors.at(name).to_vector<float>(), tensor.to_vector<float>()) << name;
  }

  // The first step's loss from the trained weights is not that of a fresh initialisation.
  const auto first_loss = [&](const std::vector<std::string>& extra) {
    std::vector<std::string> overrides = {"train.progress=false", "train.max_steps=1", "train.log_interval=1"};
    overrides.insert(overrides.end(), extra.begin(), extra.end());
    const fs::path metrics = temp_path("first.jsonl");
    fs::remove(metrics);
    EXPECT_EQ(train_from_config(config.string(), overrides, metrics.string()), 0);
    const std::map<int64_t, nlohmann::json> steps = step_lines(read_jsonl(metrics));
    fs::remove(metrics);
    return steps.at(1)["loss"].get<double>();
  };
  EXPECT_NE(first_loss({"model.weights=" + toml_string(weights.string())}), first_loss({}));
  try {
    train_from_config(config.string(), {"model.weights=\"/nonexistent/w.safetensors\""}, "");
    FAIL() << "loaded weights from a missing file";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("/nonexistent/w.safetensors"), std::string::npos) << e.what();
  }
  fs::remove(weights);
  fs::remove_all(dir);
}

TEST(TrainConfig, toml_string_escapes_what_toml_needs) {
  EXPECT_EQ(toml_string("/tmp/a b"), "\"/tmp/a b\"");
  EXPECT_EQ(toml_string("C:\\x\"y"), "\"C:\\\\x\\\"y\"");
  EXPECT_EQ(toml_string(std::string("a\nb")), "\"a\\u000Ab\"");
}

TEST(TrainConfig, every_mixed_precision_mode_trains) {
  const fs::path config = write_config("colossal_cli_train_config_test_amp.toml");
  for (const char* mode : {"fp16.mode=\"naive\"", "fp16.mode=\"torch\"", "bf16=true"}) {
    SCOPED_TRACE(mode);
    const fs::path metrics = temp_path("amp.jsonl");
    fs::remove(metrics);
    ASSERT_EQ(train_from_config(config.string(), {mode, "train.progress=false"}, metrics.string()), 0);
    const nlohmann::json summary = read_jsonl(metrics).back();
    fs::remove(metrics);
    ASSERT_TRUE(summary["train_loss"].is_number()) << summary.dump();
    EXPECT_TRUE(std::isfinite(summary["train_loss"].get<double>())) << summary.dump();
    EXPECT_TRUE(std::isfinite(summary["test_loss"].get<double>())) << summary.dump();
  }
}

TEST(TrainConfig, unsupported_keys_are_named) {
  const fs::path config = write_config("colossal_cli_train_config_test_bad.toml");
  try {
    train_from_config(config.string(), {"parallel.data=2"}, "");
    FAIL() << "expected an error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("parallel."), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace colossal::cli
