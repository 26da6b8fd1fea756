// dropout: argument checks, the Philox (seed, offset) draw from the generator, and autograd that
// regenerates the mask in backward instead of saving it (ops/loss_kernels.h).
//
// Note [Dropout mask]: element i (row-major over x) keeps iff uniform_float(word i % 4 of
// philox_block(seed, offset, i / 4)) >= p, with (seed, offset) = (gen.seed(), gen.next_offset())
// taken once per call. The mask is a pure function of (seed, offset, i), so every device draws the
// same one, and the backward recomputes it from the two integers it captures rather than keeping
// a byte per element alive until backward: the memory saved is the size of every dropout
// activation, the cost is one Philox block per four elements again, which is far cheaper than the
// memory traffic the saved mask would have cost to write and read. Since dropout is linear in x for
// a fixed mask, the backward is the forward kernel applied to the output gradient.
//
// Eval mode and p == 0 return x itself and draw nothing (the generator does not advance), as in
// torch. p == 1 zeroes everything (its scale would be infinite, so dropped and kept alike give 0).
#include "colossal/autograd/function.h"  // record
#include "colossal/core/view.h"          // contiguous_raw
#include "colossal/ops/elementwise.h"    // add
#include "colossal/ops/loss_kernels.h"
#include "colossal/ops/nn_functional.h"

namespace colossal::ops {

constinit core::DispatchStub<DropoutKernel> dropout_stub("dropout");

Tensor dropout(const Tensor& x, double p, bool training, core::Generator* generator) {
  COLOSSAL_CHECK(x.defined(), "dropout: the input is undefined");
  COLOSSAL_CHECK(p >= 0.0 && p <= 1.0, "dropout: probability p must be in [0, 1], got {}", p);
  COLOSSAL_CHECK(core::is_floating(x.dtype()),
                 "dropout: expected a floating tensor (f32, f64, f16, bf16), got {} of shape {}", x.dtype(), x.shape());
  if (!training || p == 0.0) return x;

  core::Generator& gen = generator ? *generator : core::default_generator();
  const DropoutParams params = make_dropout_params(p, gen.seed(), gen.next_offset());
  const Tensor input = core::contiguous_raw(x);
  Tensor out = core::empty(x.shape(), TensorOptions(x.dtype(), x.device()));
  if (out.numel() > 0) dropout_stub(x.device(), out, input, Tensor(), params);

  autograd::record("dropout", {x}, {out}, [params](const std::vector<Tensor>& grads, const autograd::Node&) {
    const Tensor grad_out = core::contiguous_raw(grads[0]);
    Tensor grad_x = core::empty(grad_out.shape(), TensorOptions(grad_out.dtype(), grad_out.device()));
    if (grad_x.numel() > 0) dropout_stub(grad_x.device(), grad_x, grad_out, Tensor(), params);
    return std::vector<Tensor>{grad_x};
  });
  return out;
}

// The residual's gradient is the output's; x's is dropout's backward (the same mask from the same
// params). One pass over x, residual and out forward instead of dropout's pass and then add's.
Tensor dropout_add(const Tensor& x, const Tensor& residual, double p, bool training, core::Generator* generator) {
  COLOSSAL_CHECK(x.defined() && residual.defined(), "dropout_add: an input is undefined");
  COLOSSAL_CHECK(x.shape() == residual.shape() && x.dtype() == residual.dtype() && x.device() == residual.device(),
                 "dropout_add: x ({} {} on {}) and the residual ({} {} on {}) must have one shape, dtype and device",
                 x.dtype(), x.shape(), x.device(), residual.dtype(), residual.shape(), residual.device());
  COLOSSAL_CHECK(p >= 0.0 && p <= 1.0, "dropout_add: probability p must be in [0, 1], got {}", p);
  COLOSSAL_CHECK(core::is_floating(x.dtype()),
                 "dropout_add: expected floating tensors (f32, f64, f16, bf16), got {} of shape {}", x.dtype(),
                 x.shape());
  if (!training || p == 0.0) return add(residual, x);

  core::Generator& gen = generator ? *generator : core::default_generator();
  const DropoutParams params = make_dropout_params(p, gen.seed(), gen.next_offset());
  const Tensor input = core::contiguous_raw(x);
  const Tensor base = core::contiguous_raw(residual);
  Tensor out = core::empty(x.shape(), TensorOptions(x.dtype(), x.device()));
  if (out.numel() > 0) dropout_stub(x.device(), out, input, base, params);

  autograd::record("dropout_add", {x, residual}, {out},
                   [params](const std::vector<Tensor>& grads, const autograd::Node& node) {
                     Tensor grad_x;
                     if (node.needs_input_grad(0)) {
                       const Tensor grad_out = core::contiguous_raw(grads[0]);
                       grad_x = core::empty(grad_out.shape(), TensorOptions(grad_out.dtype(), grad_out.device()));
                       if (grad_x.numel() > 0) dropout_stub(grad_x.device(), grad_x, grad_out, Tensor(), params);
                     }
                     return std::vector<Tensor>{grad_x, grads[0]};
                   });
  return out;
}

}  // namespace colossal::ops
