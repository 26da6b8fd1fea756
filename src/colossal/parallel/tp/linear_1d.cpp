// 1D tensor-parallel linear layers: see linear_1d.h.
#include "colossal/parallel/tp/linear_1d.h"

#include <fmt/format.h>

#include <functional>
#include <utility>
#include <vector>

#include "colossal/core/error.h"
#include "colossal/ops/autocast.h"     // autocast_dtype
#include "colossal/ops/elementwise.h"  // add
#include "colossal/ops/linalg.h"       // linear
#include "colossal/parallel/tp/mappings.h"
#include "colossal/parallel/tp/replicated.h"  // replicated_copy

namespace colossal::parallel::tp {
namespace {

/// Features along `dim` of a weight in `layout`: out is dim 0 of [out, in] and dim 1 of [in, out].
int out_dim(WeightLayout layout) {
  return layout == WeightLayout::kOutIn ? 0 : 1;
}
int in_dim(WeightLayout layout) {
  return layout == WeightLayout::kOutIn ? 1 : 0;
}

/// This rank's 1/size of `t` along `dim`, as a tensor of its own (a parameter, not a view of the
/// serial one).
Tensor shard(const Tensor& t, int dim, const comm::ProcessGroup& group, const char* layer, const char* what,
             const std::vector<int64_t>& order = {}) {
  const int64_t n = t.shape()[static_cast<size_t>(dim)];
  COLOSSAL_CHECK(n % group.size() == 0,
                 "{}: the {} ({} of them, dim {} of the weight of shape {}) do not split over the {} ranks of the "
                 "tensor-parallel group; choose a parallel.tensor.size that divides {}",
                 layer, what, n, dim, t.shape(), group.size(), n);
  return shard_of(t, ShardSpec::shard(dim, order), group.rank(), group.size());
}

/// y = x W^T or x W for a weight in `layout` (then GELU when `gelu`); `hook` sees the input's
/// gradient in backward.
Tensor affine(const Tensor& x, const Tensor& weight, const Tensor& bias, WeightLayout layout,
              ops::InputGradHook hook = {}, bool gelu = false) {
  const Tensor w = layout == WeightLayout::kOutIn ? weight : weight.t();
  return gelu ? ops::linear_gelu(x, w, bias, std::move(hook)) : ops::linear(x, w, bias, std::move(hook));
}

/// The dimension of activations [..., T, features] sequence parallelism splits: `shard`'s, or the
/// sequence's.
int64_t sequence_dim(const Tensor& x, const SequenceShard* shard) {
  COLOSSAL_CHECK(x.dim() >= 2, "sequence parallelism: activations must be [..., T, features], got shape {}", x.shape());
  return shard != nullptr ? shard->dim(x) : x.dim() - 2;
}

const char* layout_name(WeightLayout layout) {
  return layout == WeightLayout::kOutIn ? "[out, in]" : "[in, out]";
}

}  // namespace

// ---- column

ColumnParallelLinear::ColumnParallelLinear(const Tensor& weight, const Tensor& bias, WeightLayout layout,
                                           std::shared_ptr<comm::ProcessGroup> group, bool gather_output,
                                           std::vector<int64_t> order)
    : group_(std::move(group)), layout_(layout), gather_output_(gather_output), order_(std::move(order)) {
  COLOSSAL_CHECK(group_ != nullptr, "ColumnParallelLinear needs the tensor-parallel group");
  COLOSSAL_CHECK(weight.dim() == 2, "ColumnParallelLinear: the weight must be 2-D, got shape {}", weight.shape());
  out_features_ = weight.shape()[static_cast<size_t>(out_dim(layout))];
  in_features_ = weight.shape()[static_cast<size_t>(in_dim(layout))];
  COLOSSAL_CHECK(!bias.defined() || (bias.dim() == 1 && bias.shape()[0] == out_features_),
                 "ColumnParallelLinear: the bias of shape {} does not match {} output features", bias.shape(),
                 out_features_);
  COLOSSAL_CHECK(order_.empty() || static_cast<int64_t>(order_.size()) == out_features_,
                 "ColumnParallelLinear: an order of {} output features for a layer of {}", order_.size(),
                 out_features_);
  weight_ = &register_parameter(
      "weight", shard(weight, out_dim(layout), *group_, "ColumnParallelLinear", "output features", order_));
  bias_ = &register_parameter(
      "bias", bias.defined() ? shard(bias, 0, *group_, "ColumnParallelLinear", "output features", order_) : Tensor());
}

std::map<std::string, ShardSpec> ColumnParallelLinear::shard_specs() const {
  std::map<std::string, ShardSpec> specs = {{"weight", ShardSpec::shard(out_dim(layout_), order_)}};
  if (bias_->defined()) specs.emplace("bias", ShardSpec::shard(0, order_));
  return specs;
}

std::shared_ptr<ColumnParallelLinear> ColumnParallelLinear::from(const nn::Linear& serial,
                                                                 std::shared_ptr<comm::ProcessGroup> group,
                                                                 bool gather_output) {
  return std::make_shared<ColumnParallelLinear>(serial.weight(), serial.bias(), WeightLayout::kOutIn, std::move(group),
                                                gather_output);
}

std::shared_ptr<ColumnParallelLinear> ColumnParallelLinear::from(const nn::Conv1D& serial,
                                                                 std::shared_ptr<comm::ProcessGroup> group,
                                                                 bool gather_output) {
  return std::make_shared<ColumnParallelLinear>(serial.weight(), serial.bias(), WeightLayout::kInOut, std::move(group),
                                                gather_output);
}

Tensor ColumnParallelLinear::forward(const Tensor& x) {
  return gather_output_ ? gather_from_region(local_forward(x, /*gelu=*/false), -1, *group_)
                        : local_forward(x, /*gelu=*/false);
}

Tensor ColumnParallelLinear::forward_gelu(const Tensor& x) {
  COLOSSAL_CHECK(!gather_output_,
                 "ColumnParallelLinear::forward_gelu: the layer gathers its output; GELU applies to this rank's "
                 "features, before any gather");
  return local_forward(x, /*gelu=*/true);
}

Tensor ColumnParallelLinear::local_forward(const Tensor& x, bool gelu) {
  // Every rank needs the whole input; the input's gradient is the sum of every shard's part (under
  // sequence parallelism, each rank's sequence shard of that sum). Without sequence parallelism
  // that sum is copy_to_region's all-reduce folded into the linear op, overlapping the weight's
  // gradient GEMM (all_reduce_input_grad).
  if (sequence_parallel_) {
    return affine(gather_from_sequence_region(x, sequence_dim(x, shard_.get()), *group_), *weight_, *bias_, layout_, {},
                  gelu);
  }
  return affine(x, *weight_, *bias_, layout_, all_reduce_input_grad(*group_), gelu);
}

std::string ColumnParallelLinear::extra_repr() const {
  return fmt::format("in_features={}, out_features={} ({} on each of {} ranks), layout {}, gather_output={}{}",
                     in_features_, out_features_, out_features_per_rank(), group_->size(), layout_name(layout_),
                     gather_output_, sequence_parallel_ ? ", sequence_parallel" : "");
}

// ---- row

RowParallelLinear::RowParallelLinear(const Tensor& weight, const Tensor& bias, WeightLayout layout,
                                     std::shared_ptr<comm::ProcessGroup> group, bool input_is_parallel)
    : group_(std::move(group)), layout_(layout), input_is_parallel_(input_is_parallel) {
  COLOSSAL_CHECK(group_ != nullptr, "RowParallelLinear needs the tensor-parallel group");
  COLOSSAL_CHECK(weight.dim() == 2, "RowParallelLinear: the weight must be 2-D, got shape {}", weight.shape());
  out_features_ = weight.shape()[static_cast<size_t>(out_dim(layout))];
  in_features_ = weight.shape()[static_cast<size_t>(in_dim(layout))];
  COLOSSAL_CHECK(!bias.defined() || (bias.dim() == 1 && bias.shape()[0] == out_features_),
                 "RowParallelLinear: the bias of shape {} does not match {} output features", bias.shape(),
                 out_features_);
  weight_ =
      &register_parameter("weight", shard(weight, in_dim(layout), *group_, "RowParallelLinear", "input features"));
  bias_ = &register_parameter(
      "bias", bias.defined() ? shard_of(bias, ShardSpec::replicate(), group_->rank(), group_->size()) : Tensor());
}

std::map<std::string, ShardSpec> RowParallelLinear::shard_specs() const {
  return {{"weight", ShardSpec::shard(in_dim(layout_))}};  // the bias is replicated
}

std::shared_ptr<RowParallelLinear> RowParallelLinear::from(const nn::Linear& serial,
                                                           std::shared_ptr<comm::ProcessGroup> group,
                                                           bool input_is_parallel) {
  return std::make_shared<RowParallelLinear>(serial.weight(), serial.bias(), WeightLayout::kOutIn, std::move(group),
                                             input_is_parallel);
}

std::shared_ptr<RowParallelLinear> RowParallelLinear::from(const nn::Conv1D& serial,
                                                           std::shared_ptr<comm::ProcessGroup> group,
                                                           bool input_is_parallel) {
  return std::make_shared<RowParallelLinear>(serial.weight(), serial.bias(), WeightLayout::kInOut, std::move(group),
                                             input_is_parallel);
}

namespace {

/// split_linear for either serial layer type: its weight in `layout`, a fresh layer of its type for
/// the replicated copy.
template <class Serial>
std::shared_ptr<nn::Module> split_linear_of(const Serial& serial, WeightLayout layout,
                                            const std::shared_ptr<comm::ProcessGroup>& group, LinearSplit how,
                                            const std::function<std::shared_ptr<Serial>()>& fresh) {
  switch (how.split) {
    case config::TensorSplit::kColumn: {
      auto layer = std::make_shared<ColumnParallelLinear>(serial.weight(), serial.bias(), layout, group,
                                                          how.gather_output, std::move(how.order));
      layer->set_sequence_parallel(how.sequence_parallel, how.shard);
      return layer;
    }
    case config::TensorSplit::kRow: {
      auto layer = std::make_shared<RowParallelLinear>(serial.weight(), serial.bias(), layout, group,
                                                       /*input_is_parallel=*/true);
      layer->set_sequence_parallel(how.sequence_parallel, how.shard);
      return layer;
    }
    case config::TensorSplit::kReplicate:
      return replicated_copy(serial, fresh());
    case config::TensorSplit::kVocab:
      break;
  }
  COLOSSAL_FAIL("split_linear: a linear layer cannot take spec \"vocab\" (valid: \"column\", \"row\", \"replicate\")");
}

}  // namespace

std::shared_ptr<nn::Module> split_linear(const nn::Linear& serial, const std::shared_ptr<comm::ProcessGroup>& group,
                                         LinearSplit how) {
  return split_linear_of<nn::Linear>(serial, WeightLayout::kOutIn, group, std::move(how), [&serial] {
    core::Generator scratch(0);  // the fresh layer's draws, overwritten with the serial values
    return std::make_shared<nn::Linear>(serial.in_features(), serial.out_features(), serial.bias().defined(), &scratch);
  });
}

std::shared_ptr<nn::Module> split_linear(const nn::Conv1D& serial, const std::shared_ptr<comm::ProcessGroup>& group,
                                         LinearSplit how) {
  return split_linear_of<nn::Conv1D>(serial, WeightLayout::kInOut, group, std::move(how), [&serial] {
    core::Generator scratch(0);
    return std::make_shared<nn::Conv1D>(serial.in_features(), serial.out_features(), &scratch);
  });
}

PendingSum RowParallelLinear::start(const Tensor& x) {
  COLOSSAL_CHECK(!sequence_parallel_,
                 "RowParallelLinear::start: the split forward is built without sequence "
                 "parallelism (its output is a reduce-scatter, not an all-reduce)");
  const Tensor local = local_input(x);
  return reduce_from_region_async(affine(local, *weight_, Tensor(), layout_), *group_, /*consume_input=*/true);
}

Tensor RowParallelLinear::finish(PendingSum pending) {
  pending.done.wait();
  return bias_->defined() ? ops::add(pending.y, *bias_) : pending.y;
}

Tensor RowParallelLinear::forward(const Tensor& x) {
  const Tensor local = local_input(x);
  if (!sequence_parallel_ && group_->size() > 1) {
    if (const int64_t blocks = blocks_for(local); blocks > 1) return forward_in_row_blocks(local, blocks);
  }
  // The partial products sum over the group; the bias is added once, after the sum.
  const Tensor partial = affine(local, *weight_, Tensor(), layout_);
  if (sequence_parallel_) {
    const Tensor y = reduce_scatter_to_sequence_region(partial, sequence_dim(partial, shard_.get()), *group_);
    // Each rank adds the bias to its own rows: the bias's gradient is the sum of every rank's.
    return bias_->defined() ? ops::add(y, copy_to_region(*bias_, *group_)) : y;
  }
  Tensor y = reduce_from_region(partial, *group_, /*consume_input=*/true);
  return bias_->defined() ? ops::add(y, *bias_) : y;
}

namespace {

/// `gemms(on_block)` makes a row layer's output block by block, handing each finished block to
/// on_block: each is all-reduced at once, under the next block's GEMMs, and all are waited for
/// before the output is returned (Note [Row blocks of a linear's output] in ops/linalg.cpp). The sum
/// happens in place in the output, which the linear's backward does not read: the gradient flows
/// through as through reduce_from_region's identity backward.
template <class Gemms>
Tensor summed_by_block(comm::ProcessGroup& group, Gemms&& gemms) {
  std::vector<comm::Work> pending;
  const std::function<void(const Tensor&)> on_block = [&](const Tensor& block) {
    pending.push_back(group.all_reduce(block, comm::ReduceOp::sum, /*async=*/true));
  };
  Tensor y = gemms(on_block);
  for (comm::Work& work : pending) work.wait();
  return y;
}

}  // namespace

Tensor RowParallelLinear::forward_add(const Tensor& x, const Tensor& residual) {
  COLOSSAL_CHECK(fuses_residual(),
                 "RowParallelLinear::forward_add: the residual goes into the GEMM only without sequence "
                 "parallelism");
  // Under autocast the product is 16-bit while the residual stream stays f32 (the add promotes): folded
  // into the GEMM, the sum would come out 16-bit. So then, and for mixed dtypes, the adds stay apart.
  if (ops::autocast_dtype() || residual.dtype() != x.dtype()) return ops::add(residual, forward(x));
  const Tensor local = local_input(x);
  const int rank = group_->rank(), size = group_->size();
  if (const int64_t blocks = blocks_for(local); blocks > 1 && size > 1) {
    return summed_by_block(*group_, [&](const auto& on_block) {
      return ops::linear_add_part(local, weight_out_in(), *bias_, residual, rank, size, blocks, on_block);
    });
  }
  const Tensor partial = ops::linear_add_part(local, weight_out_in(), *bias_, residual, rank, size);
  return reduce_from_region(partial, *group_, /*consume_input=*/true);
}

void RowParallelLinear::set_row_blocks(int64_t blocks) {
  COLOSSAL_CHECK(blocks >= 0 && blocks <= 64,
                 "RowParallelLinear: parallel.tensor.row_blocks must be from 0 to 64 (1: one GEMM, then its "
                 "all-reduce; 0: chosen by the output's size), got {}",
                 blocks);
  row_blocks_ = blocks;
}

int64_t auto_row_blocks(int64_t output_bytes) {
  return output_bytes >= kAutoRowBlocksBytes ? 2 : 1;
}

int64_t RowParallelLinear::blocks_for(const Tensor& local) const {
  if (row_blocks_ > 0) return row_blocks_;
  // The GEMM writes the autocast dtype where autocast is on, else the input's.
  const DType dtype = ops::autocast_dtype().value_or(local.dtype());
  const int64_t rows = local.dim() == 0 ? 1 : local.numel() / std::max<int64_t>(1, local.shape().back());
  return auto_row_blocks(rows * out_features_ * static_cast<int64_t>(core::element_size(dtype)));
}

Tensor RowParallelLinear::forward_in_row_blocks(const Tensor& local, int64_t blocks) {
  const Tensor y = summed_by_block(*group_, [&](const auto& on_block) {
    return ops::linear_in_row_blocks(local, weight_out_in(), blocks, on_block);
  });
  return bias_->defined() ? ops::add(y, *bias_) : y;
}

Tensor RowParallelLinear::local_input(const Tensor& x) const {
  const Tensor local = input_is_parallel_ ? x : scatter_to_region(x, -1, *group_);
  COLOSSAL_CHECK(local.shape().back() == in_features_per_rank(),
                 "RowParallelLinear: this rank's input has {} features in its last dimension (shape {}), but its "
                 "shard takes {} of the layer's {}{}",
                 local.shape().back(), local.shape(), in_features_per_rank(), in_features_,
                 input_is_parallel_ ? " (input_is_parallel: pass the column layer's split output)" : "");
  return local;
}

Tensor RowParallelLinear::weight_out_in() const {
  return layout_ == WeightLayout::kOutIn ? *weight_ : weight_->t();
}

std::string RowParallelLinear::extra_repr() const {
  return fmt::format("in_features={} ({} on each of {} ranks), out_features={}, layout {}, input_is_parallel={}{}",
                     in_features_, in_features_per_rank(), group_->size(), out_features_, layout_name(layout_),
                     input_is_parallel_, sequence_parallel_ ? ", sequence_parallel" : "");
}

void set_row_blocks(nn::Module& model, int64_t blocks) {
  for (const auto& [name, module] : model.named_modules()) {
    if (auto* row = dynamic_cast<RowParallelLinear*>(module)) row->set_row_blocks(blocks);
  }
}

}  // namespace colossal::parallel::tp
