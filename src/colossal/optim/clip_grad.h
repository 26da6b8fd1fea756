// Gradient clipping by the global norm (torch.nn.utils.clip_grad_norm_ semantics) and the vector
// norm it is built on. Written with ops, so they run on whatever device the tensors live; the L2
// norm of many gradients and the in-place scaling by a device scalar also have multi-tensor kernels
// (one pass over all gradients in a few launches instead of several launches per tensor; see Note
// [Clipping in one pass] in clip_grad.cpp).
#pragma once

#include <limits>
#include <vector>

#include "colossal/core/dispatch.h"
#include "colossal/core/tensor.h"

namespace colossal::optim {

inline constexpr double kInfNorm = std::numeric_limits<double>::infinity();

/// ||t||_p over all elements as a 0-d tensor on t's device: p = kInfNorm gives max |t_i|, any other
/// p > 0 gives (sum |t_i|^p)^(1/p). Computed in f32 for f16/bf16 inputs (their squares overflow
/// and their sums lose digits), in t's dtype otherwise. Not recorded by autograd.
Tensor vector_norm(const Tensor& t, double norm_type = 2.0);

/// The p-norm of all gradients of `params` taken together (parameters without a gradient are
/// skipped), as a 0-d f64 tensor on the first gradient's device; 0 when there are no gradients.
/// All gradients must be on one device.
Tensor total_grad_norm(const std::vector<Tensor>& params, double norm_type = 2.0);

/// Scales every gradient in place by max_norm / (total + 1e-6) when that factor is below 1 and
/// returns the total norm from before the scaling (0-d f64 on the gradients' device), exactly as
/// torch.nn.utils.clip_grad_norm_. The factor is applied as a device tensor (min(factor, 1)), so
/// nothing waits for the GPU: a training step stays free of host syncs until someone reads the
/// norm. With error_if_nonfinite the total is read first (a sync), and a NaN or infinite total
/// throws before any gradient is touched.
Tensor clip_grad_norm_on_device(const std::vector<Tensor>& params, double max_norm, double norm_type = 2.0,
                                bool error_if_nonfinite = false);

/// The scaling half of clip_grad_norm_on_device, for a total norm computed elsewhere (over several
/// ranks: parallel/gradient_statistics.h): every gradient times min(1, max_norm / (total_norm +
/// 1e-6)), the factor a device tensor.
void scale_grads_to_norm(const std::vector<Tensor>& params, double max_norm, const Tensor& total_norm);

/// min(1, max_norm / (total_norm + 1e-6)) as a 0-d f64 tensor on total_norm's device: the factor
/// clipping multiplies the gradients by (exactly 1 when they are within the bound, so unclipped
/// gradients keep their bits). No host sync.
Tensor clip_coefficient(const Tensor& total_norm, double max_norm);

/// `scale` (0-d) as it multiplies a tensor of `dtype`: rounded to that dtype's accumulation type
/// (f32 for f32, f16 and bf16; f64 for f64), as the fused kernels read it. The product is then one
/// rounding to `dtype`.
Tensor scale_for(const Tensor& scale, DType dtype);

/// sum over `tensors` of sum x^2 (squares and sum in f64, so the result is non-finite exactly when
/// some element is: mixed precision's overflow check), as a 0-d f64 tensor on their device, after
/// first multiplying every tensor in place by `scale` (rounded to its dtype) when `scale` is not 1.
/// The squares are of the scaled values. On
/// CUDA the contiguous tensors go through one multi-tensor pass; the rest, and every tensor
/// elsewhere, through ops. All tensors on one device; an empty list gives a CPU 0.
Tensor sum_of_squares(const std::vector<Tensor>& tensors, double scale = 1.0);

/// Multiplies every tensor of `tensors` in place by the 0-d `scale` (scale_for each tensor's dtype,
/// the product rounded to the tensor's dtype): one multi-tensor pass on CUDA.
void scale_(const std::vector<Tensor>& tensors, const Tensor& scale);

/// The multi-tensor kernels behind sum_of_squares and scale_, for the contiguous floating tensors
/// of one device (the caller hands the rest to ops).
using SumOfSquaresKernel = Tensor(const std::vector<Tensor>& tensors, double scale);
extern core::DispatchStub<SumOfSquaresKernel> sum_of_squares_stub;
using ScaleKernel = void(const std::vector<Tensor>& tensors, const Tensor& scale);
extern core::DispatchStub<ScaleKernel> scale_stub;

/// clip_grad_norm_on_device with the norm read on the host.
double clip_grad_norm(const std::vector<Tensor>& params, double max_norm, double norm_type = 2.0,
                      bool error_if_nonfinite = false);

}  // namespace colossal::optim
