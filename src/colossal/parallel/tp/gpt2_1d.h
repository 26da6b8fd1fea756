// GPT-2's transformer block split Megatron-style over the tensor-parallel group, built from a serial
// nn::models::GPT2Block: attention with whole heads per rank (the fused c_attn's q, k and v columns
// of this rank's heads, a column-parallel layer, then the row-parallel c_proj), and the MLP as a
// column-parallel c_fc followed by a row-parallel c_proj. The layer norms are replicated. Two
// all-reduces forward (one per sub-layer) and two backward, as in Megatron-LM.
//
// Dropout follows Megatron's RNG tracker (random.h): the attention probabilities (this rank's
// heads) draw from the tensor-parallel generator, the embeddings' and the residual branches'
// dropout (replicated activations, after the row-parallel all-reduce) from the data generator.
//
// Sequence parallelism (Megatron's sequence_parallel, ParallelGPT2Options): between the
// tensor-parallel regions each rank holds its shard of the sequence [B, T/tp, C] instead of the
// whole replicated activation, so the layer norms, the residual adds and the dropouts there work on
// 1/tp of the tokens. Each column-parallel layer all-gathers its input along the sequence
// (gather_from_sequence_region) and each row-parallel layer reduce-scatters its output
// (reduce_scatter_to_sequence_region) in place of the all-reduce: the same bytes on the wire, 1/tp
// of the activation memory outside the regions. The layer norms' and the row-parallel biases'
// gradients are summed over the group (layer_norm_sp.h); the dropouts on sequence shards draw from
// the tensor-parallel generator. Sequences must split: T % tp == 0.
//
// Other layouts (ParallelGPT2Options::plan, gpt2_plan.h): each linear layer column-split,
// row-split or replicated, wte split by vocabulary rows or along the embedding dimension or
// replicated, wpe split along the embedding dimension or replicated, as per-parameter sharding
// specs (parallel.tensor.specs) ask. Where a split activation meets a layer that needs it whole
// (a column-split c_attn before a column-split or replicated c_proj), the parts are gathered
// (gather_from_region). Sequence parallelism takes the built-in plan only.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <vector>

#include "colossal/comm/process_group.h"
#include "colossal/core/random.h"
#include "colossal/nn/dropout.h"
#include "colossal/nn/layer_norm.h"
#include "colossal/nn/models/gpt2.h"
#include "colossal/nn/module.h"
#include "colossal/parallel/tp/embedding_1d.h"
#include "colossal/parallel/tp/gpt2_plan.h"
#include "colossal/parallel/tp/linear_1d.h"
#include "colossal/parallel/tp/random.h"

namespace colossal::parallel::tp {

struct ParallelGPT2Options {
  /// Where dropout draws its masks (random.h).
  DropoutGenerators dropout;
  /// Megatron's sequence parallelism (parallel.tensor.sequence_parallel): activations outside the
  /// tensor-parallel regions split along the sequence, see the file's head.
  bool sequence_parallel = false;
  /// How each layer splits (gpt2_plan.h); empty: the built-in policy (Gpt2Plan::megatron).
  std::optional<Gpt2Plan> plan;
  /// parallel.tensor.overlap_chunks: ParallelGPT2's blocks run the batch as this many chunks, each
  /// chunk's all-reduces under another's GEMMs (Note [Overlapped tensor-parallel blocks]); 1: off.
  /// Used with row-parallel c_proj layers (the built-in policy) and neither sequence parallelism nor
  /// activation checkpointing; otherwise the blocks run whole.
  int overlap_chunks = 1;
  /// The blocks' residual adds and c_proj biases folded into the row-parallel c_proj GEMMs
  /// (RowParallelLinear::forward_add; parallel.tensor.fused_residual, on by default in `colossal train`): where
  /// c_proj is row-parallel without sequence parallelism (row blocks too) and its dropout draws nothing
  /// (p = 0, or evaluation); elsewhere the block adds as usual.
  bool fused_residual = false;
  /// Set by ParallelGPT2 for its layers (leave it empty): the dimension sequence parallelism splits
  /// the activations along in the current forward (Note [Token shards] in gpt2_1d.cpp).
  std::shared_ptr<SequenceShard> sequence_shard;
};

/// GPT-2 attention with n_head / tp heads on each rank (c_attn column-split; all heads on every
/// rank when it is replicated).
class ParallelGPT2Attention : public nn::Module {
 public:
  /// Throws naming both when n_head does not divide by the group's size. `plan`: c_attn's and
  /// c_proj's splits (checked by check_gpt2_plan).
  ParallelGPT2Attention(const nn::models::GPT2Attention& serial, const nn::models::GPT2Config& config,
                        std::shared_ptr<comm::ProcessGroup> group, const ParallelGPT2Options& options = {},
                        const Gpt2BlockPlan& plan = {});
  /// x [B, T, n_embd], the same on every rank -> [B, T, n_embd], the same on every rank; under
  /// sequence parallelism this rank's [B, T/tp, n_embd] in and out.
  Tensor forward(const Tensor& x) override;
  /// forward in two halves (Note [Overlapped tensor-parallel blocks]): start leaves c_proj's
  /// all-reduce running, finish waits for it and adds the bias and the dropout. Needs a row-parallel
  /// c_proj without sequence parallelism (splittable()).
  PendingSum start(const Tensor& x);
  Tensor finish(PendingSum pending);
  bool splittable() const;
  /// residual + forward(x) with the residual added in c_proj's GEMM, where fuses_residual():
  /// a row-parallel c_proj that can (RowParallelLinear::fuses_residual), its input not gathered,
  /// and a dropout that draws nothing now.
  Tensor forward_add(const Tensor& x, const Tensor& residual);
  bool fuses_residual() const;

  /// The columns of the serial c_attn ([n_embd, 3 n_embd]: q, then k, then v, each head's n_embd /
  /// n_head columns in head order) that rank `rank` of `size` holds, in its order: its heads' q, then
  /// their k, then their v, the layout multihead_attention reads.
  static std::vector<int64_t> qkv_columns(int64_t n_embd, int64_t n_head, int rank, int size);

  /// The layers as the plan made them: the typed ones null where the plan chose another split.
  std::shared_ptr<ColumnParallelLinear> c_attn() const {
    return std::dynamic_pointer_cast<ColumnParallelLinear>(c_attn_);
  }
  std::shared_ptr<RowParallelLinear> c_proj() const { return std::dynamic_pointer_cast<RowParallelLinear>(c_proj_); }
  /// Where the attention probabilities' dropout draws (the tensor-parallel generator when the heads
  /// are split, the data generator when every rank holds them all).
  core::Generator* attn_dropout_generator() const { return attn_dropout_generator_; }

 private:
  /// This rank's heads' attention of x (c_attn, then the fused attention), before c_proj.
  Tensor heads(const Tensor& x);

  std::shared_ptr<comm::ProcessGroup> group_;
  int64_t local_heads_;
  bool gather_heads_;  ///< c_attn split by heads, c_proj wanting its whole input
  double attn_dropout_;
  core::Generator* attn_dropout_generator_;
  std::shared_ptr<nn::Module> c_attn_;
  std::shared_ptr<nn::Module> c_proj_;
  std::shared_ptr<nn::Dropout> resid_dropout_;
};

/// GPT-2's MLP: c_fc column-parallel, tanh GELU on this rank's 4 n_embd / tp hidden features, c_proj
/// row-parallel.
class ParallelGPT2MLP : public nn::Module {
 public:
  ParallelGPT2MLP(const nn::models::GPT2MLP& serial, const nn::models::GPT2Config& config,
                  std::shared_ptr<comm::ProcessGroup> group, const ParallelGPT2Options& options = {},
                  const Gpt2BlockPlan& plan = {});
  Tensor forward(const Tensor& x) override;
  /// As ParallelGPT2Attention's.
  PendingSum start(const Tensor& x);
  Tensor finish(PendingSum pending);
  bool splittable() const;
  Tensor forward_add(const Tensor& x, const Tensor& residual);
  bool fuses_residual() const;

  std::shared_ptr<ColumnParallelLinear> c_fc() const { return std::dynamic_pointer_cast<ColumnParallelLinear>(c_fc_); }
  std::shared_ptr<RowParallelLinear> c_proj() const { return std::dynamic_pointer_cast<RowParallelLinear>(c_proj_); }

 private:
  /// gelu(c_fc(x)) on this rank's hidden features, before any gather and c_proj.
  Tensor activated(const Tensor& x);

  std::shared_ptr<comm::ProcessGroup> group_;
  bool gather_hidden_;  ///< c_fc column-split, c_proj wanting its whole input
  std::shared_ptr<nn::Module> c_fc_;
  std::shared_ptr<nn::Module> c_proj_;
  std::shared_ptr<nn::Dropout> dropout_;
};

/// x + attn(ln_1(x)), then + mlp(ln_2(.)), with the serial block's parameter names. Checkpointed
/// as the serial block is (its checkpoint_activations): recomputed in backward while training,
/// both dropout generators rewound so every rank draws its forward masks again, and the block's
/// all-reduces (or, under sequence parallelism, all-gathers and reduce-scatters) issued again
/// inside backward, in the same order on every rank of the group since every rank runs the same
/// graph (Megatron's recompute).
class ParallelGPT2Block : public nn::Module {
 public:
  ParallelGPT2Block(const nn::models::GPT2Block& serial, const nn::models::GPT2Config& config,
                    std::shared_ptr<comm::ProcessGroup> group, const ParallelGPT2Options& options = {},
                    const Gpt2BlockPlan& plan = {});
  Tensor forward(const Tensor& x) override;
  /// forward in four steps for ParallelGPT2's overlapped chunks: x -> attn's running sum, then the
  /// residual h = x + attn, then mlp's running sum, then h + mlp.
  PendingSum attn_start(const Tensor& x);
  Tensor attn_finish(const Tensor& x, PendingSum pending);
  PendingSum mlp_start(const Tensor& h);
  Tensor mlp_finish(const Tensor& h, PendingSum pending);
  /// Whether the four steps apply (row-parallel c_proj layers, no sequence parallelism, no
  /// checkpointing).
  bool splittable() const;

  bool checkpoint_activations() const { return checkpoint_activations_; }
  void set_checkpoint_activations(bool on) { checkpoint_activations_ = on; }

  const std::shared_ptr<nn::LayerNorm>& ln_1() const { return ln_1_; }
  const std::shared_ptr<ParallelGPT2Attention>& attn() const { return attn_; }
  const std::shared_ptr<nn::LayerNorm>& ln_2() const { return ln_2_; }
  const std::shared_ptr<ParallelGPT2MLP>& mlp() const { return mlp_; }

 private:
  std::shared_ptr<nn::LayerNorm> ln_1_;
  std::shared_ptr<ParallelGPT2Attention> attn_;
  std::shared_ptr<nn::LayerNorm> ln_2_;
  std::shared_ptr<ParallelGPT2MLP> mlp_;
  DropoutGenerators dropout_;
  bool checkpoint_activations_;
  bool fused_residual_;  ///< ParallelGPT2Options::fused_residual

  Tensor forward_block(const Tensor& x);
};

/// The whole GPT-2 language model over the tensor-parallel group, built from a serial GPT2: the tied
/// wte split by vocabulary rows (VocabParallelEmbedding) serving both the lookup and the head, wpe
/// and the final layer norm replicated, every block a ParallelGPT2Block. forward() returns this
/// rank's slice of the logits [B, T, V/tp] (its vocabulary rows); loss() is the vocab-parallel
/// cross-entropy of them, so no rank ever holds the whole vocabulary's logits. Under another plan
/// (options.plan) with wte split along the embedding dimension or replicated, the logits are whole
/// on every rank and loss() is the serial one.
class ParallelGPT2 : public nn::Module {
 public:
  /// Throws naming both when the heads do not split over the group; a vocabulary that does not is
  /// padded (VocabParallelEmbedding), its padding never a target and left out of loss().
  /// Dropout draws from `options.dropout` as the file's head says. A plan the layers cannot compute
  /// is an error naming the parameter (check_gpt2_plan), as is sequence parallelism with a plan
  /// other than the built-in one.
  ParallelGPT2(nn::models::GPT2& serial, std::shared_ptr<comm::ProcessGroup> group, ParallelGPT2Options options = {});
  /// ids [B, T] -> this rank's logits [B, T, V'/tp] (V' the vocabulary padded to a multiple of tp;
  /// the padding's logits are zero and loss() leaves them out) (every position, also under sequence
  /// parallelism; there B or T must divide by the group's size, an error naming both otherwise).
  Tensor forward(const Tensor& ids) override;
  /// The mean next-token loss of forward()'s logits against targets [B, T] (as
  /// nn::models::lm_cross_entropy on the gathered logits), the same on every rank.
  Tensor loss(const Tensor& logits, const Tensor& targets, int64_t ignore_index = -100);
  /// Every block's activation checkpointing on or off (built as the serial model's blocks are).
  void set_checkpoint_activations(bool on);

  /// Whether forward()'s logits are whole on every rank (wte not split by vocabulary): then top-k
  /// accuracy and the serial criterion apply to them.
  bool logits_whole() const { return plan_.logits_whole(); }
  const Gpt2Plan& plan() const { return plan_; }

  /// wte as a VocabParallelEmbedding; null under a plan that splits it otherwise.
  std::shared_ptr<VocabParallelEmbedding> wte() const {
    return std::dynamic_pointer_cast<VocabParallelEmbedding>(wte_);
  }
  /// wpe replicated (the built-in policy); null under a plan that splits it.
  std::shared_ptr<nn::Embedding> wpe() const { return std::dynamic_pointer_cast<nn::Embedding>(wpe_); }
  const std::shared_ptr<nn::ModuleList>& h() const { return h_; }
  const std::shared_ptr<nn::LayerNorm>& ln_f() const { return ln_f_; }

 private:
  std::shared_ptr<comm::ProcessGroup> group_;
  std::shared_ptr<SequenceShard> shard_;  // what sequence parallelism splits (Note [Token shards])
  bool sequence_parallel_;
  int overlap_chunks_;
  Gpt2Plan plan_;
  std::shared_ptr<nn::Module> wte_;
  std::shared_ptr<nn::Module> wpe_;
  int64_t n_positions_;
  std::shared_ptr<nn::Dropout> drop_;
  std::shared_ptr<nn::ModuleList> h_;
  std::shared_ptr<nn::LayerNorm> ln_f_;

  /// The blocks over `overlap_chunks_` chunks of the batch (Note [Overlapped tensor-parallel blocks]).
  Tensor blocks_in_chunks(const Tensor& hidden);
};

}  // namespace colossal::parallel::tp
