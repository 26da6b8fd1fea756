// Engine: one training step of a model (forward, loss, backward, and every `gradient_accumulation`
// micro-steps clipping, optimizer update and scheduler step) and evaluation without autograd,
// as Colossal-AI's Engine does for the Trainer and for hand-written loops.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "colossal/amp/mixed_precision_optimizer.h"
#include "colossal/comm/process_group.h"
#include "colossal/core/tensor.h"
#include "colossal/engine/schedule.h"
#include "colossal/engine/update_under_forward.h"
#include "colossal/nn/module.h"
#include "colossal/optim/lr_scheduler.h"
#include "colossal/optim/optimizer.h"
#include "colossal/parallel/dp/data_parallel.h"
#include "colossal/parallel/gradient_handler.h"
#include "colossal/parallel/gradient_statistics.h"
#include "colossal/parallel/parallel_context.h"
#include "colossal/parallel/zero/low_level_zero.h"
#include "colossal/parallel/zero/zero_handler.h"

namespace colossal::engine {

/// The loss of a model's output against its target, e.g. ops::cross_entropy.
using Criterion = std::function<Tensor(const Tensor& output, const Tensor& target)>;

/// How a pipeline stage's tensors are named in the serial model it was cut from, so that its
/// checkpoints hold the serial model's tensors and the serial optimizer's state (Note [Checkpoints
/// of a pipeline] in checkpoint_sharding.cpp). Made by the run assembly (initialize/pipeline_stage.h).
struct SerialNames {
  /// The stage model's state_dict names -> the serial model's ("1.0.h.3.ln_1.weight" -> "h.3.ln_1.weight").
  std::map<std::string, std::string> model;
  /// Every state_dict name of the serial model, in its order (the order a serial run writes them).
  std::vector<std::string> model_order;
  /// The serial optimizer's parameter groups, each its parameters' serial names in order: index i of
  /// the serial optimizer's state_dict ("state.<i>.exp_avg") counts across them.
  std::vector<std::vector<std::string>> optimizer_groups;
};

struct EngineOptions {
  /// Micro-steps whose gradients are summed before one optimizer update; each micro-step's loss is
  /// divided by this count, so with a mean loss the update equals that of the concatenated batch.
  int64_t gradient_accumulation = 1;
  /// Clip the global gradient norm to this value before each update (Colossal-AI's clip_grad_norm
  /// config); unset leaves gradients alone.
  std::optional<double> clip_grad_norm;
  double clip_norm_type = 2.0;
  /// Mixed precision (config fp16 / bf16): the Engine wraps the optimizer in an
  /// amp::MixedPrecisionOptimizer, which converts the model (naive, bf16), scales the loss, skips
  /// overflowing steps and steps fp32 master weights; in torch mode the forward runs under
  /// ops::AutocastGuard(f16). Unset: everything in the model's own dtype.
  std::optional<amp::AmpOptions> amp;
  /// The run's layout and process groups (parallel/parallel_context.h). Null: one process, the
  /// dp = pp = tp = 1 layout over a single-process group on the model's device. The Engine reduces
  /// gradients over the context's data group (through the gradient handler) and gradient statistics
  /// over the groups GradientStatistics picks, and reports the loss averaged over the data group.
  std::shared_ptr<const parallel::ParallelContext> context;
  /// Builds the gradient handler for the model, after the mixed-precision conversion (its hooks sit on
  /// the tensors backward fills). Unset: a parallel::DataParallel over the context's data group when
  /// that has more than one rank (with `data_parallel`'s options), none otherwise.
  std::function<std::unique_ptr<parallel::GradientHandler>(nn::Module& model, const parallel::ParallelContext& context)>
      gradient_handler;
  parallel::DataParallelOptions data_parallel;
  /// ZeRO over the context's data group (config zero.*): the gradient handler is a
  /// parallel::zero::LowLevelZero at stages 1 and 2, a parallel::zero::Zero3 (parameters sharded in
  /// chunks too) at stage 3, which shards the optimizer (after the mixed-precision wrapper's
  /// conversion). Not with `gradient_handler` set, nor with a pipeline; stages 1 and 2 shard each
  /// tensor rank's parameters over its data group under tensor parallelism, stage 3 refuses it. With
  /// `zero->offload_optimizer` (any stage) the optimizer steps on the host (Note [Optimizer
  /// offload]): the Engine calls the handler's host step in place of optimizer.step() and lets it
  /// step buckets (chunks) during backward when neither clipping nor an fp16 loss scale needs every
  /// gradient first.
  std::optional<parallel::zero::ZeroOptions> zero;
  /// The forward/backward order of a micro-step; null: NonPipelineSchedule.
  std::shared_ptr<Schedule> schedule;
  /// Under a pipeline: the serial model's names of this stage's tensors, for checkpoints (a run of
  /// the whole model leaves it null).
  std::shared_ptr<const SerialNames> serial_names;
  /// Called at the end of each accumulation window once the gradient handler has finished (the
  /// gradients are the update's), before unscaling, clipping and the optimizer step: the layout
  /// harness reads the gradients here.
  std::function<void(Engine& engine)> before_update;
  /// Leave the optimizer's update running into the next forward, each block waiting for its own
  /// parameters' update just before it reads them (Note [Update under the next forward] in
  /// engine.cpp). Unset: off (measured no faster yet). Only where no gradient handler runs (one
  /// data-parallel rank, no ZeRO), without a pipeline schedule, and once the first forward has shown
  /// that every unit's forward hooks run; elsewhere the update ends with the step, as with false.
  /// COLOSSAL_UPDATE_UNDER_FORWARD=0 or 1 overrides it.
  std::optional<bool> update_under_forward;
  /// With data parallelism, step() returns the mean of the data group's losses (one all-reduce of a
  /// scalar per micro-step): with equal shares that is the loss of the global batch, the number the
  /// serial run reports, and every rank's hooks and logs see it. false returns this rank's own loss.
  bool report_mean_loss = true;
};

class Engine {
 public:
  /// `lr_scheduler`, when given, steps once per optimizer update (per iteration, as Colossal-AI's
  /// engine steps it); leave it out to step one from an LRSchedulerHook instead.
  Engine(std::shared_ptr<nn::Module> model, std::shared_ptr<optim::Optimizer> optimizer, Criterion criterion,
         EngineOptions options = {}, std::shared_ptr<optim::LRScheduler> lr_scheduler = nullptr);

  void train() { model_->train(); }
  void eval() { model_->eval(); }
  /// Drops the gradients and restarts the accumulation window.
  void zero_grad();

  /// One micro-step: the schedule's forward, loss and backward of loss / gradient_accumulation; on
  /// the window's last micro-step also the gradient handler's reduction, clipping, optimizer.step(),
  /// zero_grad and the scheduler's step. Returns the unscaled loss, detached (under data parallelism
  /// the data group's mean: options.report_mean_loss).
  Tensor step(const Tensor& input, const Tensor& target);
  /// Backward of one micro-step's loss, for schedules: divided by the accumulation window and, under
  /// fp16 loss scaling, scaled.
  void backward(const Tensor& loss);
  /// For schedules: the output step() reports through last_output().
  void set_last_output(Tensor output) { last_output_ = std::move(output); }
  /// The model's output for `input` with autograd off.
  Tensor evaluate(const Tensor& input);
  /// The model's output for `input`, through the mixed-precision casts when on, recording the
  /// autograd graph as step() does (benchmarks time it alone).
  Tensor forward(const Tensor& input);
  /// The criterion on (output, target).
  Tensor criterion(const Tensor& output, const Tensor& target) const { return criterion_(output, target); }

  /// The output of the last step()'s forward (detached), for metric hooks.
  const Tensor& last_output() const { return last_output_; }
  /// Whether the last step() updated the parameters (it ended an accumulation window).
  bool last_step_updated() const { return last_step_updated_; }
  /// The gradient norm before clipping at the last update, when clipping is on.
  /// Reading it waits for the GPU (the norm stays a device tensor until asked for).
  std::optional<double> last_grad_norm() const;
  /// Whether the last window's optimizer step was skipped for inf/NaN gradients (fp16 modes).
  bool last_step_skipped() const { return last_step_skipped_; }
  /// The mixed-precision wrapper, or null without options.amp.
  amp::MixedPrecisionOptimizer* amp() { return amp_.get(); }
  /// The gradient handler, or null when gradients need no reduction (one data-parallel rank).
  parallel::GradientHandler* gradient_handler() { return gradient_handler_.get(); }
  /// The gradient handler when it is a parallel::DataParallel, else null.
  parallel::DataParallel* data_parallel() { return dynamic_cast<parallel::DataParallel*>(gradient_handler_.get()); }
  /// The gradient handler when it is ZeRO (options.zero, any stage), else null.
  parallel::zero::ZeroHandler* zero() { return dynamic_cast<parallel::zero::ZeroHandler*>(gradient_handler_.get()); }
  /// The run's layout and groups (a single-process one when options.context was null).
  const parallel::ParallelContext& context() const { return *context_; }
  /// Over which groups the overflow flag and the clipping norm are reduced.
  const parallel::GradientStatistics& gradient_statistics() const { return *gradient_statistics_; }
  parallel::GradientStatistics& gradient_statistics() { return *gradient_statistics_; }
  Schedule& schedule() { return *schedule_; }
  /// Optimizer updates so far (skipped fp16 steps included, as the scheduler counts them); a
  /// checkpoint restores the count.
  int64_t num_updates() const { return num_updates_; }
  /// The device of the model's parameters (the profiler's device ranges go on its current stream).
  Device device() const { return device_; }
  void set_num_updates(int64_t updates) { num_updates_ = updates; }
  /// Micro-steps taken in the current accumulation window (0: at a window boundary, where a
  /// checkpoint holds the whole training state).
  int64_t micro_step() const { return micro_step_; }

  /// The model, its parameters current: what the gradient handler left writing them after the step
  /// is waited for first (GradientHandler::wait_for_parameters).
  nn::Module& model() {
    wait_for_update();
    return *model_;
  }
  /// The current stream waits for what the last update left running: the gradient handler's
  /// gathers (GradientHandler::wait_for_parameters) and an update under the next forward (Note
  /// [Update under the next forward]). model() calls it; so does whatever reads the optimizer's
  /// state or the parameters outside the forward (checkpoints).
  void wait_for_update();
  /// Whether updates run under the next forward (EngineOptions::update_under_forward), and the parts
  /// the forwards' pre-hooks waited for so far (tests).
  const UpdateUnderForward* update_under_forward() const { return update_under_forward_.get(); }
  optim::Optimizer& optimizer() { return *optimizer_; }
  optim::LRScheduler* lr_scheduler() { return lr_scheduler_.get(); }
  const EngineOptions& options() const { return options_; }

 private:
  Device device_{};
  std::shared_ptr<nn::Module> model_;
  std::shared_ptr<optim::Optimizer> optimizer_;
  Criterion criterion_;
  EngineOptions options_;
  std::shared_ptr<optim::LRScheduler> lr_scheduler_;
  int64_t micro_step_ = 0;  // micro-steps done in the current accumulation window
  int64_t num_updates_ = 0;
  bool last_step_updated_ = false;
  Tensor last_grad_norm_;  // 0-d on the gradients' device, undefined before the first clipped update
  bool last_step_skipped_ = false;
  Tensor last_output_;
  std::unique_ptr<amp::MixedPrecisionOptimizer> amp_;
  std::shared_ptr<const parallel::ParallelContext> context_;
  std::unique_ptr<parallel::GradientHandler> gradient_handler_;
  std::unique_ptr<parallel::GradientStatistics> gradient_statistics_;
  std::shared_ptr<Schedule> schedule_;
  std::unique_ptr<UpdateUnderForward> update_under_forward_;  // last: its hooks sit on the model

  void update();
  /// Whether this update may step in two parts around the last reductions (Note [Update beside
  /// the last reductions]).
  bool updates_in_two_parts() const;
  /// What the optimizer steps: the model's parameters, or ZeRO's shards of them.
  std::vector<Tensor> stepped_tensors();
  /// The optimizer step (through mixed precision where there is one) of the parameters with a
  /// gradient, without clipping: one part of a two-part update.
  void step_parameters_with_gradients();
  /// The tensors the optimizer steps (first), each with the tensor the model and the gradient handler
  /// know it by (second): under mixed precision without ZeRO the f32 masters and their 16-bit
  /// parameters, else the same tensors twice (the model's parameters, or ZeRO's shards).
  std::pair<std::vector<Tensor>, std::vector<Tensor>> optimizer_tensors() const;
  /// Steps every parameter but `late`, waits for the handler's last reductions, then steps `late`.
  void step_in_two_parts(const std::vector<Tensor>& late);
  /// The update's step after every reduction: before_update, clipping, mixed precision, the optimizer.
  void step_whole();
};

}  // namespace colossal::engine
