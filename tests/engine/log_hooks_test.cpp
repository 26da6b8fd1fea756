// The logging hooks driven by a small Trainer: TensorBoard scalars (tags, steps, the lr each update
// used, per-epoch tables), the by-step log line under gradient accumulation, the memory report and
// the per-pass timing they publish for the other hooks.
#include "colossal/engine/log_hooks.h"

#include <gtest/gtest.h>
#include <unistd.h>  // getpid

#include <chrono>
#include <filesystem>
#include <map>
#include <memory>
#include <sstream>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include <fmt/core.h>

#include "colossal/core/error.h"
#include "colossal/data/data_loader.h"
#include "colossal/engine/hooks.h"
#include "colossal/engine/trainer.h"
#include "colossal/ops/nn_functional.h"   // cross_entropy
#include "colossal/optim/lr_scheduler.h"  // LinearWarmupLR
#include "colossal/optim/sgd.h"
#include "engine_test_util.h"

namespace colossal::engine {
namespace {

namespace fs = std::filesystem;

Tensor cross_entropy_loss(const Tensor& output, const Tensor& target) {
  return ops::cross_entropy(output, target);
}

std::shared_ptr<optim::Sgd> make_sgd(nn::Module& model) {
  optim::SgdOptions options;
  options.lr = 0.1;
  return std::make_shared<optim::Sgd>(model.parameters(), options);
}

/// A fresh directory for one test, removed with everything in it at the end.
class TempDir {
 public:
  TempDir() {
    const auto* info = ::testing::UnitTest::GetInstance()->current_test_info();
    path_ = fs::temp_directory_path() /
            ("colossal_log_hooks_test_" + std::string(info->name()) + "_" + std::to_string(::getpid()));
    fs::remove_all(path_);
  }
  ~TempDir() { fs::remove_all(path_); }
  const fs::path& path() const { return path_; }

 private:
  fs::path path_;
};

/// Records each training iteration's loss, and copies of the metric tables once every hook of
/// lower priority has published (priority 100: after all the stock hooks).
class ProbeHook : public Hook {
 public:
  ProbeHook() : Hook(100) {}
  void after_train_iter(Trainer&, const Tensor&, const Tensor&, const Tensor& loss) override {
    losses.push_back(loss.item<double>());
  }
  void after_train_epoch(Trainer& trainer) override { train_tables.push_back(trainer.train_metrics()); }
  void after_test_epoch(Trainer& trainer) override { test_tables.push_back(trainer.test_metrics()); }

  std::vector<double> losses;
  std::vector<MetricTable> train_tables, test_tables;
};

/// Sleeps in every iteration, so that timings have a known lower bound.
class SleepHook : public Hook {
 public:
  explicit SleepHook(std::chrono::milliseconds duration) : duration_(duration) {}
  void before_train_iter(Trainer&) override { std::this_thread::sleep_for(duration_); }
  void before_test_iter(Trainer&) override { std::this_thread::sleep_for(duration_); }

 private:
  std::chrono::milliseconds duration_;
};

/// (step, value) of every scalar tagged `tag`, in file order.
std::vector<std::pair<int64_t, float>> series(const std::vector<EventRecord>& records, const std::string& tag) {
  std::vector<std::pair<int64_t, float>> points;
  for (const EventRecord& record : records) {
    for (const EventScalar& scalar : record.scalars) {
      if (scalar.tag == tag) points.emplace_back(record.step, scalar.value);
    }
  }
  return points;
}

std::vector<std::string> lines_of(const std::string& text) {
  std::vector<std::string> lines;
  std::istringstream stream(text);
  for (std::string line; std::getline(stream, line);) lines.push_back(line);
  return lines;
}

// ---- TensorboardHook

TEST(TensorboardHook, WritesStepScalarsAndEpochTables) {
  TempDir dir;
  auto model = testing::make_linear(3, 2, 5);
  auto optimizer = make_sgd(*model);
  // lr(k) = 0.1 (10 - k) / 10 for update k = 0, 1, ...: each iteration's lr differs from the next.
  auto scheduler = std::make_shared<optim::LinearWarmupLR>(*optimizer, 10);
  Engine engine(model, optimizer, cross_entropy_loss, {}, scheduler);
  // 6 samples in batches of 2: 3 iterations per epoch; 4 test samples.
  data::DataLoader train_loader(std::make_shared<testing::TinyClassificationDataset>(6), testing::batches_of(2));
  data::DataLoader test_loader(std::make_shared<testing::TinyClassificationDataset>(4), testing::batches_of(2));
  auto tensorboard = std::make_shared<TensorboardHook>((dir.path() / "tb").string());
  auto probe = std::make_shared<ProbeHook>();
  Trainer trainer(engine);
  trainer.fit(train_loader, 2, &test_loader, 1,
              {tensorboard, std::make_shared<LossHook>(), std::make_shared<AccuracyHook>(), probe});

  ASSERT_EQ(fs::path(tensorboard->event_file()).parent_path(), dir.path() / "tb");
  const std::vector<EventRecord> records = read_event_file(tensorboard->event_file());
  ASSERT_FALSE(records.empty());
  EXPECT_EQ(records.front().file_version, "brain.Event:2");

  const auto losses = series(records, "train/loss");
  const auto lrs = series(records, "train/lr");
  ASSERT_EQ(losses.size(), 6u);
  ASSERT_EQ(lrs.size(), 6u);
  ASSERT_EQ(probe->losses.size(), 6u);
  for (size_t i = 0; i < 6; ++i) {
    SCOPED_TRACE(i);
    EXPECT_EQ(losses[i].first, static_cast<int64_t>(i + 1));
    EXPECT_EQ(losses[i].second, static_cast<float>(probe->losses[i]));
    // Iteration i + 1 ran update i, with the lr the scheduler had set for step i.
    EXPECT_EQ(lrs[i].first, static_cast<int64_t>(i + 1));
    EXPECT_EQ(lrs[i].second, static_cast<float>(scheduler->get_lr(static_cast<int64_t>(i)).front()));
  }

  // Per-epoch tables at the epoch's last iteration; the train loss is renamed off the step series.
  ASSERT_EQ(probe->train_tables.size(), 2u);
  ASSERT_EQ(probe->test_tables.size(), 2u);
  const auto epoch_losses = series(records, "train/epoch_loss");
  const auto test_losses = series(records, "test/loss");
  const auto test_accuracies = series(records, "test/accuracy");
  ASSERT_EQ(epoch_losses.size(), 2u);
  ASSERT_EQ(test_losses.size(), 2u);
  ASSERT_EQ(test_accuracies.size(), 2u);
  for (size_t epoch = 0; epoch < 2; ++epoch) {
    SCOPED_TRACE(epoch);
    const auto step = static_cast<int64_t>(3 * (epoch + 1));
    EXPECT_EQ(epoch_losses[epoch], std::make_pair(step, static_cast<float>(probe->train_tables[epoch].at("loss"))));
    EXPECT_EQ(test_losses[epoch], std::make_pair(step, static_cast<float>(probe->test_tables[epoch].at("loss"))));
    EXPECT_EQ(test_accuracies[epoch],
              std::make_pair(step, static_cast<float>(probe->test_tables[epoch].at("accuracy"))));
  }
  // Every scalar is one of the series above.
  size_t scalars = 0;
  for (const EventRecord& record : records) scalars += record.scalars.size();
  EXPECT_EQ(scalars, 6u + 6u + 2u + 2u + 2u);
}

TEST(TensorboardHook, StepIntervalAndPublishedMetrics) {
  TempDir dir;
  auto model = testing::make_linear(3, 2, 7);
  Engine engine(model, make_sgd(*model), cross_entropy_loss);
  data::DataLoader train_loader(std::make_shared<testing::TinyClassificationDataset>(8), testing::batches_of(2));
  auto tensorboard = std::make_shared<TensorboardHook>(dir.path().string(), 3);
  Trainer trainer(engine);
  // LogTimingHook (priority 5) publishes before the TensorBoard hook (priority 10) writes the table.
  std::ostringstream timing_log;
  trainer.fit(train_loader, 2, nullptr, 1, {tensorboard, std::make_shared<LogTimingHook>(&timing_log)});

  const std::vector<EventRecord> records = read_event_file(tensorboard->event_file());
  // 4 iterations per epoch, 8 in all: steps 3 and 6 only.
  const auto losses = series(records, "train/loss");
  ASSERT_EQ(losses.size(), 2u);
  EXPECT_EQ(losses[0].first, 3);
  EXPECT_EQ(losses[1].first, 6);
  const auto epoch_times = series(records, "train/epoch_time_s");
  ASSERT_EQ(epoch_times.size(), 2u);
  EXPECT_EQ(epoch_times[0].first, 4);
  EXPECT_EQ(epoch_times[1].first, 8);
  EXPECT_EQ(series(records, "train/iter_time_s").size(), 2u);
}

TEST(TensorboardHook, OneFilePerFit) {
  TempDir dir;
  auto model = testing::make_linear(3, 2, 7);
  Engine engine(model, make_sgd(*model), cross_entropy_loss);
  data::DataLoader train_loader(std::make_shared<testing::TinyClassificationDataset>(4), testing::batches_of(2));
  auto tensorboard = std::make_shared<TensorboardHook>(dir.path().string(), 0);
  Trainer trainer(engine);
  trainer.fit(train_loader, 1, nullptr, 1, {tensorboard, std::make_shared<LossHook>()});
  const std::string first = tensorboard->event_file();
  trainer.fit(train_loader, 1, nullptr, 1, {tensorboard, std::make_shared<LossHook>()});
  EXPECT_NE(tensorboard->event_file(), first);
  // step_interval 0: no per-step scalars, so the epoch loss keeps the plain tag.
  for (const std::string& file : {first, tensorboard->event_file()}) {
    const std::vector<EventRecord> records = read_event_file(file);
    EXPECT_TRUE(series(records, "train/lr").empty());
    ASSERT_EQ(series(records, "train/loss").size(), 1u);
    EXPECT_EQ(series(records, "train/loss")[0].first, 2);
  }
}

TEST(TensorboardHook, RejectsBadArguments) {
  EXPECT_THROW(TensorboardHook(""), Error);
  EXPECT_THROW(TensorboardHook("logs", -1), Error);
}

// ---- LogMetricByStepHook

TEST(LogMetricByStepHook, PrintsEveryIntervalUpdatesUnderAccumulation) {
  auto model = testing::make_linear(3, 2, 11);
  auto optimizer = make_sgd(*model);
  auto scheduler = std::make_shared<optim::LinearWarmupLR>(*optimizer, 10);
  EngineOptions options;
  options.gradient_accumulation = 2;
  Engine engine(model, optimizer, cross_entropy_loss, options, scheduler);
  // 8 samples in batches of 2: 4 iterations, 2 updates per epoch; 2 epochs: 4 updates.
  data::DataLoader train_loader(std::make_shared<testing::TinyClassificationDataset>(8), testing::batches_of(2));
  std::ostringstream log;
  auto probe = std::make_shared<ProbeHook>();
  Trainer trainer(engine);
  trainer.fit(train_loader, 2, nullptr, 1, {std::make_shared<LogMetricByStepHook>(&log, 2), probe});

  ASSERT_EQ(probe->losses.size(), 8u);
  // Line k covers iterations 4k .. 4k + 3 (updates 2k + 1 and 2k + 2) and shows the lr of the
  // update it ends on, update 2k + 1 counted from 0.
  std::vector<std::string> expected;
  for (int64_t line = 0; line < 2; ++line) {
    double sum = 0.0;
    for (int64_t i = 4 * line; i < 4 * line + 4; ++i) sum += probe->losses[static_cast<size_t>(i)];
    expected.push_back(fmt::format("step {} | epoch {}/2 | loss={:.6g} lr={:.6g}", 2 * line + 2, line + 1, sum / 4.0,
                                   scheduler->get_lr(2 * line + 1).front()));
  }
  EXPECT_EQ(lines_of(log.str()), expected);
}

TEST(LogMetricByStepHook, RejectsZeroInterval) {
  EXPECT_THROW(LogMetricByStepHook(nullptr, 0), Error);
}

// ---- LogMemoryHook

TEST(LogMemoryHook, ReadsHostMemory) {
  const HostMemory memory = read_host_memory();
  if (!fs::exists("/proc/self/status")) GTEST_SKIP() << "no /proc/self/status on this system";
  ASSERT_TRUE(memory.rss_bytes.has_value());
  ASSERT_TRUE(memory.peak_rss_bytes.has_value());
  // A running test program is resident in at least a megabyte, and far below a terabyte.
  EXPECT_GT(*memory.rss_bytes, int64_t{1} << 20);
  EXPECT_LT(*memory.rss_bytes, int64_t{1} << 40);
  EXPECT_GE(*memory.peak_rss_bytes, *memory.rss_bytes);
}

TEST(LogMemoryHook, PrintsBaselineAndPublishesPerEpoch) {
  if (!fs::exists("/proc/self/status")) GTEST_SKIP() << "no /proc/self/status on this system";
  auto model = testing::make_linear(3, 2, 5);
  Engine engine(model, make_sgd(*model), cross_entropy_loss);
  data::DataLoader train_loader(std::make_shared<testing::TinyClassificationDataset>(4), testing::batches_of(2));
  std::ostringstream log;
  auto probe = std::make_shared<ProbeHook>();
  Trainer trainer(engine);
  trainer.fit(train_loader, 2, nullptr, 1, {std::make_shared<LogMemoryHook>(&log), probe});

  const std::vector<std::string> lines = lines_of(log.str());
  ASSERT_EQ(lines.size(), 3u) << log.str();
  EXPECT_EQ(lines[0].rfind("Before training | memory | host_rss=", 0), 0u) << lines[0];
  EXPECT_EQ(lines[1].rfind("Epoch 1/2 | memory | host_rss=", 0), 0u) << lines[1];
  EXPECT_EQ(lines[2].rfind("Epoch 2/2 | memory | host_rss=", 0), 0u) << lines[2];
  EXPECT_NE(lines[1].find(" host_peak_rss="), std::string::npos) << lines[1];
  ASSERT_EQ(probe->train_tables.size(), 2u);
  for (const MetricTable& table : probe->train_tables) {
    ASSERT_TRUE(table.contains("host_rss_mib"));
    ASSERT_TRUE(table.contains("host_peak_rss_mib"));
    EXPECT_GT(table.at("host_rss_mib"), 1.0);
    EXPECT_GE(table.at("host_peak_rss_mib"), table.at("host_rss_mib"));
  }
}

// ---- LogTimingHook

TEST(LogTimingHook, PublishesAndPrintsPassTimes) {
  auto model = testing::make_linear(3, 2, 5);
  Engine engine(model, make_sgd(*model), cross_entropy_loss);
  data::DataLoader train_loader(std::make_shared<testing::TinyClassificationDataset>(6), testing::batches_of(2));
  data::DataLoader test_loader(std::make_shared<testing::TinyClassificationDataset>(4), testing::batches_of(2));
  std::ostringstream timing_log, epoch_log;
  auto probe = std::make_shared<ProbeHook>();
  constexpr auto kSleep = std::chrono::milliseconds(5);
  Trainer trainer(engine);
  trainer.fit(train_loader, 2, &test_loader, 2,
              {std::make_shared<LogMetricByEpochHook>(&epoch_log), std::make_shared<LogTimingHook>(&timing_log),
               std::make_shared<SleepHook>(kSleep), probe});

  // Each iteration sleeps kSleep inside the timed window, so the times are at least that.
  const double sleep_s = std::chrono::duration<double>(kSleep).count();
  ASSERT_EQ(probe->train_tables.size(), 2u);
  ASSERT_EQ(probe->test_tables.size(), 1u);  // test_interval 2 over 2 epochs: epoch 0 only
  for (const MetricTable& table : probe->train_tables) {
    ASSERT_TRUE(table.contains("epoch_time_s"));
    ASSERT_TRUE(table.contains("iter_time_s"));
    EXPECT_GE(table.at("iter_time_s"), sleep_s);
    EXPECT_DOUBLE_EQ(table.at("iter_time_s") * 3.0, table.at("epoch_time_s"));
  }
  EXPECT_GE(probe->test_tables[0].at("iter_time_s"), sleep_s);
  EXPECT_DOUBLE_EQ(probe->test_tables[0].at("iter_time_s") * 2.0, probe->test_tables[0].at("epoch_time_s"));

  const std::vector<std::string> lines = lines_of(timing_log.str());
  ASSERT_EQ(lines.size(), 4u) << timing_log.str();
  EXPECT_EQ(lines[0],
            fmt::format("Epoch 1/2 | train | time {:.3f}s, {:.2f}ms/iter over 3 iters",
                        probe->train_tables[0].at("epoch_time_s"), 1e3 * probe->train_tables[0].at("iter_time_s")));
  EXPECT_EQ(lines[1].rfind("Epoch 1/2 | test | time ", 0), 0u) << lines[1];
  EXPECT_NE(lines[1].find("over 2 iters"), std::string::npos) << lines[1];
  EXPECT_EQ(lines[2].rfind("Epoch 2/2 | train | time ", 0), 0u) << lines[2];
  EXPECT_EQ(lines[3].rfind("Training took ", 0), 0u) << lines[3];
  // Published before LogMetricByEpochHook (priority 10) prints its line.
  EXPECT_NE(epoch_log.str().find("epoch_time_s="), std::string::npos) << epoch_log.str();
}

}  // namespace
}  // namespace colossal::engine
