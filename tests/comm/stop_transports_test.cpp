// comm::stop_transports (comm/watchdog.h): runs every registered stop hook on the calling thread,
// each time it is called, so that a rank leaving on an error aborts its communicators before they
// are torn down.
#include <gtest/gtest.h>

#include <atomic>

#include "colossal/comm/watchdog.h"

namespace colossal::comm {
namespace {

TEST(StopTransports, RunsEveryStopHookOnTheCallingThread) {
  static std::atomic<int> first{0}, second{0};
  add_stop_hook([] { ++first; });
  add_stop_hook([] { ++second; });
  stop_transports();
  EXPECT_EQ(first.load(), 1);
  EXPECT_EQ(second.load(), 1);
  stop_transports();  // hooks must tolerate running again (ncclCommAbort happens once per communicator)
  EXPECT_EQ(first.load(), 2);
  EXPECT_EQ(second.load(), 2);
}

}  // namespace
}  // namespace colossal::comm
