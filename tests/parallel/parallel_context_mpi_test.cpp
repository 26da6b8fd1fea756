// ParallelContext under MPI (2 and 4 ranks): for every layout the world fits, each group of the
// context holds exactly the layout's ranks in Colossal-AI's order, and a reduction inside it sees
// only its members; seeds follow the layout; bad configs are refused before any group is made.
#include <gtest/gtest.h>

#include <numeric>
#include <vector>

#include "../comm/mpi_test_main.h"
#include "colossal/core/error.h"
#include "colossal/parallel/parallel_context.h"

namespace colossal::parallel {
namespace {

using comm::testing::world;

std::shared_ptr<comm::ProcessGroup> world_group() {
  return std::shared_ptr<comm::ProcessGroup>(&world(), [](comm::ProcessGroup*) {});
}

config::ParallelConfig layout_config(int pipeline, int tensor, config::TensorParallelMode mode, int depth = 1) {
  config::ParallelConfig c;
  c.pipeline = pipeline;
  c.tensor.size = tensor;
  c.tensor.mode = mode;
  c.tensor.depth = depth;
  return c;
}

void expect_groups_match_the_layout(const config::ParallelConfig& config) {
  const ParallelContext context = ParallelContext::create(config, world_group());
  const int me = world().rank();
  int kinds = 0;
  for (const GroupKind kind : all_group_kinds()) {
    SCOPED_TRACE(std::string(to_string(kind)));
    ASSERT_EQ(context.has_group(kind), context.layout().has_group(kind));
    if (!context.has_group(kind)) continue;
    ++kinds;
    const std::vector<int> expected = context.layout().group(kind, me);
    const comm::ProcessGroup& group = *context.group(kind);
    EXPECT_EQ(group.global_ranks(), expected);
    EXPECT_EQ(group.rank(), context.layout().rank_in_group(kind, me));
    // The sum of the members' world ranks, computed inside the group.
    Tensor sum = core::from_vector<int64_t>({me}, {1});
    context.group(kind)->all_reduce(sum, comm::ReduceOp::sum);
    EXPECT_EQ(sum.item<int64_t>(), std::accumulate(expected.begin(), expected.end(), int64_t{0}));
  }
  EXPECT_GE(kinds, 4);  // data, model, pipeline, tensor at least
  EXPECT_EQ(context.seed(SeedMode::kData, 1024), 1024);
  EXPECT_EQ(context.seed(SeedMode::kTensor, 1024), 1024 + context.coords().tp + 1024 * context.coords().pp);
}

TEST(ParallelContext, DataParallelOnly) {
  expect_groups_match_the_layout(layout_config(1, 1, config::TensorParallelMode::k1d));
}

TEST(ParallelContext, PipelineAcrossTheWorld) {
  expect_groups_match_the_layout(layout_config(world().size(), 1, config::TensorParallelMode::k1d));
}

TEST(ParallelContext, Tensor1dAcrossTheWorld) {
  expect_groups_match_the_layout(layout_config(1, world().size(), config::TensorParallelMode::k1d));
}

TEST(ParallelContext, HybridLayoutsOnFourRanks) {
  if (world().size() != 4) GTEST_SKIP() << "needs 4 ranks";
  expect_groups_match_the_layout(layout_config(1, 2, config::TensorParallelMode::k1d));  // dp 2 x tp 2
  expect_groups_match_the_layout(layout_config(2, 2, config::TensorParallelMode::k1d));  // pp 2 x tp 2
  expect_groups_match_the_layout(layout_config(2, 1, config::TensorParallelMode::k1d));  // dp 2 x pp 2
  expect_groups_match_the_layout(layout_config(1, 4, config::TensorParallelMode::k2d));  // 2 x 2 grid
  expect_groups_match_the_layout(layout_config(1, 4, config::TensorParallelMode::k2p5d, 1));
}

TEST(ParallelContext, BadLayoutsAreRefusedNamingTheRule) {
  try {
    ParallelContext::create(layout_config(1, world().size() + 1, config::TensorParallelMode::k1d), world_group());
    FAIL() << "accepted a tensor size larger than the world";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("parallel."), std::string::npos) << e.what();
  }
  if (world().size() == 4) {
    const ParallelContext context =
        ParallelContext::create(layout_config(1, 2, config::TensorParallelMode::k1d), world_group());
    try {
      context.group(GroupKind::k2dRow);
      FAIL() << "a 1d layout has no 2d groups";
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find("2d_row"), std::string::npos) << e.what();
    }
  }
}

}  // namespace
}  // namespace colossal::parallel

int main(int argc, char** argv) {
  return colossal::comm::testing::run_mpi_tests(argc, argv);
}
