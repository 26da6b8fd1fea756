// NonFiniteLossHook: NaN weights (as from a bad checkpoint) and a NaN batch stop the run naming the
// first bad step and epoch, before anything is checkpointed; the losses are read only at the check
// points; under fp16 loss scaling an overflow the scaler skipped goes on, while a NaN loss on an
// update that was applied, or a long streak of skipped ones, stops.
#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>
#include <limits>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "colossal/amp/mixed_precision_optimizer.h"
#include "colossal/core/error.h"
#include "colossal/data/data_loader.h"
#include "colossal/engine/checkpoint.h"
#include "colossal/engine/engine.h"
#include "colossal/engine/hooks.h"
#include "colossal/engine/trainer.h"
#include "colossal/ops/elementwise.h"    // add
#include "colossal/ops/nn_functional.h"  // cross_entropy
#include "colossal/optim/sgd.h"
#include "engine_test_util.h"

namespace colossal::engine {
namespace {

namespace fs = std::filesystem;

/// TinyClassificationDataset with sample `odd_index` replaced by `odd_value` in every feature.
class OddSampleDataset : public data::Dataset {
 public:
  OddSampleDataset(int64_t size, int64_t odd_index, double odd_value)
      : base_(size), odd_index_(odd_index), odd_value_(odd_value) {}
  int64_t size() const override { return base_.size(); }
  data::Example get(int64_t index) const override {
    data::Example example = base_.get(index);
    if (index == odd_index_) example.input = core::full({3}, odd_value_, DType::f64);
    return example;
  }

 private:
  testing::TinyClassificationDataset base_;
  int64_t odd_index_;
  double odd_value_;
};

/// A Linear(3, 2) classifier trained by SGD over `dataset` in batches of 2, in f64 or under `amp`.
struct SmallRun {
  core::Generator init{3};
  std::shared_ptr<nn::Linear> model = std::make_shared<nn::Linear>(3, 2, true, &init);
  std::unique_ptr<Engine> engine;
  std::unique_ptr<data::DataLoader> loader;

  explicit SmallRun(std::shared_ptr<data::Dataset> dataset, std::optional<amp::AmpMode> amp_mode = std::nullopt,
                    int64_t accumulation = 1, Criterion criterion = nullptr) {
    if (!amp_mode) model->to(DType::f64);  // mixed precision starts from f32
    optim::SgdOptions sgd;
    sgd.lr = 0.1;
    EngineOptions options;
    options.gradient_accumulation = accumulation;
    if (amp_mode) {
      options.amp = amp::AmpOptions::for_mode(*amp_mode);
      // A scale of 1 keeps this model's gradients far from fp16's range: only a forward overflow skips.
      options.amp->scaler.initial_scale = 1.0;
    }
    if (!criterion) criterion = [](const Tensor& out, const Tensor& target) { return ops::cross_entropy(out, target); };
    engine =
        std::make_unique<Engine>(model, std::make_shared<optim::Sgd>(model->parameters(), sgd), criterion, options);
    loader = std::make_unique<data::DataLoader>(std::move(dataset), testing::batches_of(2));
  }
};

/// After each iteration, how many losses the guard holds unread and whether the update was skipped.
class Observer : public Hook {
 public:
  explicit Observer(const NonFiniteLossHook& guard) : Hook(60), guard_(guard) {}
  void after_train_iter(Trainer& trainer, const Tensor&, const Tensor&, const Tensor&) override {
    unchecked.push_back(guard_.unchecked());
    if (trainer.engine().last_step_updated() && trainer.engine().last_step_skipped()) ++skipped;
  }
  void after_train(Trainer&) override { finished = true; }
  std::vector<int64_t> unchecked;
  int64_t skipped = 0;
  bool finished = false;

 private:
  const NonFiniteLossHook& guard_;
};

template <class Fn>
std::string error_of(Fn&& fn) {
  try {
    fn();
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

fs::path fresh_dir(const std::string& name) {
  const fs::path dir = fs::temp_directory_path() / ("colossal_non_finite_loss_test_" + name + "_" +
                                                    std::to_string(::testing::UnitTest::GetInstance()->random_seed()));
  fs::remove_all(dir);
  return dir;
}

// Weights that are NaN from the start (a checkpoint saved after divergence, say): the first save,
// after the first update, asks the guard, which names step 1 of epoch 1; nothing is written.
TEST(NonFiniteLossHook, NanWeightsStopBeforeTheFirstCheckpoint) {
  SmallRun run(std::make_shared<testing::TinyClassificationDataset>(8));
  run.model->weight().detach().fill_(std::nan(""));
  const fs::path dir = fresh_dir("nan_weights");
  auto guard = std::make_shared<NonFiniteLossHook>();  // no check interval: only the save asks
  auto observer = std::make_shared<Observer>(*guard);
  Trainer trainer(*run.engine);
  const std::string message = error_of([&] {
    trainer.fit(
        *run.loader, 2, nullptr, 1,
        {std::make_shared<SaveCheckpointHook>(dir, NamedGenerators{}, 1, /*step_interval=*/1), guard, observer});
  });
  EXPECT_NE(message.find("the training loss became NaN at step 1 (epoch 1/2)"), std::string::npos) << message;
  EXPECT_NE(message.find("lower the learning rate"), std::string::npos) << message;
  EXPECT_NE(message.find("clip_grad_norm"), std::string::npos) << message;
  EXPECT_NE(message.find("model.weights"), std::string::npos) << message;
  EXPECT_FALSE(observer->finished);
  EXPECT_TRUE(!fs::exists(dir) || fs::is_empty(dir)) << "a NaN state was checkpointed";
  fs::remove_all(dir);
}

// A NaN batch at iteration 6 (epoch 2 of 3): with a check every 4 iterations the run stops
// at the check after it (iteration 8), naming iteration 6, and in between the losses stay unread on
// their device (the count of unread losses only grows between checks).
TEST(NonFiniteLossHook, NamesTheFirstBadStepAndReadsOnlyAtTheCheckPoints) {
  // Sample 2 turns NaN from its second visit on: iteration 2 of epoch 1 is finite, iteration 6
  // (the same batch in epoch 2) is the first NaN one, and the update spreads it to every later step.
  class LateNanDataset : public data::Dataset {
   public:
    int64_t size() const override { return 8; }
    data::Example get(int64_t index) const override {
      data::Example example = base_.get(index);
      if (index == 2 && ++visits_ > 1) example.input = core::full({3}, std::nan(""), DType::f64);
      return example;
    }

   private:
    testing::TinyClassificationDataset base_{8};
    mutable int visits_ = 0;
  };
  SmallRun late(std::make_shared<LateNanDataset>());
  auto guard = std::make_shared<NonFiniteLossHook>(/*check_interval=*/4);
  auto observer = std::make_shared<Observer>(*guard);
  Trainer trainer(*late.engine);
  const std::string message = error_of([&] { trainer.fit(*late.loader, 3, nullptr, 1, {guard, observer}); });
  EXPECT_NE(message.find("became NaN at step 6 (epoch 2/3)"), std::string::npos) << message;
  EXPECT_EQ(trainer.cur_step(), 7) << "stopped at the check of iteration 8, not later";
  EXPECT_EQ(observer->unchecked, (std::vector<int64_t>{1, 2, 3, 0, 1, 2, 3}));
}

// fp16 loss scaling: an input beyond fp16's range overflows one step, whose update the scaler
// skips; that is normal and the run goes on (here with accumulation, so the loss of the window's
// first micro-step waits for the window's outcome).
TEST(NonFiniteLossHook, SkippedOverflowUnderLossScalingGoesOn) {
  SmallRun run(std::make_shared<OddSampleDataset>(8, 2, 1e6), amp::AmpMode::naive, /*accumulation=*/2);
  auto guard = std::make_shared<NonFiniteLossHook>(/*check_interval=*/1);
  auto observer = std::make_shared<Observer>(*guard);
  Trainer trainer(*run.engine);
  EXPECT_EQ(error_of([&] { trainer.fit(*run.loader, 2, nullptr, 1, {guard, observer}); }), "");
  EXPECT_TRUE(observer->finished);
  EXPECT_EQ(observer->skipped, 2) << "the overflowing window of each epoch was skipped";
}

// NaN weights under fp16: every update is skipped, and the scale cannot help a loss computed
// before scaling; max_skipped_in_a_row such iterations stop the run.
TEST(NonFiniteLossHook, LongStreakOfSkippedNonFiniteLossesStops) {
  SmallRun run(std::make_shared<testing::TinyClassificationDataset>(8), amp::AmpMode::naive);
  run.model->weight().detach().fill_(std::nan(""));  // the fp16 copy the forward uses; no update ever lands
  auto guard = std::make_shared<NonFiniteLossHook>(0, /*max_skipped_in_a_row=*/3);
  Trainer trainer(*run.engine);
  const std::string message = error_of([&] { trainer.fit(*run.loader, 2, nullptr, 1, {guard}); });
  EXPECT_NE(message.find("on 3 iterations in a row"), std::string::npos) << message;
  EXPECT_NE(message.find("the last at step 3 (epoch 1/2)"), std::string::npos) << message;
}

// Under fp16, a NaN loss whose gradients are finite (here a NaN constant added to the loss) is
// not skipped by the scaler: the update goes through, and the run stops.
TEST(NonFiniteLossHook, NonFiniteLossOnAnAppliedUpdateStopsUnderLossScaling) {
  const Tensor nan = core::scalar_tensor(std::nan(""), DType::f32);
  SmallRun run(
      std::make_shared<testing::TinyClassificationDataset>(8), amp::AmpMode::naive, 1,
      [nan](const Tensor& out, const Tensor& target) { return ops::add(ops::cross_entropy(out, target), nan); });
  auto guard = std::make_shared<NonFiniteLossHook>(2);
  Trainer trainer(*run.engine);
  const std::string message = error_of([&] { trainer.fit(*run.loader, 1, nullptr, 1, {guard}); });
  EXPECT_NE(message.find("became NaN at step 1 (epoch 1/1) on an update the fp16 loss scaler did not skip"),
            std::string::npos)
      << message;
}

TEST(NonFiniteLossHook, RejectsBadArguments) {
  EXPECT_THROW(NonFiniteLossHook(-1), Error);
  EXPECT_THROW(NonFiniteLossHook(0, 0), Error);
}

}  // namespace
}  // namespace colossal::engine
