// 1D tensor-parallel linear layers (Megatron-LM's ColumnParallelLinear and RowParallelLinear,
// Colossal-AI's Linear1D_Col / Linear1D_Row): a serial layer's weight split over the tensor-parallel
// group, each rank holding one shard, the communication done by the autograd pairs of
// parallel/tp/mappings.h. A transformer's MLP is a column layer (output features split, no gather)
// followed by a row layer (input features split): one all-reduce forward and one backward.
//
// Built from a serial layer (nn::Linear, weight [out, in], or Hugging Face's nn::Conv1D, weight [in,
// out]): each rank copies its shard, so the parallel model starts as the serial one and a test can
// compare the two directly. Parameter names stay the serial layer's ("weight", "bias"), holding the
// shard.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "colossal/comm/process_group.h"
#include "colossal/config/train_config.h"  // TensorSplit
#include "colossal/nn/linear.h"
#include "colossal/nn/module.h"
#include "colossal/parallel/tp/mappings.h"  // PendingSum
#include "colossal/parallel/tp/shard_spec.h"

namespace colossal::parallel::tp {

/// How a layer stores its weight.
enum class WeightLayout {
  kOutIn,  ///< [out, in]: torch.nn.Linear, timm (y = x W^T + b)
  kInOut,  ///< [in, out]: Hugging Face's Conv1D, GPT-2 (y = x W + b)
};

/// Which dimension of the activations [B, T, features] sequence parallelism splits over the tensor
/// group, shared by a model's layers and set by the model for each forward (Note [Token shards] in
/// gpt2_1d.cpp): the batch where B divides by the group's size (each rank's tokens then lie
/// contiguously, and the all-gather and reduce-scatter need no permuting copies), else the sequence
/// (Megatron's, whose activations are [T, B, features]). Without one, the sequence.
struct SequenceShard {
  bool batch = false;
  /// The dimension of x to split or gather along.
  int64_t dim(const Tensor& x) const { return batch ? 0 : x.dim() - 2; }
};

/// y = x A + b with A's output features split over the group: rank r computes outputs
/// [r * out / tp, (r + 1) * out / tp). The input is replicated (copy_to_region: its gradient is
/// all-reduced in backward); the output is this rank's slice of the last dimension, or, with
/// gather_output, the whole output (gather_from_region).
class ColumnParallelLinear : public nn::Module, public Sharded {
 public:
  /// The shard of `weight` (in `layout`) and `bias` (undefined: none) for this rank of `group`.
  /// Throws naming the sizes when the output features do not divide by the group's size.
  /// `order`: the serial output features in the order the ranks' parts concatenate to (empty: the
  /// natural order); attention's fused q/k/v uses it to give each rank its heads' q, k and v.
  ColumnParallelLinear(const Tensor& weight, const Tensor& bias, WeightLayout layout,
                       std::shared_ptr<comm::ProcessGroup> group, bool gather_output = false,
                       std::vector<int64_t> order = {});
  static std::shared_ptr<ColumnParallelLinear> from(const nn::Linear& serial, std::shared_ptr<comm::ProcessGroup> group,
                                                    bool gather_output = false);
  static std::shared_ptr<ColumnParallelLinear> from(const nn::Conv1D& serial, std::shared_ptr<comm::ProcessGroup> group,
                                                    bool gather_output = false);

  /// Without sequence parallelism: x replicated (copy_to_region). With it (Megatron's
  /// sequence_parallel): x is this rank's shard of the sequence dimension (the one before the
  /// features), all-gathered in forward and its gradient reduce-scattered in backward.
  Tensor forward(const Tensor& x) override;
  /// gelu(forward(x)) with the tanh approximation, as one ops::linear_gelu (the GEMM's epilogue
  /// applies the bias and GELU): GPT-2's MLP hidden layer without a pass over its activations.
  /// Needs gather_output false (the GELU applies to this rank's features).
  Tensor forward_gelu(const Tensor& x);
  /// `shard`: the dimension the activations are split along (the sequence when null).
  void set_sequence_parallel(bool on, std::shared_ptr<const SequenceShard> shard = nullptr) {
    sequence_parallel_ = on;
    shard_ = std::move(shard);
  }
  bool sequence_parallel() const { return sequence_parallel_; }
  std::string extra_repr() const override;
  /// weight along its output dimension (in `order`), bias along 0.
  std::map<std::string, ShardSpec> shard_specs() const override;

  const Tensor& weight() const { return *weight_; }  ///< this rank's shard, in the serial layout
  const Tensor& bias() const { return *bias_; }
  int64_t in_features() const { return in_features_; }
  int64_t out_features() const { return out_features_; }  ///< the whole layer's
  int64_t out_features_per_rank() const { return out_features_ / group_->size(); }

 private:
  /// This rank's output features of x (gathered from the sequence shards first under sequence
  /// parallelism), with GELU when asked.
  Tensor local_forward(const Tensor& x, bool gelu);

  std::shared_ptr<comm::ProcessGroup> group_;
  WeightLayout layout_;
  bool gather_output_;
  bool sequence_parallel_ = false;
  std::shared_ptr<const SequenceShard> shard_;
  std::vector<int64_t> order_;
  int64_t in_features_, out_features_;
  Tensor* weight_;
  Tensor* bias_;
};

/// y = x A + b with A's input features split over the group: rank r multiplies inputs
/// [r * in / tp, (r + 1) * in / tp) by its rows of A, and the partial products are summed
/// (reduce_from_region: an all-reduce forward, identity backward). The input is this rank's slice of
/// the last dimension (input_is_parallel, after a column layer) or the whole input, of which each
/// rank takes its slice (scatter_to_region). The bias is replicated and added once, after the sum.
class RowParallelLinear : public nn::Module, public Sharded {
 public:
  /// Throws naming the sizes when the input features do not divide by the group's size.
  RowParallelLinear(const Tensor& weight, const Tensor& bias, WeightLayout layout,
                    std::shared_ptr<comm::ProcessGroup> group, bool input_is_parallel = true);
  static std::shared_ptr<RowParallelLinear> from(const nn::Linear& serial, std::shared_ptr<comm::ProcessGroup> group,
                                                 bool input_is_parallel = true);
  static std::shared_ptr<RowParallelLinear> from(const nn::Conv1D& serial, std::shared_ptr<comm::ProcessGroup> group,
                                                 bool input_is_parallel = true);

  /// Without sequence parallelism the output is whole on every rank (all-reduce). With it the
  /// partial products are reduce-scattered along the sequence dimension (the one before the
  /// features): rank r gets its shard of the sum, and the replicated bias, added to that shard, has
  /// its gradient summed over the group (copy_to_region).
  Tensor forward(const Tensor& x) override;
  /// forward in two halves, without sequence parallelism: start() computes this rank's partial
  /// product and leaves its all-reduce running; finish() waits for it and adds the bias. Work issued
  /// between them runs under the communication.
  PendingSum start(const Tensor& x);
  Tensor finish(PendingSum pending);
  /// residual + forward(x), the residual [..., out] replicated over the group, with the bias and the
  /// residual added inside this rank's GEMM on its share of the rows before the all-reduce
  /// (ops::linear_add_part, Note [A row-parallel layer's residual in its GEMM]); with row blocks, each
  /// block all-reduced under the next one's GEMMs. Not under sequence parallelism (fuses_residual()).
  Tensor forward_add(const Tensor& x, const Tensor& residual);
  bool fuses_residual() const { return !sequence_parallel_; }
  /// `shard`: the dimension the activations are split along (the sequence when null).
  void set_sequence_parallel(bool on, std::shared_ptr<const SequenceShard> shard = nullptr) {
    sequence_parallel_ = on;
    shard_ = std::move(shard);
  }
  /// parallel.tensor.row_blocks: without sequence parallelism, forward runs its GEMM over this many
  /// blocks of rows and all-reduces each block while the next one's GEMM runs (ops::
  /// linear_in_row_blocks, Note [Row blocks of a linear's output]); 1: one GEMM, then the all-reduce;
  /// 0: auto_row_blocks() at each forward.
  void set_row_blocks(int64_t blocks);
  int64_t row_blocks() const { return row_blocks_; }
  /// The blocks a forward on this rank's input `local` runs: row_blocks(), or for 0,
  /// auto_row_blocks() of its output's bytes.
  int64_t blocks_for(const Tensor& local) const;
  bool sequence_parallel() const { return sequence_parallel_; }
  std::string extra_repr() const override;
  /// weight along its input dimension; the bias replicated.
  std::map<std::string, ShardSpec> shard_specs() const override;

  const Tensor& weight() const { return *weight_; }     ///< this rank's shard, in the serial layout
  const Tensor& bias() const { return *bias_; }         ///< replicated on every rank of the group
  int64_t in_features() const { return in_features_; }  ///< the whole layer's
  int64_t out_features() const { return out_features_; }
  int64_t in_features_per_rank() const { return in_features_ / group_->size(); }

 private:
  Tensor forward_in_row_blocks(const Tensor& local, int64_t blocks);
  /// This rank's slice of the input's features (x itself when input_is_parallel), checked.
  Tensor local_input(const Tensor& x) const;
  /// The weight shard as [out, in], a view either way it is held.
  Tensor weight_out_in() const;

  std::shared_ptr<comm::ProcessGroup> group_;
  WeightLayout layout_;
  bool input_is_parallel_;
  bool sequence_parallel_ = false;
  std::shared_ptr<const SequenceShard> shard_;
  int64_t row_blocks_ = 1;  // 0: auto
  int64_t in_features_, out_features_;
  Tensor* weight_;
  Tensor* bias_;
};

/// parallel.tensor.row_blocks = 0: a row layer whose output (in the dtype its GEMM writes) is this
/// many bytes or more runs in 2 blocks, a smaller one in 1. Measured on 2 H100s beside the copy
/// engines' sums (docs/benchmarks.md, session 23): GPT 1.3B's 32 MiB outputs gained 1.4 ms a step
/// from 2 blocks (3 and 4 gained nothing), GPT-2 350M's 16 MiB lost 1.1 ms: below this the second
/// all-reduce's fixed cost outweighs the GEMM it hides under.
inline constexpr int64_t kAutoRowBlocksBytes = int64_t{32} << 20;
int64_t auto_row_blocks(int64_t output_bytes);

/// How a per-parameter plan (gpt2_plan.h, vit_plan.h) wants one linear layer.
struct LinearSplit {
  config::TensorSplit split = config::TensorSplit::kReplicate;
  /// A column layer's output gathered whole (before a layer that wants it whole).
  bool gather_output = false;
  /// A column layer's output features in the order the ranks' parts concatenate to (whole heads).
  std::vector<int64_t> order;
  bool sequence_parallel = false;
  std::shared_ptr<const SequenceShard> shard;
};

/// The serial layer as `how` makes it: a ColumnParallelLinear (output features split), a
/// RowParallelLinear (input features split, the input this rank's part) or a replicated copy of its
/// own. Throws for "vocab", which no linear layer takes (the plans' checks say so first).
std::shared_ptr<nn::Module> split_linear(const nn::Linear& serial, const std::shared_ptr<comm::ProcessGroup>& group,
                                         LinearSplit how);
std::shared_ptr<nn::Module> split_linear(const nn::Conv1D& serial, const std::shared_ptr<comm::ProcessGroup>& group,
                                         LinearSplit how);

/// Sets parallel.tensor.row_blocks on every RowParallelLinear in `model` (at any depth).
void set_row_blocks(nn::Module& model, int64_t blocks);

}  // namespace colossal::parallel::tp
