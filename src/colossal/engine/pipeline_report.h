// The pipeline's bubble report (issue 20): every stage's busy and idle time over a micro-step
// (PipelineSchedule's timing, Note [Pipeline bubble]) gathered over the pipeline group, and the
// measured bubble against the schedule's (p - 1) / (v m). The trainer prints it every
// parallel.pipeline_report steps (PipelineReportHook); bench/pipeline_bubble.sh reads those lines.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "colossal/engine/hook.h"
#include "colossal/engine/pipeline_schedule.h"

namespace colossal::engine {

struct BubbleReport {
  int num_stages = 1;
  int num_chunks = 1;
  int64_t num_microbatches = 1;
  std::vector<StageTiming> stages;  ///< by stage
  /// Idle over busy time, the stages' mean: the measured bubble fraction.
  double measured() const;
  /// (p - 1) / (v m): what the schedule promises with equal ops and free exchanges.
  double expected() const;
  /// "pipeline bubble: 2 stages x 1 chunk, 8 microbatches; stage 0 busy 812.1 ms idle 99.8 ms, ...;
  /// bubble (idle / busy) 0.123, schedule (p - 1) / (v m) 0.125".
  std::string describe() const;
};

/// Every stage's last measured micro-step (PipelineSchedule::last_timing) at every stage: collective
/// over the schedule's group.
BubbleReport gather_bubble_report(const PipelineSchedule& schedule);

/// Turns the schedule's timing on for every `interval`-th training step and prints the bubble report
/// after it (on `print` ranks: the writer). Every rank of the pipeline must run it (the report is a
/// collective).
class PipelineReportHook : public Hook {
 public:
  PipelineReportHook(std::shared_ptr<PipelineSchedule> schedule, int64_t interval, bool print);
  std::string name() const override { return "PipelineReportHook"; }
  void before_train_iter(Trainer& trainer) override;
  void after_train_iter(Trainer& trainer, const Tensor& output, const Tensor& target, const Tensor& loss) override;
  /// The last report gathered (for tests).
  const BubbleReport& last_report() const { return last_; }

 private:
  std::shared_ptr<PipelineSchedule> schedule_;
  int64_t interval_;
  bool print_;
  int64_t iterations_ = 0;
  bool measuring_ = false;
  BubbleReport last_;
};

}  // namespace colossal::engine
