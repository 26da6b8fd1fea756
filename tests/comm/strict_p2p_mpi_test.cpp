// StrictP2PProcessGroup (comm/strict_p2p_process_group.h, Note [Strict point-to-point]) on MPI ranks in
// pairs (0-1, 2-3): crossing sends and receives in one batch pass their data; a send completes only
// once its receive is posted (a plain MPI send of a few bytes completes at once); sends and receives
// issued in different orders on the two sides fail on both ranks, naming both; collectives and
// sub-groups work through it.
#include <gtest/gtest.h>

#include <chrono>
#include <thread>

#include "colossal/comm/strict_p2p_process_group.h"
#include "gradcheck.h"  // EXPECT_ERROR_CONTAINS
#include "mpi_test_main.h"

namespace colossal::comm::testing {
namespace {

using namespace std::chrono_literals;

/// A strict group of every rank, on a communicator of its own (a failed test leaves it out of step).
std::shared_ptr<ProcessGroup> strict_world() {
  return std::make_shared<StrictP2PProcessGroup>(world().split(0, world().rank()));
}

int partner() {
  return world().rank() ^ 1;
}

TEST(StrictP2P, CrossingSendsAndReceivesInOneBatchPassTheirData) {
  if (world().size() % 2 != 0) GTEST_SKIP() << "pairs of ranks";
  auto group = strict_world();
  const int r = world().rank();
  for (int round = 0; round < 3; ++round) {
    Tensor out = full({2, 3}, static_cast<double>(10 * r + round), DType::f32);
    Tensor in = empty({2, 3}, TensorOptions(DType::f32));
    Tensor out2 = full({4}, static_cast<double>(r), DType::f64);
    Tensor in2 = empty({4}, TensorOptions(DType::f64));
    group->batch_send_recv({{P2POp::Kind::send, out, partner(), 1},
                            {P2POp::Kind::recv, in, partner(), 1},
                            {P2POp::Kind::send, out2, partner(), 2},
                            {P2POp::Kind::recv, in2, partner(), 2}});
    EXPECT_TRUE(values_equal(in, std::vector<double>(6, 10.0 * partner() + round)));
    EXPECT_TRUE(values_equal(in2, std::vector<double>(4, partner())));
  }
  // Collectives go through it too.
  Tensor t = full({3}, 1.0, DType::f32);
  group->all_reduce(t);
  EXPECT_TRUE(values_equal(t, std::vector<double>(3, world().size())));
  auto pair = group->split(r / 2, r);
  ASSERT_NE(pair, nullptr);
  EXPECT_EQ(pair->size(), 2);
  EXPECT_NE(std::string(pair->backend_name()).find("strict p2p"), std::string::npos);
}

TEST(StrictP2P, ASendCompletesOnlyOnceItsReceiveIsPosted) {
  if (world().size() % 2 != 0) GTEST_SKIP() << "pairs of ranks";
  auto group = strict_world();
  Tensor t = full({2}, 3.0, DType::f32);
  if (world().rank() % 2 == 0) {
    Work send = group->send(t, partner(), 0, /*async=*/true);
    // The receiver posts its receive only after the world barrier below; 300 ms on, a plain MPI send of
    // 8 bytes would long have completed (eagerly), a strict one has not.
    std::this_thread::sleep_for(300ms);
    EXPECT_FALSE(send.is_completed());
    world().barrier();
    send.wait();
  } else {
    world().barrier();
    Tensor in = empty({2}, TensorOptions(DType::f32));
    group->recv(in, partner(), 0);
    EXPECT_TRUE(values_equal(in, {3.0, 3.0}));
  }
}

TEST(StrictP2P, SendsAndReceivesInAnotherOrderFailOnBothRanks) {
  if (world().size() % 2 != 0) GTEST_SKIP() << "pairs of ranks";
  auto group = strict_world();
  Tensor a = full({2}, 1.0, DType::f32), b = full({3}, 2.0, DType::f32);
  if (world().rank() % 2 == 0) {
    // Sends a (tag 1) then b (tag 2); the partner receives b first.
    EXPECT_ERROR_CONTAINS(group->batch_send_recv({{P2POp::Kind::send, a, partner(), 1}}),
                          "send #0 to rank " + std::to_string(partner()) +
                              " is tag 1, a f32 tensor of shape [2], but rank " + std::to_string(partner()) +
                              "'s receive #0 from it expects tag 2, a f32 tensor of shape [3]");
  } else {
    Tensor into = empty({3}, TensorOptions(DType::f32));
    EXPECT_ERROR_CONTAINS(group->recv(into, partner(), 2), "receive #0 from rank " + std::to_string(partner()) +
                                                               " expects tag 2, a f32 tensor of shape [3], but");
  }
  // Equal shapes, other tags: NCCL would have delivered the wrong message silently.
  auto again = strict_world();
  Tensor x = full({2}, 1.0, DType::f32);
  if (world().rank() % 2 == 0) {
    EXPECT_ERROR_CONTAINS(again->send(x, partner(), 5), "is tag 5, a f32 tensor of shape [2], but");
  } else {
    EXPECT_ERROR_CONTAINS(again->recv(x, partner(), 6), "expects tag 6, a f32 tensor of shape [2], but");
  }
  world().barrier();
}

}  // namespace
}  // namespace colossal::comm::testing

int main(int argc, char** argv) {
  return colossal::comm::testing::run_mpi_tests(argc, argv);
}
