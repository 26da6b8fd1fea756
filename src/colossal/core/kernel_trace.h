// Where a GPU's time goes: CUPTI's activity records of every kernel, copy and memset between
// start() and stop(), with their device, stream and real (not replayed) start and end times. The
// step profiler (core/profiler.h) draws them as the trace's kernel lanes; train_step_bench --trace
// and gpu_kernels_bench summarize them. Present when the build found CUPTI
// (kernel_trace_available()); elsewhere start() throws.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace colossal::core::cuda {

struct KernelRecord {
  std::string name;  ///< the kernel's demangled name, or "[memcpy ...]" / "[memset]"
  int device = 0;
  uint32_t stream = 0;  ///< CUPTI's stream id (stable within a process)
  uint64_t start_ns = 0;
  uint64_t end_ns = 0;
};

/// Whether this build has CUPTI (the toolkit's CUDA::cupti was found).
bool kernel_trace_available();

/// CUPTI's clock now, in the records' time base (ns), for aligning them with a host clock.
uint64_t kernel_trace_timestamp_ns();

/// One trace at a time per process. start() enables CUPTI's activity kinds; stop() synchronizes the
/// device, flushes CUPTI's buffers and returns the records sorted by start time.
class KernelTrace {
 public:
  void start();
  std::vector<KernelRecord> stop();
};

/// "void colossal::ops::cuda::(anonymous namespace)::layer_norm_kernel<__nv_bfloat16, 4>(...)" ->
/// "layer_norm_kernel<__nv_bfloat16, 4>": what a reader recognises.
std::string short_kernel_name(const std::string& name);

/// A summary of a trace: the span from the first start to the last end, the time at least one
/// record ran (the union of intervals; span - busy is the GPU left idle, e.g. waiting for launches),
/// and the top `top` names by summed duration with their count and share.
std::string summarize(const std::vector<KernelRecord>& records, int top);

}  // namespace colossal::core::cuda
