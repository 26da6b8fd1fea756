// train_mlp: a two-layer MLP trained with plain SGD on labels from a fixed random teacher MLP.
// Two Philox streams keep runs comparable: the task stream (teacher, held-out set) depends only on
// the seed, so changing --hidden or --steps changes the student, never the problem it learns.
#include "colossal/cli/train_mlp.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <vector>

#include "colossal/autograd/engine.h"     // backward
#include "colossal/autograd/grad_mode.h"  // NoGradGuard
#include "colossal/core/error.h"          // COLOSSAL_CHECK
#include "colossal/core/random.h"         // Generator, randn, uniform_
#include "colossal/ops/elementwise.h"     // relu, add_
#include "colossal/ops/linalg.h"          // linear
#include "colossal/ops/nn_functional.h"   // cross_entropy
#include "colossal/ops/reduction.h"       // argmax

namespace colossal::cli {
namespace {

// Keeps the training stream of seed s away from the task stream of seed s + 1.
constexpr uint64_t kRunStreamSalt = 0x9E3779B97F4A7C15ull;

struct Linear {
  Tensor weight;  ///< [out, in]
  Tensor bias;    ///< [out]
  Tensor operator()(const Tensor& x) const { return ops::linear(x, weight, bias); }
};

/// PyTorch's nn.Linear initialisation: weight and bias uniform in +-1/sqrt(in).
Linear make_linear(int64_t in, int64_t out, core::Generator& gen, bool requires_grad) {
  const double bound = 1.0 / std::sqrt(static_cast<double>(in));
  Linear layer{core::empty({out, in}), core::empty({out})};
  core::uniform_(layer.weight, -bound, bound, &gen);
  core::uniform_(layer.bias, -bound, bound, &gen);
  layer.weight.set_requires_grad(requires_grad);
  layer.bias.set_requires_grad(requires_grad);
  return layer;
}

struct Mlp {
  Linear fc1, fc2;
  Tensor operator()(const Tensor& x) const { return fc2(ops::relu(fc1(x))); }
};

struct Batch {
  Tensor x;       ///< [n, input_dim] f32
  Tensor labels;  ///< [n] i64
};

Batch sample(const Mlp& teacher, int64_t n, int64_t input_dim, core::Generator& gen) {
  autograd::NoGradGuard no_grad;
  Tensor x = core::randn({n, input_dim}, {}, &gen);
  return {x, ops::argmax(teacher(x), 1)};
}

void check_config(const MlpTrainConfig& c) {
  COLOSSAL_CHECK(c.steps > 0, "train: --steps must be at least 1, got {}", c.steps);
  COLOSSAL_CHECK(c.batch_size > 0, "train: --batch-size must be at least 1, got {}", c.batch_size);
  COLOSSAL_CHECK(c.hidden > 0, "train: --hidden must be at least 1, got {}", c.hidden);
  COLOSSAL_CHECK(c.lr > 0 && std::isfinite(c.lr), "train: --lr must be a positive finite number, got {}", c.lr);
  COLOSSAL_CHECK(c.log_every >= 0, "train: --log-every must be 0 (never) or positive, got {}", c.log_every);
  COLOSSAL_CHECK(c.input_dim > 0, "train: input_dim must be at least 1, got {}", c.input_dim);
  COLOSSAL_CHECK(c.num_classes >= 2, "train: num_classes must be at least 2, got {}", c.num_classes);
  COLOSSAL_CHECK(c.eval_size > 0, "train: eval_size must be at least 1, got {}", c.eval_size);
}

}  // namespace

MlpTrainResult train_mlp(const MlpTrainConfig& config, const StepLogger& log) {
  check_config(config);
  core::Generator task_gen(config.seed);
  core::Generator run_gen(config.seed + kRunStreamSalt);

  // Nonlinear, so no linear classifier matches it, and small enough for the student to learn.
  const int64_t teacher_hidden = 32;
  const Mlp teacher{make_linear(config.input_dim, teacher_hidden, task_gen, false),
                    make_linear(teacher_hidden, config.num_classes, task_gen, false)};
  const Batch eval = sample(teacher, config.eval_size, config.input_dim, task_gen);

  Mlp student{make_linear(config.input_dim, config.hidden, run_gen, true),
              make_linear(config.hidden, config.num_classes, run_gen, true)};
  std::vector<Tensor> params{student.fc1.weight, student.fc1.bias, student.fc2.weight, student.fc2.bias};

  MlpTrainResult result;
  const auto start = std::chrono::steady_clock::now();
  for (int64_t step = 1; step <= config.steps; ++step) {
    const Batch batch = sample(teacher, config.batch_size, config.input_dim, run_gen);
    Tensor loss = ops::cross_entropy(student(batch.x), batch.labels);
    autograd::backward(loss);
    {
      autograd::NoGradGuard no_grad;
      for (Tensor& p : params) {
        ops::add_(p, p.grad(), -config.lr);
        p.set_grad(Tensor());
      }
    }
    // Reading the loss is the only host sync in the step, so it happens only when someone looks.
    const bool logged = config.log_every > 0 && (step % config.log_every == 0 || step == 1);
    if (step == 1 || step == config.steps || logged) {
      const double value = loss.item<double>();
      if (step == 1) result.first_loss = value;
      if (step == config.steps) result.final_loss = value;
      if (log && (logged || step == config.steps)) log(step, value);
    }
  }
  result.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();

  autograd::NoGradGuard no_grad;
  const Tensor logits = student(eval.x);
  result.eval_loss = ops::cross_entropy(logits, eval.labels).item<double>();
  const std::vector<int64_t> predicted = ops::argmax(logits, 1).to_vector<int64_t>();
  const std::vector<int64_t> labels = eval.labels.to_vector<int64_t>();
  std::vector<int64_t> class_counts(config.num_classes, 0);
  int64_t correct = 0;
  for (size_t i = 0; i < labels.size(); ++i) {
    correct += predicted[i] == labels[i];
    ++class_counts[labels[i]];
  }
  const auto n = static_cast<double>(labels.size());
  result.eval_accuracy = correct / n;
  result.majority_accuracy = *std::max_element(class_counts.begin(), class_counts.end()) / n;
  return result;
}

}  // namespace colossal::cli
