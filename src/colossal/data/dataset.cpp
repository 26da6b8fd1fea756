// TransformDataset, Compose and the index check every dataset uses.
#include "colossal/data/dataset.h"

#include "colossal/core/error.h"
#include "colossal/data/random.h"

namespace colossal::data {

Tensor label_tensor(int64_t label) {
  Tensor t = core::empty({}, DType::i64);
  *t.data<int64_t>() = label;
  return t;
}

void check_index(int64_t index, int64_t size, const char* what) {
  COLOSSAL_CHECK(index >= 0 && index < size, "{}: index {} is out of range; the dataset has {} samples (0 to {})", what,
                 index, size, size - 1);
}

Tensor Compose::apply(const Tensor& image, core::Generator& generator) const {
  Tensor out = image;
  for (const auto& t : transforms_) out = t->apply(out, generator);
  return out;
}

std::string Compose::name() const {
  std::string out = "Compose(";
  for (size_t i = 0; i < transforms_.size(); ++i) out += (i ? ", " : "") + transforms_[i]->name();
  return out + ")";
}

TransformDataset::TransformDataset(std::shared_ptr<Dataset> base, std::shared_ptr<const Transform> transform,
                                   uint64_t seed)
    : base_(std::move(base)), transform_(std::move(transform)), seed_(seed) {
  COLOSSAL_CHECK(base_ != nullptr, "TransformDataset: the base dataset is null");
  COLOSSAL_CHECK(transform_ != nullptr, "TransformDataset: the transform is null");
}

Example TransformDataset::get(int64_t index) const {
  Example example = base_->get(index);
  core::Generator generator = derive_generator(seed_, RandomStream::sample_transform, epoch_.load(), index);
  try {
    example.input = transform_->apply(example.input, generator);
  } catch (const Error& e) {
    COLOSSAL_FAIL("{} failed on sample {} (input shape {}): {}", transform_->name(), index, example.input.shape(),
                  e.what());
  }
  return example;
}

void TransformDataset::set_epoch(int64_t epoch) {
  epoch_.store(epoch);
  base_->set_epoch(epoch);
}

}  // namespace colossal::data
