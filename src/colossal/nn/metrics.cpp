// Top-k accuracy: each row's label rank counted in one pass over the row on the host (no sort).
#include "colossal/nn/metrics.h"

#include <cmath>

#include "colossal/core/view.h"  // contiguous_raw, to_device_raw

namespace colossal::nn {

namespace {
Tensor contiguous_on_cpu(const Tensor& t) {
  return core::contiguous_raw(t.device().is_cpu() ? t : core::to_device_raw(t, core::kCpu));
}
}  // namespace

std::vector<AccuracyCounts> topk_correct(const Tensor& logits, const Tensor& labels, const std::vector<int64_t>& ks,
                                         int64_t ignore_index) {
  COLOSSAL_CHECK(logits.defined() && labels.defined(), "topk_correct: logits and labels must be defined");
  COLOSSAL_CHECK(logits.dim() >= 1 && core::is_floating(logits.dtype()),
                 "topk_correct: expected floating logits [..., C], got {} of shape {}", logits.dtype(), logits.shape());
  const Shape row_shape(logits.shape().begin(), logits.shape().end() - 1);
  COLOSSAL_CHECK(labels.shape() == row_shape && (labels.dtype() == DType::i32 || labels.dtype() == DType::i64),
                 "topk_correct: labels must be i32/i64 of shape {} for logits {}, got {} of shape {}", row_shape,
                 logits.shape(), labels.dtype(), labels.shape());
  for (int64_t k : ks) COLOSSAL_CHECK(k >= 1, "topk_correct: k must be at least 1, got {}", k);

  const int64_t classes = logits.size(-1);
  const int64_t rows = classes == 0 ? 0 : logits.numel() / classes;
  const Tensor scores = contiguous_on_cpu(logits);
  const std::vector<int64_t> label_values = labels.to_vector<int64_t>();
  std::vector<AccuracyCounts> counts(ks.size());
  core::dispatch_floating(scores.dtype(), "topk_correct", [&]<class T>() {
    const T* data = scores.data<T>();
    for (int64_t row = 0; row < rows; ++row) {
      const int64_t label = label_values[static_cast<size_t>(row)];
      if (label == ignore_index) continue;
      COLOSSAL_CHECK(label >= 0 && label < classes, "topk_correct: label {} of row {} is outside [0, {})", label, row,
                     classes);
      const T* row_scores = data + row * classes;
      const double target = static_cast<double>(row_scores[label]);
      // The label's rank in a stable descending sort: larger scores, and equal ones of lower index.
      int64_t rank = 0;
      for (int64_t c = 0; c < classes; ++c) {
        const double score = static_cast<double>(row_scores[c]);
        rank += (score > target || (score == target && c < label)) ? 1 : 0;
      }
      for (size_t i = 0; i < ks.size(); ++i) {
        counts[i].total += 1;
        counts[i].correct += (!std::isnan(target) && rank < ks[i]) ? 1 : 0;
      }
    }
  });
  return counts;
}

double accuracy(const Tensor& logits, const Tensor& labels, int64_t k, int64_t ignore_index) {
  return topk_correct(logits, labels, {k}, ignore_index).front().accuracy();
}

}  // namespace colossal::nn
