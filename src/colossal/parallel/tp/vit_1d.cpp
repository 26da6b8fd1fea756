// The Vision Transformer split over the tensor-parallel group: see vit_1d.h.
#include "colossal/parallel/tp/vit_1d.h"

#include <utility>

#include "colossal/autograd/checkpoint.h"  // checkpoint
#include "colossal/autograd/grad_mode.h"   // NoGradGuard
#include "colossal/core/error.h"
#include "colossal/nn/attention.h"     // multihead_attention
#include "colossal/ops/elementwise.h"  // add
#include "colossal/ops/indexing.h"     // cat
#include "colossal/parallel/tp/heads.h"
#include "colossal/parallel/tp/layer_norm_sp.h"
#include "colossal/parallel/tp/mappings.h"
#include "colossal/parallel/tp/replicated.h"

namespace colossal::parallel::tp {
namespace {

/// A replicated copy of a serial layer norm; under sequence parallelism one that works on token shards.
std::shared_ptr<nn::LayerNorm> copy_of(const nn::LayerNorm& serial, int64_t width,
                                       const std::shared_ptr<comm::ProcessGroup>& group,
                                       const ParallelViTOptions& options) {
  if (options.sequence_parallel) return std::make_shared<SequenceParallelLayerNorm>(serial, group);
  return replicated_copy(serial, std::make_shared<nn::LayerNorm>(width, serial.eps()));
}

/// How a plan's `split` makes one of a block's linear layers. `gather_output`: a column-split layer's
/// output gathered whole (the second of a pair, proj and fc2; the first's parts go to the activation
/// and are gathered after it where needed); `order` gives a column-split qkv whole heads.
LinearSplit layer_split(TensorSplit split, const ParallelViTOptions& options, bool gather_output,
                        std::vector<int64_t> order = {}) {
  return {.split = split,
          .gather_output = gather_output,
          .order = std::move(order),
          .sequence_parallel = options.sequence_parallel,
          .shard = options.sequence_shard};
}

/// The generator of dropout and drop path between the tensor-parallel regions: the data's on whole
/// activations, the tensor-parallel one on token shards (each rank's tokens its own).
core::Generator* outside_generator(const ParallelViTOptions& options) {
  return options.sequence_parallel ? options.dropout.tensor_or_data() : options.dropout.data;
}

}  // namespace

ParallelViTAttention::ParallelViTAttention(const nn::MultiheadSelfAttention& serial,
                                           const nn::models::ViTConfig& config,
                                           std::shared_ptr<comm::ProcessGroup> group, const ParallelViTOptions& options,
                                           const VitBlockPlan& plan)
    : Module("ParallelViTAttention"),
      group_(std::move(group)),
      local_heads_(plan.attn_in == TensorSplit::kColumn ? config.num_heads / group_->size() : config.num_heads),
      gather_heads_(plan.attn_in == TensorSplit::kColumn && plan.attn_out != TensorSplit::kRow),
      attn_dropout_(config.attn_drop_rate),
      // Split heads draw masks of their own; whole heads, the same on every rank, the data's.
      attn_dropout_generator_(plan.attn_in == TensorSplit::kColumn ? options.dropout.tensor_or_data()
                                                                   : options.dropout.data) {
  // qkv's output features [3 C] (q, k, v in head order) reordered so rank r's part is its heads'.
  std::vector<int64_t> order;
  if (plan.attn_in == TensorSplit::kColumn)
    order = head_qkv_order(config.embed_dim, config.num_heads, group_->size(), "the ViT's num_heads");
  qkv_ = register_module("qkv",
                         split_linear(*serial.qkv(), group_,
                                      layer_split(plan.attn_in, options, /*gather_output=*/false, std::move(order))));
  // The heads' outputs concatenate in head order: a row-split proj's input features split as the heads
  // do; a column-split proj takes them gathered and gathers its own output.
  proj_ = register_module(
      "proj", split_linear(*serial.proj(), group_, layer_split(plan.attn_out, options, /*gather_output=*/true)));
  proj_drop_ =
      register_module("proj_drop", std::make_shared<nn::Dropout>(config.proj_drop_rate, outside_generator(options)));
}

Tensor ParallelViTAttention::forward(const Tensor& x) {
  Tensor attended = nn::multihead_attention(qkv_->forward(x), local_heads_, /*causal=*/false, attn_dropout_,
                                            is_training(), attn_dropout_generator_);
  if (gather_heads_) attended = gather_from_region(attended, -1, *group_);
  return proj_drop_->forward(proj_->forward(attended));
}

ParallelViTMLP::ParallelViTMLP(const nn::MLP& serial, const nn::models::ViTConfig& config,
                               std::shared_ptr<comm::ProcessGroup> group, const ParallelViTOptions& options,
                               const VitBlockPlan& plan)
    : Module("ParallelViTMLP"),
      group_(std::move(group)),
      gather_hidden_(plan.mlp_in == TensorSplit::kColumn && plan.mlp_out != TensorSplit::kRow) {
  fc1_ = register_module(
      "fc1", split_linear(*serial.fc1(), group_, layer_split(plan.mlp_in, options, /*gather_output=*/false)));
  // ViT's MLP takes the exact GELU (timm's nn.GELU); elementwise, so it applies to each rank's features.
  act_ = register_module("act", std::make_shared<nn::GELU>(ops::GeluApproximation::none));
  // On this rank's hidden features its own masks; on whole ones (fc1 replicated) the data's.
  drop1_ = register_module("drop1",
                           std::make_shared<nn::Dropout>(config.proj_drop_rate, plan.mlp_in == TensorSplit::kColumn
                                                                                    ? options.dropout.tensor_or_data()
                                                                                    : options.dropout.data));
  fc2_ = register_module(
      "fc2", split_linear(*serial.fc2(), group_, layer_split(plan.mlp_out, options, /*gather_output=*/true)));
  drop2_ = register_module("drop2", std::make_shared<nn::Dropout>(config.proj_drop_rate, outside_generator(options)));
}

Tensor ParallelViTMLP::forward(const Tensor& x) {
  Tensor hidden = drop1_->forward(act_->forward(fc1_->forward(x)));
  if (gather_hidden_) hidden = gather_from_region(hidden, -1, *group_);
  return drop2_->forward(fc2_->forward(hidden));
}

ParallelViTBlock::ParallelViTBlock(const nn::TransformerBlock& serial, const nn::models::ViTConfig& config,
                                   double drop_path, std::shared_ptr<comm::ProcessGroup> group,
                                   const ParallelViTOptions& options, const VitBlockPlan& plan)
    : Module("ParallelViTBlock"), dropout_(options.dropout), checkpoint_activations_(serial.checkpoint_activations()) {
  norm1_ = register_module("norm1", copy_of(*serial.norm1(), config.embed_dim, group, options));
  attn_ = register_module("attn", std::make_shared<ParallelViTAttention>(*serial.attn(), config, group, options, plan));
  drop_path1_ = register_module("drop_path1", std::make_shared<nn::DropPath>(drop_path, outside_generator(options)));
  norm2_ = register_module("norm2", copy_of(*serial.norm2(), config.embed_dim, group, options));
  mlp_ = register_module("mlp", std::make_shared<ParallelViTMLP>(*serial.mlp(), config, group, options, plan));
  drop_path2_ = register_module("drop_path2", std::make_shared<nn::DropPath>(drop_path, outside_generator(options)));
}

Tensor ParallelViTBlock::forward(const Tensor& x) {
  if (!checkpoint_activations_ || !is_training()) return forward_block(x);
  return autograd::checkpoint([this](const Tensor& in) { return forward_block(in); }, x,
                              {.generators = {dropout_.data, dropout_.tensor}});
}

Tensor ParallelViTBlock::forward_block(const Tensor& x) {
  const Tensor h = ops::add(x, drop_path1_->forward(attn_->forward(norm1_->forward(x))));
  return ops::add(h, drop_path2_->forward(mlp_->forward(norm2_->forward(h))));
}

ParallelViT::ParallelViT(const nn::models::VisionTransformer& serial, std::shared_ptr<comm::ProcessGroup> group,
                         ParallelViTOptions options)
    : Module("ParallelViT"),
      config_(serial.config()),
      group_(group),
      sequence_parallel_(options.sequence_parallel),
      shard_(std::make_shared<SequenceShard>()),
      plan_(options.plan ? *options.plan : VitPlan::megatron(config_.depth)) {
  COLOSSAL_CHECK(group != nullptr, "ParallelViT needs the tensor-parallel group");
  options.sequence_shard = shard_;  // the layers read what forward() decides (Note [Token shards])
  const nn::models::ViTConfig& c = config_;
  // Checked first, so a bad size is named as the heads rather than as a layer's features.
  if (plan_.is_megatron())
    head_qkv_columns(c.embed_dim, c.num_heads, group->rank(), group->size(), "the ViT's num_heads");
  check_vit_plan(plan_, c, group->size());
  COLOSSAL_CHECK(!sequence_parallel_ || plan_.is_megatron(),
                 "ParallelViT: sequence parallelism is built for the built-in plan (heads and MLP column then row) "
                 "only; drop parallel.tensor.specs or sequence_parallel");
  // The replicated layers are built, then overwritten with the serial values: their own initial
  // draws come from a scratch generator, not the global one.
  core::Generator scratch(0);
  {
    autograd::NoGradGuard no_grad;
    cls_token_ = &register_parameter("cls_token", serial.cls_token().detach().contiguous().clone());
    pos_embed_ = &register_parameter("pos_embed", serial.pos_embed().detach().contiguous().clone());
  }
  patch_embed_ = register_module(
      "patch_embed",
      replicated_copy(*serial.patch_embed(),
                      std::make_shared<nn::PatchEmbedding>(c.img_size, c.patch_size, c.in_chans, c.embed_dim,
                                                           serial.patch_embed()->proj()->bias().defined(), &scratch)));
  pos_drop_ = register_module("pos_drop", std::make_shared<nn::Dropout>(c.pos_drop_rate, options.dropout.data));
  blocks_ = register_module("blocks", std::make_shared<nn::ModuleList>());
  for (size_t i = 0; i < serial.blocks()->size(); ++i) {
    const auto block = std::dynamic_pointer_cast<nn::TransformerBlock>((*serial.blocks())[i]);
    COLOSSAL_CHECK(block != nullptr, "ParallelViT: blocks.{} of the serial model is not a TransformerBlock", i);
    const double drop_path = c.depth > 1 ? c.drop_path_rate * static_cast<double>(i) / static_cast<double>(c.depth - 1)
                                         : 0.0;  // as VisionTransformer
    COLOSSAL_CHECK(i < plan_.blocks.size(), "ParallelViT: the serial model has more blocks than config depth = {}",
                   c.depth);
    blocks_->push_back(std::make_shared<ParallelViTBlock>(*block, c, drop_path, group, options, plan_.blocks[i]));
  }
  norm_ = register_module("norm", copy_of(*serial.norm(), c.embed_dim, group, options));
  head_drop_ = register_module("head_drop", std::make_shared<nn::Dropout>(c.drop_rate, options.dropout.data));
  head_ = register_module(
      "head", replicated_copy(*serial.head(), std::make_shared<nn::Linear>(c.embed_dim, c.num_classes,
                                                                           serial.head()->bias().defined(), &scratch)));
}

void ParallelViT::set_checkpoint_activations(bool on) {
  config_.checkpoint_activations = on;
  for (size_t i = 0; i < blocks_->size(); ++i) blocks_->at<ParallelViTBlock>(i)->set_checkpoint_activations(on);
}

Tensor ParallelViT::forward(const Tensor& images) {
  // As VisionTransformer's embed and classify: whole activations between the blocks on every rank.
  const Tensor patches = patch_embed_->forward(images);  // [B, N, C]
  const Tensor cls = cls_token_->expand({patches.size(0), 1, cls_token_->size(2)});
  Tensor tokens = pos_drop_->forward(ops::add(ops::cat({cls, patches}, 1), *pos_embed_));
  const int64_t batch = tokens.size(0);
  if (sequence_parallel_) {
    // Note [Token shards] in gpt2_1d.cpp: this rank's share of the batch where it divides, else of the
    // tokens where they do, else of the batch padded with zero images' rows to a multiple of the
    // group's size (a test set's last batch, say: every op works per image, and the padding's outputs
    // are dropped before the head, so no gradient comes from them). The embedding before is
    // replicated: the split's backward all-gathers its gradient.
    const int64_t size = group_->size();
    shard_->batch = batch % size == 0 || tokens.size(1) % size != 0;
    if (batch % size != 0 && shard_->batch) {
      const int64_t padding = size - batch % size;
      tokens = ops::cat({tokens, core::zeros({padding, tokens.size(1), tokens.size(2)},
                                             TensorOptions(tokens.dtype(), tokens.device()))},
                        0);
    }
    tokens = scatter_to_region(tokens, shard_->dim(tokens), *group_);
  }
  for (const auto& block : *blocks_) tokens = (*block)(tokens);  // operator(): its hooks run (ZeRO-3's)
  Tensor normed = norm_->forward(tokens);
  if (sequence_parallel_) {
    // The shards gathered whole on every rank for the replicated head (the gather's backward keeps
    // this rank's share of the gradient, which every rank holds whole); any padding dropped.
    normed = gather_from_region(normed, shard_->dim(normed), *group_);
    if (normed.size(0) != batch) normed = normed.narrow(0, 0, batch);
  }
  return head_->forward(head_drop_->forward(normed.select(1, 0)));
}

}  // namespace colossal::parallel::tp
