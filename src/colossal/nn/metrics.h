// Classification metrics: top-k accuracy of logits against class labels, as counts that data-
// parallel evaluation can sum across ranks before dividing (timm's accuracy(), Colossal-AI's
// Accuracy metric).
#pragma once

#include <cstdint>
#include <vector>

#include "colossal/core/tensor.h"

namespace colossal::nn {

struct AccuracyCounts {
  int64_t correct = 0;  ///< rows whose label is among the k highest logits
  int64_t total = 0;    ///< rows counted (ignored labels are not)
  /// correct / total, or 0 when nothing was counted.
  double accuracy() const { return total == 0 ? 0.0 : static_cast<double>(correct) / static_cast<double>(total); }
};

/// For each k in ks: the rows of logits [..., C] (any floating dtype and device) whose label
/// (labels [...] of i32/i64 class indices) is among the k highest logits. Ties rank the lower
/// class index first, as a stable descending sort does; a NaN logit for the label is never
/// correct. Rows whose label is ignore_index are skipped. k >= 1; k >= C counts every row.
/// Throws naming the row when a label is outside [0, C).
std::vector<AccuracyCounts> topk_correct(const Tensor& logits, const Tensor& labels, const std::vector<int64_t>& ks,
                                         int64_t ignore_index = -100);

/// The top-k accuracy in [0, 1] (top-1 by default) of one batch.
double accuracy(const Tensor& logits, const Tensor& labels, int64_t k = 1, int64_t ignore_index = -100);

}  // namespace colossal::nn
