// train_mlp: the smallest real training run, a two-layer MLP learning a synthetic classification
// task with plain SGD on the CPU. `colossal train` runs it until the config-driven trainer
// (engine/, config/) replaces it; tests/cli checks that it learns.
#pragma once

#include <cstdint>
#include <functional>

namespace colossal::cli {

struct MlpTrainConfig {
  int64_t steps = 2000;      ///< SGD steps, each on a fresh batch
  int64_t batch_size = 128;  ///< examples per step
  double lr = 0.1;           ///< SGD learning rate
  int64_t hidden = 64;       ///< width of the student's hidden layer
  uint64_t seed = 0;         ///< seeds the teacher, the data streams and the student's initialisation
  int64_t log_every = 200;   ///< log step 1, every this many steps and the last (0: only the last)
  int64_t input_dim = 16;    ///< features per example
  int64_t num_classes = 4;   ///< classes the teacher assigns
  int64_t eval_size = 4096;  ///< held-out examples for the final accuracy
};

struct MlpTrainResult {
  double first_loss = 0;  ///< training loss of the first batch, before any update
  double final_loss = 0;  ///< training loss of the last batch
  double eval_loss = 0;   ///< mean cross-entropy on the held-out set after training
  double eval_accuracy = 0;
  /// Accuracy of always answering the held-out set's most frequent class: the bar to clear.
  double majority_accuracy = 0;
  double seconds = 0;  ///< wall time of the training loop
};

/// Called on the steps MlpTrainConfig::log_every picks with the 1-based step and its batch's loss.
using StepLogger = std::function<void(int64_t step, double loss)>;

/// Trains a student MLP (linear, relu, linear; cross-entropy) on labels from a fixed random teacher
/// MLP: x ~ N(0, I), label = argmax(teacher(x)). Throws colossal::Error on an invalid config.
MlpTrainResult train_mlp(const MlpTrainConfig& config, const StepLogger& log = {});

}  // namespace colossal::cli
