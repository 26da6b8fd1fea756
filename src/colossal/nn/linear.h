// Affine layers: Linear (PyTorch/timm layout, weight [out, in]) and Conv1D (Hugging Face GPT-2's
// layout, weight [in, out], y = x W + b), so checkpoints of either family load without transposes.
#pragma once

#include "colossal/core/random.h"
#include "colossal/nn/module.h"

namespace colossal::nn {

/// y = x W^T + b over the last dimension of x. Initialised as PyTorch's: weight
/// kaiming_uniform_(a = sqrt(5)) (U(-1/sqrt(in), 1/sqrt(in))), bias U(-1/sqrt(in), 1/sqrt(in)).
class Linear : public Module {
 public:
  Linear(int64_t in_features, int64_t out_features, bool bias = true, core::Generator* generator = nullptr);
  Tensor forward(const Tensor& x) override;
  std::string extra_repr() const override;

  const Tensor& weight() const { return *weight_; }  ///< [out_features, in_features]
  const Tensor& bias() const { return *bias_; }      ///< [out_features], undefined without bias
  int64_t in_features() const { return in_features_; }
  int64_t out_features() const { return out_features_; }

 private:
  int64_t in_features_;
  int64_t out_features_;
  Tensor* weight_;
  Tensor* bias_;
};

/// Hugging Face's transformers.pytorch_utils.Conv1D (GPT-2's c_attn, c_proj, c_fc): y = x W + b
/// with weight [in_features, out_features]. Initialised as Hugging Face's: weight N(0, 0.02), bias 0.
class Conv1D : public Module {
 public:
  Conv1D(int64_t in_features, int64_t out_features, core::Generator* generator = nullptr);
  Tensor forward(const Tensor& x) override;
  std::string extra_repr() const override;

  const Tensor& weight() const { return *weight_; }  ///< [in_features, out_features]
  const Tensor& bias() const { return *bias_; }      ///< [out_features]
  int64_t in_features() const { return in_features_; }
  int64_t out_features() const { return out_features_; }

 private:
  int64_t in_features_;
  int64_t out_features_;
  Tensor* weight_;
  Tensor* bias_;
};

}  // namespace colossal::nn
