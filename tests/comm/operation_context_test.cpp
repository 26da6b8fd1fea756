// OperationContext (comm/operation_context.h): contexts nest outermost first and end with their
// scope, belong to the thread that opened them, and reach the name a watched operation reports on a
// timeout.
#include "colossal/comm/operation_context.h"

#include <gtest/gtest.h>

#include <string>
#include <thread>

#include "colossal/comm/single_process_group.h"
#include "colossal/comm/watchdog.h"

namespace colossal::comm {
namespace {

TEST(OperationContext, NestsAndEndsWithItsScope) {
  EXPECT_EQ(OperationContext::current(), "");
  EXPECT_EQ(with_operation_context("recv"), "recv");
  {
    const OperationContext outer("pipeline stage 1 of 2");
    {
      const OperationContext inner("forward of microbatch 3");
      EXPECT_EQ(OperationContext::current(), "pipeline stage 1 of 2: forward of microbatch 3");
      EXPECT_EQ(with_operation_context("recv of a f32 tensor"),
                "recv of a f32 tensor (pipeline stage 1 of 2: forward of microbatch 3)");
    }
    EXPECT_EQ(OperationContext::current(), "pipeline stage 1 of 2");
  }
  EXPECT_EQ(OperationContext::current(), "");
}

TEST(OperationContext, BelongsToItsThread) {
  const OperationContext here("main thread");
  std::string seen = "unset";
  std::thread([&] { seen = OperationContext::current(); }).join();
  EXPECT_EQ(seen, "");
  EXPECT_EQ(OperationContext::current(), "main thread");
}

TEST(OperationContext, NamesTheWatchedOperation) {
  class Done final : public WatchedOperation {
   public:
    using WatchedOperation::WatchedOperation;
    bool poll() noexcept override { return true; }
  };
  const std::shared_ptr<ProcessGroup> group = single_process_group(core::kCpu);
  const OperationContext context("pipeline stage 0 of 1: backward of microbatch 2");
  const Done op(*group, "recv of a f64 tensor of shape [4] from rank 1");
  EXPECT_EQ(op.operation(),
            "recv of a f64 tensor of shape [4] from rank 1 (pipeline stage 0 of 1: backward of microbatch 2)");
}

}  // namespace
}  // namespace colossal::comm
