// Helpers of the golden model tests: open a reference file from tests/data/golden, pick the
// tensors under one prefix ("param.", "grad.", "step3.") as a state dict, and the relative error by
// norm that the tests' tolerances are stated in.
#pragma once

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <functional>
#include <string>
#include <string_view>

#include "colossal/nn/module.h"
#include "colossal/nn/safetensors.h"
#include "colossal/optim/adam.h"

namespace colossal::testing {

inline nn::SafetensorsFile load_golden(const std::string& file_name) {
  return nn::load_safetensors(std::string(COLOSSAL_TEST_DATA_DIR) + "/golden/" + file_name);
}

/// The tensors named "<prefix><name>", under <name>, cast to dtype.
inline nn::StateDict with_prefix(const nn::StateDict& tensors, std::string_view prefix, DType dtype) {
  nn::StateDict out;
  for (const auto& [name, tensor] : tensors) {
    if (name.starts_with(prefix)) out.insert(name.substr(prefix.size()), tensor.to(dtype));
  }
  return out;
}

/// The keys of a state dict, sorted (files list them alphabetically, modules in registration order).
inline std::vector<std::string> sorted_keys(const nn::StateDict& state) {
  std::vector<std::string> keys = state.keys();
  std::sort(keys.begin(), keys.end());
  return keys;
}

/// ||actual - expected|| / ||expected|| over all elements, in f64; infinite on a shape mismatch.
inline double relative_error(const Tensor& actual, const Tensor& expected) {
  if (!actual.defined() || actual.shape() != expected.shape()) return INFINITY;
  const std::vector<double> a = actual.to_vector<double>(), e = expected.to_vector<double>();
  double diff = 0.0, norm = 0.0;
  for (size_t i = 0; i < a.size(); ++i) {
    diff += (a[i] - e[i]) * (a[i] - e[i]);
    norm += e[i] * e[i];
  }
  return std::sqrt(diff) / std::sqrt(norm);
}

/// Tracks the largest relative error of a group of comparisons (printed by the test so that a
/// tolerance's margin stays visible) and EXPECTs each under tolerance.
class ErrorTracker {
 public:
  ErrorTracker(std::string what, double tolerance) : what_(std::move(what)), tolerance_(tolerance) {}
  ~ErrorTracker() {
    std::printf("[ golden ] %-40s max relative error %.3e (tolerance %.0e, worst: %s)\n", what_.c_str(), max_,
                tolerance_, worst_.c_str());
  }
  void check(const Tensor& actual, const Tensor& expected, const std::string& name) {
    const double error = relative_error(actual, expected);
    EXPECT_LE(error, tolerance_) << what_ << ": " << name << " (actual shape "
                                 << (actual.defined() ? fmt::format("{}", actual.shape()) : "undefined")
                                 << ", expected " << fmt::format("{}", expected.shape()) << ")";
    if (!(error <= max_)) {
      max_ = error;
      worst_ = name;
    }
  }

 private:
  std::string what_;
  double tolerance_;
  double max_ = 0.0;
  std::string worst_ = "-";
};

/// The f64 check both golden files share: `loss_of(model)` (forward on the file's inputs) against
/// output.logits/output.loss through `logits_of`, every parameter's gradient against grad.<name>,
/// then the README's optimiser (torch.optim.AdamW, lr 1e-3, betas (0.9, 0.999), eps 1e-8, weight
/// decay 0.1 on every parameter) for three steps on the same batch against output.losses_steps_0_1_2
/// and step3.<name>. `label` names the model in the printed error lines.
inline void check_golden_f64_training(nn::Module& model, const nn::SafetensorsFile& golden, const std::string& label,
                                      const std::function<Tensor(nn::Module&)>& logits_of,
                                      const std::function<Tensor(const Tensor&)>& loss_of, double tolerance) {
  const Tensor logits = logits_of(model);
  Tensor loss = loss_of(logits);
  {
    ErrorTracker forward(label + " f64 logits, loss", tolerance);
    forward.check(logits, golden.tensors.at("output.logits"), "logits");
    forward.check(loss.reshape({1}), golden.tensors.at("output.loss"), "loss");
  }
  autograd::backward(loss);
  {
    ErrorTracker backward(label + " f64 gradients", tolerance);
    const nn::StateDict expected = with_prefix(golden.tensors, "grad.", DType::f64);
    const auto params = model.named_parameters();
    EXPECT_EQ(params.size(), expected.size());
    for (const auto& [name, param] : params) backward.check(param.grad(), expected.at(name), name);
  }
  ASSERT_NE(golden.metadata.at("adamw").find("\"weight_decay\": 0.1"), std::string::npos);
  optim::AdamW optimizer(
      model.parameters(),
      optim::AdamOptions{.lr = 1e-3, .beta1 = 0.9, .beta2 = 0.999, .eps = 1e-8, .weight_decay = 0.1});
  std::vector<double> losses{loss.item<double>()};
  optimizer.step();
  for (int step = 1; step < 3; ++step) {
    optimizer.zero_grad();
    loss = loss_of(logits_of(model));
    losses.push_back(loss.item<double>());
    autograd::backward(loss);
    optimizer.step();
  }
  ErrorTracker training(label + " f64 AdamW losses, step-3 params", tolerance);
  training.check(core::from_vector(losses, {3}), golden.tensors.at("output.losses_steps_0_1_2"), "losses_steps_0_1_2");
  const nn::StateDict expected = with_prefix(golden.tensors, "step3.", DType::f64);
  EXPECT_EQ(sorted_keys(model.state_dict()), sorted_keys(expected));
  for (const auto& [name, param] : model.named_parameters()) training.check(param, expected.at(name), name);
}

}  // namespace colossal::testing
