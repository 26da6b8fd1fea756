// Schedule: how the Engine runs the forward and backward passes of one micro-step's batch. The
// Engine owns what comes around them (the gradient handler's sync, the update at the end of an
// accumulation window, the loss it reports); a schedule owns the order of the passes. Today's one is
// NonPipelineSchedule (forward, loss, backward of the whole batch on this rank, Colossal-AI's
// NonPipelineSchedule); the pipeline schedules (1F1B, interleaved) run microbatches across stages
// through the same seam.
#pragma once

#include <string_view>

#include "colossal/core/tensor.h"

namespace colossal::engine {

class Engine;

class Schedule {
 public:
  virtual ~Schedule() = default;
  /// "non-pipeline", "1f1b", ...: for logs.
  virtual std::string_view name() const = 0;
  /// Forward, loss and backward of one micro-step on (input, target), through engine.forward,
  /// engine.criterion and engine.backward (which apply mixed precision and the accumulation
  /// window's division); records the output with engine.set_last_output. Returns this rank's
  /// unscaled loss, detached.
  virtual Tensor forward_backward(Engine& engine, const Tensor& input, const Tensor& target) = 0;
  /// The model's output for `input` without autograd (evaluation), the same on every rank that calls
  /// it; undefined: the Engine runs its model's forward itself (the default).
  virtual Tensor evaluate(Engine& /*engine*/, const Tensor& /*input*/) { return Tensor(); }
};

/// The whole batch through the whole model on this rank.
class NonPipelineSchedule final : public Schedule {
 public:
  std::string_view name() const override { return "non-pipeline"; }
  Tensor forward_backward(Engine& engine, const Tensor& input, const Tensor& target) override;
};

}  // namespace colossal::engine
