// `colossal export` on the command line: what it was given that it cannot use (a missing path, a
// weights file instead of a checkpoint) is an error that speaks of export and names the file.
#include "colossal/cli/export.h"

#include <gtest/gtest.h>

#include <filesystem>
#include <string>

#include <fmt/format.h>
#include <CLI/CLI.hpp>

#include "colossal/core/tensor.h"
#include "colossal/nn/safetensors.h"

namespace colossal::cli {
namespace {

namespace fs = std::filesystem;

fs::path temp_path(const std::string& name) {
  return fs::temp_directory_path() /
         ("colossal_cli_export_test_" + std::to_string(::testing::UnitTest::GetInstance()->random_seed()) + "_" + name);
}

void run_export(const std::string& arguments) {
  CLI::App app;
  add_export_command(app);
  app.parse("export " + arguments, false);
}

TEST(ExportDeathTest, MissingCheckpointSpeaksOfExport) {
  const fs::path missing = temp_path("absent.safetensors");
  // The path follows "colossal export: " directly: no "resume: " in between, as there was.
  EXPECT_EXIT(run_export(fmt::format("{} -o {}", missing.string(), temp_path("out.safetensors").string())),
              ::testing::ExitedWithCode(1),
              "colossal export: /[^ ]*absent\\.safetensors does not exist; give a checkpoint file or a folder");
}

TEST(ExportDeathTest, WeightsFileNeedsNoExport) {
  const fs::path weights = temp_path("weights.safetensors");
  nn::StateDict state;
  state.insert("w", core::ones({2}));
  nn::save_safetensors(weights, state, {{"format", "pt"}});
  EXPECT_EXIT(
      run_export(fmt::format("{} -o {}", weights.string(), temp_path("out.safetensors").string())),
      ::testing::ExitedWithCode(1),
      "colossal export: /[^ ]*weights\\.safetensors is not a colossal training checkpoint[^\n]*model\\.weights");
  fs::remove(weights);
}

}  // namespace
}  // namespace colossal::cli
