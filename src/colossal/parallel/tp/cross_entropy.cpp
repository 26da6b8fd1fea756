// vocab_parallel_cross_entropy: see cross_entropy.h.
#include "colossal/parallel/tp/cross_entropy.h"

#include <algorithm>
#include <cmath>
#include <vector>

#include "colossal/autograd/function.h"   // record
#include "colossal/autograd/grad_mode.h"  // NoGradGuard
#include "colossal/core/error.h"
#include "colossal/ops/elementwise.h"
#include "colossal/ops/indexing.h"  // gather, scatter_add
#include "colossal/ops/reduction.h"

namespace colossal::parallel::tp {
namespace {

using Grads = std::vector<Tensor>;

/// All-reduces a contiguous copy of `t` over `group` and returns it.
Tensor all_reduced(const Tensor& t, comm::ProcessGroup& group, comm::ReduceOp op) {
  Tensor out = t.contiguous().clone();
  if (group.size() > 1) group.all_reduce(out, op);
  return out;
}

}  // namespace

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
  const double start = static_cast<double>(group.rank() * local);
  // The columns of this rank's slice that are real entries (the rest, at the end of the last
  // ranks' slices, is padding).
  const int64_t real_columns = std::clamp<int64_t>(vocab - group.rank() * local, 0, local);
  // 16-bit logits are computed in f32, as the serial op does; f64 stays f64.
  const DType compute = logits.dtype() == DType::f64 ? DType::f64 : DType::f32;
  const DType out_dtype = logits.dtype() == DType::f64 ? DType::f64 : DType::f32;

  Tensor loss_rows, probs, onehot, valid;
  Tensor real_mask;  // [1, local]: 1 for real columns, 0 for padding; undefined without padding
  double count = 0;
  {
    autograd::NoGradGuard no_grad;
    Tensor x = logits.detach().reshape({rows, local}).to(compute);
    const Tensor t = target.reshape({rows}).to(compute);  // indices < 2^24 are exact in f32
    if (real_columns < local) {
      // Padding columns at -infinity: exp() gives them no probability, and the all-reduced maximum
      // is a real entry's (rank 0's slice is real), so no -inf - -inf arises.
      std::vector<double> shift(static_cast<size_t>(local), 0.0);
      for (int64_t j = real_columns; j < local; ++j) shift[static_cast<size_t>(j)] = -INFINITY;
      real_mask = core::from_vector<double>(shift, {1, local}).to(compute).to(x.device());
      x = ops::add(x, real_mask);
      std::vector<double> keep(static_cast<size_t>(local), 0.0);
      for (int64_t j = 0; j < real_columns; ++j) keep[static_cast<size_t>(j)] = 1.0;
      real_mask = core::from_vector<double>(keep, {1, local}).to(compute).to(x.device());
    }
    // The row's maximum over the whole vocabulary, then the normaliser of exp(x - max).
    const Tensor row_max = all_reduced(ops::max(x, 1).values, group, comm::ReduceOp::max);
    const Tensor e = ops::exp(ops::sub(x, row_max.reshape({rows, 1})));
    const Tensor sum_e = all_reduced(ops::sum(e, {1}), group, comm::ReduceOp::sum);
    const Tensor lse = ops::add(ops::log(sum_e), row_max);
    probs = ops::div(e, sum_e.reshape({rows, 1}));
    // The target's logit: on the rank whose slice holds it, zero elsewhere, summed.
    const Tensor in_shard =
        ops::mul(ops::gt(t, start - 0.5).to(compute), ops::lt(t, start + static_cast<double>(local) - 0.5).to(compute));
    const Tensor local_index = ops::mul(ops::add(t, -start), in_shard).to(DType::i64).reshape({rows, 1});
    const Tensor picked = ops::mul(ops::gather(x, 1, local_index).reshape({rows}), in_shard);
    const Tensor target_logit = all_reduced(picked, group, comm::ReduceOp::sum);
    Tensor nll = ops::sub(lse, target_logit);
    if (smoothing > 0.0) {
      // The smoothed term: -mean over the whole vocabulary of log p = lse - mean(x).
      // Over the real entries only (the padding's -infinity times zero would be NaN: mask first).
      const Tensor real_x =
          real_mask.defined() ? ops::mul(logits.detach().reshape({rows, local}).to(compute), real_mask) : x;
      const Tensor sum_x = all_reduced(ops::sum(real_x, {1}), group, comm::ReduceOp::sum);
      const Tensor smooth = ops::sub(lse, ops::div(sum_x, static_cast<double>(vocab)));
      nll = ops::add(ops::mul(nll, 1.0 - smoothing), ops::mul(smooth, smoothing));
    }
    valid = ops::add(ops::mul(ops::eq(t, static_cast<double>(options.ignore_index)).to(compute), -1.0), 1.0);
    loss_rows = ops::mul(nll, valid);
    count = rows == 0 ? 0.0 : ops::sum(valid).to(core::kCpu).item<double>();
    onehot = ops::scatter_add(core::zeros({rows, local}, TensorOptions(compute, x.device())), 1, local_index,
                              in_shard.reshape({rows, 1}));
  }

  Tensor loss;
  {
    autograd::NoGradGuard no_grad;
    switch (options.reduction) {
      case ops::Reduction::mean:
        loss = ops::div(ops::sum(loss_rows), count > 0 ? count : 1.0).to(out_dtype);
        break;
      case ops::Reduction::sum:
        loss = ops::sum(loss_rows).to(out_dtype);
        break;
      case ops::Reduction::none:
        loss = loss_rows.reshape(row_shape).to(out_dtype).contiguous();
        break;
    }
  }
  const ops::Reduction reduction = options.reduction;
  const Shape logits_shape = logits.shape();
  const DType logits_dtype = logits.dtype();
  autograd::record("tp::vocab_parallel_cross_entropy", {logits}, {loss},
                   [=](const Grads& g, const autograd::Node&) -> Grads {
                     // d loss_n / d x_local = softmax - (1 - s) onehot - s / V, times the row's weight.
                     Tensor weight;
                     if (reduction == ops::Reduction::none) {
                       weight = ops::mul(g[0].reshape({rows}).to(probs.dtype()), valid);
                     } else {
                       const double scale = reduction == ops::Reduction::mean && count > 0 ? 1.0 / count : 1.0;
                       weight = ops::mul(ops::mul(valid, g[0].to(probs.dtype())), scale);
                     }
                     Tensor d = ops::sub(probs, ops::mul(onehot, 1.0 - smoothing));
                     if (smoothing > 0.0) {
                       const double uniform = -smoothing / static_cast<double>(vocab);
                       d = real_mask.defined() ? ops::add(d, ops::mul(real_mask, uniform)) : ops::add(d, uniform);
                     }
                     d = ops::mul(d, weight.reshape({rows, 1}));
                     return Grads{d.reshape(logits_shape).to(logits_dtype)};
                   });
  return loss;
}

}  // namespace colossal::parallel::tp
