// Trainer::fit: the hook points in Colossal-AI's order, priority sorting, test_interval, and the
// loss and accuracy hooks' values.
#include "colossal/engine/trainer.h"

#include <gtest/gtest.h>

#include <memory>
#include <sstream>
#include <string>
#include <vector>

#include "colossal/data/data_loader.h"
#include "colossal/engine/hooks.h"
#include "colossal/ops/nn_functional.h"  // cross_entropy
#include "colossal/optim/sgd.h"
#include "engine_test_util.h"

namespace colossal::engine {
namespace {

Tensor cross_entropy_loss(const Tensor& output, const Tensor& target) {
  return ops::cross_entropy(output, target);
}

struct Fixture {
  std::shared_ptr<nn::Linear> model = testing::make_linear(3, 2, 5);
  std::shared_ptr<optim::Sgd> optimizer = [this] {
    optim::SgdOptions options;
    options.lr = 0.1;
    return std::make_shared<optim::Sgd>(model->parameters(), options);
  }();
  Engine engine{model, optimizer, cross_entropy_loss};
  // 6 samples in batches of 2: 3 training iterations; 4 test samples: 2 test iterations.
  data::DataLoader train_loader{std::make_shared<testing::TinyClassificationDataset>(6), testing::batches_of(2)};
  data::DataLoader test_loader{std::make_shared<testing::TinyClassificationDataset>(4), testing::batches_of(2)};
};

/// Appends "<tag><point>" to a shared log at every hook point.
class RecordingHook : public Hook {
 public:
  RecordingHook(std::vector<std::string>* log, std::string tag = "", int priority = 0)
      : Hook(priority), log_(log), tag_(std::move(tag)) {}
  void before_train(Trainer&) override { add("before_train"); }
  void after_train(Trainer&) override { add("after_train"); }
  void before_train_epoch(Trainer&) override { add("before_train_epoch"); }
  void after_train_epoch(Trainer&) override { add("after_train_epoch"); }
  void before_train_iter(Trainer&) override { add("before_train_iter"); }
  void after_train_iter(Trainer&, const Tensor&, const Tensor&, const Tensor& loss) override {
    EXPECT_TRUE(loss.defined());
    add("after_train_iter");
  }
  void before_test(Trainer&) override { add("before_test"); }
  void after_test(Trainer&) override { add("after_test"); }
  void before_test_epoch(Trainer&) override { add("before_test_epoch"); }
  void after_test_epoch(Trainer&) override { add("after_test_epoch"); }
  void before_test_iter(Trainer&) override { add("before_test_iter"); }
  void after_test_iter(Trainer&, const Tensor& output, const Tensor&, const Tensor& loss) override {
    EXPECT_FALSE(output.requires_grad());
    EXPECT_TRUE(loss.defined());
    add("after_test_iter");
  }

 private:
  void add(const std::string& point) { log_->push_back(tag_ + point); }
  std::vector<std::string>* log_;
  std::string tag_;
};

std::vector<std::string> expected_epoch(int64_t train_iters, int64_t test_iters, bool test) {
  std::vector<std::string> e{"before_train_epoch"};
  for (int64_t i = 0; i < train_iters; ++i) {
    e.push_back("before_train_iter");
    e.push_back("after_train_iter");
  }
  e.push_back("after_train_epoch");
  if (!test) return e;
  e.push_back("before_test");
  e.push_back("before_test_epoch");
  for (int64_t i = 0; i < test_iters; ++i) {
    e.push_back("before_test_iter");
    e.push_back("after_test_iter");
  }
  e.push_back("after_test_epoch");
  e.push_back("after_test");
  return e;
}

TEST(Trainer, HookOrderTwoEpochsThreeItersTestEveryEpoch) {
  Fixture f;
  std::vector<std::string> log;
  Trainer trainer(f.engine);
  trainer.fit(f.train_loader, 2, &f.test_loader, 1, {std::make_shared<RecordingHook>(&log)});

  std::vector<std::string> expected{"before_train"};
  for (int epoch = 0; epoch < 2; ++epoch) {
    auto e = expected_epoch(3, 2, true);
    expected.insert(expected.end(), e.begin(), e.end());
  }
  expected.push_back("after_train");
  EXPECT_EQ(log, expected);
  EXPECT_EQ(trainer.cur_step(), 6);
  EXPECT_EQ(f.engine.num_updates(), 6);
}

TEST(Trainer, TestIntervalFollowsColossalAiRule) {
  Fixture f;
  std::vector<std::string> log;
  Trainer trainer(f.engine);
  // Epochs 0 and 2 test (epoch % test_interval == 0); epoch 1 does not.
  trainer.fit(f.train_loader, 3, &f.test_loader, 2, {std::make_shared<RecordingHook>(&log)});
  std::vector<std::string> expected{"before_train"};
  for (int epoch = 0; epoch < 3; ++epoch) {
    auto e = expected_epoch(3, 2, epoch % 2 == 0);
    expected.insert(expected.end(), e.begin(), e.end());
  }
  expected.push_back("after_train");
  EXPECT_EQ(log, expected);
}

TEST(Trainer, NoTestLoaderMeansNoTestHooks) {
  Fixture f;
  std::vector<std::string> log;
  Trainer trainer(f.engine);
  trainer.fit(f.train_loader, 1, nullptr, 1, {std::make_shared<RecordingHook>(&log)});
  std::vector<std::string> expected{"before_train"};
  auto e = expected_epoch(3, 0, false);
  expected.insert(expected.end(), e.begin(), e.end());
  expected.push_back("after_train");
  EXPECT_EQ(log, expected);
}

TEST(Trainer, HooksRunByAscendingPriorityStable) {
  Fixture f;
  std::vector<std::string> log;
  Trainer trainer(f.engine);
  trainer.fit(f.train_loader, 1, nullptr, 1,
              {std::make_shared<RecordingHook>(&log, "c:", 5), std::make_shared<RecordingHook>(&log, "a:", -1),
               std::make_shared<RecordingHook>(&log, "b1:", 2), std::make_shared<RecordingHook>(&log, "b2:", 2)});
  ASSERT_GE(log.size(), 4u);
  EXPECT_EQ(std::vector<std::string>(log.begin(), log.begin() + 4),
            (std::vector<std::string>{"a:before_train", "b1:before_train", "b2:before_train", "c:before_train"}));
  EXPECT_EQ(std::vector<std::string>(log.end() - 4, log.end()),
            (std::vector<std::string>{"a:after_train", "b1:after_train", "b2:after_train", "c:after_train"}));
  ASSERT_EQ(trainer.hooks().size(), 4u);
  EXPECT_EQ(trainer.hooks()[0]->priority(), -1);
  EXPECT_EQ(trainer.hooks()[3]->priority(), 5);
}

TEST(Trainer, ThroughputCountsTheTargetsRowsWhereTheRankHasNoOutput) {
  // A pipeline stage before the last has no output; its throughput is still the batch's samples.
  Fixture f;
  Trainer trainer(f.engine);
  ThroughputHook hook;
  hook.before_train_epoch(trainer);
  hook.after_train_iter(trainer, Tensor(), core::zeros({2}, DType::i64), Tensor());
  hook.after_train_iter(trainer, core::zeros({3, 2}), Tensor(), Tensor());  // no target: the output's rows
  hook.after_train_epoch(trainer);
  const double throughput = trainer.train_metrics().at("throughput");
  EXPECT_GT(throughput, 0.0);
  // Nothing to count: no samples.
  ThroughputHook none;
  none.before_train_epoch(trainer);
  none.after_train_iter(trainer, Tensor(), Tensor(), Tensor());
  none.after_train_epoch(trainer);
  EXPECT_EQ(trainer.train_metrics().at("throughput"), 0.0);
}

TEST(Trainer, LossAndAccuracyHooksAverageThePass) {
  Fixture f;
  std::ostringstream log;
  Trainer trainer(f.engine);
  trainer.fit(f.train_loader, 1, &f.test_loader, 1,
              {std::make_shared<LogMetricByEpochHook>(&log), std::make_shared<LossHook>(),
               std::make_shared<AccuracyHook>(), std::make_shared<ThroughputHook>()});

  // Recompute the test metrics from the trained model: mean of the two batch losses, top-1 over 4 rows.
  double loss_sum = 0.0;
  int64_t correct = 0, total = 0;
  for (data::Batch& batch : f.test_loader) {
    Tensor out = f.engine.evaluate(batch.input);
    loss_sum += cross_entropy_loss(out, batch.target).item<double>();
    const auto predicted = out.to_vector<double>();
    const auto labels = batch.target.to_vector<int64_t>();
    for (size_t r = 0; r < labels.size(); ++r) {
      const int64_t argmax = predicted[2 * r + 1] > predicted[2 * r] ? 1 : 0;
      correct += argmax == labels[r];
      ++total;
    }
  }
  // Same ops on the same inputs in the same order: equal bits.
  EXPECT_EQ(trainer.test_metrics().at("loss"), loss_sum / 2.0);
  EXPECT_EQ(trainer.test_metrics().at("accuracy"), static_cast<double>(correct) / static_cast<double>(total));
  EXPECT_TRUE(trainer.train_metrics().contains("loss"));
  EXPECT_GT(trainer.train_metrics().at("throughput"), 0.0);
  // The log hook (priority 10) runs after the metric hooks despite being listed first.
  EXPECT_NE(log.str().find("Epoch 1/1 | train | loss="), std::string::npos) << log.str();
  EXPECT_NE(log.str().find("Epoch 1/1 | test | accuracy="), std::string::npos) << log.str();
}

}  // namespace
}  // namespace colossal::engine
