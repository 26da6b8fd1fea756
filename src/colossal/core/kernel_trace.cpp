// CUPTI kernel trace: see kernel_trace.h.
#include "colossal/core/kernel_trace.h"

#include "colossal/core/build_config.h"
#include "colossal/core/error.h"

#if COLOSSAL_WITH_CUPTI

#include <cuda_runtime.h>
#include <cupti.h>
#include <cxxabi.h>

#include <algorithm>
#include <cstdlib>
#include <map>
#include <memory>
#include <mutex>

#include <fmt/format.h>

namespace colossal::core::cuda {

namespace {

constexpr size_t kBufferBytes = 8u << 20;

std::mutex g_mutex;
std::vector<KernelRecord>* g_records = nullptr;  // the running trace's, under g_mutex

void check(CUptiResult result, const char* what) {
  if (result == CUPTI_SUCCESS) return;
  const char* message = nullptr;
  cuptiGetResultString(result, &message);
  COLOSSAL_FAIL("CUPTI: {} failed: {}", what, message ? message : "unknown error");
}

std::string demangle(const char* name) {
  if (name == nullptr) return "[unnamed kernel]";
  int status = 0;
  std::unique_ptr<char, decltype(&std::free)> out(abi::__cxa_demangle(name, nullptr, nullptr, &status), &std::free);
  return status == 0 && out ? std::string(out.get()) : std::string(name);
}

void CUPTIAPI buffer_requested(uint8_t** buffer, size_t* size, size_t* max_records) {
  *buffer = static_cast<uint8_t*>(std::aligned_alloc(8, kBufferBytes));
  *size = kBufferBytes;
  *max_records = 0;
}

void CUPTIAPI buffer_completed(CUcontext, uint32_t, uint8_t* buffer, size_t, size_t valid) {
  std::lock_guard<std::mutex> lock(g_mutex);
  CUpti_Activity* record = nullptr;
  while (cuptiActivityGetNextRecord(buffer, valid, &record) == CUPTI_SUCCESS) {
    if (g_records == nullptr) continue;
    switch (record->kind) {
      case CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL:
      case CUPTI_ACTIVITY_KIND_KERNEL: {
        const auto* k = reinterpret_cast<const CUpti_ActivityKernel10*>(record);
        g_records->push_back({demangle(k->name), static_cast<int>(k->deviceId), k->streamId, k->start, k->end});
        break;
      }
      case CUPTI_ACTIVITY_KIND_MEMCPY: {
        const auto* m = reinterpret_cast<const CUpti_ActivityMemcpy6*>(record);
        g_records->push_back({fmt::format("[memcpy kind {}]", int(m->copyKind)), static_cast<int>(m->deviceId),
                              m->streamId, m->start, m->end});
        break;
      }
      case CUPTI_ACTIVITY_KIND_MEMSET: {
        const auto* m = reinterpret_cast<const CUpti_ActivityMemset4*>(record);
        g_records->push_back({"[memset]", static_cast<int>(m->deviceId), m->streamId, m->start, m->end});
        break;
      }
      default:
        break;
    }
  }
  std::free(buffer);
}

}  // namespace

std::string short_kernel_name(const std::string& name) {
  std::string s = name;
  for (const std::string noise : {"(anonymous namespace)::", "colossal::core::", "colossal::ops::", "colossal::"}) {
    for (size_t at = s.find(noise); at != std::string::npos; at = s.find(noise)) s.erase(at, noise.size());
  }
  // Cut the argument list: the first '(' outside template brackets.
  int depth = 0;
  for (size_t i = 0; i < s.size(); ++i) {
    if (s[i] == '<') ++depth;
    if (s[i] == '>') --depth;
    if (s[i] == '(' && depth == 0) {
      s.resize(i);
      break;
    }
  }
  // Drop the return type: up to the last space outside template brackets.
  depth = 0;
  size_t cut = 0;
  for (size_t i = 0; i < s.size(); ++i) {
    if (s[i] == '<') ++depth;
    if (s[i] == '>') --depth;
    if (depth == 0 && s[i] == ' ') cut = i + 1;
  }
  if (cut < s.size()) s = s.substr(cut);
  if (s.size() < 4) s = name;  // an unusual name the cuts above mangled: keep it whole
  return s.size() > 150 ? s.substr(0, 147) + "..." : s;
}

bool kernel_trace_available() {
  return true;
}

uint64_t kernel_trace_timestamp_ns() {
  uint64_t now = 0;
  check(cuptiGetTimestamp(&now), "cuptiGetTimestamp");
  return now;
}

void KernelTrace::start() {
  std::lock_guard<std::mutex> lock(g_mutex);
  COLOSSAL_CHECK(g_records == nullptr, "KernelTrace::start: a trace is already running");
  g_records = new std::vector<KernelRecord>();
  check(cuptiActivityRegisterCallbacks(buffer_requested, buffer_completed), "cuptiActivityRegisterCallbacks");
  check(cuptiActivityEnable(CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL), "enable kernels");
  check(cuptiActivityEnable(CUPTI_ACTIVITY_KIND_MEMCPY), "enable memcpy");
  check(cuptiActivityEnable(CUPTI_ACTIVITY_KIND_MEMSET), "enable memset");
}

std::vector<KernelRecord> KernelTrace::stop() {
  cudaDeviceSynchronize();
  check(cuptiActivityFlushAll(1), "cuptiActivityFlushAll");
  cuptiActivityDisable(CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL);
  cuptiActivityDisable(CUPTI_ACTIVITY_KIND_MEMCPY);
  cuptiActivityDisable(CUPTI_ACTIVITY_KIND_MEMSET);
  std::lock_guard<std::mutex> lock(g_mutex);
  std::vector<KernelRecord> records = std::move(*g_records);
  delete g_records;
  g_records = nullptr;
  std::sort(records.begin(), records.end(),
            [](const KernelRecord& a, const KernelRecord& b) { return a.start_ns < b.start_ns; });
  return records;
}

std::string summarize(const std::vector<KernelRecord>& records, int top) {
  if (records.empty()) return "trace: no kernels recorded\n";
  uint64_t first = records.front().start_ns, last = 0, busy = 0, cursor = 0;
  struct Total {
    double ns = 0;
    int64_t count = 0;
  };
  std::map<std::string, Total> totals;
  double sum_ns = 0;
  for (const KernelRecord& r : records) {
    last = std::max(last, r.end_ns);
    // Union of [start, end): records come sorted by start.
    const uint64_t from = std::max(cursor, r.start_ns);
    if (r.end_ns > from) busy += r.end_ns - from;
    cursor = std::max(cursor, r.end_ns);
    Total& t = totals[short_kernel_name(r.name)];
    t.ns += double(r.end_ns - r.start_ns);
    ++t.count;
    sum_ns += double(r.end_ns - r.start_ns);
  }
  const double span = double(last - first);
  std::string out = fmt::format(
      "trace: {} records, span {:.3f} ms, GPU busy {:.3f} ms ({:.1f}%), idle {:.3f} ms, summed durations {:.3f} ms\n",
      records.size(), span * 1e-6, double(busy) * 1e-6, 100.0 * double(busy) / span, (span - double(busy)) * 1e-6,
      sum_ns * 1e-6);
  std::vector<std::pair<std::string, Total>> sorted(totals.begin(), totals.end());
  std::sort(sorted.begin(), sorted.end(), [](const auto& a, const auto& b) { return a.second.ns > b.second.ns; });
  out += fmt::format("{:>9} {:>6} {:>6} {:>9}  {}\n", "ms", "%", "count", "us/call", "kernel");
  for (int i = 0; i < int(sorted.size()) && i < top; ++i) {
    const auto& [name, t] = sorted[size_t(i)];
    out += fmt::format("{:9.3f} {:6.1f} {:6d} {:9.1f}  {}\n", t.ns * 1e-6, 100.0 * t.ns / sum_ns, t.count,
                       t.ns * 1e-3 / double(t.count), name);
  }
  return out;
}

}  // namespace colossal::core::cuda

#else  // no CUPTI in this build

namespace colossal::core::cuda {

bool kernel_trace_available() {
  return false;
}

uint64_t kernel_trace_timestamp_ns() {
  return 0;
}

void KernelTrace::start() {
  COLOSSAL_FAIL("KernelTrace: this build has no CUPTI (the CUDA toolkit's CUDA::cupti was not found)");
}

std::vector<KernelRecord> KernelTrace::stop() {
  return {};
}

std::string short_kernel_name(const std::string& name) {
  return name;
}

std::string summarize(const std::vector<KernelRecord>&, int) {
  return "trace: this build has no CUPTI\n";
}

}  // namespace colossal::core::cuda

#endif
