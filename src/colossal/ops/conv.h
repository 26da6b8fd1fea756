// Convolution, batch normalisation and pooling over NCHW images.
#pragma once

#include <array>

#include "colossal/core/tensor.h"

namespace colossal::ops {

using Pair = std::array<int64_t, 2>;

/// x [N, C, H, W], weight [O, C / groups, kH, kW], bias [O] or undefined.
Tensor conv2d(const Tensor& x, const Tensor& weight, const Tensor& bias = Tensor(), Pair stride = {1, 1},
              Pair padding = {0, 0}, Pair dilation = {1, 1}, int64_t groups = 1);

/// Batch norm over (N, H, W) per channel. Training uses batch statistics and updates the running
/// ones in place (running = (1 - momentum) * running + momentum * batch, the variance unbiased);
/// evaluation uses the running ones. weight/bias [C] may be undefined.
Tensor batch_norm2d(const Tensor& x, Tensor& running_mean, Tensor& running_var, const Tensor& weight, const Tensor& bias,
                    bool training, double momentum = 0.1, double eps = 1e-5);

/// Max pooling; the gradient goes to the (first) maximum of each window. Padding is -inf.
Tensor max_pool2d(const Tensor& x, Pair kernel, Pair stride = {0, 0}, Pair padding = {0, 0});
/// Average pooling; count_include_pad divides by the full window size (PyTorch's default).
Tensor avg_pool2d(const Tensor& x, Pair kernel, Pair stride = {0, 0}, Pair padding = {0, 0}, bool count_include_pad = true);
/// Average pooling to a fixed output size with PyTorch's window boundaries.
Tensor adaptive_avg_pool2d(const Tensor& x, Pair output_size);

}  // namespace colossal::ops
