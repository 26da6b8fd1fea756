// CPU cross-entropy kernels for f32, f64, f16 and bf16 logits (f16/bf16 computed in f32): a fused
// forward that makes one log-softmax + loss pass per row and keeps only the row logsumexp, and a
// fused backward that writes (softmax - target distribution) * scale straight from it.
#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

#include "colossal/core/parallel_for.h"  // parallel_for
#include "colossal/ops/loss_kernels.h"

namespace colossal::ops {
namespace {

/// Calls row(i) for every row, spreading rows over threads.
template <class Row>
void for_each_row(int64_t rows, int64_t classes, Row&& row) {
  core::parallel_for(0, rows, std::max<int64_t>(1, core::kParallelGrain / std::max<int64_t>(classes, 1)),
                     [&](int64_t begin, int64_t end) {
                       for (int64_t i = begin; i < end; ++i) row(i);
                     });
}

/// Hard targets as int64 (or an empty vector for soft targets), validated serially before any
/// parallel region: an exception must not escape an OpenMP region.
std::vector<int64_t> read_class_targets(const Tensor& target, const CrossEntropyParams& params, int64_t classes) {
  if (params.soft_target) return {};
  std::vector<int64_t> labels(static_cast<size_t>(target.numel()));
  core::dispatch_index(target.dtype(), "cross_entropy", [&]<class Index>() {
    const Index* t = target.data<Index>();
    for (size_t i = 0; i < labels.size(); ++i) {
      const int64_t y = static_cast<int64_t>(t[i]);
      COLOSSAL_CHECK(y == params.ignore_index || (y >= 0 && y < classes),
                     "cross_entropy: target {} at row {} is out of range for {} classes (valid: 0..{}, or "
                     "ignore_index {})",
                     y, i, classes, classes - 1, params.ignore_index);
      labels[i] = y;
    }
  });
  return labels;
}

void cross_entropy_forward_cpu(const Tensor& out, const Tensor& lse, const Tensor& total_weight, const Tensor& logits,
                               const Tensor& target, const CrossEntropyParams& params) {
  const int64_t rows = logits.shape()[0];
  const int64_t classes = logits.shape()[1];
  const std::vector<int64_t> labels = read_class_targets(target, params, classes);
  core::dispatch_floating(logits.dtype(), "cross_entropy", [&]<class T>() {
    using Acc = core::acc_t<T>;
    const T* x = logits.data<T>();
    const T* soft = params.soft_target ? target.data<T>() : nullptr;
    Acc* row_lse = lse.data<Acc>();
    const Acc smoothing = static_cast<Acc>(params.label_smoothing);
    const Acc uniform_share = classes > 0 ? smoothing / static_cast<Acc>(classes) : Acc(0);
    std::vector<Acc> row_loss(static_cast<size_t>(rows));
    for_each_row(rows, classes, [&](int64_t i) {
      const T* xr = x + i * classes;
      Acc max_value = -std::numeric_limits<Acc>::infinity();
      for (int64_t c = 0; c < classes; ++c) max_value = std::max(max_value, static_cast<Acc>(xr[c]));
      Acc sum_exp = 0;
      for (int64_t c = 0; c < classes; ++c) sum_exp += std::exp(static_cast<Acc>(xr[c]) - max_value);
      const Acc log_sum_exp = max_value + std::log(sum_exp);
      row_lse[i] = log_sum_exp;
      Acc loss = 0;
      if (soft) {  // sum_c q_c (lse - x_c), q = (1 - s) t + s / C
        const T* tr = soft + i * classes;
        for (int64_t c = 0; c < classes; ++c) {
          const Acc q = (1 - smoothing) * static_cast<Acc>(tr[c]) + uniform_share;
          loss += q * (log_sum_exp - static_cast<Acc>(xr[c]));
        }
      } else if (labels[i] != params.ignore_index) {  // (1 - s) nll + s * mean_c(lse - x_c)
        loss = (1 - smoothing) * (log_sum_exp - static_cast<Acc>(xr[labels[i]]));
        if (smoothing != 0) {
          Acc sum_x = 0;
          for (int64_t c = 0; c < classes; ++c) sum_x += static_cast<Acc>(xr[c]);
          loss += smoothing * (log_sum_exp - sum_x / static_cast<Acc>(classes));
        }
      }
      row_loss[i] = loss;
    });

    int64_t counted = rows;
    if (!soft)
      counted = std::count_if(labels.begin(), labels.end(), [&](int64_t y) { return y != params.ignore_index; });
    *total_weight.data<double>() = static_cast<double>(counted);
    // The loss is in the accumulation type (f32 for 16-bit logits): never rounded to 16 bits.
    Acc* y = out.data<Acc>();
    if (params.reduction == Reduction::none) {
      for (int64_t i = 0; i < rows; ++i) y[i] = static_cast<Acc>(row_loss[i]);
      return;
    }
    // Serial, in double: the result must not depend on the thread count.
    double total = 0.0;
    for (int64_t i = 0; i < rows; ++i) total += static_cast<double>(row_loss[i]);
    // mean over no counted rows is 0 / 0 = nan, as in torch (Note [Cross entropy over no targets]).
    if (params.reduction == Reduction::mean) total /= static_cast<double>(counted);
    y[0] = static_cast<Acc>(total);
  });
}

void cross_entropy_backward_cpu(const Tensor& grad_logits, const Tensor& grad_target, const Tensor& grad_out,
                                const Tensor& logits, const Tensor& target, const Tensor& lse,
                                const Tensor& total_weight, const CrossEntropyParams& params) {
  const int64_t rows = logits.shape()[0];
  const int64_t classes = logits.shape()[1];
  const std::vector<int64_t> labels = read_class_targets(target, params, classes);
  core::dispatch_floating(logits.dtype(), "cross_entropy backward", [&]<class T>() {
    using Acc = core::acc_t<T>;
    const T* x = logits.data<T>();
    const T* soft = params.soft_target ? target.data<T>() : nullptr;
    const Acc* row_lse = lse.data<Acc>();
    const Acc* dy = grad_out.data<Acc>();
    T* dx = grad_logits.defined() ? grad_logits.data<T>() : nullptr;
    T* dt = grad_target.defined() ? grad_target.data<T>() : nullptr;
    const Acc smoothing = static_cast<Acc>(params.label_smoothing);
    const Acc uniform_share = classes > 0 ? smoothing / static_cast<Acc>(classes) : Acc(0);
    double shared_scale = 0.0;  // the gradient of each row's loss under sum and mean
    if (params.reduction != Reduction::none) {
      shared_scale = static_cast<double>(dy[0]);
      if (params.reduction == Reduction::mean) shared_scale /= *total_weight.data<double>();
    }
    for_each_row(rows, classes, [&](int64_t i) {
      const T* xr = x + i * classes;
      T* dxr = dx ? dx + i * classes : nullptr;
      T* dtr = dt ? dt + i * classes : nullptr;
      const bool ignored = !soft && labels[i] == params.ignore_index;
      // Ignored rows get an exact 0 even when mean's divisor is 0 (Note [Cross entropy over no targets]).
      const Acc scale =
          ignored ? Acc(0)
                  : static_cast<Acc>(params.reduction == Reduction::none ? static_cast<double>(dy[i]) : shared_scale);
      const Acc log_sum_exp = row_lse[i];
      if (ignored) {
        if (dxr) std::fill(dxr, dxr + classes, static_cast<T>(0.0f));
        return;
      }
      if (soft) {
        const T* tr = soft + i * classes;
        // d/dx_c sum_k q_k (lse - x_k) = p_c * sum_k q_k - q_c; soft targets need not sum to 1.
        Acc q_total = 0;
        for (int64_t c = 0; c < classes; ++c) q_total += (1 - smoothing) * static_cast<Acc>(tr[c]) + uniform_share;
        for (int64_t c = 0; c < classes; ++c) {
          const Acc log_p = static_cast<Acc>(xr[c]) - log_sum_exp;
          if (dxr) {
            const Acc q = (1 - smoothing) * static_cast<Acc>(tr[c]) + uniform_share;
            dxr[c] = static_cast<T>((std::exp(log_p) * q_total - q) * scale);
          }
          if (dtr) dtr[c] = static_cast<T>(-(1 - smoothing) * log_p * scale);
        }
        return;
      }
      if (!dxr) return;
      const int64_t label = labels[i];
      for (int64_t c = 0; c < classes; ++c) {
        const Acc q = uniform_share + (c == label ? 1 - smoothing : Acc(0));
        dxr[c] = static_cast<T>((std::exp(static_cast<Acc>(xr[c]) - log_sum_exp) - q) * scale);
      }
    });
  });
}

/// Row i's target as an index into this slice's columns, or -1 where the slice does not hold it.
template <class Index>
int64_t local_column(const Index* t, int64_t i, const VocabShardParams& params) {
  const int64_t y = static_cast<int64_t>(t[i]) - params.class_start;
  return y >= 0 && y < params.real_columns && static_cast<int64_t>(t[i]) != params.ignore_index ? y : -1;
}

void vocab_shard_cross_entropy_forward_cpu(const Tensor& stats, const Tensor& logits, const Tensor& target,
                                           const VocabShardParams& params) {
  const int64_t rows = logits.shape()[0];
  const int64_t columns = logits.shape()[1];
  core::dispatch_index(target.dtype(), "vocab_parallel_cross_entropy", [&]<class Index>() {
    const Index* t = target.data<Index>();
    for (int64_t i = 0; i < rows; ++i) {  // serially: an exception must not escape an OpenMP region
      const int64_t y = static_cast<int64_t>(t[i]);
      COLOSSAL_CHECK(y == params.ignore_index || (y >= 0 && y < params.classes),
                     "vocab_parallel_cross_entropy: target {} at row {} is out of range for a vocabulary of {} "
                     "(valid: 0..{}, or ignore_index {})",
                     y, i, params.classes, params.classes - 1, params.ignore_index);
    }
    core::dispatch_floating(logits.dtype(), "vocab_parallel_cross_entropy", [&]<class T>() {
      using Acc = core::acc_t<T>;
      const T* x = logits.data<T>();
      Acc* lse = stats.data<Acc>();
      Acc* picked = lse + rows;
      Acc* sums = lse + 2 * rows;
      const int64_t real = params.real_columns;
      for_each_row(rows, columns, [&](int64_t i) {
        const T* xr = x + i * columns;
        Acc max_value = -std::numeric_limits<Acc>::infinity();
        for (int64_t c = 0; c < real; ++c) max_value = std::max(max_value, static_cast<Acc>(xr[c]));
        Acc sum_exp = 0, sum_x = 0;
        for (int64_t c = 0; c < real; ++c) sum_exp += std::exp(static_cast<Acc>(xr[c]) - max_value);
        if (params.label_smoothing != 0.0) {
          for (int64_t c = 0; c < real; ++c) sum_x += static_cast<Acc>(xr[c]);
        }
        // A slice with no real columns contributes nothing to the sum of exponentials.
        lse[i] = real == 0 ? -std::numeric_limits<Acc>::infinity() : max_value + std::log(sum_exp);
        const int64_t y = local_column(t, i, params);
        picked[i] = y >= 0 ? static_cast<Acc>(xr[y]) : Acc(0);
        sums[i] = sum_x;
      });
    });
  });
}

void vocab_shard_cross_entropy_backward_cpu(const Tensor& grad_logits, const Tensor& logits, const Tensor& target,
                                            const Tensor& lse, const Tensor& scale, const VocabShardParams& params) {
  const int64_t rows = logits.shape()[0];
  const int64_t columns = logits.shape()[1];
  core::dispatch_index(target.dtype(), "vocab_parallel_cross_entropy backward", [&]<class Index>() {
    const Index* t = target.data<Index>();
    core::dispatch_floating(logits.dtype(), "vocab_parallel_cross_entropy backward", [&]<class T>() {
      using Acc = core::acc_t<T>;
      const T* x = logits.data<T>();
      T* dx = grad_logits.data<T>();
      const Acc* row_lse = lse.data<Acc>();
      const Acc* row_scale = scale.data<Acc>();
      const Acc smoothing = static_cast<Acc>(params.label_smoothing);
      const Acc uniform_share = smoothing / static_cast<Acc>(params.classes);
      for_each_row(rows, columns, [&](int64_t i) {
        const T* xr = x + i * columns;
        T* dxr = dx + i * columns;
        const int64_t y = local_column(t, i, params);
        for (int64_t c = 0; c < columns; ++c) {
          if (c >= params.real_columns) {
            dxr[c] = static_cast<T>(0.0f);
            continue;
          }
          const Acc q = uniform_share + (c == y ? 1 - smoothing : Acc(0));
          dxr[c] = static_cast<T>((std::exp(static_cast<Acc>(xr[c]) - row_lse[i]) - q) * row_scale[i]);
        }
      });
    });
  });
}

COLOSSAL_REGISTER_KERNEL(cross_entropy_forward_stub, core::DeviceType::cpu, cross_entropy_forward_cpu);
COLOSSAL_REGISTER_KERNEL(cross_entropy_backward_stub, core::DeviceType::cpu, cross_entropy_backward_cpu);
COLOSSAL_REGISTER_KERNEL(vocab_shard_cross_entropy_forward_stub, core::DeviceType::cpu,
                         vocab_shard_cross_entropy_forward_cpu);
COLOSSAL_REGISTER_KERNEL(vocab_shard_cross_entropy_backward_stub, core::DeviceType::cpu,
                         vocab_shard_cross_entropy_backward_cpu);

}  // namespace
}  // namespace colossal::ops
