// vocab_parallel_cross_entropy: see cross_entropy.h.
#include "colossal/parallel/tp/cross_entropy.h"

#include <algorithm>
#include <vector>

#include "colossal/autograd/function.h"   // record
#include "colossal/autograd/grad_mode.h"  // NoGradGuard
#include "colossal/core/error.h"
#include "colossal/core/view.h"  // select_raw
#include "colossal/ops/elementwise.h"
#include "colossal/ops/loss_kernels.h"  // vocab_shard_cross_entropy_*_stub
#include "colossal/ops/reduction.h"

namespace colossal::parallel::tp {
namespace {

using Grads = std::vector<Tensor>;

/// Row `r` of a contiguous [k, rows] tensor, as a view.
Tensor row_of(const Tensor& t, int64_t r) {
  return core::select_raw(t, 0, r);
}

}  // namespace

// Note [Vocab-parallel cross-entropy]: each rank reads its slice of the logits once in the forward
// (ops' vocab_shard_cross_entropy_forward: the slice's logsumexp over its real columns, the target's
// logit where the slice holds it, the sum of the real columns for label smoothing) and once in the
// backward (softmax minus the smoothed one-hot, times each row's scale, straight into the gradient in
// the logits' dtype). Between them two all-reduces of [rows] and [3, rows] values: the largest slice
// logsumexp m, then sum_r exp(lse_r - m), the target's logit and the sum of the logits, so that
// lse = m + log(sum_r exp(lse_r - m)). Nothing of the logits' size is allocated besides the gradient,
// and nothing is read back to the host (the mean's count stays on the device).
Tensor vocab_parallel_cross_entropy(const Tensor& logits, const Tensor& target, comm::ProcessGroup& group,
                                    const ops::CrossEntropyOptions& options, int64_t vocab_size) {
  COLOSSAL_CHECK(logits.defined() && logits.dim() >= 1 && core::is_floating(logits.dtype()),
                 "vocab_parallel_cross_entropy: logits must be a floating tensor of at least 1 dimension, got {} {}",
                 logits.defined() ? logits.dtype() : DType::f32, logits.defined() ? logits.shape() : Shape{});
  COLOSSAL_CHECK(target.defined() && !core::is_floating(target.dtype()),
                 "vocab_parallel_cross_entropy: target must hold class indices (i32/i64); soft targets need the "
                 "gathered logits");
  Shape row_shape = logits.shape();
  row_shape.pop_back();
  COLOSSAL_CHECK(target.shape() == row_shape,
                 "vocab_parallel_cross_entropy: target of shape {} does not match logits of shape {} (the target "
                 "has the logits' shape without the vocabulary dimension)",
                 target.shape(), logits.shape());
  COLOSSAL_CHECK(logits.device() == group.device(),
                 "vocab_parallel_cross_entropy: logits are on {} but the tensor-parallel group works on {}",
                 logits.device(), group.device());
  const double smoothing = options.label_smoothing;
  COLOSSAL_CHECK(smoothing >= 0.0 && smoothing <= 1.0,
                 "vocab_parallel_cross_entropy: label_smoothing must be in [0, 1], got {}", smoothing);

  const int64_t local = logits.shape().back();
  const int64_t rows = local == 0 ? 0 : logits.numel() / local;
  const int64_t padded_vocab = local * group.size();
  COLOSSAL_CHECK(vocab_size <= padded_vocab,
                 "vocab_parallel_cross_entropy: a vocabulary of {} entries, but only {} logits on each of {} ranks "
                 "({} in all)",
                 vocab_size, local, group.size(), padded_vocab);
  const int64_t vocab = vocab_size > 0 ? vocab_size : padded_vocab;
  const ops::VocabShardParams params{.class_start = group.rank() * local,
                                     // The columns of this rank's slice that are real entries (the rest, at the end of
                                     // the last ranks' slices, is padding).
                                     .real_columns = std::clamp<int64_t>(vocab - group.rank() * local, 0, local),
                                     .classes = vocab,
                                     .ignore_index = options.ignore_index,
                                     .label_smoothing = smoothing};
  // 16-bit logits are computed in f32, as the serial op does; f64 stays f64.
  const DType compute = logits.dtype() == DType::f64 ? DType::f64 : DType::f32;
  const Device device = logits.device();

  Tensor lse, valid, count, loss;
  const Tensor x = logits.detach().reshape({rows, local}).contiguous();
  const Tensor t = target.detach().reshape({rows}).contiguous();
  {
    autograd::NoGradGuard no_grad;
    Tensor stats = core::empty({3, rows}, TensorOptions(compute, device));
    if (rows > 0) ops::vocab_shard_cross_entropy_forward_stub(device, stats, x, t, params);
    // The whole row's logsumexp from the slices': m = max_r lse_r, then sum_r exp(lse_r - m).
    Tensor row_max = core::empty({rows}, TensorOptions(compute, device));
    row_max.copy_(row_of(stats, 0));
    if (group.size() > 1) group.all_reduce(row_max, comm::ReduceOp::max);
    row_of(stats, 0).copy_(ops::exp(ops::sub(row_of(stats, 0), row_max)));
    if (group.size() > 1) group.all_reduce(stats, comm::ReduceOp::sum);
    lse = ops::add(ops::log(row_of(stats, 0)), row_max);
    Tensor nll = ops::sub(lse, row_of(stats, 1));
    if (smoothing > 0.0) {
      // The smoothed term: -mean over the whole vocabulary of log p = lse - mean(x).
      const Tensor smooth = ops::sub(lse, ops::div(row_of(stats, 2), static_cast<double>(vocab)));
      nll = ops::add(ops::mul(nll, 1.0 - smoothing), ops::mul(smooth, smoothing));
    }
    valid = ops::add(ops::mul(ops::eq(t, static_cast<double>(options.ignore_index)).to(compute), -1.0), 1.0);
    const Tensor loss_rows = ops::mul(nll, valid);
    // The mean's divisor: the rows not ignored, on the device; a batch of ignored rows only has
    // loss 0 (count 0 -> 1).
    count = ops::sum(valid);
    count = ops::add(count, ops::eq(count, 0.0).to(compute));
    switch (options.reduction) {
      case ops::Reduction::mean:
        loss = ops::div(ops::sum(loss_rows), count);
        break;
      case ops::Reduction::sum:
        loss = ops::sum(loss_rows);
        break;
      case ops::Reduction::none:
        loss = loss_rows.reshape(row_shape).contiguous();
        break;
    }
  }
  const ops::Reduction reduction = options.reduction;
  const Shape logits_shape = logits.shape();
  autograd::record("tp::vocab_parallel_cross_entropy", {logits}, {loss},
                   [=](const Grads& g, const autograd::Node&) -> Grads {
                     // d loss_n / d x_local = softmax - (1 - s) onehot - s / V, times the row's weight.
                     Tensor scale;
                     if (reduction == ops::Reduction::none) {
                       scale = ops::mul(g[0].reshape({rows}).to(compute), valid);
                     } else {
                       const Tensor upstream =
                           reduction == ops::Reduction::mean ? ops::div(g[0].to(compute), count) : g[0].to(compute);
                       scale = ops::mul(valid, upstream);
                     }
                     scale = scale.contiguous();
                     Tensor d = core::empty({rows, local}, TensorOptions(x.dtype(), x.device()));
                     if (rows > 0)
                       ops::vocab_shard_cross_entropy_backward_stub(x.device(), d, x, t, lse, scale, params);
                     return Grads{d.reshape(logits_shape)};
                   });
  return loss;
}

}  // namespace colossal::parallel::tp
