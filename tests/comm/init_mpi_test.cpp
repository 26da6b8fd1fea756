// init_process_group under mpirun (2 and 4 ranks): the environment reads as Open MPI's, the automatic
// backend of a CPU build is MPI, and the world it returns agrees with MPI_COMM_WORLD and works.
#include "colossal/comm/init.h"
#include "gradcheck.h"  // EXPECT_ERROR_CONTAINS
#include "mpi_test_main.h"

namespace colossal::comm::testing {
namespace {

TEST(InitProcessGroup, EnvironmentIsOpenMpis) {
  const DistEnv env = read_dist_env();
  if (env.source == EnvSource::single && world().size() == 1) GTEST_SKIP() << "a singleton MPI process, not mpirun's";
  EXPECT_EQ(env.source, EnvSource::openmpi);
  EXPECT_EQ(env.rank, world().rank());
  EXPECT_EQ(env.world_size, world().size());
  // mpirun on one host: every rank is local.
  EXPECT_EQ(env.local_world_size, world().size());
  EXPECT_EQ(env.local_rank, world().rank());
}

TEST(InitProcessGroup, MpiBackendGivesTheWorld) {
  auto group = init_process_group(Backend::mpi);
  ASSERT_NE(group, nullptr);
  EXPECT_EQ(group->backend_name(), "mpi");
  EXPECT_EQ(group->rank(), world().rank());
  EXPECT_EQ(group->size(), world().size());
  Tensor t = scalar_tensor(group->rank(), DType::i64);
  group->all_reduce(t, ReduceOp::max);
  EXPECT_EQ(t.item<int64_t>(), group->size() - 1);
}

TEST(InitProcessGroup, AutomaticPicksWhatTheBuildHas) {
  if (backend_available(Backend::nccl)) GTEST_SKIP() << "a GPU is visible: automatic means nccl here";
  auto group = init_process_group(Backend::automatic);
  ASSERT_NE(group, nullptr);
  EXPECT_EQ(group->backend_name(), "mpi");
  group->barrier();
}

TEST(InitProcessGroup, EnvironmentThatDisagreesWithMpiIsRejected) {
  DistEnv env = read_dist_env();
  env.world_size += 1;
  env.source = EnvSource::torchrun;
  InitOptions options;
  options.backend = Backend::mpi;
  EXPECT_ERROR_CONTAINS(init_process_group(options, env), "needs its ranks started by mpirun");
}

TEST(InitProcessGroup, NcclWithoutItsRequirementsNamesWhatIsMissing) {
  if (backend_available(Backend::nccl)) GTEST_SKIP() << "NCCL can run here";
  InitOptions options;
  options.backend = Backend::nccl;
  EXPECT_ERROR_CONTAINS(init_process_group(options, read_dist_env()), "nccl backend");
}

}  // namespace
}  // namespace colossal::comm::testing

int main(int argc, char** argv) {
  return colossal::comm::testing::run_mpi_tests(argc, argv);
}
