// The main() of the multigpu tests (*_multigpu_test.cpp, label multigpu): every rank runs the program,
// one process per GPU, started by `colossal run --nproc_per_node N --backend processes --` (or by
// mpirun in a build with MPI); each joins the NCCL world from the launcher's environment before the
// tests. Output and outcome as the mpi tests (rank_report.h): rank 0 prints GoogleTest's output, the
// others their failures, and every rank exits non-zero when any failed.
#pragma once

#include <gtest/gtest.h>

#include <cstdio>
#include <exception>
#include <memory>

#include "colossal/comm/init.h"  // init_process_group, read_dist_env
#include "colossal/core/error.h"
#include "rank_report.h"  // print_failures_only_unless_rank_zero, any_rank_failed

namespace colossal::comm::testing {

inline std::shared_ptr<ProcessGroup>& multigpu_world_slot() {
  static std::shared_ptr<ProcessGroup> world;
  return world;
}
/// The NCCL world group every test of the program shares.
inline ProcessGroup& world() {
  return *multigpu_world_slot();
}
/// This rank's GPU.
inline Device gpu() {
  return world().device();
}

inline int run_multigpu_tests(int argc, char** argv) {
  ::testing::InitGoogleTest(&argc, argv);
  // Listing the tests needs no world (and must not wait for ranks that will never come).
  if (GTEST_FLAG_GET(list_tests)) return RUN_ALL_TESTS();
  const DistEnv env = read_dist_env();
  try {
    InitOptions options;
    options.backend = Backend::nccl;
    multigpu_world_slot() = init_process_group(options, env);
  } catch (const std::exception& e) {
    std::fprintf(stderr,
                 "cannot join the NCCL world (%s): %s\n"
                 "multigpu tests run one process per GPU: colossal run --nproc_per_node 2 --backend processes -- %s\n",
                 env.describe().c_str(), e.what(), argv[0]);
    return 1;
  }
  print_failures_only_unless_rank_zero(world().rank());
  const int local_result = RUN_ALL_TESTS();
  const bool any_failed = any_rank_failed(world(), local_result != 0);
  multigpu_world_slot().reset();
  return any_failed ? 1 : 0;
}

}  // namespace colossal::comm::testing
