// PipelineSchedule: the Engine's Schedule for pipeline parallelism. This rank is one stage of the
// pipeline group and holds its model chunks (parallel/pp/partition.h, Note [Pipeline parts]); a
// micro-step's batch is cut into microbatches, and the stage runs their forwards and backwards in
// the order of parallel/pp/schedule_order.h (1F1B, or interleaved 1F1B with several chunks),
// receiving activations from the previous stage and gradients from the next over the group.
//
// Note [Pipeline messages]
// Sends are asynchronous and kept until the micro-step ends; receives wait. Every send's receive is
// posted when the receiver reaches that op in its order, and the orders never wait on each other in
// a cycle (the whole-pipeline simulation in tests/parallel/pp shows it), so no stage blocks forever.
// Each activation travels after a small header with its dtype and shape (the next stage cannot know
// them otherwise: a last batch may be shorter); a gradient has its activation's shape and travels
// alone. Tags keep the kinds and microbatch-chunks apart under MPI. (NCCL matches by order and its
// sends wait for their receives: the GPU path will pair crossing sends and receives with
// batch_send_recv, as Megatron does; this schedule runs on MPI ranks today.)
//
// The loss is the last stage's: the mean of the microbatches' losses (each backward of loss / m, so
// the gradients are the whole batch's mean), summed over the group so that every stage reports it.
//
// Note [Gradient reduction under a pipeline]
// Each microbatch's backward adds to the stage's gradients; a gradient handler (data parallelism over
// the stage's replicas) must reduce each parameter once, after its last contribution. The schedule
// keeps the handler's sync off except during each chunk's last backward of a micro-step that ends the
// accumulation window, when that chunk's parameters receive their last contributions.
//
// Note [Tied parameters across stages]
// A weight two stages both use (GPT-2's wte: the embedding on the first stage, the output
// projection on the last; Note [Pipeline layers]) lives as a copy on each, equal at the start. Each
// copy's gradient is that stage's share; after the backwards of an accumulation window's last
// micro-step the schedule sums them over the stages that hold the weight (Megatron's embedding
// group), so every copy takes the same update and they stay equal. (Not yet with data parallelism
// on top: refused with a message.)
#pragma once

#include <memory>
#include <string_view>
#include <vector>

#include "colossal/comm/process_group.h"
#include "colossal/engine/schedule.h"
#include "colossal/nn/module.h"

namespace colossal::engine {

class PipelineSchedule final : public Schedule {
 public:
  /// `chunks`: this stage's model chunks in chunk order (all of them registered in the Engine's model,
  /// so that the optimizer and the gradient handler see their parameters); `group`: the pipeline
  /// group, rank r being stage r; `num_microbatches` >= 1 (a multiple of the group's size with more
  /// than one chunk). Every rank of the group must build one with the same numbers.
  PipelineSchedule(std::vector<std::shared_ptr<nn::Module>> chunks, std::shared_ptr<comm::ProcessGroup> group,
                   int64_t num_microbatches);

  /// Parameters this stage holds a copy of that other stages hold too, and the group of those
  /// stages (Note [Tied parameters across stages]): their gradients are summed over `tied_group`
  /// after each micro-step's backwards. Every stage of `tied_group` passes its copies in the same order.
  void set_tied_parameters(std::vector<Tensor> parameters, std::shared_ptr<comm::ProcessGroup> tied_group);

  /// The group of the stages whose `holds` is true (collective over `pipeline`: every stage calls it);
  /// null on the others.
  static std::shared_ptr<comm::ProcessGroup> tied_group(comm::ProcessGroup& pipeline, bool holds);

  std::string_view name() const override { return chunks_.size() > 1 ? "interleaved 1f1b" : "1f1b"; }
  /// The micro-step's batch (dim 0 a multiple of num_microbatches) through the pipeline; `input`
  /// matters on stage 0, `target` on the last stage. Returns the mean loss on every stage.
  Tensor forward_backward(Engine& engine, const Tensor& input, const Tensor& target) override;
  /// Evaluation: the batch forward through every stage as one microbatch (no activations kept), the
  /// last stage's output then broadcast over the group, so every stage computes the same loss and
  /// metrics (and rank 0, the first stage, logs them).
  Tensor evaluate(Engine& engine, const Tensor& input) override;

  /// Replaces the tied parameters' handles, same order and group (after mixed precision converted the
  /// model: handles taken before go stale, Note [Parameter slots]).
  void rebind_tied_parameters(std::vector<Tensor> parameters);

  /// This stage's copies of tied parameters (set_tied_parameters), and whether this stage is the one
  /// that counts them in the clipping norm (the first stage holding them; true without any).
  const std::vector<Tensor>& tied_parameters() const { return tied_; }
  bool counts_tied_parameters() const { return tied_group_ == nullptr || tied_group_->rank() == 0; }

  int stage() const { return group_->rank(); }
  int num_stages() const { return group_->size(); }
  int64_t num_microbatches() const { return num_microbatches_; }

 private:
  std::vector<std::shared_ptr<nn::Module>> chunks_;
  std::shared_ptr<comm::ProcessGroup> group_;
  int64_t num_microbatches_;
  std::vector<Tensor> tied_;
  std::shared_ptr<comm::ProcessGroup> tied_group_;
};

}  // namespace colossal::engine
