// A sampling profiler of the host side of a training step: SIGPROF every `interval_us` of the
// process's CPU time, each sample the interrupted thread's return addresses as (module, offset)
// pairs, written to a file for offline symbolisation (tools/host-profile-report resolves them
// against unstripped libraries with addr2line). For finding where enqueueing a step spends its
// time when the GPU waits on the host; no perf or gdb is needed on the GPU machine. Used by the
// benchmarks' --host-profile and by `colossal train --profile-host` (core/profiler.h: the samples
// of the profiled window, beside its trace).
#pragma once

#include <string>

namespace colossal::core {

class HostProfiler {
 public:
  /// Starts sampling; one profiler at a time.
  explicit HostProfiler(int interval_us = 200);
  /// Stops sampling (also on destruction).
  void stop();
  ~HostProfiler();
  /// One line per sample: space-separated "module+0xoffset" frames, innermost first. Returns the
  /// number of samples written.
  int write(const std::string& path) const;

  HostProfiler(const HostProfiler&) = delete;
  HostProfiler& operator=(const HostProfiler&) = delete;

 private:
  bool running_ = false;
};

}  // namespace colossal::core
