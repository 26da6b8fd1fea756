// The step profiler on the CPU (core/profiler.h): a window of steps written as a Chrome trace, and
// with host samples (--profile-host) the host's stacks over the window beside it
// (core/host_profiler.h), in the format tools/host-profile-report reads.
#include "colossal/core/profiler.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <chrono>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <string>

#include "colossal/core/error.h"
#include "colossal/core/host_profiler.h"

namespace colossal::core::profiler {
namespace {

namespace fs = std::filesystem;

/// Spends about `ms` of this thread's CPU time (SIGPROF counts CPU time, not wall time).
double spin(double ms) {
  const auto end = std::chrono::steady_clock::now() + std::chrono::duration<double, std::milli>(ms);
  double x = 0;
  while (std::chrono::steady_clock::now() < end) {
    for (int i = 0; i < 1000; ++i) x += std::sqrt(static_cast<double>(i) + x);
  }
  return x;
}

std::string read(const fs::path& path) {
  std::ifstream in(path);
  return {std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
}

TEST(HostProfiler, SamplesABusyThreadAsModuleOffsets) {
  HostProfiler sampler(500);
  EXPECT_GT(spin(150), 0);
  sampler.stop();
  const fs::path file = fs::temp_directory_path() / ("host_profiler_test_" + std::to_string(::getpid()) + ".txt");
  const int samples = sampler.write(file.string());
  EXPECT_GT(samples, 10) << "150 ms of CPU sampled every 0.5 ms";
  const std::string text = read(file);
  EXPECT_NE(text.find("+0x"), std::string::npos) << text.substr(0, 400);
  fs::remove(file);
}

TEST(Profiler, AWindowWritesItsTraceAndItsHostSamples) {
  const fs::path trace = fs::temp_directory_path() / ("profiler_test_" + std::to_string(::getpid()) + ".json");
  configure(Options{.path = trace.string(), .first_step = 1, .num_steps = 2, .host_samples = true});
  step_begin(0);
  EXPECT_FALSE(active());
  for (int64_t step = 1; step <= 2; ++step) {
    step_begin(step);
    EXPECT_TRUE(active());
    Scope range("train step");
    spin(60);
  }
  step_begin(3);  // closes the window: writes the trace and the samples
  EXPECT_FALSE(active());
  const std::string json = read(trace);
  EXPECT_NE(json.find("\"train step\""), std::string::npos) << json.substr(0, 400);
  const std::string samples = read(trace.string() + ".host.txt");
  EXPECT_NE(samples.find("+0x"), std::string::npos) << "no host samples over 120 ms of CPU";
  fs::remove(trace);
  fs::remove(trace.string() + ".host.txt");
  configure(Options{});
}

TEST(Profiler, HostSamplesWithoutATracePathAreAnError) {
  try {
    configure(Options{.path = "", .host_samples = true});
    FAIL() << "host samples without a path were taken";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("--profile-host"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("--profile"), std::string::npos) << e.what();
  }
  configure(Options{});
}

}  // namespace
}  // namespace colossal::core::profiler
