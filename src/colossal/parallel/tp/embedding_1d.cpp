// VocabParallelEmbedding: see embedding_1d.h.
#include "colossal/parallel/tp/embedding_1d.h"

#include <fmt/format.h>

#include <utility>

#include "colossal/autograd/grad_mode.h"  // NoGradGuard
#include "colossal/core/error.h"
#include "colossal/ops/elementwise.h"
#include "colossal/ops/linalg.h"         // linear
#include "colossal/ops/nn_functional.h"  // embedding
#include "colossal/parallel/tp/mappings.h"

namespace colossal::parallel::tp {

VocabParallelEmbedding::VocabParallelEmbedding(const Tensor& weight, std::shared_ptr<comm::ProcessGroup> group)
    : group_(std::move(group)) {
  COLOSSAL_CHECK(group_ != nullptr, "VocabParallelEmbedding needs the tensor-parallel group");
  COLOSSAL_CHECK(weight.dim() == 2, "VocabParallelEmbedding: the table must be 2-D [V, D], got shape {}",
                 weight.shape());
  num_embeddings_ = weight.shape()[0];
  const int64_t rows = ShardSpec::padded_size(num_embeddings_, group_->size()) / group_->size();
  first_row_ = group_->rank() * rows;
  weight_ = &register_parameter(
      "weight", shard_of(weight, ShardSpec::padded(0, num_embeddings_), group_->rank(), group_->size()));
}

std::shared_ptr<VocabParallelEmbedding> VocabParallelEmbedding::from(const nn::Embedding& serial,
                                                                     std::shared_ptr<comm::ProcessGroup> group) {
  COLOSSAL_CHECK(serial.padding_idx() < 0,
                 "VocabParallelEmbedding: an embedding with a padding row ({}) is not supported; its row would "
                 "get no gradient on one rank only",
                 serial.padding_idx());
  return std::make_shared<VocabParallelEmbedding>(serial.weight(), std::move(group));
}

Tensor VocabParallelEmbedding::partial(const Tensor& ids) {
  const int64_t rows = weight_->shape()[0];
  Tensor local_ids, keep;
  {
    // Which ids are this rank's, and their row in its shard (row 0 for the others, whose
    // embeddings are then zeroed: the index is only there to keep the lookup in range).
    autograd::NoGradGuard no_grad;
    const Tensor id = ids.to(DType::i64);
    const Tensor mine = ops::mul(ops::gt(id, static_cast<double>(first_row_) - 0.5).to(DType::i64),
                                 ops::lt(id, static_cast<double>(first_row_ + rows) - 0.5).to(DType::i64));
    local_ids = ops::mul(ops::add(id, -static_cast<double>(first_row_)).to(DType::i64), mine);
    keep = mine.to(weight_->dtype()).unsqueeze(-1);
  }
  return ops::mul(ops::embedding(local_ids, *weight_), keep);
}

Tensor VocabParallelEmbedding::forward(const Tensor& ids) {
  // The masked lookups summed over the group: every id is on exactly one rank.
  return reduce_from_region(partial(ids), *group_);
}

Tensor VocabParallelEmbedding::forward_shard(const Tensor& ids, const SequenceShard& shard) {
  const Tensor lookups = partial(ids);
  return reduce_scatter_to_sequence_region(lookups, shard.dim(lookups), *group_);
}

std::string VocabParallelEmbedding::extra_repr() const {
  return fmt::format("{} rows ({} on each of {} ranks, this one from row {}{}), dim {}", num_embeddings_,
                     weight_->shape()[0], group_->size(), first_row_,
                     padding() > 0 ? fmt::format("; {} padding rows", padding()) : "", weight_->shape()[1]);
}

// ---- split along the embedding dimension

ColumnParallelEmbedding::ColumnParallelEmbedding(const Tensor& weight, std::shared_ptr<comm::ProcessGroup> group)
    : group_(std::move(group)) {
  COLOSSAL_CHECK(group_ != nullptr, "ColumnParallelEmbedding needs the tensor-parallel group");
  COLOSSAL_CHECK(weight.dim() == 2, "ColumnParallelEmbedding: the table must be 2-D [V, D], got shape {}",
                 weight.shape());
  embedding_dim_ = weight.shape()[1];
  COLOSSAL_CHECK(embedding_dim_ % group_->size() == 0,
                 "ColumnParallelEmbedding: the embedding dimension {} (table of shape {}) does not split over the {} "
                 "ranks of the tensor-parallel group; choose a parallel.tensor.size that divides {}",
                 embedding_dim_, weight.shape(), group_->size(), embedding_dim_);
  weight_ = &register_parameter("weight", shard_of(weight, ShardSpec::shard(1), group_->rank(), group_->size()));
}

std::shared_ptr<ColumnParallelEmbedding> ColumnParallelEmbedding::from(const nn::Embedding& serial,
                                                                       std::shared_ptr<comm::ProcessGroup> group) {
  COLOSSAL_CHECK(serial.padding_idx() < 0,
                 "ColumnParallelEmbedding: an embedding with a padding row ({}) is not supported",
                 serial.padding_idx());
  return std::make_shared<ColumnParallelEmbedding>(serial.weight(), std::move(group));
}

Tensor ColumnParallelEmbedding::forward(const Tensor& ids) {
  return gather_from_region(ops::embedding(ids, *weight_), -1, *group_);
}

Tensor ColumnParallelEmbedding::head_logits(const Tensor& hidden) {
  // This rank's features of the replicated hidden states (their gradient all-gathered in backward),
  // times its columns; the partial logits summed.
  return reduce_from_region(ops::linear(scatter_to_region(hidden, -1, *group_), *weight_), *group_);
}

std::string ColumnParallelEmbedding::extra_repr() const {
  return fmt::format("{} rows, dim {} ({} on each of {} ranks)", weight_->shape()[0], embedding_dim_,
                     weight_->shape()[1], group_->size());
}

}  // namespace colossal::parallel::tp
