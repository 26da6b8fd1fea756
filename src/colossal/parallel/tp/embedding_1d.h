// Vocabulary-parallel embedding (Megatron-LM's VocabParallelEmbedding, Colossal-AI's
// VocabParallelEmbedding1D): the embedding table's rows split over the tensor-parallel group. Rank r
// holds rows [r * V'/tp, (r + 1) * V'/tp) of the table padded to V' rows, the next multiple of tp
// (Megatron pads the vocabulary the same way; the padding rows are zeros no id looks up, the loss
// leaves their logits out: vocab_parallel_cross_entropy's vocab_size); each looks up the ids that
// fall in its rows (zero for the others) and the partial embeddings are summed
// (reduce_from_region), so every rank ends with the whole lookup. The backward is local: each shard's gradient gets
// only its own rows' contributions. With the vocab-parallel cross-entropy (cross_entropy.h) a tied GPT-2 head never
// holds the whole vocabulary on one rank.
#pragma once

#include <cstdint>
#include <memory>
#include <string>

#include "colossal/comm/process_group.h"
#include "colossal/nn/embedding.h"
#include "colossal/nn/module.h"
#include "colossal/parallel/tp/linear_1d.h"  // SequenceShard
#include "colossal/parallel/tp/shard_spec.h"

namespace colossal::parallel::tp {

class VocabParallelEmbedding : public nn::Module, public Sharded {
 public:
  /// This rank's rows of `weight` [V, D], padded with zero rows to a multiple of the group's size.
  VocabParallelEmbedding(const Tensor& weight, std::shared_ptr<comm::ProcessGroup> group);
  static std::shared_ptr<VocabParallelEmbedding> from(const nn::Embedding& serial,
                                                      std::shared_ptr<comm::ProcessGroup> group);

  /// ids (i32/i64, any shape, indices into the whole vocabulary) -> [..., D], the same on every rank.
  Tensor forward(const Tensor& ids) override;
  /// Under sequence parallelism: this rank's shard (along `shard`'s dimension) of forward(ids), the
  /// masked lookups reduce-scattered instead of all-reduced (Megatron's VocabParallelEmbedding with
  /// sequence_parallel): half the bytes, and no copy of the whole to cut the shard from.
  Tensor forward_shard(const Tensor& ids, const SequenceShard& shard);
  std::string extra_repr() const override;
  /// weight by rows, padded to a multiple of the group's size.
  std::map<std::string, ShardSpec> shard_specs() const override {
    return {{"weight", ShardSpec::padded(0, num_embeddings_)}};
  }

  const Tensor& weight() const { return *weight_; }           ///< this rank's rows [V'/tp, D]
  int64_t num_embeddings() const { return num_embeddings_; }  ///< the whole vocabulary V (no padding)
  int64_t padding() const { return weight_->shape()[0] * group_->size() - num_embeddings_; }  ///< V' - V
  int64_t first_row() const { return first_row_; }  ///< the first row this rank holds

 private:
  /// This rank's masked lookups: the rows of ids in its shard, zeros for the others.
  Tensor partial(const Tensor& ids);

  std::shared_ptr<comm::ProcessGroup> group_;
  int64_t num_embeddings_, first_row_;
  Tensor* weight_;
};

/// The embedding table's columns (the embedding dimension) split over the group (Colossal-AI's
/// Embedding1D, the tutorial's ShardSpec([-1]) on wte and wpe): rank r holds columns
/// [r * D/tp, (r + 1) * D/tp) of every row, looks up its part of each embedding and the parts are
/// gathered (gather_from_region), so every rank ends with the whole lookup; the backward is local.
/// As GPT-2's tied head, the table multiplies this rank's features of the hidden states and the
/// partial logits are summed (head_logits).
class ColumnParallelEmbedding : public nn::Module, public Sharded {
 public:
  /// This rank's columns of `weight` [V, D]; throws naming both when D does not divide by the group's size.
  ColumnParallelEmbedding(const Tensor& weight, std::shared_ptr<comm::ProcessGroup> group);
  static std::shared_ptr<ColumnParallelEmbedding> from(const nn::Embedding& serial,
                                                       std::shared_ptr<comm::ProcessGroup> group);

  /// ids (i32/i64, any shape) -> [..., D], the same on every rank.
  Tensor forward(const Tensor& ids) override;
  /// hidden [..., D], the same on every rank -> hidden x table^T [..., V], the same on every rank
  /// (each rank's features times its columns, summed over the group: a row-parallel product).
  Tensor head_logits(const Tensor& hidden);
  std::string extra_repr() const override;
  std::map<std::string, ShardSpec> shard_specs() const override { return {{"weight", ShardSpec::shard(1)}}; }

  const Tensor& weight() const { return *weight_; }  ///< this rank's columns [V, D/tp]
  int64_t num_embeddings() const { return weight_->shape()[0]; }

 private:
  std::shared_ptr<comm::ProcessGroup> group_;
  int64_t embedding_dim_;
  Tensor* weight_;
};

}  // namespace colossal::parallel::tp
