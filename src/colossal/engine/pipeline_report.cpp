// The pipeline's bubble report: see pipeline_report.h.
#include "colossal/engine/pipeline_report.h"

#include <fmt/format.h>

#include <cstdio>
#include <utility>

#include "colossal/core/error.h"
#include "colossal/parallel/pp/schedule_order.h"

namespace colossal::engine {

double BubbleReport::measured() const {
  double sum = 0;
  for (const StageTiming& t : stages) sum += t.busy_ms > 0 ? t.idle_ms() / t.busy_ms : 0;
  return stages.empty() ? 0 : sum / static_cast<double>(stages.size());
}

double BubbleReport::expected() const {
  return static_cast<double>(num_stages - 1) /
         (static_cast<double>(num_chunks) * static_cast<double>(num_microbatches));
}

std::string BubbleReport::describe() const {
  std::string out = fmt::format("pipeline bubble: {} stages x {} chunk{}, {} microbatches;", num_stages, num_chunks,
                                num_chunks > 1 ? "s" : "", num_microbatches);
  for (size_t s = 0; s < stages.size(); ++s) {
    const StageTiming& t = stages[s];
    out += fmt::format(
        "{} stage {} busy {:.1f} ms idle {:.1f} ms (before the first op {:.2f}, between ops {:.2f} with a "
        "median gap of {:.3f}, after the last {:.2f})",
        s == 0 ? "" : ",", s, t.busy_ms, t.idle_ms(), t.lead_ms, t.between_ms(), t.median_gap_ms, t.tail_ms);
    if (t.longest_op >= 0) {
      const std::vector<parallel::pp::PipelineOp> order =
          parallel::pp::interleaved_order(static_cast<int>(s), num_stages, num_microbatches, num_chunks);
      const auto k = static_cast<size_t>(t.longest_op);
      const std::string op =
          k < order.size()
              ? fmt::format(" ({} of microbatch {}{})",
                            order[k].kind == parallel::pp::PipelineOp::Kind::forward ? "forward" : "backward",
                            order[k].microbatch,
                            num_chunks > 1 ? fmt::format(", chunk {}", order[k].chunk) : std::string())
              : std::string();
      out += fmt::format(" [longest op {}{} {:.2f} ms, median op {:.2f} ms, queued by the host in {:.2f} ms]",
                         t.longest_op, op, t.longest_op_ms, t.median_op_ms, t.longest_op_host_ms);
    }
  }
  out += fmt::format("; bubble (idle / busy) {:.3f}, schedule (p - 1) / (v m) {:.3f}", measured(), expected());
  return out;
}

BubbleReport gather_bubble_report(const PipelineSchedule& schedule) {
  comm::ProcessGroup& group = *schedule.group();
  const int p = group.size();
  const StageTiming& t = schedule.last_timing();
  constexpr int64_t kFields = 9;
  const Tensor mine = core::from_vector<double>(
                          {t.span_ms, t.busy_ms, t.lead_ms, t.tail_ms, t.median_gap_ms,
                           static_cast<double>(t.longest_op), t.longest_op_ms, t.median_op_ms, t.longest_op_host_ms},
                          {kFields})
                          .to(group.device());
  Tensor all = core::empty({kFields * p}, TensorOptions(DType::f64, group.device()));
  group.all_gather(all, mine);
  const std::vector<double> values = all.to(core::kCpu).to_vector<double>();
  BubbleReport report;
  report.num_stages = p;
  report.num_chunks = schedule.num_chunks();
  report.num_microbatches = schedule.num_microbatches();
  for (int s = 0; s < p; ++s) {
    const double* v = values.data() + kFields * s;
    report.stages.push_back({.span_ms = v[0],
                             .busy_ms = v[1],
                             .lead_ms = v[2],
                             .tail_ms = v[3],
                             .median_gap_ms = v[4],
                             .longest_op = static_cast<int64_t>(v[5]),
                             .longest_op_ms = v[6],
                             .median_op_ms = v[7],
                             .longest_op_host_ms = v[8]});
  }
  return report;
}

PipelineReportHook::PipelineReportHook(std::shared_ptr<PipelineSchedule> schedule, int64_t interval, bool print)
    : Hook(/*priority=*/5), schedule_(std::move(schedule)), interval_(interval), print_(print) {
  COLOSSAL_CHECK(schedule_ != nullptr, "PipelineReportHook needs the pipeline schedule");
  COLOSSAL_CHECK(interval_ >= 1, "parallel.pipeline_report = {}: the steps between reports must be >= 1", interval_);
}

void PipelineReportHook::before_train_iter(Trainer&) {
  // The first iteration warms up (allocations, the shapes' headers): the first report is of iteration
  // interval + 1, counted from 1.
  measuring_ = iterations_ > 0 && iterations_ % interval_ == 0;
  schedule_->set_timing(measuring_);
}

void PipelineReportHook::after_train_iter(Trainer&, const Tensor&, const Tensor&, const Tensor&) {
  ++iterations_;
  if (!measuring_) return;
  measuring_ = false;
  schedule_->set_timing(false);
  last_ = gather_bubble_report(*schedule_);
  if (print_) {
    fmt::print("iteration {}: {}\n", iterations_, last_.describe());
    std::fflush(stdout);
  }
}

}  // namespace colossal::engine
