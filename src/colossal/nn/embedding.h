// Embedding: a lookup table of learned vectors indexed by integer ids (token and position
// embeddings), with PyTorch's padding_idx semantics.
#pragma once

#include <optional>

#include "colossal/core/random.h"
#include "colossal/nn/module.h"

namespace colossal::nn {

/// weight [num_embeddings, embedding_dim], initialised N(0, 1) as PyTorch's. The padding row (when
/// given; negative counts from the end as in PyTorch) starts at zero and never receives gradient.
class Embedding : public Module {
 public:
  Embedding(int64_t num_embeddings, int64_t embedding_dim, std::optional<int64_t> padding_idx = std::nullopt,
            core::Generator* generator = nullptr);
  /// ids (i32/i64, any shape) -> [..., embedding_dim].
  Tensor forward(const Tensor& ids) override;
  std::string extra_repr() const override;

  const Tensor& weight() const { return *weight_; }
  int64_t num_embeddings() const { return num_embeddings_; }
  int64_t embedding_dim() const { return embedding_dim_; }
  /// The padding row after wrapping, or -1 for none.
  int64_t padding_idx() const { return padding_idx_; }

 private:
  int64_t num_embeddings_;
  int64_t embedding_dim_;
  int64_t padding_idx_ = -1;
  Tensor* weight_;
};

}  // namespace colossal::nn
