// SIGPROF sampling into a preallocated buffer (the handler only calls backtrace, after a first
// call outside it has loaded the unwinder) and dladdr-based (module, offset) output.
#include "colossal/core/host_profiler.h"

#include <dlfcn.h>
#include <execinfo.h>
#include <signal.h>
#include <sys/time.h>

#include <algorithm>
#include <atomic>
#include <cstdio>
#include <memory>
#include <stdexcept>

namespace colossal::core {
namespace {

constexpr int kMaxFrames = 48;
constexpr int kMaxSamples = 50000;

struct Sample {
  int frames;
  void* pc[kMaxFrames];
};

Sample* g_samples = nullptr;
std::atomic<int> g_count{0};

void on_sigprof(int, siginfo_t*, void*) {
  const int i = g_count.fetch_add(1, std::memory_order_relaxed);
  if (i >= kMaxSamples) return;
  g_samples[i].frames = backtrace(g_samples[i].pc, kMaxFrames);
}

void set_timer(int interval_us) {
  itimerval timer{};
  timer.it_interval.tv_usec = interval_us;
  timer.it_value.tv_usec = interval_us;
  setitimer(ITIMER_PROF, &timer, nullptr);
}

}  // namespace

HostProfiler::HostProfiler(int interval_us) {
  if (g_samples != nullptr) throw std::runtime_error("HostProfiler: one profiler at a time");
  g_samples = new Sample[kMaxSamples];
  g_count = 0;
  void* warm[4];
  backtrace(warm, 4);  // loads libgcc's unwinder outside the signal handler
  struct sigaction action {};
  action.sa_sigaction = on_sigprof;
  action.sa_flags = SA_SIGINFO | SA_RESTART;
  sigemptyset(&action.sa_mask);
  sigaction(SIGPROF, &action, nullptr);
  set_timer(interval_us);
  running_ = true;
}

void HostProfiler::stop() {
  if (!running_) return;
  set_timer(0);
  signal(SIGPROF, SIG_IGN);
  running_ = false;
}

HostProfiler::~HostProfiler() {
  stop();
  delete[] g_samples;
  g_samples = nullptr;
}

int HostProfiler::write(const std::string& path) const {
  std::FILE* f = std::fopen(path.c_str(), "w");
  if (f == nullptr) throw std::runtime_error("HostProfiler: cannot write " + path);
  const int n = std::min(g_count.load(), kMaxSamples);
  for (int s = 0; s < n; ++s) {
    // Frames 0 and 1 are the handler and the signal trampoline.
    for (int k = 2; k < g_samples[s].frames; ++k) {
      Dl_info info{};
      void* pc = g_samples[s].pc[k];
      if (dladdr(pc, &info) != 0 && info.dli_fname != nullptr) {
        // A return address points after the call; -1 lands inside the calling line.
        std::fprintf(f, "%s+0x%lx ", info.dli_fname,
                     static_cast<unsigned long>(static_cast<char*>(pc) - static_cast<char*>(info.dli_fbase) - 1));
      } else {
        std::fprintf(f, "?+%p ", pc);
      }
    }
    std::fputc('\n', f);
  }
  std::fclose(f);
  return n;
}

}  // namespace colossal::core
