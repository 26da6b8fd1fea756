// GoogleTest output and outcome for test programs that every rank of a job runs (the mpi tests under
// mpirun, the multigpu tests under `colossal run`): rank 0 prints GoogleTest's usual output, the other
// ranks only their failures, each line tagged [rank N]; at the end the ranks agree on one outcome, so
// that every rank exits non-zero when any failed.
#pragma once

#include <gtest/gtest.h>

#include <cstdio>

#include "colossal/comm/process_group.h"

namespace colossal::comm::testing {

/// On ranks other than 0: print failures only, each line tagged with the rank.
class FailurePrinter : public ::testing::EmptyTestEventListener {
 public:
  explicit FailurePrinter(int rank) : rank_(rank) {}
  void OnTestPartResult(const ::testing::TestPartResult& result) override {
    if (!result.failed()) return;
    std::fprintf(stderr, "[rank %d] %s:%d: Failure\n%s\n", rank_, result.file_name() ? result.file_name() : "?",
                 result.line_number(), result.message());
  }
  void OnTestEnd(const ::testing::TestInfo& info) override {
    if (info.result()->Failed()) {
      std::fprintf(stderr, "[rank %d] FAILED %s.%s\n", rank_, info.test_suite_name(), info.name());
    }
  }

 private:
  int rank_;
};

/// Replaces GoogleTest's printer by a FailurePrinter on ranks other than 0.
inline void print_failures_only_unless_rank_zero(int rank) {
  if (rank == 0) return;
  auto& listeners = ::testing::UnitTest::GetInstance()->listeners();
  delete listeners.Release(listeners.default_result_printer());
  listeners.Append(new FailurePrinter(rank));
}

/// Whether any rank of `world` failed (a max all-reduce of each rank's flag on the group's device);
/// rank 0 says so when only another rank did.
inline bool any_rank_failed(ProcessGroup& world, bool this_rank_failed) {
  Tensor flag = core::from_vector<int32_t>({this_rank_failed ? 1 : 0}, {1}).to(world.device());
  world.all_reduce(flag, ReduceOp::max);
  const bool any = flag.to(core::kCpu).item<int32_t>() != 0;
  if (world.rank() == 0 && any && !this_rank_failed) {
    std::fprintf(stderr, "FAILED on another rank: see the [rank N] lines above\n");
  }
  return any;
}

}  // namespace colossal::comm::testing
