// A step profiler for finding where a training step's time goes without nsys: named ranges on the
// host (steady clock, per thread) and on CUDA streams (timing events recorded where the host enqueues
// the range's first and last work), collected over a window of steps and written as a Chrome trace
// (chrome://tracing, ui.perfetto.dev) plus a per-range summary on stderr. Off by default; off, a
// range costs one relaxed atomic load.
//
//   COLOSSAL_PROFILE=trace.json colossal train ...            # steps 20-24 of the run
//   COLOSSAL_PROFILE=trace.json COLOSSAL_PROFILE_STEPS=100:10 colossal train ...
//   colossal train --profile trace.json [--profile-steps 100:10] ...
//
// The summary's columns, per range name: how many, host ms per step (time the host spent inside
// the range: launching, waiting), device ms per step (from the event at its start to the event at
// its end on its stream, which includes any time that stream sat idle waiting for the host or for
// another stream in between). A device range much longer than its kernels' sum, with host time
// close to it, means the stream waits for the host: the step is launch-bound there.
//
// Note [Device ranges and the host clock]
// Device times are measured between events; to draw them on one timeline with the host ranges, each
// stream's events are placed relative to a base event recorded on that stream when the window opens,
// whose host time is taken as the moment it was recorded. That offsets a stream's lane by however
// far the device lagged the host then (the host usually runs ahead): the durations and the order
// within a lane are exact, the alignment of lanes to the host is not.
#pragma once

#include <cstdint>
#include <string>

#include "colossal/core/device.h"

namespace colossal::core::profiler {

struct Options {
  /// Where the Chrome trace goes (its summary goes to stderr); empty: profiling off.
  std::string path;
  /// The window: steps [first_step, first_step + num_steps) of the run, counted by step_begin.
  int64_t first_step = 20;
  int64_t num_steps = 5;
  /// Also sample the host's stacks over the window (SIGPROF, core/host_profiler.h) into
  /// <path>.host.txt, for `tools/host-profile-report`: where the host's time goes while it queues
  /// the window's work (--profile-host; COLOSSAL_PROFILE_HOST=1).
  bool host_samples = false;
};

/// Options from COLOSSAL_PROFILE (the path), COLOSSAL_PROFILE_STEPS ("FIRST:COUNT") and
/// COLOSSAL_PROFILE_HOST ("1": host_samples); the path empty when the first is unset. Throws naming the variable when
/// COLOSSAL_PROFILE_STEPS is malformed.
Options options_from_env();

/// Arms the profiler (an empty path disarms it). Throws naming the option when the window is empty
/// or starts before step 0, or when host samples are asked for without a path.
void configure(const Options& options);

/// Whether ranges are being recorded now (inside the window).
bool active();

/// Marks the start of training step `step` (the trainer calls it before each step): opens the window
/// at first_step and, at first_step + num_steps, closes it, waits for the device and writes the trace
/// and the summary.
void step_begin(int64_t step);

/// Writes what an open window holds (a run that ended inside the window); nothing otherwise.
void finish();

/// A host range, and on a CUDA `device` also a range on that device's current stream. Inactive:
/// does nothing.
class Scope {
 public:
  explicit Scope(const char* name, Device device = Device{});
  ~Scope();
  Scope(const Scope&) = delete;
  Scope& operator=(const Scope&) = delete;

 private:
  int64_t host_ = -1;
  int64_t device_ = -1;
};

/// A range on one CUDA stream only (a collective on a communicator's stream): begin before the
/// stream's first work of the range, end after its last. Returns -1, and end ignores it, when
/// inactive.
int64_t begin_stream_range(std::string name, Stream stream);
void end_stream_range(int64_t id, Stream stream);

}  // namespace colossal::core::profiler
