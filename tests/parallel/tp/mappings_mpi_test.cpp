// Megatron's tensor-parallel mappings (parallel/tp/mappings.h) under MPI, at 2 and 4 ranks: the
// checks of mapping_checks.h (forward and hand-derived adjoints in f64, f32, f16 and bf16 along dims
// 0, 1 and -1 of 3-d tensors, contiguous or not; finite differences in f64 across ranks) over the
// world and over sub-groups; the identity on one rank; errors for what cannot be split.
#include <gtest/gtest.h>

#include <memory>
#include <string>

#include "../../comm/mpi_test_main.h"  // world
#include "colossal/comm/single_process_group.h"
#include "colossal/ops.h"
#include "colossal/parallel/tp/mappings.h"
#include "gradcheck.h"       // EXPECT_ERROR_CONTAINS
#include "mapping_checks.h"  // check_all, check_finite_differences_of_*, all_mappings

namespace colossal::parallel::tp {
namespace {

using comm::ProcessGroup;
using comm::testing::world;
using namespace mapping_checks;  // NOLINT: the shared checks are this test's vocabulary

TEST(TensorParallelMappings, ForwardAndBackwardOverTheWorld) {
  check_all(world());
}

TEST(TensorParallelMappings, ForwardAndBackwardInSubGroups) {
  // Pairs of neighbouring ranks, as tensor-parallel groups of size 2 are laid out: the mappings must
  // use group ranks, not world ranks, and see only their own members.
  if (world().size() < 4) GTEST_SKIP() << "needs two groups of two ranks";
  const std::shared_ptr<ProcessGroup> pair = world().split(world().rank() / 2, world().rank());
  ASSERT_EQ(pair->size(), 2);
  check_all(*pair);
}

TEST(TensorParallelMappings, FiniteDifferencesOfEachMapping) {
  check_finite_differences_of_each_mapping(world());
}

TEST(TensorParallelMappings, FiniteDifferencesOfMegatronBlocks) {
  check_finite_differences_of_megatron_blocks(world());
}

// ---- one rank, errors

TEST(TensorParallelMappings, OneRankIsTheIdentityAndStillDifferentiable) {
  // A single-process group and an MPI group of one rank (each rank alone): no communication happens,
  // so a collective issued by mistake would fail (single-process) or mismatch across ranks (MPI).
  const std::shared_ptr<ProcessGroup> alone_mpi = world().split(world().rank(), 0);
  const std::shared_ptr<ProcessGroup> single = comm::single_process_group(core::kCpu);
  for (ProcessGroup* group : {alone_mpi.get(), single.get()}) {
    ASSERT_EQ(group->size(), 1);
    for (const Mapping& m : all_mappings()) {
      SCOPED_TRACE(m.name + " over " + group->describe());
      const Tensor input = make_input(DType::f64, world().rank(), {3, 4, 5});
      Tensor x = non_contiguous(input).set_requires_grad(true);
      const Tensor y = m.apply(x, 1, *group);
      EXPECT_EQ(y.shape(), x.shape());
      EXPECT_TRUE(values_equal(y, values_of(input)));
      EXPECT_NE(y.grad_fn(), nullptr);
      const Tensor upstream = make_input(DType::f64, world().rank() + kGradientSalt, {3, 4, 5});
      autograd::backward(ops::mul(y, 3.0), upstream);
      EXPECT_TRUE(values_equal(x.grad(), values_of(ops::mul(upstream, 3.0))));
    }
  }
}

TEST(TensorParallelMappings, SizesThatDoNotSplitAreRefused) {
  const int n = world().size();
  const Shape odd{3, 2 * n + 1, 5};
  const Tensor x = make_input(DType::f32, world().rank(), odd);
  const std::string shape = "[3, " + std::to_string(2 * n + 1) + ", 5]";
  const std::string group_size = std::to_string(n) + " ranks";
  for (const char* op : {"scatter_to_region", "reduce_scatter_to_sequence_region"}) {
    SCOPED_TRACE(op);
    auto call = [&](int64_t dim) {
      return std::string(op) == "scatter_to_region" ? scatter_to_region(x, dim, world())
                                                    : reduce_scatter_to_sequence_region(x, dim, world());
    };
    EXPECT_ERROR_CONTAINS(call(1), std::string("tp::") + op);
    EXPECT_ERROR_CONTAINS(call(1), shape);
    EXPECT_ERROR_CONTAINS(call(1), "along dim 1");
    EXPECT_ERROR_CONTAINS(call(-2), "along dim -2");
    EXPECT_ERROR_CONTAINS(call(1), group_size);
    EXPECT_ERROR_CONTAINS(call(3), "out of range");
  }
  // Every rank refused before communicating: the group still works.
  Tensor probe = core::ones({1}, DType::f64);
  world().all_reduce(probe);
  EXPECT_EQ(probe.item<double>(), n);
}

}  // namespace
}  // namespace colossal::parallel::tp

int main(int argc, char** argv) {
  return colossal::comm::testing::run_mpi_tests(argc, argv);
}
