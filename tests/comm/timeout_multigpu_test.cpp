// The collective timeout over NCCL, one process per GPU (label multigpu: every rank runs this program,
// started by `colossal run --nproc_per_node 2 --backend processes --` or by mpirun). A timed-out rank
// ends its process, so each rank's test runs the scenario in a child job of its own (this program
// again, with COLOSSAL_TIMEOUT_SCENARIO set), the children of all ranks joining a world of their own
// over the TCP rendezvous. In each scenario rank 1 skips a collective: every other rank must end
// within the timeout (plus kSlackSeconds) of issuing it, with exit code 75 and a message naming the
// rank, the operation, the group and the wait; rank 1, calling it late into a world whose peers are
// gone, must end too; nothing of the job may be left running.
#include <gtest/gtest.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <exception>
#include <map>
#include <string>
#include <string_view>
#include <thread>

#include "colossal/comm/bootstrap.h"  // read_dist_env
#include "colossal/comm/init.h"       // init_process_group, backend_available
#include "colossal/comm/launch_env.h"
#include "colossal/comm/timeout.h"  // kCollectiveTimeoutExitCode
#include "timeout_support.h"        // run_child, wait_for_no_leftovers, waited_seconds

namespace colossal::comm {
namespace {

using namespace std::chrono_literals;
using Clock = std::chrono::steady_clock;

constexpr const char* kScenarioVariable = "COLOSSAL_TIMEOUT_SCENARIO";
/// A child that finds no GPU or no NCCL says so with this code, and the test skips.
constexpr int kSkipExitCode = 77;
/// The scenarios' timeout, in seconds: long enough for a healthy all-reduce of 4 KiB right after a
/// warm-up, short enough to keep the test quick.
constexpr const char* kTimeoutSeconds = "3";
constexpr double kTimeout = 3.0;
/// After its deadline a rank needs at most a watchdog poll (0.1 s), the communicators' abort and
/// its exit; 3 s covers that. Its start (NCCL's set-up) is not counted: the time runs from the
/// moment the child printed that it issues the collective.
constexpr double kSlackSeconds = 3.0;

// ---- the child: one rank of the scenario's world

/// Prints the monotonic time (the same clock in every process of the machine) at which this rank
/// issues the collective that will not complete.
void print_issue_time() {
  const auto ns = std::chrono::duration_cast<std::chrono::nanoseconds>(Clock::now().time_since_epoch()).count();
  std::fprintf(stderr, "timeout scenario: issued at %lld ns\n", static_cast<long long>(ns));
  std::fflush(stderr);
}

int run_scenario(std::string_view scenario) {
  if (!backend_available(Backend::nccl)) {
    std::fprintf(stderr, "timeout scenario: this build or machine has no NCCL with a GPU\n");
    return kSkipExitCode;
  }
  InitOptions options;
  options.backend = Backend::nccl;
  std::shared_ptr<ProcessGroup> world = init_process_group(options, read_dist_env());
  const int rank = world->rank();
  Tensor t = core::ones({1024}, TensorOptions(DType::f32, world->device()));
  // Connections up and every rank here before anyone skips.
  world->all_reduce(t);
  world->barrier();
  // Rank 1 comes late, after the others have ended on their timeout, into a world that cannot
  // complete anything any more.
  const auto late = world->timeout() + 3s;
  if (scenario == "skip_all_reduce") {
    if (rank == 1) std::this_thread::sleep_for(late);
    print_issue_time();
    world->all_reduce(t);  // only makes the stream wait
    // The host blocks inside CUDA, behind the all-reduce, where no loop of ours runs: only the
    // watchdog's thread can end this rank.
    Tensor host = t.to(core::kCpu);
  } else if (scenario == "skip_barrier") {
    if (rank == 1) std::this_thread::sleep_for(late);
    print_issue_time();
    world->barrier();  // blocks the host in NCCL's synchronize loop
  } else {
    std::fprintf(stderr, "timeout scenario: unknown scenario '%.*s'\n", static_cast<int>(scenario.size()),
                 scenario.data());
    return 2;
  }
  std::fprintf(stderr, "timeout scenario: rank %d finished '%.*s', which should have timed out\n", rank,
               static_cast<int>(scenario.size()), scenario.data());
  return 3;
}

// ---- the test: runs the child of this rank and checks how it ended

/// The issue time the child printed, or nullopt.
std::optional<Clock::time_point> issue_time(const std::string& output) {
  const std::string key = "timeout scenario: issued at ";
  const size_t at = output.find(key);
  if (at == std::string::npos) return std::nullopt;
  const long long ns = std::strtoll(output.c_str() + at + key.size(), nullptr, 10);
  return Clock::time_point(std::chrono::nanoseconds(ns));
}

void run_and_check(const std::string& scenario, std::string_view operation, int port_offset) {
  const DistEnv env = read_dist_env();
  if (env.world_size < 2) {
    GTEST_SKIP() << "one rank: run it as colossal run --nproc_per_node 2 --backend processes -- <this program>";
  }
  const std::string marker =
      scenario + "-" + std::to_string(env.rank) + "-" + std::to_string(Clock::now().time_since_epoch().count());
  // The children join a world of their own by the TCP rendezvous (COLOSSAL_LAUNCHER makes bootstrap
  // read these even under mpirun, whose variables they inherit), on a port of their own.
  const std::map<std::string, std::string> extra = {
      {kScenarioVariable, scenario},
      {std::string(env::kCollectiveTimeout), kTimeoutSeconds},
      {testing::kMarkerVariable, marker},
      {std::string(env::kColossalLauncher), "1"},
      {std::string(env::kRank), std::to_string(env.rank)},
      {std::string(env::kWorldSize), std::to_string(env.world_size)},
      {std::string(env::kLocalRank), std::to_string(env.local_rank)},
      {std::string(env::kLocalWorldSize), std::to_string(env.local_world_size)},
      {std::string(env::kMasterAddr), env.master_addr},
      {std::string(env::kMasterPort), std::to_string(env.master_port + port_offset)},
  };
  const testing::ChildResult r = testing::run_child({"/proc/self/exe"}, extra, 120s);
  const Clock::time_point ended = Clock::now();
  if (r.exited && r.exit_code == kSkipExitCode) GTEST_SKIP() << r.output;

  EXPECT_FALSE(r.overran) << "rank " << env.rank << "'s child was still running after 120 s:\n" << r.output;
  // The watchdog's ncclCommAbort can release a host stuck in CUDA behind the hung collective, so
  // the scenario may print that it returned; the process must still end with the watchdog's code
  // (checked below), which the exit path waits for.
  if (env.rank != 1) {
    EXPECT_TRUE(r.exited && r.exit_code != 0) << "exit code " << r.exit_code << "\n" << r.output;
  }
  const std::optional<Clock::time_point> issued = issue_time(r.output);
  ASSERT_TRUE(issued.has_value()) << r.output;
  const double seconds_after_issue = std::chrono::duration<double>(ended - *issued).count();
  const std::string this_rank = fmt::format("rank {} (rank {} of its group)", env.rank, env.rank);
  if (env.rank == 1) {
    // Late into a world whose peers are gone: what NCCL does then is its own (on one H100 host the
    // late all_reduce returned, the peers' aborted communicators having left their flags behind);
    // what matters is that this rank does not hang either.
    EXPECT_LT(seconds_after_issue, kTimeout + kSlackSeconds) << r.output;
  } else {
    EXPECT_EQ(r.exit_code, kCollectiveTimeoutExitCode) << r.output;
    EXPECT_LT(seconds_after_issue, kTimeout + kSlackSeconds) << r.output;
    EXPECT_NE(r.output.find(this_rank), std::string::npos) << r.output;
    EXPECT_NE(r.output.find(std::string(operation)), std::string::npos) << r.output;
    EXPECT_NE(r.output.find(fmt::format("[nccl group of {} ranks", env.world_size)), std::string::npos) << r.output;
    if (r.output.find("collective timeout:") != std::string::npos) {
      const double waited = testing::waited_seconds(r.output);
      EXPECT_GE(waited, kTimeout) << r.output;
      EXPECT_LT(waited, kTimeout + 1.0) << r.output;
    } else {
      // With 3 or more ranks a rank may hear first that another one ended on its timeout.
      EXPECT_NE(r.output.find("communication failed:"), std::string::npos) << r.output;
    }
  }
  const std::vector<int> left = testing::wait_for_no_leftovers(marker, 5s);
  EXPECT_TRUE(left.empty()) << left.size() << " process(es) of the child job still running";
}

TEST(TimeoutMultiGpu, RankSkippingAllReduceEndsTheOthersWhileTheHostWaitsInCuda) {
  run_and_check("skip_all_reduce", "all_reduce (sum) of a f32 tensor of shape [1024]", 11);
}

TEST(TimeoutMultiGpu, RankSkippingBarrierEndsTheOthers) {
  run_and_check("skip_barrier", "barrier", 12);
}

}  // namespace
}  // namespace colossal::comm

int main(int argc, char** argv) {
  if (const char* scenario = std::getenv(colossal::comm::kScenarioVariable)) {
    try {
      return colossal::comm::run_scenario(scenario);
    } catch (const std::exception& e) {
      std::fprintf(stderr, "timeout scenario: %s\n", e.what());
      return 4;
    }
  }
  ::testing::InitGoogleTest(&argc, argv);
  return RUN_ALL_TESTS();
}
