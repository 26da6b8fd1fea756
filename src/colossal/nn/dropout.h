// Regularisation by random dropping, active only in training mode: Dropout (elements) and
// DropPath (stochastic depth: whole samples of a residual branch, as timm's drop_path).
#pragma once

#include "colossal/core/random.h"
#include "colossal/nn/module.h"

namespace colossal::nn {

/// ops::dropout with this module's training flag: zeroes elements with probability p and scales
/// the rest by 1 / (1 - p); the identity in evaluation or with p = 0. The generator (nullptr =
/// the default one) must outlive the module; tensor-parallel training passes a per-mode one.
class Dropout : public Module {
 public:
  explicit Dropout(double p = 0.5, core::Generator* generator = nullptr);
  Tensor forward(const Tensor& x) override;
  /// residual + forward(x) in one pass (ops::dropout_add): the same mask forward(x) would draw.
  Tensor forward_add(const Tensor& x, const Tensor& residual);
  std::string extra_repr() const override;
  double p() const { return p_; }

 private:
  double p_;
  core::Generator* generator_;
};

/// Stochastic depth (timm's DropPath): in training each sample of the batch (dimension 0) is
/// zeroed with probability p and the survivors scaled by 1 / (1 - p), through a keep mask of shape
/// [B, 1, 1, ...] drawn from the generator; the identity in evaluation or with p = 0. Applied to a
/// residual branch, it drops the whole block for that sample.
class DropPath : public Module {
 public:
  explicit DropPath(double p = 0.0, core::Generator* generator = nullptr);
  Tensor forward(const Tensor& x) override;
  std::string extra_repr() const override;
  double p() const { return p_; }

 private:
  double p_;
  core::Generator* generator_;
};

}  // namespace colossal::nn
