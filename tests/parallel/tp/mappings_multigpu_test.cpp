// Megatron's tensor-parallel mappings (parallel/tp/mappings.h) over NCCL, one process per GPU: the
// checks of mapping_checks.h that the MPI ranks run on the CPU (forward and hand-derived adjoints in
// f64, f32, f16 and bf16 along dims 0, 1 and -1, contiguous or not; finite differences in f64 across
// ranks), here on GPU tensors, so the dim moves, the in-place all-gather and the gradient all-reduce
// run through NCCL and the CUDA copy kernels, ordered on the ranks' streams.
#include <gtest/gtest.h>

#include <memory>

#include "colossal/parallel/tp/mappings.h"
#include "mapping_checks.h"  // check_all, check_finite_differences_of_*
#include "multigpu_main.h"   // world

namespace colossal::parallel::tp {
namespace {

using comm::ProcessGroup;
using comm::testing::world;
using namespace mapping_checks;  // NOLINT: the shared checks are this test's vocabulary

TEST(TensorParallelMappingsNccl, ForwardAndBackwardOverTheWorld) {
  check_all(world());
}

TEST(TensorParallelMappingsNccl, ForwardAndBackwardInSubGroups) {
  // Pairs of neighbouring ranks (NCCL communicators split from the world), as tp = 2 groups lie.
  if (world().size() < 4) GTEST_SKIP() << "needs two groups of two ranks";
  const std::shared_ptr<ProcessGroup> pair = world().split(world().rank() / 2, world().rank());
  ASSERT_EQ(pair->size(), 2);
  check_all(*pair);
}

TEST(TensorParallelMappingsNccl, FiniteDifferencesOfEachMapping) {
  check_finite_differences_of_each_mapping(world());
}

TEST(TensorParallelMappingsNccl, FiniteDifferencesOfMegatronBlocks) {
  check_finite_differences_of_megatron_blocks(world());
}

}  // namespace
}  // namespace colossal::parallel::tp

int main(int argc, char** argv) {
  return colossal::comm::testing::run_multigpu_tests(argc, argv);
}
