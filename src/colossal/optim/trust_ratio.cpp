// guarded_ratio as arithmetic on 0-d tensors: no branch on a device value, so no host sync.
#include "colossal/optim/trust_ratio.h"

#include "colossal/core/error.h"       // COLOSSAL_CHECK
#include "colossal/core/view.h"        // cast_raw
#include "colossal/ops/elementwise.h"  // add, div, gt, mul, neg

namespace colossal::optim {

Tensor guarded_ratio(const Tensor& numerator, const Tensor& denominator, const Tensor& guard_a, const Tensor& guard_b) {
  COLOSSAL_CHECK(numerator.numel() == 1 && denominator.numel() == 1 && guard_a.numel() == 1 && guard_b.numel() == 1,
                 "guarded_ratio: expected one-element tensors, got shapes {}, {}, {}, {}", numerator.shape(),
                 denominator.shape(), guard_a.shape(), guard_b.shape());
  // both = [a > 0] * [b > 0]; ratio = both * n / (d + (1 - both)) + (1 - both). When both is 1 this
  // is n / d exactly (x * 1 and x + 0 are exact); otherwise 1, without dividing by a zero.
  const DType dtype = numerator.dtype();
  const Tensor both =
      ops::mul(core::cast_raw(ops::gt(guard_a, 0.0), dtype), core::cast_raw(ops::gt(guard_b, 0.0), dtype));
  const Tensor not_both = ops::add(ops::neg(both), 1.0);
  return ops::add(ops::mul(both, ops::div(numerator, ops::add(denominator, not_both))), not_both);
}

}  // namespace colossal::optim
