// Tests of `colossal train --config` (cli/train_config.h): a tiny ViT on synthetic images runs a few
// steps and writes a metrics summary with a finite loss; unsupported keys fail naming the key.
#include "colossal/cli/train_config.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>

#include "colossal/core/error.h"

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
epochs = 1
max_steps = 5
)";

fs::path write_config(const std::string& name) {
  const fs::path path = fs::temp_directory_path() / name;
  std::ofstream(path) << kTinyConfig;
  return path;
}

// The value after `"key": ` in a JSON line, as a double (NaN when absent or null).
double json_number(const std::string& line, const std::string& key) {
  const std::string needle = "\"" + key + "\":";
  const size_t at = line.find(needle);
  if (at == std::string::npos) return std::nan("");
  const char* begin = line.c_str() + at + needle.size();
  char* end = nullptr;
  const double value = std::strtod(begin, &end);
  return end == begin ? std::nan("") : value;
}

TEST(TrainConfig, synthetic_vit_writes_a_finite_summary) {
  const fs::path config = write_config("colossal_cli_train_config_test.toml");
  const fs::path metrics = fs::temp_directory_path() / "colossal_cli_train_config_test.jsonl";
  fs::remove(metrics);
  ASSERT_EQ(train_from_config(config.string(), {}, metrics.string()), 0);

  std::ifstream in(metrics);
  std::string line, summary;
  while (std::getline(in, line)) {
    if (line.find("\"summary\"") != std::string::npos) summary = line;
  }
  ASSERT_FALSE(summary.empty()) << "no summary line in " << metrics;
  // The summary's key is final_train_loss; accept train_loss too for a spacing-insensitive read.
  std::string compact;
  for (char ch : summary) {
    if (ch != ' ') compact += ch;
  }
  double loss = json_number(compact, "final_train_loss");
  if (std::isnan(loss)) loss = json_number(compact, "train_loss");
  EXPECT_TRUE(std::isfinite(loss)) << summary;
  EXPECT_GT(loss, 0.0) << summary;
}

TEST(TrainConfig, unsupported_model_names_the_key) {
  const fs::path config = write_config("colossal_cli_train_config_test_bad.toml");
  try {
    train_from_config(config.string(), {"model.name=gpt2"}, "");
    FAIL() << "expected an error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("model.name"), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace colossal::cli
