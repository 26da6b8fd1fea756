// Embedding: parameter setup and the ops::embedding call.
#include "colossal/nn/embedding.h"

#include <fmt/format.h>

#include "colossal/core/view.h"  // select_raw
#include "colossal/nn/init.h"
#include "colossal/ops/nn_functional.h"  // embedding

namespace colossal::nn {

Embedding::Embedding(int64_t num_embeddings, int64_t embedding_dim, std::optional<int64_t> padding_idx,
                     core::Generator* generator)
    : Module("Embedding"), num_embeddings_(num_embeddings), embedding_dim_(embedding_dim) {
  COLOSSAL_CHECK(num_embeddings > 0 && embedding_dim > 0,
                 "Embedding: num_embeddings and embedding_dim must be positive, got {} and {}", num_embeddings,
                 embedding_dim);
  if (padding_idx) {
    COLOSSAL_CHECK(*padding_idx >= -num_embeddings && *padding_idx < num_embeddings,
                   "Embedding: padding_idx {} is out of range for {} embeddings (valid: {}..{})", *padding_idx,
                   num_embeddings, -num_embeddings, num_embeddings - 1);
    padding_idx_ = *padding_idx < 0 ? *padding_idx + num_embeddings : *padding_idx;
  }
  weight_ = &register_parameter("weight", core::empty({num_embeddings, embedding_dim}));
  init::normal_(*weight_, 0.0, 1.0, generator);
  if (padding_idx_ >= 0) core::select_raw(*weight_, 0, padding_idx_).zero_();
}

Tensor Embedding::forward(const Tensor& ids) {
  return ops::embedding(ids, *weight_, padding_idx_);
}

std::string Embedding::extra_repr() const {
  std::string out = fmt::format("{}, {}", num_embeddings_, embedding_dim_);
  if (padding_idx_ >= 0) out += fmt::format(", padding_idx={}", padding_idx_);
  return out;
}

}  // namespace colossal::nn
