// Gradient clipping by the global norm (torch.nn.utils.clip_grad_norm_ semantics) and the vector
// norm it is built on. Both are written with ops, so they run on whatever device the tensors live.
#pragma once

#include <limits>
#include <vector>

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

/// clip_grad_norm_on_device with the norm read on the host.
double clip_grad_norm(const std::vector<Tensor>& params, double max_norm, double norm_type = 2.0,
                      bool error_if_nonfinite = false);

}  // namespace colossal::optim
