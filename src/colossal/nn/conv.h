// Conv2d: 2-D convolution over NCHW images with PyTorch's parameters (weight [out, in / groups,
// kH, kW], bias [out]) and initialisation; ViT's patch embedding and ResNet build on it.
#pragma once

#include "colossal/core/random.h"
#include "colossal/nn/module.h"
#include "colossal/ops/conv.h"  // Pair

namespace colossal::nn {

struct Conv2dOptions {
  ops::Pair stride{1, 1};
  ops::Pair padding{0, 0};  ///< zeros added on each side
  ops::Pair dilation{1, 1};
  int64_t groups = 1;  ///< in_channels and out_channels must both be divisible by it
  bool bias = true;
  /// The layout of x and the output (Note [image layouts] in ops/conv.h); the weight is
  /// [out, in / groups, kH, kW] in both.
  ops::ImageLayout layout = ops::ImageLayout::nchw;
};

class Conv2d : public Module {
 public:
  /// Initialised as PyTorch's: weight kaiming_uniform_(a = sqrt(5)), bias U(-1/sqrt(fan_in),
  /// 1/sqrt(fan_in)) with fan_in = in_channels / groups * kH * kW.
  Conv2d(int64_t in_channels, int64_t out_channels, ops::Pair kernel_size, const Conv2dOptions& options = {},
         core::Generator* generator = nullptr);
  Conv2d(int64_t in_channels, int64_t out_channels, int64_t kernel_size, const Conv2dOptions& options = {},
         core::Generator* generator = nullptr)
      : Conv2d(in_channels, out_channels, ops::Pair{kernel_size, kernel_size}, options, generator) {}
  /// x [N, in_channels, H, W] -> [N, out_channels, H', W'] (nhwc: [N, H, W, in_channels] -> [N, H', W', out_channels]).
  Tensor forward(const Tensor& x) override;
  std::string extra_repr() const override;

  const Tensor& weight() const { return *weight_; }
  const Tensor& bias() const { return *bias_; }
  const Conv2dOptions& options() const { return options_; }

 private:
  int64_t in_channels_;
  int64_t out_channels_;
  ops::Pair kernel_size_;
  Conv2dOptions options_;
  Tensor* weight_;
  Tensor* bias_;
};

}  // namespace colossal::nn
