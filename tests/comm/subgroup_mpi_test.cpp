// Sub-groups under mpirun (2 and 4 ranks): split() in halves and odd/even (with keys reordering the
// ranks), kNoColor, new_group() with a listed order, nested splits, collectives and point to point
// inside sub-groups against local references, and the errors of bad or mismatched rank lists.
#include "gradcheck.h"  // EXPECT_ERROR_CONTAINS
#include "mpi_test_main.h"

namespace colossal::comm::testing {
namespace {

/// Every collective on `group` gives what its members' inputs (world ranks) say it should.
void expect_collectives_work(ProcessGroup& group) {
  const std::vector<int>& members = group.global_ranks();
  const int me = members[static_cast<size_t>(group.rank())];
  for (ReduceOp op : {ReduceOp::sum, ReduceOp::avg, ReduceOp::max, ReduceOp::min}) {
    Tensor t = make_input(DType::f32, me, {9});
    group.all_reduce(t, op);
    std::vector<double> expected;
    for (int64_t i = 0; i < 9; ++i) expected.push_back(reference_value(DType::f32, op, members, i));
    EXPECT_TRUE(values_equal(t, expected)) << reduce_op_name(op) << " over " << group.describe();
  }
  Tensor gathered = zeros({group.size()}, DType::i32);
  group.all_gather(gathered, scalar_tensor(me, DType::i32));
  std::vector<double> member_values(members.begin(), members.end());
  EXPECT_TRUE(values_equal(gathered, member_values)) << group.describe();

  Tensor from_last = make_input(DType::i64, me, {4});
  group.broadcast(from_last, group.size() - 1);
  std::vector<double> expected_broadcast;
  for (int64_t i = 0; i < 4; ++i) expected_broadcast.push_back(input_value(DType::i64, members.back(), i));
  EXPECT_TRUE(values_equal(from_last, expected_broadcast)) << group.describe();
}

TEST(SubGroups, SplitInHalves) {
  const int size = world().size(), rank = world().rank();
  const int half = size / 2;
  auto group = world().split(rank < half ? 0 : 1, rank);
  ASSERT_NE(group, nullptr);
  EXPECT_EQ(group->size(), half);
  EXPECT_EQ(group->rank(), rank % half);
  std::vector<int> expected_members;
  for (int r = rank < half ? 0 : half; r < (rank < half ? half : size); ++r) expected_members.push_back(r);
  EXPECT_EQ(group->global_ranks(), expected_members);
  EXPECT_EQ(group->backend_name(), "mpi");
  expect_collectives_work(*group);
}

TEST(SubGroups, SplitOddEvenWithKeysReversingTheOrder) {
  const int size = world().size(), rank = world().rank();
  auto group = world().split(rank % 2, /*key=*/-rank);
  ASSERT_NE(group, nullptr);
  std::vector<int> expected_members;  // highest world rank first
  for (int r = size - 1; r >= 0; --r) {
    if (r % 2 == rank % 2) expected_members.push_back(r);
  }
  EXPECT_EQ(group->global_ranks(), expected_members);
  EXPECT_EQ(group->global_ranks()[static_cast<size_t>(group->rank())], rank);
  expect_collectives_work(*group);
}

TEST(SubGroups, EqualKeysKeepTheParentOrder) {
  auto group = world().split(0, /*key=*/0);
  ASSERT_NE(group, nullptr);
  EXPECT_EQ(group->global_ranks(), iota_ranks(world().size()));
  EXPECT_EQ(group->rank(), world().rank());
}

TEST(SubGroups, NoColorLeavesARankOut) {
  const int rank = world().rank();
  auto group = world().split(rank == 0 ? kNoColor : 5, rank);
  if (rank == 0) {
    EXPECT_EQ(group, nullptr);
  } else {
    ASSERT_NE(group, nullptr);
    EXPECT_EQ(group->size(), world().size() - 1);
    EXPECT_EQ(group->rank(), rank - 1);
    expect_collectives_work(*group);
  }
}

TEST(SubGroups, NewGroupInListedOrder) {
  const int size = world().size(), rank = world().rank();
  const std::vector<int> listed{size - 1, 0};
  auto group = world().new_group(listed);
  if (rank != 0 && rank != size - 1) {
    EXPECT_EQ(group, nullptr);
    return;
  }
  ASSERT_NE(group, nullptr);
  EXPECT_EQ(group->size(), 2);
  EXPECT_EQ(group->rank(), rank == size - 1 ? 0 : 1);
  EXPECT_EQ(group->global_ranks(), listed);
  expect_collectives_work(*group);
}

TEST(SubGroups, NestedSplitsTrackWorldRanks) {
  const int size = world().size(), rank = world().rank();
  auto halves = world().split(rank < size / 2 ? 0 : 1, rank);
  ASSERT_NE(halves, nullptr);
  auto singles = halves->split(halves->rank(), 0);  // every rank alone
  ASSERT_NE(singles, nullptr);
  EXPECT_EQ(singles->size(), 1);
  EXPECT_EQ(singles->global_ranks(), std::vector<int>{rank});
  // Within one rank, collectives are identities (and sends are refused: there is no peer).
  Tensor t = make_input(DType::f64, rank, {3});
  singles->all_reduce(t, ReduceOp::avg);
  std::vector<double> own;
  for (int64_t i = 0; i < 3; ++i) own.push_back(input_value(DType::f64, rank, i));
  EXPECT_TRUE(values_equal(t, own));
  // A new_group of a sub-group names ranks of that sub-group.
  auto back = halves->new_group({halves->size() - 1});
  if (halves->rank() == halves->size() - 1) {
    ASSERT_NE(back, nullptr);
    EXPECT_EQ(back->global_ranks(), std::vector<int>{rank});
  } else {
    EXPECT_EQ(back, nullptr);
  }
}

TEST(SubGroups, PointToPointAndAllToAllInsideASubGroup) {
  const int rank = world().rank();
  auto group = world().split(rank % 2, rank);
  ASSERT_NE(group, nullptr);
  const int n = group->size(), me = group->rank();
  const std::vector<int>& members = group->global_ranks();
  if (n >= 2) {
    const int next = (me + 1) % n, previous = (me + n - 1) % n;
    Tensor incoming = zeros({4}, DType::f16);
    group->batch_send_recv(
        {{P2POp::Kind::send, make_input(DType::f16, rank, {4}), next, 0}, {P2POp::Kind::recv, incoming, previous, 0}});
    std::vector<double> expected;
    for (int64_t i = 0; i < 4; ++i)
      expected.push_back(input_value(DType::f16, members[static_cast<size_t>(previous)], i));
    EXPECT_TRUE(values_equal(incoming, expected));
  }
  Tensor input = make_input(DType::bf16, rank, {n, 2});
  Tensor output = zeros({n, 2}, DType::bf16);
  group->all_to_all(output, input, /*async=*/true).wait();
  std::vector<double> expected;
  for (int source = 0; source < n; ++source) {
    for (int64_t k = 0; k < 2; ++k)
      expected.push_back(input_value(DType::bf16, members[static_cast<size_t>(source)], 2 * me + k));
  }
  EXPECT_TRUE(values_equal(output, expected));
}

TEST(SubGroups, BadRankListsAreRejectedOnEveryRank) {
  const int size = world().size(), rank = world().rank();
  EXPECT_ERROR_CONTAINS(world().new_group({}), "new_group: the rank list is empty");
  EXPECT_ERROR_CONTAINS(world().new_group({0, size}),
                        fmt::format("new_group: rank {} in [0, {}] is outside this group", size, size));
  EXPECT_ERROR_CONTAINS(world().new_group({1, 0, 1}), "new_group: rank 1 appears twice in [1, 0, 1]");
  // Rank 0 lists a different group than the others: every rank finds out, none hangs.
  const std::vector<int> mine = rank == 0 ? std::vector<int>{0} : std::vector<int>{0, 1};
  EXPECT_ERROR_CONTAINS(world().new_group(mine), "passed different rank lists");
  // And the world is still usable.
  Tensor t = ones({1});
  world().all_reduce(t);
  EXPECT_EQ(t.item<float>(), static_cast<float>(size));
}

}  // namespace
}  // namespace colossal::comm::testing

int main(int argc, char** argv) {
  return colossal::comm::testing::run_mpi_tests(argc, argv);
}
