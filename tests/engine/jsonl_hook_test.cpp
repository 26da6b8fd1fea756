// MetricsJsonlHook: every line of the file parses as JSON: a step line every log_interval
// iterations, one per epoch with the expected keys (null where an epoch had no test pass), then the
// summary with the last epoch's metrics.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <memory>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

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
    EXPECT_EQ(steps[i]["epoch"].get<int64_t>(), static_cast<int64_t>(2 * i + 1) / 3);
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
    EXPECT_EQ(line["epoch"].get<int64_t>(), epoch);
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
  EXPECT_EQ(summary["steps"].get<int64_t>(), 9);
  EXPECT_EQ(summary["train_loss"].get<double>(), epochs[2]["train_loss"].get<double>());
  EXPECT_EQ(summary["test_loss"].get<double>(), epochs[2]["test_loss"].get<double>());
  EXPECT_EQ(summary["test_accuracy"].get<double>(), epochs[2]["test_accuracy"].get<double>());
  for (const char* key : {"best_test_accuracy", "samples_per_s", "wall_s"}) {
    EXPECT_TRUE(summary[key].is_number()) << key;
  }
}

}  // namespace
}  // namespace colossal::engine
