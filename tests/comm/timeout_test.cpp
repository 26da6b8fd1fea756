// The collective timeout: its sources (COLOSSAL_COLLECTIVE_TIMEOUT, parallel.timeout_s), its
// inheritance by sub-groups, the message, and whole jobs under mpirun and `colossal run` in which a
// rank skips a collective: the others end within the timeout, naming the rank, the operation, the
// group and the wait, and nothing of the job is left running.
#include <gtest/gtest.h>

#include <unistd.h>  // getpid

#include <chrono>
#include <cstdlib>
#include <map>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "colossal/comm/launch_env.h"
#include "colossal/comm/single_process_group.h"
#include "colossal/comm/timeout.h"
#include "colossal/comm/watchdog.h"
#include "colossal/core/build_config.h"
#if COLOSSAL_TIMEOUT_TEST_CONFIG
#include "colossal/config/train_config.h"  // parse_config: the parallel.timeout_s key
#endif
#include "gradcheck.h"        // EXPECT_ERROR_CONTAINS
#include "timeout_support.h"  // run_child, wait_for_no_leftovers, waited_seconds

namespace colossal::comm {
namespace {

using namespace std::chrono_literals;
using testing::ChildResult;

/// Sets or unsets a variable for one test, restoring it after.
class ScopedEnv {
 public:
  ScopedEnv(const char* name, const char* value) : name_(name) {
    if (const char* old = std::getenv(name)) old_ = old;
    if (value != nullptr) {
      ::setenv(name, value, 1);
    } else {
      ::unsetenv(name);
    }
  }
  ~ScopedEnv() {
    if (old_) {
      ::setenv(name_.c_str(), old_->c_str(), 1);
    } else {
      ::unsetenv(name_.c_str());
    }
  }

 private:
  std::string name_;
  std::optional<std::string> old_;
};

const char* kVariable = "COLOSSAL_COLLECTIVE_TIMEOUT";

TEST(CollectiveTimeout, VariableNameIsTheOneInLaunchEnv) {
  EXPECT_EQ(env::kCollectiveTimeout, kVariable);
}

TEST(CollectiveTimeout, ParsesSeconds) {
  EXPECT_EQ(parse_collective_timeout("300"), 300s);
  EXPECT_EQ(parse_collective_timeout("2.5"), 2500ms);
  EXPECT_EQ(parse_collective_timeout("1e1"), 10s);
  // A positive value below a millisecond rounds up: never a zero timeout.
  EXPECT_EQ(parse_collective_timeout("0.0001"), 1ms);
}

TEST(CollectiveTimeout, BadValuesNameTheVariable) {
  for (const char* bad : {"", "abc", "5s", "0", "-1", "inf", "nan", "1e9"}) {
    SCOPED_TRACE(bad);
    EXPECT_ERROR_CONTAINS(parse_collective_timeout(bad), std::string(kVariable) + "='" + bad + "'");
  }
  EXPECT_ERROR_CONTAINS(parse_collective_timeout("abc"), "is not a number of seconds");
  EXPECT_ERROR_CONTAINS(parse_collective_timeout("0"), "> 0 and <= 604800");
}

TEST(CollectiveTimeout, VariableOverridesWhatTheProgramAsked) {
  {
    ScopedEnv unset(kVariable, nullptr);
    EXPECT_EQ(collective_timeout_from_env(), std::nullopt);
    EXPECT_EQ(resolve_collective_timeout(42s), 42s);
  }
  {
    ScopedEnv empty(kVariable, "");
    EXPECT_EQ(resolve_collective_timeout(42s), 42s);
  }
  {
    ScopedEnv set(kVariable, "7");
    EXPECT_EQ(resolve_collective_timeout(42s), 7s);
  }
  {
    ScopedEnv bad(kVariable, "soon");
    EXPECT_ERROR_CONTAINS(resolve_collective_timeout(42s), "COLOSSAL_COLLECTIVE_TIMEOUT='soon'");
  }
}

#if COLOSSAL_TIMEOUT_TEST_CONFIG
TEST(CollectiveTimeout, ConfigKeyDefaultsTo300AndMustBePositive) {
  EXPECT_EQ(config::TrainConfig{}.parallel.timeout_s, 300);
  EXPECT_EQ(config::parse_config("[parallel]\ntimeout_s = 2.5\n", {}, "test.toml").parallel.timeout_s, 2.5);
  EXPECT_EQ(config::parse_config("", {"parallel.timeout_s=30"}, "test.toml").parallel.timeout_s, 30);
  for (const char* bad : {"0", "-5", "1e9"}) {
    SCOPED_TRACE(bad);
    EXPECT_ERROR_CONTAINS(config::parse_config(std::string("[parallel]\ntimeout_s = ") + bad + "\n", {}, "test.toml"),
                          "parallel.timeout_s");
  }
  // The run assembly turns the key into the world's timeout with the same check.
  EXPECT_EQ(collective_timeout_from_seconds(2.5, "parallel.timeout_s"), 2500ms);
  EXPECT_ERROR_CONTAINS(collective_timeout_from_seconds(0, "parallel.timeout_s"), "parallel.timeout_s = 0");
}
#endif

TEST(CollectiveTimeout, SubgroupsInheritTheParentsTimeout) {
  std::shared_ptr<ProcessGroup> world = single_process_group(core::kCpu);
  EXPECT_EQ(world->timeout(), kDefaultCollectiveTimeout);
  world->set_timeout(1234ms);
  EXPECT_EQ(world->split(0, 0)->timeout(), 1234ms);
  EXPECT_EQ(world->new_group({0})->timeout(), 1234ms);
  EXPECT_ERROR_CONTAINS(world->set_timeout(0ms), "must be positive");
}

/// An operation that never finishes, for the message.
class NeverDone final : public WatchedOperation {
 public:
  using WatchedOperation::WatchedOperation;
  bool poll() noexcept override { return false; }
};

TEST(CollectiveTimeout, MessageNamesRankOperationGroupAndWait) {
  std::shared_ptr<ProcessGroup> world = single_process_group(core::kCpu);
  world->set_timeout(2s);
  NeverDone op(*world, "all_reduce (sum) of a f32 tensor of shape [4]");
  EXPECT_EQ(op.deadline() - op.issued(), 2s);
  const std::string message = timeout_message(op, op.issued() + 2100ms);
  EXPECT_NE(message.find("rank 0 (rank 0 of its group) waited 2.1 s for all_reduce (sum) of a f32 tensor of shape "
                         "[4] [" +
                         world->describe() + "]"),
            std::string::npos)
      << message;
  EXPECT_NE(message.find("the timeout is 2 s"), std::string::npos) << message;
  EXPECT_NE(message.find("exit code 75"), std::string::npos) << message;
  EXPECT_NE(message.find("parallel.timeout_s or COLOSSAL_COLLECTIVE_TIMEOUT"), std::string::npos) << message;
}

/// An operation whose poll blocks, as a CUDA query does when another thread's driver call holds the
/// context (Note [A blocked poll] in comm/watchdog.cpp).
class BlockingPoll final : public WatchedOperation {
 public:
  using WatchedOperation::WatchedOperation;
  bool poll() noexcept override {
    for (;;) std::this_thread::sleep_for(1h);
  }
};

TEST(CollectiveTimeoutDeathTest, AWatchdogWhosePollBlocksStillEndsTheProcess) {
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  EXPECT_EXIT(
      {
        std::shared_ptr<ProcessGroup> world = single_process_group(core::kCpu);
        world->set_timeout(1s);
        watch(std::make_shared<BlockingPoll>(*world, "recv of a f32 tensor of shape [8, 16] from rank 0"));
        std::this_thread::sleep_for(60s);  // the watchdog's guard ends the process before this returns
        std::_Exit(0);
      },
      ::testing::ExitedWithCode(kCollectiveTimeoutExitCode),
      "waited .* for recv of a f32 tensor of shape \\[8, 16\\] from rank 0.*query of that operation itself "
      "blocked");
}

// ---- whole jobs: a rank skips a collective

#if COLOSSAL_WITH_MPI && defined(COLOSSAL_TIMEOUT_HELPER)

/// mpirun and the helper with the timeout set; every job gets its own marker.
std::string new_job_marker(const std::string& name) {
  return name + "-" + std::to_string(::getpid()) + "-" +
         std::to_string(std::chrono::steady_clock::now().time_since_epoch().count());
}

std::map<std::string, std::string> job_env(const std::string& marker, const char* timeout) {
  return {{kVariable, timeout},
          {testing::kMarkerVariable, marker},
          {"OMPI_ALLOW_RUN_AS_ROOT", "1"},
          {"OMPI_ALLOW_RUN_AS_ROOT_CONFIRM", "1"},
          {"OMP_NUM_THREADS", "1"}};
}

/// Starting 2 ranks under mpirun and joining them takes under a second on an idle 2-core CI machine
/// (up to 2.3 s seen with other tests beside it); the watchdog adds at most a poll (0.1 s) after the
/// deadline and the launcher a moment to stop the other rank. 5 s of slack covers that with room.
constexpr double kSlackSeconds = 5.0;

void expect_ended_within(const ChildResult& r, double timeout_seconds) {
  EXPECT_FALSE(r.overran) << "the job was still running after the limit:\n" << r.output;
  EXPECT_TRUE(r.exited && r.exit_code != 0) << "exit code " << r.exit_code << "\n" << r.output;
  EXPECT_LT(r.seconds, timeout_seconds + kSlackSeconds) << r.output;
  const double waited = testing::waited_seconds(r.output);
  // It waited at least the timeout, and at most a poll and a scheduling delay more.
  EXPECT_GE(waited, timeout_seconds) << r.output;
  EXPECT_LT(waited, timeout_seconds + 1.0) << r.output;
}

void expect_no_leftovers(const std::string& marker) {
  const std::vector<int> left = testing::wait_for_no_leftovers(marker, 3s);
  EXPECT_TRUE(left.empty()) << left.size() << " process(es) of the job still running, e.g. pid " << left.front();
}

std::vector<std::string> mpirun(const char* scenario) {
  return {COLOSSAL_MPIEXEC, "-np", "2", "--oversubscribe", COLOSSAL_TIMEOUT_HELPER, scenario};
}

TEST(MpiTimeout, RankSkippingAllReduceEndsTheOtherWithinTheTimeout) {
  const std::string marker = new_job_marker("skip_all_reduce");
  const ChildResult r = testing::run_child(mpirun("skip_all_reduce"), job_env(marker, "2"), 20s);
  expect_ended_within(r, 2.0);
  EXPECT_NE(r.output.find("collective timeout: rank 0 (rank 0 of its group) waited"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("for all_reduce (sum) of a f32 tensor of shape [4] [mpi group of 2 ranks (world ranks 0, "
                          "1), this is rank 0]"),
            std::string::npos)
      << r.output;
  EXPECT_NE(r.output.find("the timeout is 2 s"), std::string::npos) << r.output;
  EXPECT_EQ(r.output.find("should have timed out"), std::string::npos) << r.output;
  expect_no_leftovers(marker);
}

TEST(MpiTimeout, AsyncWorkNobodyWaitsOnIsWatched) {
  const std::string marker = new_job_marker("skip_async");
  const ChildResult r = testing::run_child(mpirun("skip_async"), job_env(marker, "1"), 20s);
  expect_ended_within(r, 1.0);
  EXPECT_NE(r.output.find("rank 0 (rank 0 of its group) waited"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("all_reduce (sum) of a f32 tensor of shape [4]"), std::string::npos) << r.output;
  expect_no_leftovers(marker);
}

TEST(MpiTimeout, SubgroupsTimeOutNamingBothRanks) {
  const std::string marker = new_job_marker("skip_in_subgroup");
  const ChildResult r = testing::run_child(mpirun("skip_in_subgroup"), job_env(marker, "1"), 20s);
  expect_ended_within(r, 1.0);
  // new_group({1, 0}): world rank 0 is rank 1 of the group, which inherited the world's timeout.
  EXPECT_NE(r.output.find("rank 0 (rank 1 of its group) waited"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("all_gather of a f32 input of shape [4] into [8] [mpi group of 2 ranks (world ranks 1, 0), "
                          "this is rank 1]"),
            std::string::npos)
      << r.output;
  EXPECT_NE(r.output.find("the timeout is 1 s"), std::string::npos) << r.output;
  expect_no_leftovers(marker);
}

TEST(MpiTimeout, AReceiveThatNeverCompletesNamesWhatItWasFor) {
  // A pipeline stage waiting for an activation its peer never sends: the message names the stage, the
  // pass and the microbatch (comm/operation_context.h), not only the receive.
  const std::string marker = new_job_marker("skip_send");
  const ChildResult r = testing::run_child(mpirun("skip_send"), job_env(marker, "1"), 20s);
  expect_ended_within(r, 1.0);
  EXPECT_NE(r.output.find("rank 1 (rank 1 of its group) waited"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("(pipeline stage 1 of 2: forward of microbatch 0)"), std::string::npos) << r.output;
  expect_no_leftovers(marker);
}

#if defined(COLOSSAL_BINARY)
TEST(MpiTimeout, ColossalRunNamesTheRankThatTimedOut) {
  const std::string marker = new_job_marker("colossal_run");
  const ChildResult r = testing::run_child({COLOSSAL_BINARY, "run", "--nproc_per_node", "2", "--backend", "mpi", "--",
                                            COLOSSAL_TIMEOUT_HELPER, "skip_all_reduce"},
                                           job_env(marker, "1"), 20s);
  expect_ended_within(r, 1.0);
  EXPECT_NE(r.output.find("rank 0 (rank 0 of its group) waited"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("colossal run: rank 0 exited with code 75"), std::string::npos) << r.output;
  expect_no_leftovers(marker);
}
#endif

#endif

}  // namespace
}  // namespace colossal::comm
