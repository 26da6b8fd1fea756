// COLOSSAL_STEP_TIMING (engine/step_timing.h): unset or 0 is off, N samples every N-th step, and
// anything else is an error naming the variable. (The events themselves: step_timing_gpu_test.)
#include "colossal/engine/step_timing.h"

#include <gtest/gtest.h>

#include <cstdlib>
#include <string>

#include "colossal/core/error.h"

namespace colossal::engine {
namespace {

class StepTimingEnv : public ::testing::Test {
 protected:
  void TearDown() override { ::unsetenv(name().c_str()); }
  static std::string name() { return std::string(kStepTimingVariable); }
};

TEST_F(StepTimingEnv, UnsetOrZeroIsOffAndNSamplesEveryNthStep) {
  ::unsetenv(name().c_str());
  EXPECT_EQ(step_timing_interval_from_env(), 0);
  ::setenv(name().c_str(), "0", 1);
  EXPECT_EQ(step_timing_interval_from_env(), 0);
  ::setenv(name().c_str(), "10", 1);
  EXPECT_EQ(step_timing_interval_from_env(), 10);
}

TEST_F(StepTimingEnv, BadValuesNameTheVariable) {
  for (const char* bad : {"ten", "-1", "3x", "1.5"}) {
    ::setenv(name().c_str(), bad, 1);
    try {
      step_timing_interval_from_env();
      FAIL() << bad << " was accepted";
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find("COLOSSAL_STEP_TIMING = \"" + std::string(bad) + "\""), std::string::npos)
          << e.what();
    }
  }
}

}  // namespace
}  // namespace colossal::engine
