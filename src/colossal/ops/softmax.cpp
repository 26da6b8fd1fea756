// softmax and log_softmax over any dimension: input checks, the [outer, size, inner] view the
// kernels work on, and autograd through the fused backward kernels (ops/nn_kernels.h).
#include "colossal/autograd/function.h"  // record
#include "colossal/core/view.h"          // contiguous_raw
#include "colossal/ops/autocast.h"
#include "colossal/ops/nn_functional.h"
#include "colossal/ops/nn_kernels.h"

namespace colossal::ops {

constinit core::DispatchStub<SoftmaxForwardKernel> softmax_forward_stub("softmax_forward");
constinit core::DispatchStub<SoftmaxBackwardKernel> softmax_backward_stub("softmax_backward");

namespace {

struct RowGeometry {
  int64_t outer = 1, size = 1, inner = 1;
};

Tensor softmax_impl(const char* op, const Tensor& x, int64_t dim, bool log) {
  COLOSSAL_CHECK(x.defined(), "{}: the input is undefined", op);
  COLOSSAL_CHECK(
      core::is_floating(x.dtype()),
      "{}: expected a floating tensor (f32, f64, f16, bf16), got {} of shape {}; convert with .to(DType::f32)", op,
      x.dtype(), x.shape());
  const int64_t d = x.wrap_dim(dim, op);
  RowGeometry g;
  for (int64_t i = 0; i < x.dim(); ++i) {
    if (i < d) g.outer *= x.shape()[i];
    if (i == d) g.size = x.shape()[i];
    if (i > d) g.inner *= x.shape()[i];
  }
  const Tensor input = core::contiguous_raw(x);
  Tensor out = core::empty(x.shape(), TensorOptions(x.dtype(), x.device()));
  if (out.numel() > 0) softmax_forward_stub(x.device(), out, input, g.outer, g.size, g.inner, log);
  autograd::record(log ? "log_softmax" : "softmax", {x}, {out},
                   [y = out.detach(), g, log](const std::vector<Tensor>& grads, const autograd::Node&) {
                     const Tensor grad_y = core::contiguous_raw(grads[0]);
                     Tensor grad_x = core::empty(y.shape(), TensorOptions(y.dtype(), y.device()));
                     if (grad_x.numel() > 0) {
                       softmax_backward_stub(y.device(), grad_x, grad_y, y, g.outer, g.size, g.inner, log);
                     }
                     return std::vector<Tensor>{grad_x};
                   });
  return out;
}

}  // namespace

Tensor softmax(const Tensor& x, int64_t dim) {
  if (autocast_dtype()) {
    const AutocastGuard off(std::nullopt);
    return softmax(autocast::to_f32(x), dim);
  }
  return softmax_impl("softmax", x, dim, false);
}

Tensor log_softmax(const Tensor& x, int64_t dim) {
  if (autocast_dtype()) {
    const AutocastGuard off(std::nullopt);
    return log_softmax(autocast::to_f32(x), dim);
  }
  return softmax_impl("log_softmax", x, dim, true);
}

}  // namespace colossal::ops
