// Tests of the built-in training job (cli/train_mlp.h): it learns its synthetic task, the same seed
// gives the same bits, and a bad config is rejected with a message naming the flag.
#include "colossal/cli/train_mlp.h"

#include <gtest/gtest.h>

#include <vector>

#include "gradcheck.h"  // EXPECT_ERROR_CONTAINS

namespace colossal::cli {
namespace {

MlpTrainConfig small_config() {
  MlpTrainConfig config;
  config.steps = 400;
  config.batch_size = 64;
  config.hidden = 64;
  config.eval_size = 1024;
  config.log_every = 0;
  return config;
}

TEST(TrainMlp, learns_the_teacher) {
  const MlpTrainResult result = train_mlp(small_config());
  // The student starts near uniform over 4 classes, loss ~ ln 4 = 1.39; a run that learns at all
  // ends far below it. Halving is a loose bar that does not depend on a lucky batch.
  EXPECT_GT(result.first_loss, 1.0);
  EXPECT_LT(result.final_loss, 0.5 * result.first_loss);
  EXPECT_LT(result.eval_loss, 0.5 * result.first_loss);
  // Guessing the most frequent class is what a model that learned nothing about x can do.
  // This run reaches about 85% (majority class: 49%); the bars leave ten points for kernels that
  // sum in another order, which changes the bits of a run but not whether it learns.
  EXPECT_GT(result.eval_accuracy, result.majority_accuracy + 0.2);
  EXPECT_GT(result.eval_accuracy, 0.75);
}

TEST(TrainMlp, same_seed_same_bits) {
  const MlpTrainResult a = train_mlp(small_config());
  const MlpTrainResult b = train_mlp(small_config());
  EXPECT_EQ(a.final_loss, b.final_loss);
  EXPECT_EQ(a.eval_loss, b.eval_loss);
  EXPECT_EQ(a.eval_accuracy, b.eval_accuracy);

  MlpTrainConfig other = small_config();
  other.seed = 1;
  EXPECT_NE(train_mlp(other).eval_loss, a.eval_loss);
}

TEST(TrainMlp, logs_every_n_steps_and_the_last) {
  MlpTrainConfig config = small_config();
  config.steps = 25;
  config.log_every = 10;
  std::vector<int64_t> logged_steps;
  std::vector<double> logged_losses;
  const MlpTrainResult result = train_mlp(config, [&](int64_t step, double loss) {
    logged_steps.push_back(step);
    logged_losses.push_back(loss);
  });
  EXPECT_EQ(logged_steps, (std::vector<int64_t>{1, 10, 20, 25}));
  EXPECT_EQ(logged_losses.front(), result.first_loss);
  EXPECT_EQ(logged_losses.back(), result.final_loss);
}

TEST(TrainMlp, rejects_bad_config) {
  MlpTrainConfig config = small_config();
  config.steps = 0;
  EXPECT_ERROR_CONTAINS(train_mlp(config), "--steps must be at least 1, got 0");
  config = small_config();
  config.lr = -0.5;
  EXPECT_ERROR_CONTAINS(train_mlp(config), "--lr must be a positive finite number, got -0.5");
  config = small_config();
  config.batch_size = -3;
  EXPECT_ERROR_CONTAINS(train_mlp(config), "--batch-size must be at least 1, got -3");
}

}  // namespace
}  // namespace colossal::cli
