// StepTiming: where a training step's GPU time goes, phase by phase, measured with CUDA events on
// the compute stream: forward and backward, the part of the gradient reduction backward did not
// hide (the compute stream waiting for the gradient handler's collectives), the update (unscale,
// clip, optimizer, scheduler), and the gap to the next step's start (the GPU waiting for the host).
// It answers "why does data parallelism lose 5%": communication left exposed at the end of backward,
// backward itself slowed by the collectives beside it, or the host. Sampled every `interval` steps;
// the events are read only in summary(), long after they completed, so a step never waits.
// Turned on for `colossal train` by COLOSSAL_STEP_TIMING=N (kStepTimingVariable): every N-th step,
// summarised per rank at the end of the run.
#pragma once

#include <cstdint>
#include <deque>
#include <memory>
#include <optional>
#include <string>
#include <string_view>

#include "colossal/core/device.h"

namespace colossal::engine {

inline constexpr std::string_view kStepTimingVariable = "COLOSSAL_STEP_TIMING";

/// COLOSSAL_STEP_TIMING as a sampling interval (0 or unset: off); a bad value throws naming it.
int64_t step_timing_interval_from_env();

class StepTiming {
 public:
  enum class Mark { step_start, backward_end, reduced, updated };

  /// Samples every `interval`-th optimizer step (>= 1) on `device` (a CUDA device).
  StepTiming(core::Device device, int64_t interval);
  ~StepTiming();
  StepTiming(const StepTiming&) = delete;
  StepTiming& operator=(const StepTiming&) = delete;

  /// Records `mark` on the device's current stream when the step being timed is sampled. The
  /// Engine calls step_start at a window's first micro-step, backward_end after its last
  /// backward, reduced after the gradient handler's finish(), updated at the end of the update.
  void mark(Mark mark);

  struct Summary {
    int64_t samples = 0;
    double forward_backward_ms = 0;  ///< step start to the end of the last backward
    double exposed_reduction_ms = 0;  ///< end of backward to the reduced gradients
    double update_ms = 0;             ///< reduced gradients to the end of the update
    double step_ms = 0;               ///< step start to the next step's start (sampled steps with a successor)
    std::string describe() const;     ///< "forward+backward 28.10 ms, exposed reduction 0.52 ms, ..."
  };
  /// Averages over the samples (waits for the last one's events).
  Summary summary() const;

 private:
  struct Sample;
  core::Device device_;
  int64_t interval_;
  int64_t steps_ = 0;  // step_start marks seen
  bool sampling_ = false;
  std::deque<std::unique_ptr<Sample>> samples_;
};

}  // namespace colossal::engine
