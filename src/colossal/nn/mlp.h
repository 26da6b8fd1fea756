// MLP: the transformer feed-forward block fc1 -> activation -> dropout -> fc2 -> dropout, under
// timm's names (fc1, act, drop1, fc2, drop2) so ViT checkpoints load as they are.
#pragma once

#include <memory>

#include "colossal/core/random.h"
#include "colossal/nn/activation.h"
#include "colossal/nn/dropout.h"
#include "colossal/nn/linear.h"

namespace colossal::nn {

struct MLPOptions {
  /// Output width; 0 means in_features (a residual branch).
  int64_t out_features = 0;
  /// GELU form: none (exact, timm) or tanh (GPT-2's gelu_new).
  ops::GeluApproximation activation = ops::GeluApproximation::none;
  /// Dropout probability after the activation and after fc2 (timm's drop / proj_drop).
  double dropout = 0.0;
  bool bias = true;
  /// Drives both dropouts; nullptr means core::default_generator(). Must outlive the module.
  core::Generator* dropout_generator = nullptr;
};

class MLP : public Module {
 public:
  /// generator initialises fc1 and fc2 (PyTorch's Linear default).
  MLP(int64_t in_features, int64_t hidden_features, const MLPOptions& options = {},
      core::Generator* generator = nullptr);
  /// x [..., in_features] -> [..., out_features].
  Tensor forward(const Tensor& x) override;

  const std::shared_ptr<Linear>& fc1() const { return fc1_; }
  const std::shared_ptr<Linear>& fc2() const { return fc2_; }

 private:
  std::shared_ptr<Linear> fc1_;
  std::shared_ptr<GELU> act_;
  std::shared_ptr<Dropout> drop1_;
  std::shared_ptr<Linear> fc2_;
  std::shared_ptr<Dropout> drop2_;
};

}  // namespace colossal::nn
