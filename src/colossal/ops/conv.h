// Convolution, batch normalisation and pooling over images in NCHW or NHWC layout.
#pragma once

#include <array>

#include "colossal/core/tensor.h"

namespace colossal::ops {

using Pair = std::array<int64_t, 2>;

/// The order of an image tensor's dimensions; see Note [image layouts].
enum class ImageLayout {
  nchw,  ///< [N, C, H, W]: PyTorch's default
  nhwc,  ///< [N, H, W, C]: channels innermost (PyTorch's channels_last memory format, made explicit in the shape)
};

// Note [image layouts]
// Every image op takes its layout as an argument: with nhwc, x, the output and their gradients are
// [N, H, W, C] where nchw has [N, C, H, W]; parameters (conv weights [O, C / groups, kH, kW],
// per-channel vectors) are the same in both, so checkpoints do not depend on the layout. On the GPU
// nhwc is the fast one: cuDNN's tensor-core convolutions compute in NHWC (an NCHW call pays a
// transpose of its input, output and gradients inside cuDNN) and a per-channel reduction over
// [N * H * W, C] reads whole rows of channels. The CPU computes nhwc by transposing to nchw and back
// (recorded, so gradients flow), as does any op a backend has no nhwc kernel for; the results are
// the nchw op's, transposed. A pointwise conv2d (1x1, stride 1, no padding, one group) in f16 or
// bf16 and nhwc is ops::linear over the pixels on every device.

/// x [N, C, H, W] (nhwc: [N, H, W, C]), weight [O, C / groups, kH, kW], bias [O] or undefined.
Tensor conv2d(const Tensor& x, const Tensor& weight, const Tensor& bias = Tensor(), Pair stride = {1, 1},
              Pair padding = {0, 0}, Pair dilation = {1, 1}, int64_t groups = 1,
              ImageLayout layout = ImageLayout::nchw);

/// Batch norm over (N, H, W) per channel. Training uses batch statistics and updates the running
/// ones in place (running = (1 - momentum) * running + momentum * batch, the variance unbiased);
/// evaluation uses the running ones. weight/bias [C] may be undefined.
Tensor batch_norm2d(const Tensor& x, Tensor& running_mean, Tensor& running_var, const Tensor& weight,
                    const Tensor& bias, bool training, double momentum = 0.1, double eps = 1e-5,
                    ImageLayout layout = ImageLayout::nchw);

/// relu(batch_norm2d(...)), as ResNet applies it: one pass each way where the backend has the fused
/// kernels (CUDA, nhwc), the two ops in turn elsewhere; the same results either way.
Tensor batch_norm_relu2d(const Tensor& x, Tensor& running_mean, Tensor& running_var, const Tensor& weight,
                         const Tensor& bias, bool training, double momentum = 0.1, double eps = 1e-5,
                         ImageLayout layout = ImageLayout::nchw);

/// relu(batch_norm2d(x, ...) + residual), a residual block's end: one pass forward where the backend
/// has the fused kernel (CUDA, nhwc; rounding as the composed ops do), the three ops in turn
/// elsewhere; the same results either way. residual has x's shape and device.
Tensor batch_norm_add_relu2d(const Tensor& x, const Tensor& residual, Tensor& running_mean, Tensor& running_var,
                             const Tensor& weight, const Tensor& bias, bool training, double momentum = 0.1,
                             double eps = 1e-5, ImageLayout layout = ImageLayout::nchw);

/// Max pooling; the gradient goes to the (first) maximum of each window. Padding is -inf.
Tensor max_pool2d(const Tensor& x, Pair kernel, Pair stride = {0, 0}, Pair padding = {0, 0},
                  ImageLayout layout = ImageLayout::nchw);
/// Average pooling; count_include_pad divides by the full window size (PyTorch's default).
Tensor avg_pool2d(const Tensor& x, Pair kernel, Pair stride = {0, 0}, Pair padding = {0, 0},
                  bool count_include_pad = true, ImageLayout layout = ImageLayout::nchw);
/// Average pooling to a fixed output size with PyTorch's window boundaries.
Tensor adaptive_avg_pool2d(const Tensor& x, Pair output_size, ImageLayout layout = ImageLayout::nchw);

/// The other layout's view of an image: nchw [N, C, H, W] -> nhwc [N, H, W, C] (to_nhwc) and back
/// (to_nchw), each a recorded contiguous copy.
Tensor to_nhwc(const Tensor& x);
Tensor to_nchw(const Tensor& x);

}  // namespace colossal::ops
