// PipelineSchedule: the Engine's Schedule for pipeline parallelism. This rank is one stage of the
// pipeline group and holds its model chunks (parallel/pp/partition.h, Note [Pipeline parts]); a
// micro-step's batch is cut into microbatches, and the stage runs their forwards and backwards in
// the order of parallel/pp/schedule_order.h (1F1B, or interleaved 1F1B with several chunks),
// receiving activations from the previous stage and gradients from the next over the group.
//
// Note [Pipeline messages]
// Activations go forward and gradients back in the batches of parallel/pp/exchange_plan.h (Note
// [Pipeline exchanges]): before each op (each forward-backward pair when interleaved) one
// batch_send_recv with the previous op's output and this op's input, the same sequences on both ends
// of every direction, so the exchange runs over NCCL (which matches by order and completes a send only
// once its receive is posted) as over MPI; a batch with a receive is waited for before its op, one of
// sends only at the end of the micro-step. Shapes: every stage is given the batch, whose shape keys
// the activation shapes the stage has learnt; the first time a shape comes, microbatch 0's
// activations travel after a header (dtype, shape; one host read each), and the rest allocate from
// what was learnt. Every exchange runs under an OperationContext naming the stage, the microbatches
// and the messages, so a peer that never comes ends the rank (the collective timeout) with them
// named. Tags carry each message's identity: MPI matches by them; the strict group
// (comm/strict_p2p_process_group.h), under which the tests run, checks both ends agree on them.
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
// group), so every copy takes the same update and they stay equal. Under data parallelism the
// gradient handler's reduction is finished first, then the stages' sum adds the averaged shares.
// Where the first stage only looks rows of the weight up (set_tied_rows), the sum runs under that
// stage's last backward instead: Note [Tied sum under the last backward] in pipeline_schedule.cpp.
// Note [Pipeline bubble]
// With timing on, a stage measures each micro-step: its span, from the start of the micro-step to the
// end of the loss's all-reduce that closes it (which waits for every stage, so every stage's span is
// the pipeline's), and its busy time, the sum of its forwards' and backwards' own times; the rest of
// the span it waited for its neighbours (the bubble, and any exchange that took longer than the
// compute it overlaps). Host clocks on the CPU; on a GPU, timing events on the compute stream around
// each op, recorded after the op's receives were waited for, so an op's time is its kernels' and not
// the wait. The bubble fraction idle / busy is comparable to the schedule's (p - 1) / (v m): in 1F1B
// every stage is busy m op pairs of the pipeline's m + p - 1 (engine/pipeline_report.h gathers and
// prints it).
#pragma once

#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string_view>
#include <utility>
#include <vector>

#include "colossal/comm/process_group.h"
#include "colossal/engine/schedule.h"
#include "colossal/nn/module.h"
#include "colossal/parallel/pp/exchange_plan.h"  // ExchangeBatch

namespace colossal::engine {

/// One stage's time over a micro-step (Note [Pipeline bubble]): from its start to the end of the
/// pipeline's closing all-reduce (span), and the part of it spent inside its forwards and backwards
/// (busy).
struct StageTiming {
  double span_ms = 0;
  double busy_ms = 0;
  /// Where the idle time fell: before the first op (lead), after the last one (tail), and between
  /// ops (the rest), with the median of the gaps between consecutive ops. In 1F1B the lead and the
  /// tail are the schedule's warm-up and cool-down waits; the gaps are the steady phase's, where
  /// each exchange and any host lag sit on the critical path.
  double lead_ms = 0;
  double tail_ms = 0;
  double median_gap_ms = 0;
  /// The op that took longest (its index in the stage's schedule order, -1 with none), its time, the
  /// median op's, and how long the host took to queue it: a long op the host queued as quickly as the
  /// others waited on the device, one the host took as long over was the host's delay.
  int64_t longest_op = -1;
  double longest_op_ms = 0;
  double median_op_ms = 0;
  double longest_op_host_ms = 0;
  double idle_ms() const { return span_ms - busy_ms; }
  double between_ms() const { return idle_ms() - lead_ms - tail_ms; }
};

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

  /// The rows of dim 0 of every tied parameter that the first stage's forward of one microbatch reads,
  /// from that microbatch's input (a 1-D integer tensor on the stage's device), where the first stage
  /// holding them is stage 0 and uses them only as a lookup table in one piece of its chunk 0 (GPT-2's
  /// wte, the embedding of the token ids): its backward then adds to those rows alone. With it, the
  /// stages' sum of the tied gradients runs under stage 0's last backward rather than after it, and
  /// only those rows follow (Note [Tied sum under the last backward]). Every stage of the tied group
  /// sets it alike; each stage's input must have the batch's shape.
  using TiedRows = std::function<Tensor(const Tensor& microbatch_input)>;
  void set_tied_rows(TiedRows rows) { tied_rows_ = std::move(rows); }

  /// The group of the stages whose `holds` is true (collective over `pipeline`: every stage calls it);
  /// null on the others; `pipeline` itself when every stage holds them.
  static std::shared_ptr<comm::ProcessGroup> tied_group(const std::shared_ptr<comm::ProcessGroup>& pipeline,
                                                        bool holds);

  /// For a pipeline of more than two stages: a group of each pair of neighbouring stages this stage is
  /// in (stage s with s - 1 and s + 1; with `ring`, the last stage with stage 0 too, which the
  /// interleaved schedule's chunks pass between), by the other stage, each of two ranks ordered by
  /// stage. Collective over `pipeline` (ncclCommSplit in two or three rounds). Empty for two stages
  /// or fewer: the pipeline group is the pair.
  static std::map<int, std::shared_ptr<comm::ProcessGroup>> neighbour_pairs(
      const std::shared_ptr<comm::ProcessGroup>& pipeline, bool ring);
  /// Messages between this stage and stage `stage` go over `pair` (a group of the two, ordered by
  /// stage, from neighbour_pairs) instead of the pipeline group: the copy engines' sends and receives
  /// of two GPUs (Note [Pair sends and receives by the copy engines]) between neighbouring stages of
  /// a longer pipeline. Both stages set it alike, before the first step.
  void set_neighbour_group(int stage, std::shared_ptr<comm::ProcessGroup> pair);

  std::string_view name() const override { return chunks_.size() > 1 ? "interleaved 1f1b" : "1f1b"; }
  /// The micro-step's batch (dim 0 a multiple of num_microbatches) through the pipeline; `input`'s
  /// values matter on stage 0 (its shape on every stage: Note [Pipeline messages]), `target` on the
  /// last stage. Returns the mean loss on every stage.
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

  /// Measures the micro-steps from now on (Note [Pipeline bubble]; on a GPU each then waits for its
  /// last op to finish on the device), or stops.
  void set_timing(bool on) { timing_ = on; }
  /// The last measured micro-step's timing on this stage.
  const StageTiming& last_timing() const { return last_timing_; }
  const std::shared_ptr<comm::ProcessGroup>& group() const { return group_; }
  int num_chunks() const { return static_cast<int>(chunks_.size()); }

  int stage() const { return group_->rank(); }
  int num_stages() const { return group_->size(); }
  int64_t num_microbatches() const { return num_microbatches_; }

 private:
  std::vector<std::shared_ptr<nn::Module>> chunks_;
  std::shared_ptr<comm::ProcessGroup> group_;
  /// The neighbours' own pair groups (set_neighbour_group), by their stage.
  std::map<int, std::shared_ptr<comm::ProcessGroup>> neighbours_;
  int64_t num_microbatches_;
  std::vector<Tensor> tied_;
  std::shared_ptr<comm::ProcessGroup> tied_group_;
  TiedRows tied_rows_;
  /// Stage 0's side of Note [Tied sum under the last backward]: a forward hook on the piece holding
  /// the tied parameters, armed for the last microbatch's forward, puts a wait for the stages' sum
  /// before that piece's backward. Shared with the hook.
  struct TiedWait {
    bool armed = false;   ///< the next forward of the piece is the window's last
    bool hooked = false;  ///< that forward's output carries the wait
    std::vector<comm::Work> sums;
  };
  std::shared_ptr<TiedWait> tied_wait_ = std::make_shared<TiedWait>();
  bool tied_piece_searched_ = false;
  /// Stage 0, at its first step with the sum under the backward: puts the hook on the piece of chunk 0
  /// that holds every tied parameter. Where no single piece does, the hook never fires, and the sum is
  /// waited for at the start of the last backward.
  void hook_tied_piece_once();
  bool timing_ = false;
  StageTiming last_timing_;
  /// The activation shapes each batch shape gave, by sending chunk (Note [Pipeline exchanges]).
  std::map<std::vector<int64_t>, std::map<int, std::pair<Shape, DType>>> shapes_;
  /// This stage's exchange batches (parallel/pp/exchange_plan.h), made once per (forward only,
  /// headers): they depend on nothing else that changes between steps, and each takes the
  /// neighbours' plans to make.
  const std::vector<parallel::pp::ExchangeBatch>& exchange_plan(bool forward_only, bool headers);
  std::map<std::pair<bool, bool>, std::vector<parallel::pp::ExchangeBatch>> plans_;
  /// The training plan without headers, each batch split into its sends and its receives, where every
  /// group this stage exchanges over lets receives go up early (Note [Receives posted one op ahead]);
  /// null where one does not. Made at the first step with known shapes, after which the groups are
  /// fixed (set_neighbour_group refuses later changes).
  struct EarlyPlan {
    std::vector<parallel::pp::ExchangeBatch> sends, receives;
  };
  const EarlyPlan* early_plan();
  std::optional<std::optional<EarlyPlan>> early_plan_;
};

}  // namespace colossal::engine
