// StepTiming: see step_timing.h.
#include "colossal/engine/step_timing.h"

#include <fmt/format.h>

#include <cstdlib>

#include "colossal/core/cuda_device.h"
#include "colossal/core/error.h"

namespace colossal::engine {

int64_t step_timing_interval_from_env() {
  const char* text = std::getenv(std::string(kStepTimingVariable).c_str());
  if (text == nullptr || *text == '\0') return 0;
  char* end = nullptr;
  const long long value = std::strtoll(text, &end, 10);
  COLOSSAL_CHECK(end != text && *end == '\0' && value >= 0,
                 "{} = \"{}\": expected a whole number of steps >= 0 (0: off; N: time every N-th step)",
                 kStepTimingVariable, text);
  return value;
}

/// The events of one sampled step, and the start of the step after it (for the step time).
struct StepTiming::Sample {
  core::cuda::Event start{true}, backward_end{true}, reduced{true}, updated{true}, next_start{true};
  bool has_backward_end = false, has_reduced = false, has_updated = false, has_next_start = false;
};

StepTiming::StepTiming(core::Device device, int64_t interval) : device_(device), interval_(interval) {
  COLOSSAL_CHECK(device_.is_cuda(), "StepTiming times CUDA streams; {} is not a CUDA device", device_);
  COLOSSAL_CHECK(interval_ >= 1, "StepTiming: the sampling interval must be >= 1, got {}", interval_);
}

StepTiming::~StepTiming() = default;

void StepTiming::mark(Mark mark) {
  const core::Stream stream = core::cuda::current_stream(device_);
  if (mark == Mark::step_start) {
    // The previous sample's step ends where this one starts.
    if (sampling_ && !samples_.empty() && !samples_.back()->has_next_start) {
      samples_.back()->next_start.record(stream);
      samples_.back()->has_next_start = true;
    }
    sampling_ = steps_++ % interval_ == 0;
    if (!sampling_) return;
    // A few hundred samples are plenty; the oldest go.
    if (samples_.size() >= 256) samples_.pop_front();
    // Events belong to the device current when they are made: make them on ours (a rank of a
    // data-parallel run works on cuda:N while the thread's current device may still be cuda:0).
    core::cuda::DeviceGuard guard(device_);
    samples_.push_back(std::make_unique<Sample>());
    samples_.back()->start.record(stream);
    return;
  }
  if (!sampling_ || samples_.empty()) return;
  Sample& s = *samples_.back();
  switch (mark) {
    case Mark::backward_end:
      s.backward_end.record(stream);
      s.has_backward_end = true;
      break;
    case Mark::reduced:
      s.reduced.record(stream);
      s.has_reduced = true;
      break;
    case Mark::updated:
      s.updated.record(stream);
      s.has_updated = true;
      break;
    case Mark::step_start:
      break;
  }
}

StepTiming::Summary StepTiming::summary() const {
  Summary out;
  int64_t with_next = 0;
  for (const auto& s : samples_) {
    if (!s->has_backward_end || !s->has_reduced || !s->has_updated) continue;
    s->updated.synchronize();
    ++out.samples;
    out.forward_backward_ms += s->start.elapsed_ms(s->backward_end);
    out.exposed_reduction_ms += s->backward_end.elapsed_ms(s->reduced);
    out.update_ms += s->reduced.elapsed_ms(s->updated);
    if (s->has_next_start) {
      s->next_start.synchronize();
      out.step_ms += s->start.elapsed_ms(s->next_start);
      ++with_next;
    }
  }
  if (out.samples > 0) {
    const auto n = static_cast<double>(out.samples);
    out.forward_backward_ms /= n;
    out.exposed_reduction_ms /= n;
    out.update_ms /= n;
  }
  if (with_next > 0) out.step_ms /= static_cast<double>(with_next);
  return out;
}

std::string StepTiming::Summary::describe() const {
  return fmt::format(
      "{} sampled steps: forward+backward {:.2f} ms, exposed gradient reduction {:.2f} ms, update {:.2f} ms, "
      "start to next start {:.2f} ms (the rest: the GPU waiting between steps)",
      samples, forward_backward_ms, exposed_reduction_ms, update_ms, step_ms);
}

}  // namespace colossal::engine
