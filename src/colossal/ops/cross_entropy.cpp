// cross_entropy: input checks (hard or soft targets, [N, C] or [C] logits), the fused
// log-softmax + loss forward kernel and autograd through the fused backward kernel
// (ops/loss_kernels.h). Semantics follow torch.nn.functional.cross_entropy.
//
// Note [Cross entropy over no targets]: with Reduction::mean the loss is divided by the number of
// rows whose target is not ignore_index. When every target is ignored (or N == 0) that is 0 / 0 =
// nan, as in torch; the gradient is still 0 everywhere, because ignored rows contribute nothing.
#include "colossal/autograd/function.h"  // record
#include "colossal/core/view.h"          // contiguous_raw, view_raw
#include "colossal/ops/autocast.h"
#include "colossal/ops/loss_kernels.h"
#include "colossal/ops/nn_functional.h"

namespace colossal::ops {

constinit core::DispatchStub<CrossEntropyForwardKernel> cross_entropy_forward_stub("cross_entropy_forward");
constinit core::DispatchStub<CrossEntropyBackwardKernel> cross_entropy_backward_stub("cross_entropy_backward");
constinit core::DispatchStub<VocabShardForwardKernel> vocab_shard_cross_entropy_forward_stub(
    "vocab_shard_cross_entropy_forward");
constinit core::DispatchStub<VocabShardBackwardKernel> vocab_shard_cross_entropy_backward_stub(
    "vocab_shard_cross_entropy_backward");

namespace {

const char* reduction_name(Reduction reduction) {
  switch (reduction) {
    case Reduction::none:
      return "none";
    case Reduction::mean:
      return "mean";
    case Reduction::sum:
      return "sum";
  }
  return "?";
}

}  // namespace

Tensor cross_entropy(const Tensor& logits, const Tensor& target, const CrossEntropyOptions& options) {
  if (autocast_dtype()) {
    const AutocastGuard off(std::nullopt);
    return cross_entropy(autocast::to_f32(logits), autocast::to_f32(target), options);
  }
  COLOSSAL_CHECK(logits.defined() && target.defined(), "cross_entropy: logits and target must be defined");
  COLOSSAL_CHECK(logits.dim() == 1 || logits.dim() == 2, "cross_entropy: logits must be [N, C] or [C], got shape {}",
                 logits.shape());
  COLOSSAL_CHECK(core::is_floating(logits.dtype()),
                 "cross_entropy: logits must be floating (f32, f64, f16, bf16), got {} of shape {}", logits.dtype(),
                 logits.shape());
  COLOSSAL_CHECK(logits.device() == target.device(), "cross_entropy: logits are on {} but target is on {}",
                 logits.device(), target.device());
  COLOSSAL_CHECK(options.label_smoothing >= 0.0 && options.label_smoothing <= 1.0,
                 "cross_entropy: label_smoothing must be in [0, 1], got {}", options.label_smoothing);
  const bool batched = logits.dim() == 2;
  const int64_t rows = batched ? logits.shape()[0] : 1;
  const int64_t classes = logits.shape().back();
  CrossEntropyParams params;
  params.ignore_index = options.ignore_index;
  params.label_smoothing = options.label_smoothing;
  params.reduction = options.reduction;
  params.soft_target = core::is_floating(target.dtype());
  if (params.soft_target) {
    COLOSSAL_CHECK(target.shape() == logits.shape(),
                   "cross_entropy: soft (probability) targets must have the logits' shape {}, got {}; class-index "
                   "targets must be i32 or i64",
                   logits.shape(), target.shape());
    COLOSSAL_CHECK(target.dtype() == logits.dtype(),
                   "cross_entropy: soft targets must have the logits' dtype {}, got {}", logits.dtype(),
                   target.dtype());
  } else {
    COLOSSAL_CHECK(target.dtype() == DType::i32 || target.dtype() == DType::i64,
                   "cross_entropy: target must be class indices (i32, i64) or probabilities of the logits' dtype, got "
                   "{} of shape {}",
                   target.dtype(), target.shape());
    const Shape expected = batched ? Shape{rows} : Shape{};
    COLOSSAL_CHECK(target.shape() == expected,
                   "cross_entropy: class-index target must have shape {} for logits of shape {}, got {}", expected,
                   logits.shape(), target.shape());
  }
  COLOSSAL_CHECK(classes > 0 || rows == 0, "cross_entropy: logits of shape {} have no classes", logits.shape());

  const Tensor logits_2d = core::view_raw(core::contiguous_raw(logits), {rows, classes});
  const Tensor target_flat =
      core::view_raw(core::contiguous_raw(target), params.soft_target ? Shape{rows, classes} : Shape{rows});
  // The loss comes out in the accumulation type: f32 for f16/bf16 logits (never rounded to 16 bits,
  // so a mixed-precision model's logits need no f32 copy before the loss), f64 for f64.
  const DType acc_dtype = logits.dtype() == DType::f64 ? DType::f64 : DType::f32;
  Tensor out = core::empty(options.reduction == Reduction::none ? Shape{rows} : Shape{},
                           TensorOptions(acc_dtype, logits.device()));
  Tensor lse = core::empty({rows}, TensorOptions(acc_dtype, logits.device()));
  Tensor total_weight = core::empty({}, TensorOptions(DType::f64, logits.device()));
  cross_entropy_forward_stub(logits.device(), out, lse, total_weight, logits_2d, target_flat, params);
  if (options.reduction == Reduction::none && !batched) out = core::view_raw(out, {});

  autograd::record(std::string("cross_entropy(") + reduction_name(options.reduction) + ")", {logits, target}, {out},
                   [saved_logits = logits_2d.detach(), saved_target = target_flat.detach(), lse = lse.detach(),
                    total_weight = total_weight.detach(), params,
                    logits_shape = logits.shape()](const std::vector<Tensor>& grads, const autograd::Node& node) {
                     const int64_t n = saved_logits.shape()[0];
                     const Tensor grad_out = core::contiguous_raw(grads[0]);
                     const Tensor grad_rows =
                         params.reduction == Reduction::none ? core::view_raw(grad_out, {n}) : grad_out;
                     const TensorOptions grad_options(saved_logits.dtype(), saved_logits.device());
                     Tensor grad_logits, grad_target;
                     if (node.needs_input_grad(0)) grad_logits = core::empty(saved_logits.shape(), grad_options);
                     if (params.soft_target && node.needs_input_grad(1))
                       grad_target = core::empty(saved_logits.shape(), grad_options);
                     if (grad_logits.defined() || grad_target.defined()) {
                       cross_entropy_backward_stub(saved_logits.device(), grad_logits, grad_target, grad_rows,
                                                   saved_logits, saved_target, lse, total_weight, params);
                     }
                     if (grad_logits.defined()) grad_logits = core::view_raw(grad_logits, logits_shape);
                     if (grad_target.defined()) grad_target = core::view_raw(grad_target, logits_shape);
                     return std::vector<Tensor>{grad_logits, grad_target};
                   });
  return out;
}

}  // namespace colossal::ops
