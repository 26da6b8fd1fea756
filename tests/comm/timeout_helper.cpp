// comm_timeout_helper: the ranks of the collective-timeout scenarios that timeout_test.cpp runs under
// mpirun and `colossal run --backend mpi`. Each scenario has a rank skip what the others call, so
// those others must end on the watchdog (exit code kCollectiveTimeoutExitCode, a message on stderr)
// within COLOSSAL_COLLECTIVE_TIMEOUT; the skipping rank sleeps until the launcher stops it.
//   comm_timeout_helper skip_all_reduce   rank 1 skips an all_reduce that rank 0 waits for
//   comm_timeout_helper skip_async        rank 1 skips; rank 0 issues it async and never waits
//   comm_timeout_helper skip_in_subgroup  the same on new_group({1, 0}), whose ranks are reversed
//   comm_timeout_helper skip_send         rank 0 never sends what rank 1 receives inside an
//                                         OperationContext (a pipeline stage's, as the schedule sets)
#include <chrono>
#include <cstdio>
#include <exception>
#include <string_view>
#include <thread>

#include "colossal/comm/init.h"               // init_process_group, read_dist_env
#include "colossal/comm/operation_context.h"  // OperationContext

namespace {

using namespace colossal;

/// Longer than any test's limit: the launcher, not this sleep, ends the rank.
void sleep_until_stopped() {
  std::this_thread::sleep_for(std::chrono::seconds(60));
}

int run(std::string_view scenario) {
  comm::InitOptions options;
  options.backend = comm::Backend::mpi;
  std::shared_ptr<comm::ProcessGroup> world = comm::init_process_group(options, comm::read_dist_env());
  // Every rank has joined and MPI has connected them before the scenario starts.
  world->barrier();
  Tensor t = core::ones({4});
  if (scenario == "skip_all_reduce") {
    if (world->rank() == 1) sleep_until_stopped();
    world->all_reduce(t);
  } else if (scenario == "skip_async") {
    if (world->rank() == 1) sleep_until_stopped();
    comm::Work work = world->all_reduce(t, comm::ReduceOp::sum, /*async=*/true);
    // Computing for longer than the timeout without waiting: only the watchdog's thread can notice.
    sleep_until_stopped();
    work.wait();
  } else if (scenario == "skip_in_subgroup") {
    std::shared_ptr<comm::ProcessGroup> reversed = world->new_group({1, 0});
    if (world->rank() == 1) sleep_until_stopped();
    Tensor gathered = core::empty({8});
    reversed->all_gather(gathered, t);
  } else if (scenario == "skip_send") {
    if (world->rank() == 0) sleep_until_stopped();
    const comm::OperationContext context("pipeline stage 1 of 2: forward of microbatch 0");
    world->recv(t, 0, /*tag=*/5);
  } else {
    std::fprintf(stderr, "comm_timeout_helper: unknown scenario '%.*s'\n", static_cast<int>(scenario.size()),
                 scenario.data());
    return 2;
  }
  std::fprintf(stderr, "comm_timeout_helper: rank %d finished '%.*s', which should have timed out\n", world->rank(),
               static_cast<int>(scenario.size()), scenario.data());
  return 3;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 2) {
    std::fprintf(stderr, "usage: %s skip_all_reduce|skip_async|skip_in_subgroup|skip_send\n", argv[0]);
    return 2;
  }
  try {
    return run(argv[1]);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "comm_timeout_helper: %s\n", e.what());
    return 4;
  }
}
