// Autocast: see autocast.h.
#include "colossal/ops/autocast.h"

#include "colossal/core/error.h"
#include "colossal/ops/shape.h"  // to_dtype

namespace colossal::ops {
namespace {

thread_local std::optional<DType> tls_autocast_dtype;

}  // namespace

std::optional<DType> autocast_dtype() {
  return tls_autocast_dtype;
}

AutocastGuard::AutocastGuard(std::optional<DType> dtype) : previous_(tls_autocast_dtype) {
  COLOSSAL_CHECK(!dtype || *dtype == DType::f16 || *dtype == DType::bf16,
                 "AutocastGuard: autocast computes in f16 or bf16, got {}", *dtype);
  tls_autocast_dtype = dtype;
}

AutocastGuard::~AutocastGuard() {
  tls_autocast_dtype = previous_;
}

namespace autocast {

Tensor to_lower(const Tensor& t, DType dtype) {
  return t.defined() && t.dtype() == DType::f32 ? to_dtype(t, dtype) : t;
}

Tensor to_f32(const Tensor& t) {
  return t.defined() && (t.dtype() == DType::f16 || t.dtype() == DType::bf16) ? to_dtype(t, DType::f32) : t;
}

}  // namespace autocast
}  // namespace colossal::ops
