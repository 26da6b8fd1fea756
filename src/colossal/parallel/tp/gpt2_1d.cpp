// GPT-2's block split over the tensor-parallel group: see gpt2_1d.h.
#include "colossal/parallel/tp/gpt2_1d.h"

#include <utility>

#include "colossal/autograd/checkpoint.h"  // checkpoint
#include "colossal/autograd/grad_mode.h"   // NoGradGuard
#include "colossal/core/error.h"
#include "colossal/nn/attention.h"  // multihead_attention
#include "colossal/ops/elementwise.h"
#include "colossal/ops/indexing.h"  // index_select
#include "colossal/ops/linalg.h"    // linear
#include "colossal/parallel/tp/cross_entropy.h"
#include "colossal/parallel/tp/heads.h"
#include "colossal/parallel/tp/layer_norm_sp.h"
#include "colossal/parallel/tp/mappings.h"
#include "colossal/parallel/tp/replicated.h"

namespace colossal::parallel::tp {
namespace {

/// A replicated copy of a serial layer norm (its own parameters, the same values); under sequence
/// parallelism one that works on sequence shards.
std::shared_ptr<nn::LayerNorm> copy_of(const nn::LayerNorm& serial, int64_t width,
                                       const std::shared_ptr<comm::ProcessGroup>& group,
                                       const ParallelGPT2Options& options) {
  if (options.sequence_parallel) return std::make_shared<SequenceParallelLayerNorm>(serial, group);
  auto ln = std::make_shared<nn::LayerNorm>(width, serial.eps());
  autograd::NoGradGuard no_grad;
  ln->to(serial.weight().device());  // where the serial model lives (the GPU in a training run)
  ln->to(serial.weight().dtype());
  ln->weight().copy_(serial.weight());
  ln->bias().copy_(serial.bias());
  return ln;
}

/// The generator of dropout on what lies between the tensor-parallel regions: replicated (the data
/// generator), or sequence shards under sequence parallelism (the tensor-parallel one).
core::Generator* outside_generator(const ParallelGPT2Options& options) {
  return options.sequence_parallel ? options.dropout.tensor_or_data() : options.dropout.data;
}

/// A linear layer of the serial model as `split` makes it (split_linear), with the options' sequence parallelism.
std::shared_ptr<nn::Module> linear_for(const nn::Conv1D& serial, TensorSplit split,
                                       const std::shared_ptr<comm::ProcessGroup>& group,
                                       const ParallelGPT2Options& options, bool gather_output,
                                       std::vector<int64_t> order = {}) {
  return split_linear(serial, group,
                      {.split = split,
                       .gather_output = gather_output,
                       .order = std::move(order),
                       .sequence_parallel = options.sequence_parallel,
                       .shard = options.sequence_shard});
}

/// An embedding of the serial model as `split` makes it (kColumn: along the embedding dimension).
std::shared_ptr<nn::Module> embedding_for(const nn::Embedding& serial, TensorSplit split,
                                          const std::shared_ptr<comm::ProcessGroup>& group) {
  switch (split) {
    case TensorSplit::kVocab:
      return VocabParallelEmbedding::from(serial, group);
    case TensorSplit::kColumn:
      return ColumnParallelEmbedding::from(serial, group);
    case TensorSplit::kReplicate: {
      core::Generator scratch(0);
      return replicated_copy(serial, std::make_shared<nn::Embedding>(serial.num_embeddings(), serial.embedding_dim(),
                                                                     std::nullopt, &scratch));
    }
    case TensorSplit::kRow:
      break;
  }
  COLOSSAL_FAIL("tensor-parallel GPT-2: an embedding cannot take spec \"row\" (check_gpt2_plan)");
}

/// Whether a sublayer's c_proj can take the block's residual into its GEMM (Note [A row-parallel
/// layer's residual in its GEMM]): row-parallel and able to, its input not gathered first, and the
/// dropout after it drawing nothing now (p = 0, or evaluation).
bool takes_residual(const RowParallelLinear* proj, bool gathered_input, const nn::Dropout& dropout) {
  return proj != nullptr && proj->fuses_residual() && !gathered_input && (dropout.p() == 0.0 || !dropout.is_training());
}

}  // namespace

std::vector<int64_t> ParallelGPT2Attention::qkv_columns(int64_t n_embd, int64_t n_head, int rank, int size) {
  return head_qkv_columns(n_embd, n_head, rank, size, "n_head");
}

ParallelGPT2Attention::ParallelGPT2Attention(const nn::models::GPT2Attention& serial,
                                             const nn::models::GPT2Config& config,
                                             std::shared_ptr<comm::ProcessGroup> group,
                                             const ParallelGPT2Options& options, const Gpt2BlockPlan& plan)
    : Module("ParallelGPT2Attention"),
      group_(std::move(group)),
      local_heads_(plan.c_attn == TensorSplit::kColumn ? config.n_head / group_->size() : config.n_head),
      gather_heads_(plan.c_attn == TensorSplit::kColumn && plan.attn_c_proj != TensorSplit::kRow),
      attn_dropout_(config.dropout),
      // Split heads draw masks of their own; whole heads, the same on every rank, the data's.
      attn_dropout_generator_(plan.c_attn == TensorSplit::kColumn ? options.dropout.tensor_or_data()
                                                                  : options.dropout.data) {
  // c_attn's output columns in the order that gives each rank's contiguous part its heads' q, k and v.
  std::vector<int64_t> order;
  if (plan.c_attn == TensorSplit::kColumn)
    order = head_qkv_order(config.n_embd, config.n_head, group_->size(), "n_head");
  c_attn_ = register_module("c_attn", linear_for(*serial.c_attn(), plan.c_attn, group_, options,
                                                 /*gather_output=*/false, std::move(order)));
  // The heads' outputs are concatenated in head order, so a row-split c_proj's input rows split as
  // the heads do; a column-split c_proj takes them gathered and gathers its own output.
  c_proj_ = register_module("c_proj", linear_for(*serial.c_proj(), plan.attn_c_proj, group_, options,
                                                 /*gather_output=*/true));
  // After c_proj every rank holds the whole output: the same mask on every rank (under sequence
  // parallelism its own shard after the reduce-scatter: masks of its own).
  resid_dropout_ =
      register_module("resid_dropout", std::make_shared<nn::Dropout>(config.dropout, outside_generator(options)));
}

Tensor ParallelGPT2Attention::heads(const Tensor& x) {
  return nn::multihead_attention(c_attn_->forward(x), local_heads_, /*causal=*/true, attn_dropout_, is_training(),
                                 attn_dropout_generator_);
}

Tensor ParallelGPT2Attention::forward(const Tensor& x) {
  Tensor attended = heads(x);
  if (gather_heads_) attended = gather_from_region(attended, -1, *group_);
  return resid_dropout_->forward(c_proj_->forward(attended));
}

bool ParallelGPT2Attention::fuses_residual() const {
  return takes_residual(c_proj().get(), gather_heads_, *resid_dropout_);
}

Tensor ParallelGPT2Attention::forward_add(const Tensor& x, const Tensor& residual) {
  COLOSSAL_CHECK(fuses_residual(), "ParallelGPT2Attention::forward_add: c_proj cannot take the residual here");
  return c_proj()->forward_add(heads(x), residual);
}

bool ParallelGPT2Attention::splittable() const {
  const auto proj = c_proj();
  return proj != nullptr && !proj->sequence_parallel() && !gather_heads_;
}

PendingSum ParallelGPT2Attention::start(const Tensor& x) {
  COLOSSAL_CHECK(splittable(), "ParallelGPT2Attention::start needs a row-parallel c_proj without sequence parallelism");
  return c_proj()->start(heads(x));
}

Tensor ParallelGPT2Attention::finish(PendingSum pending) {
  return resid_dropout_->forward(c_proj()->finish(std::move(pending)));
}

ParallelGPT2MLP::ParallelGPT2MLP(const nn::models::GPT2MLP& serial, const nn::models::GPT2Config& config,
                                 std::shared_ptr<comm::ProcessGroup> group, const ParallelGPT2Options& options,
                                 const Gpt2BlockPlan& plan)
    : Module("ParallelGPT2MLP"),
      group_(std::move(group)),
      gather_hidden_(plan.c_fc == TensorSplit::kColumn && plan.mlp_c_proj != TensorSplit::kRow) {
  c_fc_ = register_module("c_fc", linear_for(*serial.c_fc(), plan.c_fc, group_, options, /*gather_output=*/false));
  c_proj_ =
      register_module("c_proj", linear_for(*serial.c_proj(), plan.mlp_c_proj, group_, options, /*gather_output=*/true));
  dropout_ = register_module("dropout", std::make_shared<nn::Dropout>(config.dropout, outside_generator(options)));
}

Tensor ParallelGPT2MLP::activated(const Tensor& x) {
  // GPT-2's gelu_new is the tanh approximation; elementwise, so it applies to each rank's features.
  // A column-parallel c_fc applies it in its GEMM's epilogue (ops::linear_gelu), as the serial MLP.
  const std::shared_ptr<ColumnParallelLinear> column = c_fc();
  return column ? column->forward_gelu(x) : ops::gelu(c_fc_->forward(x), ops::GeluApproximation::tanh);
}

Tensor ParallelGPT2MLP::forward(const Tensor& x) {
  Tensor hidden = activated(x);
  if (gather_hidden_) hidden = gather_from_region(hidden, -1, *group_);
  return dropout_->forward(c_proj_->forward(hidden));
}

bool ParallelGPT2MLP::fuses_residual() const {
  return takes_residual(c_proj().get(), gather_hidden_, *dropout_);
}

Tensor ParallelGPT2MLP::forward_add(const Tensor& x, const Tensor& residual) {
  COLOSSAL_CHECK(fuses_residual(), "ParallelGPT2MLP::forward_add: c_proj cannot take the residual here");
  return c_proj()->forward_add(activated(x), residual);
}

bool ParallelGPT2MLP::splittable() const {
  const auto proj = c_proj();
  return proj != nullptr && !proj->sequence_parallel() && !gather_hidden_;
}

PendingSum ParallelGPT2MLP::start(const Tensor& x) {
  COLOSSAL_CHECK(splittable(), "ParallelGPT2MLP::start needs a row-parallel c_proj without sequence parallelism");
  return c_proj()->start(activated(x));
}

Tensor ParallelGPT2MLP::finish(PendingSum pending) {
  return dropout_->forward(c_proj()->finish(std::move(pending)));
}

ParallelGPT2Block::ParallelGPT2Block(const nn::models::GPT2Block& serial, const nn::models::GPT2Config& config,
                                     std::shared_ptr<comm::ProcessGroup> group, const ParallelGPT2Options& options,
                                     const Gpt2BlockPlan& plan)
    : Module("ParallelGPT2Block"),
      dropout_(options.dropout),
      checkpoint_activations_(serial.checkpoint_activations()),
      fused_residual_(options.fused_residual) {
  ln_1_ = register_module("ln_1", copy_of(*serial.ln_1(), config.n_embd, group, options));
  attn_ =
      register_module("attn", std::make_shared<ParallelGPT2Attention>(*serial.attn(), config, group, options, plan));
  ln_2_ = register_module("ln_2", copy_of(*serial.ln_2(), config.n_embd, group, options));
  mlp_ = register_module("mlp", std::make_shared<ParallelGPT2MLP>(*serial.mlp(), config, group, options, plan));
}

Tensor ParallelGPT2Block::forward(const Tensor& x) {
  if (!checkpoint_activations_ || !is_training()) return forward_block(x);
  return autograd::checkpoint([this](const Tensor& in) { return forward_block(in); }, x,
                              {.generators = {dropout_.data, dropout_.tensor}});
}

bool ParallelGPT2Block::splittable() const {
  return !checkpoint_activations_ && attn_->splittable() && mlp_->splittable();
}

PendingSum ParallelGPT2Block::attn_start(const Tensor& x) {
  return attn_->start(ln_1_->forward(x));
}

Tensor ParallelGPT2Block::attn_finish(const Tensor& x, PendingSum pending) {
  return ops::add(x, attn_->finish(std::move(pending)));
}

PendingSum ParallelGPT2Block::mlp_start(const Tensor& h) {
  return mlp_->start(ln_2_->forward(h));
}

Tensor ParallelGPT2Block::mlp_finish(const Tensor& h, PendingSum pending) {
  return ops::add(h, mlp_->finish(std::move(pending)));
}

Tensor ParallelGPT2Block::forward_block(const Tensor& x) {
  if (fused_residual_ && attn_->fuses_residual() && mlp_->fuses_residual()) {
    // Note [A row-parallel layer's residual in its GEMM]
    const Tensor h = attn_->forward_add(ln_1_->forward(x), x);
    return mlp_->forward_add(ln_2_->forward(h), h);
  }
  const Tensor h = ops::add(x, attn_->forward(ln_1_->forward(x)));
  return ops::add(h, mlp_->forward(ln_2_->forward(h)));
}

ParallelGPT2::ParallelGPT2(nn::models::GPT2& serial, std::shared_ptr<comm::ProcessGroup> group,
                           ParallelGPT2Options options)
    : Module("ParallelGPT2"),
      group_(std::move(group)),
      shard_(std::make_shared<SequenceShard>()),
      sequence_parallel_(options.sequence_parallel),
      overlap_chunks_(options.overlap_chunks),
      plan_(options.plan ? *options.plan : Gpt2Plan::megatron(serial.config().n_layer)),
      n_positions_(serial.config().n_positions) {
  const nn::models::GPT2Config& config = serial.config();
  check_gpt2_plan(plan_, config, group_->size());
  COLOSSAL_CHECK(overlap_chunks_ >= 1,
                 "ParallelGPT2: overlap_chunks must be at least 1 (1: the blocks run whole), got {}", overlap_chunks_);
  COLOSSAL_CHECK(!sequence_parallel_ || plan_.is_megatron(),
                 "ParallelGPT2: sequence parallelism is built for the built-in plan (heads and MLP column then row, "
                 "wte by vocabulary, wpe replicated) only; drop parallel.tensor.specs or sequence_parallel");
  options.sequence_shard = shard_;  // the layers read what forward() decides (Note [Token shards])
  wte_ = register_module("wte", embedding_for(*serial.wte(), plan_.wte, group_));
  wpe_ = register_module("wpe", embedding_for(*serial.wpe(), plan_.wpe, group_));
  drop_ = register_module("drop", std::make_shared<nn::Dropout>(config.dropout, outside_generator(options)));
  h_ = register_module("h", std::make_shared<nn::ModuleList>());
  for (size_t i = 0; i < serial.h()->size(); ++i) {
    const auto block = std::dynamic_pointer_cast<nn::models::GPT2Block>((*serial.h())[i]);
    COLOSSAL_CHECK(block != nullptr, "ParallelGPT2: h.{} of the serial model is not a GPT2Block", i);
    h_->push_back(std::make_shared<ParallelGPT2Block>(*block, config, group_, options, plan_.blocks[i]));
  }
  ln_f_ = register_module("ln_f", copy_of(*serial.ln_f(), config.n_embd, group_, options));
}

void ParallelGPT2::set_checkpoint_activations(bool on) {
  for (size_t i = 0; i < h_->size(); ++i) h_->at<ParallelGPT2Block>(i)->set_checkpoint_activations(on);
}

Tensor ParallelGPT2::forward(const Tensor& ids) {
  COLOSSAL_CHECK(ids.dim() == 2, "ParallelGPT2: expected token ids [B, T], got shape {}", ids.shape());
  const int64_t tokens = ids.size(1);
  COLOSSAL_CHECK(tokens <= n_positions_, "ParallelGPT2: sequences of {} tokens exceed n_positions = {}", tokens,
                 n_positions_);
  const Tensor positions = core::arange(0.0, static_cast<double>(tokens), 1.0, TensorOptions(DType::i64, ids.device()));
  Tensor hidden;
  if (sequence_parallel_) {
    // Note [Token shards]
    shard_->batch = ids.size(0) % group_->size() == 0;
    COLOSSAL_CHECK(shard_->batch || tokens % group_->size() == 0,
                   "ParallelGPT2 with sequence parallelism: neither the batch (B = {}) nor the sequences (T = {} "
                   "tokens) split over parallel.tensor.size = {} ranks; choose data.batch_size or data.seq_len a "
                   "multiple of {}",
                   ids.size(0), tokens, group_->size(), group_->size());
    // Each rank keeps its shard of the tokens: the vocabulary's partial lookups reduce-scattered
    // (the constructor made wte vocabulary-parallel and wpe replicated), and the positions' rows
    // added to it: all of them to a batch shard (wpe's gradient, each rank's from its own
    // sequences, summed over the group), this rank's to a sequence shard.
    Tensor position_rows = wpe_->forward(positions);
    position_rows =
        shard_->batch ? copy_to_region(position_rows, *group_) : scatter_to_region(position_rows, 0, *group_);
    hidden = ops::add(wte()->forward_shard(ids, *shard_), position_rows);
  } else {
    hidden = ops::add(wte_->forward(ids), wpe_->forward(positions));
  }
  hidden = drop_->forward(hidden);
  bool chunked = overlap_chunks_ > 1 && !sequence_parallel_ && group_->size() > 1;
  for (size_t i = 0; chunked && i < h_->size(); ++i) chunked = h_->at<ParallelGPT2Block>(i)->splittable();
  if (chunked) {
    hidden = blocks_in_chunks(hidden);
  } else {
    for (const auto& block : *h_) hidden = (*block)(hidden);  // operator(): its hooks run (ZeRO-3's)
  }
  const Tensor normed = ln_f_->forward(hidden);
  if (auto vocab = std::dynamic_pointer_cast<VocabParallelEmbedding>(wte_)) {
    // The tied head: this rank's vocabulary rows times the hidden states of every position, whose
    // gradient is the sum of every rank's part (copy_to_region; under sequence parallelism the
    // all-gather of the shards, whose backward reduce-scatters that sum).
    // Without sequence parallelism that sum's all-reduce runs under the head's weight-gradient GEMM,
    // the step's largest (all_reduce_input_grad).
    if (!sequence_parallel_) return ops::linear(normed, vocab->weight(), Tensor(), all_reduce_input_grad(*group_));
    return ops::linear(gather_from_sequence_region(normed, shard_->dim(normed), *group_), vocab->weight());
  }
  if (auto columns = std::dynamic_pointer_cast<ColumnParallelEmbedding>(wte_)) return columns->head_logits(normed);
  return ops::linear(normed, std::dynamic_pointer_cast<nn::Embedding>(wte_)->weight());  // replicated
}

// Note [Token shards]
// Sequence parallelism keeps each rank's share of the tokens between the tensor-parallel regions, and
// all-gathers them before a region and reduce-scatters after it. Every op there (layer norm, dropout,
// the residual add) works token by token, so which tokens a rank holds is free as long as every layer
// agrees. Megatron's activations are [T, B, C] and it splits T, dim 0: each rank's share is one
// contiguous block, and the collectives read and write it in place. Ours are [B, T, C]: split along
// T, each share is B strided pieces, and every all-gather and reduce-scatter permuted it into a
// contiguous buffer and back (session 9: 141 ms a step for GPT 1.3B at tp=2 against 90 without
// sequence parallelism). So where B divides by the group's size ParallelGPT2 splits the batch
// instead, dim 0, contiguous as Megatron's; otherwise T. It decides at each forward from the
// batch's shape and tells its layers through one shared SequenceShard, which the linear layers read
// when they gather and reduce-scatter (the backward of each collective records its own dimension).

// Note [Overlapped tensor-parallel blocks]: each half of a Megatron block (attention, MLP) ends in
// the row-parallel c_proj's all-reduce, which the next op needs: run whole, the forward's 2L
// all-reduces sit on the critical path (GPT 1.3B at tp=2: 49 of [8, 1024, 2048] bf16, about 9 ms of a
// 90 ms step on H100s, docs/benchmarks.md). With the batch in chunks, each half-block is started for
// every chunk before any is finished: chunk 0's all-reduce runs on the communicator's stream while
// chunk 1's GEMMs run on the compute stream, and each wait (finish) comes one chunk's compute after
// its all-reduce was issued. The halves run in the order
//   attn_start(0) attn_start(1) | attn_finish(0) mlp_start(0) attn_finish(1) mlp_start(1) |
//   mlp_finish(0) [next block] attn_start(0) mlp_finish(1) attn_start(1) | ...
// so the last chunk's MLP sum also runs under the next block's first chunk. Every op sees the same
// rows as in the whole-batch run (the chunks split the batch dimension, which no op of a block mixes),
// so the values are the same up to the GEMMs' blocking; dropout draws its masks per chunk, in
// another order than the whole batch would (the same distribution). Backward needs nothing: autograd
// runs the chunks' nodes in reverse order of creation, and the column layers' input-gradient
// all-reduces already overlap their weight-gradient GEMMs.
Tensor ParallelGPT2::blocks_in_chunks(const Tensor& hidden) {
  if (h_->size() == 0) return hidden;
  const int64_t batch = hidden.size(0);
  COLOSSAL_CHECK(batch % overlap_chunks_ == 0,
                 "ParallelGPT2: parallel.tensor.overlap_chunks = {} does not divide the batch of {} sequences; use a "
                 "number of chunks that divides data.batch_size (per microbatch), or 1",
                 overlap_chunks_, batch);
  const int64_t rows = batch / overlap_chunks_;
  const auto n = static_cast<size_t>(overlap_chunks_);
  std::vector<Tensor> residual(n);
  std::vector<PendingSum> pending(n);
  for (size_t c = 0; c < n; ++c) residual[c] = hidden.narrow(0, static_cast<int64_t>(c) * rows, rows);
  for (size_t b = 0; b < h_->size(); ++b) {
    const auto block = h_->at<ParallelGPT2Block>(b);
    const auto previous = b > 0 ? h_->at<ParallelGPT2Block>(b - 1) : nullptr;
    for (size_t c = 0; c < n; ++c) {
      if (previous) residual[c] = previous->mlp_finish(residual[c], std::move(pending[c]));
      pending[c] = block->attn_start(residual[c]);
    }
    for (size_t c = 0; c < n; ++c) {
      residual[c] = block->attn_finish(residual[c], std::move(pending[c]));
      pending[c] = block->mlp_start(residual[c]);
    }
  }
  const auto last = h_->at<ParallelGPT2Block>(h_->size() - 1);
  for (size_t c = 0; c < n; ++c) residual[c] = last->mlp_finish(residual[c], std::move(pending[c]));
  return ops::cat(residual, 0);
}

Tensor ParallelGPT2::loss(const Tensor& logits, const Tensor& targets, int64_t ignore_index) {
  if (auto vocab = std::dynamic_pointer_cast<VocabParallelEmbedding>(wte_)) {
    // The vocabulary's padding to a multiple of the group's size (VocabParallelEmbedding) is no class.
    return vocab_parallel_cross_entropy(logits, targets, *group_, {.ignore_index = ignore_index},
                                        vocab->num_embeddings());
  }
  return nn::models::lm_cross_entropy(logits, targets, ignore_index);  // whole logits on every rank
}

}  // namespace colossal::parallel::tp
