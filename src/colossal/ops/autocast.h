// Autocast: torch.autocast's mixed precision for the ops. Inside an AutocastGuard(f16 or bf16) on a
// thread, the matrix-product ops (linear, linear_gelu, matmul, bmm, conv2d,
// scaled_dot_product_attention) cast their f32 operands to the guard's dtype and compute in it, and
// the ops that need range or accuracy (softmax, log_softmax, layer_norm, batch_norm2d,
// cross_entropy) cast 16-bit inputs up to f32; everything else runs in its inputs' dtype, with
// mixed dtypes promoting as usual. The casts are recorded ops, so gradients flow back to the f32
// parameters in f32. The mixed-precision "torch" mode (amp/) runs the forward inside a guard.
#pragma once

#include <optional>

#include "colossal/core/dtype.h"
#include "colossal/core/tensor.h"

namespace colossal::ops {

/// The dtype this thread's autocast computes matrix products in; nullopt outside autocast.
std::optional<DType> autocast_dtype();

/// Sets this thread's autocast dtype (f16 or bf16; nullopt turns autocast off) until destruction,
/// then restores the previous one. Throws naming the dtype when it is not f16 or bf16.
class AutocastGuard {
 public:
  explicit AutocastGuard(std::optional<DType> dtype);
  ~AutocastGuard();
  AutocastGuard(const AutocastGuard&) = delete;
  AutocastGuard& operator=(const AutocastGuard&) = delete;

 private:
  std::optional<DType> previous_;
};

namespace autocast {

/// For a lower-precision op: t cast to `dtype` when it is f32 (undefined, other dtypes unchanged).
Tensor to_lower(const Tensor& t, DType dtype);
/// For an f32 op: t cast to f32 when it is f16 or bf16 (undefined, other dtypes unchanged).
Tensor to_f32(const Tensor& t);

}  // namespace autocast
}  // namespace colossal::ops
