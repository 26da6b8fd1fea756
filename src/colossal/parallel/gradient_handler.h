// GradientHandler: how the gradients of one micro-step window are made the update's gradients across
// the ranks that share a model. The Engine drives it through one interface whatever it does:
// DataParallel (parallel/dp/) all-reduces replicas' gradients in buckets during backward; ZeRO will
// reduce-scatter them into shards (parallel/zero/). The Engine calls set_sync before each backward,
// finish after the window's last one (before unscaling, clipping and the optimizer step), and
// after_update after the step.
#pragma once

#include <string_view>
#include <vector>

#include "colossal/comm/process_group.h"

namespace colossal::parallel {

class GradientHandler {
 public:
  virtual ~GradientHandler() = default;

  /// Whether the next backward ends the accumulation window (true: its gradients are reduced) or
  /// only accumulates locally (DDP's no_sync).
  virtual void set_sync(bool sync) = 0;
  /// Waits for the window's reduction and leaves the reduced gradients in the parameters' .grad.
  virtual void finish() = 0;
  /// Waits for the reduction of every parameter but those it returns (the last reductions, still in
  /// flight), for an update in two parts (Note [Update beside the last reductions] in
  /// engine/engine.cpp): the Engine steps the others, then calls finish() for the rest. By default
  /// it is finish() and returns none.
  virtual std::vector<Tensor> finish_all_but_late() {
    finish();
    return {};
  }
  /// Issues what is left of the window's reduction that backward has not issued yet (DataParallel's
  /// buckets with a parameter that got no gradient), and returns whether every collective the handler
  /// issues on group() before finish() returns has now been issued, so that another collective on
  /// that group issued next comes in the same order on every rank (Note [The reported loss beside the
  /// update] in engine/engine.cpp). The default issues nothing and answers false.
  virtual bool issue_all() { return false; }
  /// Called by the Engine after the update (`stepped`: false when mixed precision skipped it for an
  /// overflow): ZeRO all-gathers the parameters each rank updated. Nothing for DataParallel.
  virtual void after_update(bool stepped) { (void)stepped; }
  /// Before the parameters are read outside the model's forward (checkpoints, tests, exports): makes
  /// the caller's stream wait for what after_update left writing them (ZeRO's all-gathers, which the
  /// next forward waits for unit by unit). Engine::model() calls it. Nothing for DataParallel.
  virtual void wait_for_parameters() {}
  /// Drops what the handler holds of an open window (Engine::zero_grad: a window cut short is not
  /// mixed into the next). DataParallel holds nothing beyond the parameters' .grad; ZeRO-2 its
  /// accumulated shard. Every rank of group() calls it together.
  virtual void zero_grad() {}
  /// The group the gradients are reduced over.
  virtual const comm::ProcessGroup& group() const = 0;
  /// True when, after finish(), every rank of group() holds the same gradients (an all-reduce);
  /// false when each holds a different part (ZeRO's shards): then gradient statistics (the clipping
  /// norm, the overflow flag) must also be reduced over group() (parallel/gradient_statistics.h).
  virtual bool replicates_gradients() const = 0;
  /// "data parallel (all-reduce in buckets)": for logs.
  virtual std::string_view name() const = 0;
};

}  // namespace colossal::parallel
