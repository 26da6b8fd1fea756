// MetricsJsonlHook: every line of the file parses as JSON: a step line every log_interval
// iterations, one per epoch with the expected keys (null where an epoch had no test pass), then the
// summary with the last epoch's metrics; epochs are 1-based as on the console, a resumed run counts
// the epochs before it, and a write that fails (a full disk) stops the run naming the file.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <memory>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "colossal/core/error.h"
#include "colossal/data/data_loader.h"
#include "colossal/engine/hooks.h"
#include "colossal/engine/trainer.h"
#include "colossal/ops/nn_functional.h"  // cross_entropy
#include "colossal/optim/sgd.h"
#include "engine_test_util.h"

namespace colossal::engine {
namespace {

Tensor cross_entropy_loss(const Tensor& output, const Tensor& target) {
  return ops::cross_entropy(output, target);
}

TEST(MetricsJsonlHook, WritesOneObjectPerEpochThenSummary) {
  auto model = testing::make_linear(3, 2, 9);
  optim::SgdOptions sgd;
  sgd.lr = 0.1;
  auto optimizer = std::make_shared<optim::Sgd>(model->parameters(), sgd);
  Engine engine(model, optimizer, cross_entropy_loss);
  data::DataLoader train_loader(std::make_shared<testing::TinyClassificationDataset>(6), testing::batches_of(2));
  data::DataLoader test_loader(std::make_shared<testing::TinyClassificationDataset>(4), testing::batches_of(2));

  const std::filesystem::path path =
      std::filesystem::temp_directory_path() /
      ("colossal_jsonl_hook_test_" + std::to_string(::testing::UnitTest::GetInstance()->random_seed()) + ".jsonl");
  Trainer trainer(engine);
  // test_interval 2 over 3 epochs: epochs 0 and 2 test, epoch 1 has null test metrics.
  trainer.fit(train_loader, 3, &test_loader, 2,
              {std::make_shared<MetricsJsonlHook>(path.string(), /*log_interval=*/2), std::make_shared<LossHook>(),
               std::make_shared<AccuracyHook>(), std::make_shared<ThroughputHook>()});

  std::ifstream file(path);
  ASSERT_TRUE(file.good()) << path;
  std::vector<nlohmann::json> lines;
  for (std::string line; std::getline(file, line);) {
    ASSERT_NO_THROW(lines.push_back(nlohmann::json::parse(line))) << line;
  }
  std::filesystem::remove(path);
  // 3 iterations per epoch, 9 in all: step lines at steps 2, 4, 6, 8.
  std::vector<nlohmann::json> steps, epochs;
  for (const nlohmann::json& line : lines) {
    if (line["event"] == "step") steps.push_back(line);
    if (line["event"] == "epoch") epochs.push_back(line);
  }
  ASSERT_EQ(steps.size(), 4u);
  for (size_t i = 0; i < steps.size(); ++i) {
    SCOPED_TRACE(steps[i].dump());
    EXPECT_EQ(steps[i]["step"].get<int64_t>(), static_cast<int64_t>(2 * (i + 1)));
    // Steps 2, 4, 6, 8 fall in epochs 1, 2, 2, 3 ("Epoch 2/3" on the console).
    EXPECT_EQ(steps[i]["epoch"].get<int64_t>(), static_cast<int64_t>(2 * i + 1) / 3 + 1);
    EXPECT_TRUE(steps[i]["loss"].is_number());
    EXPECT_DOUBLE_EQ(steps[i]["lr"].get<double>(), 0.1);
  }
  ASSERT_EQ(epochs.size(), 3u);
  ASSERT_EQ(lines.size(), 8u);
  for (int64_t epoch = 0; epoch < 3; ++epoch) {
    const nlohmann::json& line = epochs[static_cast<size_t>(epoch)];
    SCOPED_TRACE(line.dump());
    for (const char* key : {"epoch", "train_loss", "test_loss", "test_accuracy", "samples_per_s"}) {
      EXPECT_TRUE(line.contains(key)) << key;
    }
    EXPECT_EQ(line["epoch"].get<int64_t>(), epoch + 1);
    EXPECT_TRUE(line["train_loss"].is_number());
    EXPECT_GT(line["samples_per_s"].get<double>(), 0.0);
    const bool tested = epoch % 2 == 0;
    EXPECT_EQ(line["test_loss"].is_number(), tested);
    EXPECT_EQ(line["test_accuracy"].is_number(), tested);
    EXPECT_EQ(line["test_loss"].is_null(), !tested);
  }
  const nlohmann::json& summary = lines.back();
  SCOPED_TRACE(summary.dump());
  EXPECT_EQ(summary["event"], "summary");
  EXPECT_EQ(summary["epochs"].get<int64_t>(), 3);
  EXPECT_EQ(summary["epochs_this_run"].get<int64_t>(), 3);
  EXPECT_EQ(summary["steps"].get<int64_t>(), 9);
  EXPECT_EQ(summary["train_loss"].get<double>(), epochs[2]["train_loss"].get<double>());
  EXPECT_EQ(summary["test_loss"].get<double>(), epochs[2]["test_loss"].get<double>());
  EXPECT_EQ(summary["test_accuracy"].get<double>(), epochs[2]["test_accuracy"].get<double>());
  for (const char* key : {"best_test_accuracy", "samples_per_s", "wall_s"}) {
    EXPECT_TRUE(summary[key].is_number()) << key;
  }
}

struct SmallFit {
  std::shared_ptr<nn::Linear> model = testing::make_linear(3, 2, 9);
  Engine engine{model,
                [this] {
                  optim::SgdOptions sgd;
                  sgd.lr = 0.1;
                  return std::make_shared<optim::Sgd>(model->parameters(), sgd);
                }(),
                cross_entropy_loss};
  data::DataLoader loader{std::make_shared<testing::TinyClassificationDataset>(6), testing::batches_of(2)};
};

std::vector<nlohmann::json> read_lines(const std::filesystem::path& path) {
  std::ifstream file(path);
  std::vector<nlohmann::json> lines;
  for (std::string line; std::getline(file, line);) lines.push_back(nlohmann::json::parse(line));
  return lines;
}

// A run resumed at epoch 2 of 3 appends epoch 3 (1-based, as "Epoch 3/3" on its console) and a
// summary that counts all 3 epochs, 1 of them in this run.
TEST(MetricsJsonlHook, ResumedRunCountsEpochsFromOneAndInAll) {
  SmallFit fit;
  const std::filesystem::path path = std::filesystem::temp_directory_path() /
                                     ("colossal_jsonl_hook_test_resumed_" +
                                      std::to_string(::testing::UnitTest::GetInstance()->random_seed()) + ".jsonl");
  std::filesystem::remove(path);
  Trainer trainer(fit.engine);
  trainer.resume_at({2, 0, 6});
  trainer.fit(fit.loader, 3, nullptr, 1,
              {std::make_shared<MetricsJsonlHook>(path.string(), 1, /*append=*/true), std::make_shared<LossHook>()});
  const std::vector<nlohmann::json> lines = read_lines(path);
  std::filesystem::remove(path);
  ASSERT_EQ(lines.size(), 5u);  // steps 7, 8, 9; epoch 3; summary
  for (size_t i = 0; i < 3; ++i) {
    EXPECT_EQ(lines[i]["step"].get<int64_t>(), static_cast<int64_t>(7 + i));
    EXPECT_EQ(lines[i]["epoch"].get<int64_t>(), 3);
  }
  EXPECT_EQ(lines[3]["event"], "epoch");
  EXPECT_EQ(lines[3]["epoch"].get<int64_t>(), 3);
  EXPECT_EQ(lines[4]["epochs"].get<int64_t>(), 3);
  EXPECT_EQ(lines[4]["epochs_this_run"].get<int64_t>(), 1);
  EXPECT_EQ(lines[4]["steps"].get<int64_t>(), 9);
  EXPECT_EQ(lines[4]["steps_this_run"].get<int64_t>(), 3);
}

// train.max_steps cuts the first epoch after 2 of its 3 iterations: the summary counts that epoch,
// as its epoch line does.
TEST(MetricsJsonlHook, EpochCutByMaxStepsCounts) {
  SmallFit fit;
  const std::filesystem::path path =
      std::filesystem::temp_directory_path() /
      ("colossal_jsonl_hook_test_cut_" + std::to_string(::testing::UnitTest::GetInstance()->random_seed()) + ".jsonl");
  Trainer trainer(fit.engine);
  trainer.fit(fit.loader, 3, nullptr, 1, {std::make_shared<MetricsJsonlHook>(path.string())}, false,
              FitLimits{.max_updates = 2});
  const std::vector<nlohmann::json> lines = read_lines(path);
  std::filesystem::remove(path);
  ASSERT_EQ(lines.size(), 2u);
  EXPECT_EQ(lines[0]["epoch"].get<int64_t>(), 1);
  EXPECT_EQ(lines[1]["epochs"].get<int64_t>(), 1);
  EXPECT_EQ(lines[1]["steps"].get<int64_t>(), 2);
}

// /dev/full accepts the open and fails every write with ENOSPC, as a full disk does: the run stops
// with an error naming the file and the reason instead of finishing with an empty file.
TEST(MetricsJsonlHook, FailedWriteStopsTheRunNamingTheFileAndTheReason) {
  if (!std::filesystem::exists("/dev/full")) GTEST_SKIP() << "no /dev/full on this system";
  SmallFit fit;
  Trainer trainer(fit.engine);
  try {
    trainer.fit(fit.loader, 1, nullptr, 1, {std::make_shared<MetricsJsonlHook>("/dev/full", 1)});
    FAIL() << "the run ended without an error";
  } catch (const Error& e) {
    const std::string message = e.what();
    EXPECT_NE(message.find("'/dev/full'"), std::string::npos) << message;
    EXPECT_NE(message.find("No space left on device"), std::string::npos) << message;
  }
  // The summary alone (no step lines) fails too, at the end.
  SmallFit quiet;
  Trainer quiet_trainer(quiet.engine);
  EXPECT_THROW(quiet_trainer.fit(quiet.loader, 1, nullptr, 1, {std::make_shared<MetricsJsonlHook>("/dev/full", 0)}),
               Error);
  // A file that cannot be opened says why.
  try {
    trainer.fit(fit.loader, 1, nullptr, 1, {std::make_shared<MetricsJsonlHook>("/nonexistent-dir/m.jsonl")});
    FAIL() << "opened a file in a missing folder";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("No such file or directory"), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace colossal::engine
