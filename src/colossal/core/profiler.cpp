// The step profiler: see profiler.h.
#include "colossal/core/profiler.h"

#include <fmt/format.h>

#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>
#include <memory>
#include <mutex>
#include <stdexcept>
#include <string>
#include <string_view>
#include <thread>
#include <vector>

#include "colossal/core/cuda_device.h"  // Event, current_stream, synchronize
#include "colossal/core/error.h"
#include "colossal/core/host_profiler.h"  // HostProfiler
#include "colossal/core/kernel_trace.h"   // KernelTrace

namespace colossal::core::profiler {
namespace {

using Clock = std::chrono::steady_clock;

struct HostRange {
  std::string name;
  int thread = 0;
  double begin_us = 0, end_us = -1;
};

struct DeviceRange {
  std::string name;
  Stream stream;
  size_t lane = 0;
  std::unique_ptr<cuda::Event> begin, end;
};

/// A stream's reference point: an event recorded when the stream's first range began, and the
/// host time of that moment (Note [Device ranges and the host clock]).
struct Lane {
  Stream stream;
  std::unique_ptr<cuda::Event> base;
  double host_us = 0;
};

struct State {
  std::mutex mutex;
  Options options;
  std::atomic<bool> active{false};
  Clock::time_point origin;
  std::vector<HostRange> host;
  std::vector<DeviceRange> device;
  std::vector<Lane> lanes;
  std::map<std::thread::id, int> threads;
  /// CUPTI's kernel records, started at the window's first CUDA range (when the build has CUPTI and
  /// COLOSSAL_PROFILE_KERNELS is not 0); kernel_origin_ns is CUPTI's clock at host time kernel_origin_us.
  std::unique_ptr<cuda::KernelTrace> kernels;
  uint64_t kernel_origin_ns = 0;
  double kernel_origin_us = 0;
  /// The host's stack samples over the window (Options::host_samples).
  std::unique_ptr<HostProfiler> host_sampler;
};

bool kernels_wanted() {
  const char* value = std::getenv("COLOSSAL_PROFILE_KERNELS");
  return cuda::kernel_trace_available() && (value == nullptr || std::string_view(value) != "0");
}

State& state() {
  static State s;
  return s;
}

double now_us(const State& s) {
  return std::chrono::duration<double, std::micro>(Clock::now() - s.origin).count();
}

int thread_index(State& s) {
  const auto [it, inserted] = s.threads.try_emplace(std::this_thread::get_id(), static_cast<int>(s.threads.size()));
  return it->second;
}

size_t lane_of(State& s, Stream stream) {
  for (size_t i = 0; i < s.lanes.size(); ++i) {
    if (s.lanes[i].stream == stream) return i;
  }
  cuda::DeviceGuard guard(stream.device);  // an event belongs to the device current at its creation
  Lane lane{stream, std::make_unique<cuda::Event>(/*enable_timing=*/true), 0};
  lane.base->record(stream);
  lane.host_us = now_us(s);
  s.lanes.push_back(std::move(lane));
  return s.lanes.size() - 1;
}

int64_t begin_device_locked(State& s, std::string name, Stream stream) {
  if (!s.kernels && kernels_wanted()) {
    s.kernels = std::make_unique<cuda::KernelTrace>();
    s.kernels->start();
    s.kernel_origin_ns = cuda::kernel_trace_timestamp_ns();
    s.kernel_origin_us = now_us(s);
  }
  const size_t lane = lane_of(s, stream);
  cuda::DeviceGuard guard(stream.device);
  DeviceRange range{std::move(name), stream, lane, std::make_unique<cuda::Event>(true), nullptr};
  range.begin->record(stream);
  s.device.push_back(std::move(range));
  return static_cast<int64_t>(s.device.size()) - 1;
}

void end_device_locked(State& s, int64_t id) {
  if (id < 0 || id >= static_cast<int64_t>(s.device.size())) return;
  DeviceRange& range = s.device[static_cast<size_t>(id)];
  cuda::DeviceGuard guard(range.stream.device);
  range.end = std::make_unique<cuda::Event>(true);
  range.end->record(range.stream);
}

std::string json_string(std::string_view text) {
  std::string out = "\"";
  for (const char c : text) {
    if (c == '"' || c == '\\') {
      out += '\\';
      out += c;
    } else if (static_cast<unsigned char>(c) < 0x20) {
      out += fmt::format("\\u{:04x}", static_cast<int>(c));
    } else {
      out += c;
    }
  }
  return out + "\"";
}

/// Waits for the device, writes the trace (to a temporary name, then renamed) and the summary, and
/// clears what was collected. Called with the mutex held and the window closed.
void write_locked(State& s, int64_t steps) {
  // The host's samples stop first: what follows (waiting for the device, writing) is not the window's.
  std::string host_note;
  if (s.host_sampler) {
    s.host_sampler->stop();
    const std::string file = s.options.path + ".host.txt";
    try {
      const int samples = s.host_sampler->write(file);
      host_note =
          fmt::format("  host samples: {} in {} (tools/host-profile-report {} symbolises them)\n", samples, file, file);
    } catch (const std::exception& e) {
      host_note = fmt::format("  host samples not written: {}\n", e.what());
    }
    s.host_sampler.reset();
  }
  for (const Lane& lane : s.lanes) lane.base->synchronize();
  std::vector<cuda::KernelRecord> kernels;
  if (s.kernels) kernels = s.kernels->stop();  // synchronizes the device
  s.kernels.reset();
  for (const DeviceRange& range : s.device) {
    if (range.end) range.end->synchronize();
  }
  struct Total {
    int64_t count = 0;
    double host_us = 0, device_us = 0;
    bool on_device = false;
  };
  std::vector<std::pair<std::string, Total>> totals;  // in order of first appearance
  auto total_of = [&](const std::string& name) -> Total& {
    for (auto& [n, t] : totals) {
      if (n == name) return t;
    }
    totals.emplace_back(name, Total{});
    return totals.back().second;
  };

  std::string events;
  auto add_event = [&](const std::string& event) {
    if (!events.empty()) events += ",\n";
    events += event;
  };
  for (const auto& [id, index] : s.threads) {
    add_event(fmt::format(R"({{"ph":"M","name":"thread_name","pid":1,"tid":{},"args":{{"name":"host thread {}"}}}})",
                          index, index));
  }
  for (size_t i = 0; i < s.lanes.size(); ++i) {
    add_event(
        fmt::format(R"({{"ph":"M","name":"thread_name","pid":2,"tid":{},"args":{{"name":{}}}}})", i,
                    json_string(fmt::format("{} stream {}", s.lanes[i].stream.device, s.lanes[i].stream.handle))));
  }
  add_event(R"({"ph":"M","name":"process_name","pid":1,"args":{"name":"host"}})");
  add_event(R"({"ph":"M","name":"process_name","pid":2,"args":{"name":"device, from events"}})");
  for (const HostRange& r : s.host) {
    if (r.end_us < 0) continue;
    Total& t = total_of(r.name);
    ++t.count;
    t.host_us += r.end_us - r.begin_us;
    add_event(fmt::format(R"({{"ph":"X","pid":1,"tid":{},"name":{},"ts":{:.3f},"dur":{:.3f}}})", r.thread,
                          json_string(r.name), r.begin_us, r.end_us - r.begin_us));
  }
  for (const DeviceRange& r : s.device) {
    if (!r.end) continue;
    const Lane& lane = s.lanes[r.lane];
    const double begin = lane.host_us + 1e3 * lane.base->elapsed_ms(*r.begin);
    const double dur = 1e3 * r.begin->elapsed_ms(*r.end);
    Total& t = total_of(r.name);
    if (!t.on_device) t.on_device = true;
    if (t.count == 0) t.count = -1;  // device-only range: counted below
    t.device_us += dur;
    add_event(fmt::format(R"({{"ph":"X","pid":2,"tid":{},"name":{},"ts":{:.3f},"dur":{:.3f}}})", r.lane,
                          json_string(r.name), begin, dur));
  }
  // Device-only ranges count their device records.
  for (auto& [name, t] : totals) {
    if (t.count == -1) {
      t.count = 0;
      for (const DeviceRange& r : s.device) t.count += r.name == name && r.end ? 1 : 0;
    }
  }

  // The kernels, one lane per (device, stream), on the host clock (CUPTI's clock read beside it).
  std::vector<std::pair<int, uint32_t>> kernel_lanes;
  struct StreamBusy {
    int64_t records = 0;
    double busy_us = 0, cursor_us = 0, nccl_us = 0;
  };
  std::vector<StreamBusy> busy;
  for (const cuda::KernelRecord& k : kernels) {
    const std::pair<int, uint32_t> key{k.device, k.stream};
    size_t lane = 0;
    while (lane < kernel_lanes.size() && kernel_lanes[lane] != key) ++lane;
    if (lane == kernel_lanes.size()) {
      kernel_lanes.push_back(key);
      busy.emplace_back();
      add_event(
          fmt::format(R"({{"ph":"M","name":"thread_name","pid":3,"tid":{},"args":{{"name":"cuda:{} stream {}"}}}})",
                      lane, k.device, k.stream));
    }
    const double begin =
        s.kernel_origin_us + (static_cast<double>(k.start_ns) - static_cast<double>(s.kernel_origin_ns)) / 1e3;
    const double dur = static_cast<double>(k.end_ns - k.start_ns) / 1e3;
    const std::string name = cuda::short_kernel_name(k.name);
    add_event(fmt::format(R"({{"ph":"X","pid":3,"tid":{},"name":{},"ts":{:.3f},"dur":{:.3f}}})", lane,
                          json_string(name), begin, dur));
    StreamBusy& b = busy[lane];
    ++b.records;
    const double from = std::max(b.cursor_us, begin);  // records come sorted by start
    if (begin + dur > from) b.busy_us += begin + dur - from;
    b.cursor_us = std::max(b.cursor_us, begin + dur);
    if (name.starts_with("nccl") || name.find("ncclDevKernel") != std::string::npos) b.nccl_us += dur;
  }
  if (!kernel_lanes.empty()) {
    add_event(R"({"ph":"M","name":"process_name","pid":3,"args":{"name":"kernels, from CUPTI"}})");
  }

  const std::filesystem::path path(s.options.path);
  const std::filesystem::path temporary = path.string() + ".tmp";
  {
    std::ofstream out(temporary);
    COLOSSAL_CHECK(out.good(), "profiler: cannot write the trace to {} (COLOSSAL_PROFILE / --profile)",
                   temporary.string());
    out << "{\"traceEvents\":[\n" << events << "\n],\"displayTimeUnit\":\"ms\"}\n";
    COLOSSAL_CHECK(out.good(), "profiler: writing {} failed", temporary.string());
  }
  std::filesystem::rename(temporary, path);

  std::string summary = fmt::format("profile of {} steps ({}), per step:\n  {:<36} {:>7} {:>10} {:>10}\n", steps,
                                    path.string(), "range", "count", "host ms", "device ms");
  for (const auto& [name, t] : totals) {
    summary +=
        fmt::format("  {:<36} {:>7.1f} {:>10.3f} {:>10}\n", name, static_cast<double>(t.count) / steps,
                    t.host_us / 1e3 / steps, t.on_device ? fmt::format("{:.3f}", t.device_us / 1e3 / steps) : "");
  }
  if (!kernels.empty()) {
    const double span_us = static_cast<double>(kernels.back().end_ns - kernels.front().start_ns) / 1e3;
    summary += fmt::format("  kernels (CUPTI), per step over a span of {:.3f} ms:\n", span_us / 1e3 / steps);
    for (size_t lane = 0; lane < kernel_lanes.size(); ++lane) {
      summary += fmt::format(
          "    cuda:{} stream {:<6} {:>7.1f} records  busy {:>8.3f} ms{}\n", kernel_lanes[lane].first,
          kernel_lanes[lane].second, static_cast<double>(busy[lane].records) / steps, busy[lane].busy_us / 1e3 / steps,
          busy[lane].nccl_us > 0 ? fmt::format("  (NCCL {:.3f} ms)", busy[lane].nccl_us / 1e3 / steps) : std::string());
    }
    summary += cuda::summarize(kernels, 15);
  }
  summary += host_note;
  std::fputs(summary.c_str(), stderr);
  s.host.clear();
  s.device.clear();
  s.lanes.clear();
}

}  // namespace

Options options_from_env() {
  Options options;
  if (const char* path = std::getenv("COLOSSAL_PROFILE"); path != nullptr) options.path = path;
  if (const char* host = std::getenv("COLOSSAL_PROFILE_HOST"); host != nullptr) {
    const std::string_view value(host);
    COLOSSAL_CHECK(value == "0" || value == "1" || value.empty(), "COLOSSAL_PROFILE_HOST must be 0 or 1, got '{}'",
                   value);
    options.host_samples = value == "1";
  }
  if (const char* steps = std::getenv("COLOSSAL_PROFILE_STEPS"); steps != nullptr && *steps != '\0') {
    long long first = -1, count = -1;
    char tail = 0;
    COLOSSAL_CHECK(std::sscanf(steps, "%lld:%lld%c", &first, &count, &tail) == 2,
                   "COLOSSAL_PROFILE_STEPS must be FIRST:COUNT (e.g. 100:10), got '{}'", steps);
    options.first_step = first;
    options.num_steps = count;
  }
  return options;
}

void configure(const Options& options) {
  COLOSSAL_CHECK(options.path.empty() || (options.first_step >= 0 && options.num_steps > 0),
                 "profiler: the window must start at step >= 0 and hold >= 1 step, got first step {} and {} steps",
                 options.first_step, options.num_steps);
  COLOSSAL_CHECK(!options.host_samples || !options.path.empty(),
                 "profiler: host samples (--profile-host, COLOSSAL_PROFILE_HOST) need a trace path (--profile, "
                 "COLOSSAL_PROFILE): they are written beside it");
  State& s = state();
  std::lock_guard lock(s.mutex);
  s.active = false;
  s.options = options;
  s.host_sampler.reset();
  s.host.clear();
  s.device.clear();
  s.lanes.clear();
}

bool active() {
  return state().active.load(std::memory_order_relaxed);
}

void step_begin(int64_t step) {
  State& s = state();
  if (s.options.path.empty()) return;
  std::lock_guard lock(s.mutex);
  if (step == s.options.first_step) {
    s.origin = Clock::now();
    s.active = true;
    if (s.options.host_samples) s.host_sampler = std::make_unique<HostProfiler>();
  } else if (s.active && step == s.options.first_step + s.options.num_steps) {
    s.active = false;
    write_locked(s, s.options.num_steps);
  }
}

void finish() {
  State& s = state();
  std::lock_guard lock(s.mutex);
  if (!s.active) return;
  s.active = false;
  // The steps seen: count the outermost host ranges named like the trainer's step.
  int64_t steps = 0;
  for (const HostRange& r : s.host) steps += r.name == "train step" && r.end_us >= 0 ? 1 : 0;
  write_locked(s, std::max<int64_t>(steps, 1));
}

Scope::Scope(const char* name, Device device) {
  if (!active()) return;
  State& s = state();
  std::lock_guard lock(s.mutex);
  if (!s.active) return;
  s.host.push_back(HostRange{name, thread_index(s), now_us(s), -1});
  host_ = static_cast<int64_t>(s.host.size()) - 1;
  if (device.is_cuda()) device_ = begin_device_locked(s, name, cuda::current_stream(device));
}

Scope::~Scope() {
  if (host_ < 0) return;
  State& s = state();
  std::lock_guard lock(s.mutex);
  // A window written meanwhile (the last step's scope ends after step_begin closed it) dropped it.
  if (host_ < static_cast<int64_t>(s.host.size())) s.host[static_cast<size_t>(host_)].end_us = now_us(s);
  end_device_locked(s, device_);
}

int64_t begin_stream_range(std::string name, Stream stream) {
  if (!active()) return -1;
  State& s = state();
  std::lock_guard lock(s.mutex);
  if (!s.active) return -1;
  return begin_device_locked(s, std::move(name), stream);
}

void end_stream_range(int64_t id, Stream stream) {
  if (id < 0) return;
  State& s = state();
  std::lock_guard lock(s.mutex);
  if (id < static_cast<int64_t>(s.device.size()) && s.device[static_cast<size_t>(id)].stream == stream) {
    end_device_locked(s, id);
  }
}

}  // namespace colossal::core::profiler
