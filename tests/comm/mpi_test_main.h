// The main() of the comm mpi tests (each *_mpi_test.cpp runs under mpirun at 2 and 4 ranks): starts
// MPI through the world group before the tests, lets rank 0 print GoogleTest's usual output while the
// other ranks print only their failures (tagged [rank N]), and exits non-zero on every rank when any
// rank failed (tests/support/rank_report.h). The inputs and local references the collective tests
// compare against are tests/support/collective_reference.h's, shared with the multigpu tests.
#pragma once

#include <gtest/gtest.h>

#include <memory>

#include "collective_reference.h"  // input_value, make_input, reference_value, values_equal, ...
#include "colossal/comm/mpi/mpi_process_group.h"
#include "rank_report.h"  // print_failures_only_unless_rank_zero, any_rank_failed

namespace colossal::comm::testing {

inline std::shared_ptr<MpiProcessGroup>& world_slot() {
  static std::shared_ptr<MpiProcessGroup> world;
  return world;
}
/// The world group every test of the program shares.
inline MpiProcessGroup& world() {
  return *world_slot();
}

inline int run_mpi_tests(int argc, char** argv) {
  ::testing::InitGoogleTest(&argc, argv);
  world_slot() = MpiProcessGroup::create_world();
  print_failures_only_unless_rank_zero(world().rank());
  const int local_result = RUN_ALL_TESTS();
  const bool any_failed = any_rank_failed(world(), local_result != 0);
  world_slot().reset();
  return any_failed ? 1 : 0;
}

}  // namespace colossal::comm::testing
