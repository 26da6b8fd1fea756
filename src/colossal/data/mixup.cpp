// Mixup and one-hot targets.
#include "colossal/data/mixup.h"

#include <cstring>
#include <vector>

#include "colossal/core/error.h"
#include "colossal/core/view.h"  // contiguous_raw
#include "colossal/data/random.h"

namespace colossal::data {

Tensor one_hot(const Tensor& labels, int64_t num_classes, double label_smoothing, const HostAllocator& allocate) {
  COLOSSAL_CHECK(num_classes >= 1, "one_hot: num_classes must be at least 1, got {}", num_classes);
  COLOSSAL_CHECK(label_smoothing >= 0.0 && label_smoothing <= 1.0, "one_hot: label_smoothing must be in [0, 1], got {}",
                 label_smoothing);
  COLOSSAL_CHECK(labels.defined() && labels.device().is_cpu() && labels.dim() == 1 &&
                     (labels.dtype() == DType::i64 || labels.dtype() == DType::i32),
                 "one_hot: expected class indices [B] (i32 or i64) on the CPU, got {} {}", labels.dtype(),
                 labels.shape());
  const int64_t b = labels.size(0);
  const Tensor contiguous = core::contiguous_raw(labels);
  std::vector<int64_t> values(static_cast<size_t>(b));
  for (int64_t i = 0; i < b; ++i) {
    values[static_cast<size_t>(i)] =
        labels.dtype() == DType::i64 ? contiguous.data<int64_t>()[i] : contiguous.data<int32_t>()[i];
  }
  Tensor out = allocate({b, num_classes}, DType::f32);
  float* o = out.data<float>();
  const auto off = static_cast<float>(label_smoothing / static_cast<double>(num_classes));
  const auto on = static_cast<float>(1.0 - label_smoothing + label_smoothing / static_cast<double>(num_classes));
  for (int64_t i = 0; i < b; ++i) {
    const int64_t c = values[static_cast<size_t>(i)];
    COLOSSAL_CHECK(c >= 0 && c < num_classes, "one_hot: sample {} has class {}, outside [0, {})", i, c, num_classes);
    for (int64_t k = 0; k < num_classes; ++k) o[i * num_classes + k] = off;
    o[i * num_classes + c] = on;
  }
  return out;
}

void mix_with_previous_(const Tensor& rows, double lambda) {
  COLOSSAL_CHECK(
      rows.defined() && rows.device().is_cpu() && rows.dtype() == DType::f32 && rows.is_contiguous() && rows.dim() >= 1,
      "mixup: expected a contiguous f32 CPU batch [B, ...], got {} {}", rows.defined() ? rows.dtype() : DType::f32,
      rows.defined() ? rows.shape() : Shape{});
  const int64_t b = rows.size(0);
  if (b == 0) return;
  const int64_t row = rows.numel() / b;
  float* data = rows.data<float>();
  // In place, last row first: row i still holds x_i when row i+1 reads it. Row 0 mixes with the
  // original last row, saved before it was overwritten.
  const auto l = static_cast<float>(lambda), r = static_cast<float>(1.0 - lambda);
  std::vector<float> last(data + (b - 1) * row, data + b * row);
  for (int64_t i = b - 1; i >= 1; --i) {
    float* x = data + i * row;
    const float* prev = data + (i - 1) * row;
    for (int64_t j = 0; j < row; ++j) x[j] = l * x[j] + r * prev[j];
  }
  for (int64_t j = 0; j < row; ++j) data[j] = l * data[j] + r * last[static_cast<size_t>(j)];
}

Tensor mixup_targets(const Tensor& labels, double lambda, const MixupOptions& options, const HostAllocator& allocate) {
  COLOSSAL_CHECK(lambda >= 0.0 && lambda <= 1.0, "mixup: lambda must be in [0, 1], got {}", lambda);
  COLOSSAL_CHECK(labels.defined(), "mixup: the batch has no targets to mix");
  COLOSSAL_CHECK(labels.dim() == 1, "mixup: expected class indices [B] as targets, got {}", labels.shape());
  Tensor soft = one_hot(labels, options.num_classes, options.label_smoothing, allocate);
  mix_with_previous_(soft, lambda);
  return soft;
}

double draw_mixup_lambda(core::Generator& generator, double alpha) {
  Rng rng(generator);
  return rng.beta(alpha, alpha);
}

void mixup_batch(Batch& batch, double lambda, const MixupOptions& options, const HostAllocator& allocate) {
  COLOSSAL_CHECK(lambda >= 0.0 && lambda <= 1.0, "mixup: lambda must be in [0, 1], got {}", lambda);
  COLOSSAL_CHECK(batch.input.defined() && batch.input.dtype() == DType::f32 && batch.input.is_contiguous() &&
                     batch.input.dim() >= 1,
                 "mixup: expected a contiguous f32 input batch [B, ...], got {} {} (apply ToTensor in the dataset)",
                 batch.input.defined() ? batch.input.dtype() : DType::f32,
                 batch.input.defined() ? batch.input.shape() : Shape{});
  COLOSSAL_CHECK(batch.target.defined(), "mixup: the batch has no targets to mix");
  const int64_t b = batch.input.size(0);
  COLOSSAL_CHECK(batch.target.dim() == 1 && batch.target.size(0) == b,
                 "mixup: expected class indices [B] = [{}] as targets, got {}", b, batch.target.shape());
  batch.target = mixup_targets(batch.target, lambda, options, allocate);
  mix_with_previous_(batch.input, lambda);
}

Mixup::Mixup(MixupOptions options) : options_(options) {
  COLOSSAL_CHECK(options_.alpha > 0.0, "Mixup: alpha must be positive, got {}", options_.alpha);
  COLOSSAL_CHECK(options_.num_classes >= 1, "Mixup: num_classes must be set (at least 1), got {}",
                 options_.num_classes);
}

void Mixup::apply(Batch& batch, core::Generator& generator, const HostAllocator& allocate) const {
  mixup_batch(batch, draw_mixup_lambda(generator, options_.alpha), options_, allocate);
}

std::string Mixup::name() const {
  return fmt::format("Mixup(alpha={}, num_classes={}, label_smoothing={})", options_.alpha, options_.num_classes,
                     options_.label_smoothing);
}

}  // namespace colossal::data
