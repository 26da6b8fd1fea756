// Inputs that found a bug in the launchers' environment parsing (fuzz/dist_env_fuzz.cpp), kept as
// ordinary tests: each must give a clear error naming the variable at fault.
#include <gtest/gtest.h>

#include <cstdlib>
#include <map>
#include <string>

#include "colossal/comm/bootstrap.h"       // parse_dist_env
#include "colossal/comm/tcp_rendezvous.h"  // default_rendezvous_timeout
#include "gradcheck.h"                     // EXPECT_ERROR_CONTAINS

namespace colossal::comm {
namespace {

using Vars = std::map<std::string, std::string>;

Vars slurm_vars(const std::string& node_id, const std::string& tasks_per_node) {
  return {{"SLURM_PROCID", "0"},
          {"SLURM_NTASKS", "1"},
          {"SLURM_LOCALID", "0"},
          {"SLURM_NODEID", node_id},
          {"SLURM_STEP_TASKS_PER_NODE", tasks_per_node}};
}

// Repeats summed past INT_MAX while looking for a far node: signed overflow in slurm_tasks_on_node.
TEST(FuzzRegressions, SlurmTaskRepeatsThatOverflowAreRefused) {
  // The input as found: node 2147483647 is the first of the second run, not an overflow.
  EXPECT_EQ(parse_dist_env(slurm_vars("2147483647", "1(x2147483647),1(x2147483647)")).local_world_size, 1);
  EXPECT_EQ(parse_dist_env(slurm_vars("2147483646", "1(x2147483647)")).local_world_size, 1);
  // A node past the list, a repeat of zero or less, and a negative node name the list.
  EXPECT_ERROR_CONTAINS(parse_dist_env(slurm_vars("2147483647", "1(x2147483647)")),
                        "cannot read node 2147483647's task count from SLURM_STEP_TASKS_PER_NODE='1(x2147483647)'");
  EXPECT_ERROR_CONTAINS(parse_dist_env(slurm_vars("0", "1(x0),1")), "SLURM_STEP_TASKS_PER_NODE='1(x0),1'");
  EXPECT_ERROR_CONTAINS(parse_dist_env(slurm_vars("1", "1(x-5),1")), "SLURM_STEP_TASKS_PER_NODE='1(x-5),1'");
  EXPECT_ERROR_CONTAINS(parse_dist_env(slurm_vars("-1", "1")), "cannot read node -1's task count");
}

// 1e300 seconds overflowed the conversion to milliseconds (undefined behaviour).
TEST(FuzzRegressions, HugeRendezvousTimeoutsAreRefused) {
  ::setenv("COLOSSAL_RENDEZVOUS_TIMEOUT", "1e300", 1);
  EXPECT_ERROR_CONTAINS(default_rendezvous_timeout(),
                        "COLOSSAL_RENDEZVOUS_TIMEOUT='1e300' is not a positive number of seconds (at most 1e+09)");
  ::setenv("COLOSSAL_RENDEZVOUS_TIMEOUT", "1e9", 1);
  EXPECT_EQ(default_rendezvous_timeout(), std::chrono::seconds(1'000'000'000));
  ::unsetenv("COLOSSAL_RENDEZVOUS_TIMEOUT");
}

}  // namespace
}  // namespace colossal::comm
