// The guarded layer-wise trust ratio LAMB and LARS scale their updates by, computed on the
// tensors' device so an optimizer step reads nothing back to the host.
#pragma once

#include "colossal/core/tensor.h"

namespace colossal::optim {

/// numerator / denominator where guard_a > 0 and guard_b > 0, else 1; all four are 0-d tensors of
/// one dtype and device (norms, typically). Exact: where the guards hold the result is the
/// quotient itself, bit for bit. NaN guards count as "not > 0" (giving 1), as torch.where does in
/// Colossal-AI's Lars.
Tensor guarded_ratio(const Tensor& numerator, const Tensor& denominator, const Tensor& guard_a, const Tensor& guard_b);

}  // namespace colossal::optim
