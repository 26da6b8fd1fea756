// guarded_ratio as tensor ops on 0-d tensors: no branch on a device value, so no host sync.
#include "colossal/optim/trust_ratio.h"

#include "colossal/core/error.h"       // COLOSSAL_CHECK
#include "colossal/core/view.h"        // cast_raw
#include "colossal/ops/elementwise.h"  // div, gt, mul
#include "colossal/ops/indexing.h"     // where

namespace colossal::optim {

Tensor guarded_ratio(const Tensor& numerator, const Tensor& denominator, const Tensor& guard_a, const Tensor& guard_b) {
  COLOSSAL_CHECK(numerator.numel() == 1 && denominator.numel() == 1 && guard_a.numel() == 1 && guard_b.numel() == 1,
                 "guarded_ratio: expected one-element tensors, got shapes {}, {}, {}, {}", numerator.shape(),
                 denominator.shape(), guard_a.shape(), guard_b.shape());
  // A select rather than arithmetic on a 0/1 mask: 0 * (NaN / d) would be NaN, where Colossal-AI's
  // torch.where gives 1 for a NaN guard. The quotient is computed either way (a division by zero
  // in the branch not taken is harmless) and taken bit for bit where both guards hold.
  const DType dtype = numerator.dtype();
  const Tensor both = ops::gt(
      ops::mul(core::cast_raw(ops::gt(guard_a, 0.0), dtype), core::cast_raw(ops::gt(guard_b, 0.0), dtype)), 0.0);
  const Tensor one = core::full({}, 1.0, TensorOptions(dtype, numerator.device()));
  return ops::where(both, ops::div(numerator, denominator), one);
}

}  // namespace colossal::optim
