// Where a GPU step's time goes: CUPTI's activity records of every kernel, copy and memset between
// start() and stop(), with real (not replayed) start and end times. Used by train_step_bench --trace.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace colossal::bench {

struct TraceRecord {
  std::string name;  ///< the kernel's (demangled) name, or "[memcpy DtoD]" / "[memset]"
  uint64_t start_ns = 0;
  uint64_t end_ns = 0;
};

/// One trace at a time per process. start() enables CUPTI's activity kinds; stop() synchronizes the
/// device, flushes CUPTI's buffers and returns the records sorted by start time.
class KernelTrace {
 public:
  void start();
  std::vector<TraceRecord> stop();
};

/// A summary of a trace: the span from the first start to the last end, the time at least one
/// record ran (the union of intervals; span - busy is the GPU left idle, e.g. waiting for launches),
/// and the top `top` names by summed duration with their count and share.
std::string summarize(const std::vector<TraceRecord>& records, int top);

}  // namespace colossal::bench
