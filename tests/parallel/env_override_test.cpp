// The gradient handlers' environment overrides (parallel/env_override.h).
#include "colossal/parallel/env_override.h"

#include <gtest/gtest.h>

#include <cstdlib>

#include "../support/gradcheck.h"  // EXPECT_ERROR_CONTAINS

namespace colossal::parallel {
namespace {

constexpr const char* kName = "COLOSSAL_ENV_OVERRIDE_TEST";

TEST(EnvOverride, UnsetOrEmptyIsNone) {
  ::unsetenv(kName);
  EXPECT_EQ(env_switch(kName), std::nullopt);
  EXPECT_EQ(env_count(kName, "buckets", 10), std::nullopt);
  ::setenv(kName, "", 1);
  EXPECT_EQ(env_switch(kName), std::nullopt);
  EXPECT_EQ(env_count(kName, "buckets", 10), std::nullopt);
  ::unsetenv(kName);
}

TEST(EnvOverride, ValuesAndClearErrors) {
  ::setenv(kName, "1", 1);
  EXPECT_EQ(env_switch(kName), true);
  EXPECT_EQ(env_count(kName, "buckets", 10), 1);
  ::setenv(kName, "0", 1);
  EXPECT_EQ(env_switch(kName), false);
  EXPECT_EQ(env_count(kName, "buckets", 10), 0);
  ::setenv(kName, "10", 1);
  EXPECT_EQ(env_count(kName, "buckets", 10), 10);
  EXPECT_ERROR_CONTAINS(env_switch(kName), "COLOSSAL_ENV_OVERRIDE_TEST must be 0 or 1, got '10'");
  ::setenv(kName, "11", 1);
  EXPECT_ERROR_CONTAINS(env_count(kName, "buckets", 10),
                        "COLOSSAL_ENV_OVERRIDE_TEST must be a whole number of buckets from 0 to 10, got '11'");
  ::setenv(kName, "2x", 1);
  EXPECT_ERROR_CONTAINS(env_count(kName, "buckets", 10), "got '2x'");
  ::setenv(kName, "-1", 1);
  EXPECT_ERROR_CONTAINS(env_count(kName, "buckets", 10), "got '-1'");
  ::unsetenv(kName);
}

}  // namespace
}  // namespace colossal::parallel
