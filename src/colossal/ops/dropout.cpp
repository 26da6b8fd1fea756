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

namespace {

void check_arguments(const char* op, const Tensor& x, double p) {
  COLOSSAL_CHECK(x.defined(), "{}: the input is undefined", op);
  COLOSSAL_CHECK(p >= 0.0 && p <= 1.0, "{}: probability p must be in [0, 1], got {}", op, p);
  COLOSSAL_CHECK(core::is_floating(x.dtype()),
                 "{}: expected a floating tensor (f32, f64, f16, bf16), got {} of shape {}", op, x.dtype(), x.shape());
}

/// [residual +] t with the mask of `params` applied, as a new contiguous tensor (the kernel of
/// ops/loss_kernels.h; an undefined residual adds nothing).
Tensor masked(const Tensor& t, const Tensor& residual, const DropoutParams& params) {
  const Tensor input = core::contiguous_raw(t);
  Tensor out = core::empty(t.shape(), TensorOptions(t.dtype(), t.device()));
  if (out.numel() > 0) {
    dropout_stub(t.device(), out, input, residual.defined() ? core::contiguous_raw(residual) : Tensor(), params);
  }
  return out;
}

DropoutParams draw_params(double p, core::Generator* generator) {
  core::Generator& gen = generator ? *generator : core::default_generator();
  return make_dropout_params(p, gen.seed(), gen.next_offset());
}

}  // namespace

Tensor dropout(const Tensor& x, double p, bool training, core::Generator* generator) {
  check_arguments("dropout", x, p);
  if (!training || p == 0.0) return x;
  const DropoutParams params = draw_params(p, generator);
  Tensor out = masked(x, Tensor(), params);
  autograd::record("dropout", {x}, {out}, [params](const std::vector<Tensor>& grads, const autograd::Node&) {
    return std::vector<Tensor>{masked(grads[0], Tensor(), params)};
  });
  return out;
}

// The residual's gradient is the output's; x's is dropout's backward (the same mask from the same
// params). One pass over x, residual and out forward instead of dropout's pass and then add's.
Tensor dropout_add(const Tensor& x, const Tensor& residual, double p, bool training, core::Generator* generator) {
  check_arguments("dropout_add", x, p);
  COLOSSAL_CHECK(residual.defined(), "dropout_add: the residual is undefined");
  COLOSSAL_CHECK(x.shape() == residual.shape() && x.device() == residual.device(),
                 "dropout_add: x ({} {} on {}) and the residual ({} {} on {}) must have one shape and device",
                 x.dtype(), x.shape(), x.device(), residual.dtype(), residual.shape(), residual.device());
  if (!training || p == 0.0) return add(residual, x);
  // Under autocast (fp16 "torch" mode) a branch's output is 16-bit while the residual stream stays
  // f32: the sum promotes as add does, through dropout's own pass (the same mask from the same draw).
  if (x.dtype() != residual.dtype()) return add(residual, dropout(x, p, training, generator));
  const DropoutParams params = draw_params(p, generator);
  Tensor out = masked(x, residual, params);
  autograd::record("dropout_add", {x, residual}, {out},
                   [params](const std::vector<Tensor>& grads, const autograd::Node& node) {
                     const Tensor grad_x = node.needs_input_grad(0) ? masked(grads[0], Tensor(), params) : Tensor();
                     return std::vector<Tensor>{grad_x, grads[0]};
                   });
  return out;
}

}  // namespace colossal::ops
