// Pointwise modules with no parameters: GELU (exact or GPT-2's tanh form), ReLU, and Identity
// (the placeholder timm puts where an optional layer is switched off).
#pragma once

#include "colossal/nn/module.h"
#include "colossal/ops/elementwise.h"  // GeluApproximation

namespace colossal::nn {

class GELU : public Module {
 public:
  explicit GELU(ops::GeluApproximation approximation = ops::GeluApproximation::none)
      : Module("GELU"), approximation_(approximation) {}
  Tensor forward(const Tensor& x) override { return ops::gelu(x, approximation_); }
  std::string extra_repr() const override {
    return approximation_ == ops::GeluApproximation::tanh ? "approximate='tanh'" : "approximate='none'";
  }
  ops::GeluApproximation approximation() const { return approximation_; }

 private:
  ops::GeluApproximation approximation_;
};

class ReLU : public Module {
 public:
  ReLU() : Module("ReLU") {}
  Tensor forward(const Tensor& x) override { return ops::relu(x); }
};

class Identity : public Module {
 public:
  Identity() : Module("Identity") {}
  Tensor forward(const Tensor& x) override { return x; }
};

}  // namespace colossal::nn
