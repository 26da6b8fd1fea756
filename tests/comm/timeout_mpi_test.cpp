// The collective timeout where nothing hangs (ranks under mpirun, at 2 and 4): a short timeout never
// ends a job whose operations complete, however late the host waits for them or however it waits
// (wait, is_completed, dropping the Work); sub-groups inherit the timeout. The jobs that do hang are
// in timeout_test.cpp, since a timed-out rank ends its process.
#include <chrono>
#include <thread>

#include "mpi_test_main.h"

namespace colossal::comm::testing {
namespace {

using namespace std::chrono_literals;

/// A group of every rank with `timeout`, so the shared world keeps its own.
std::shared_ptr<ProcessGroup> group_with_timeout(std::chrono::milliseconds timeout) {
  std::shared_ptr<ProcessGroup> group = world().split(0, world().rank());
  group->set_timeout(timeout);
  return group;
}

double expected_sum(int size) {
  return static_cast<double>(size * (size + 1) / 2);
}

TEST(TimeoutMpi, SubgroupsInheritTheTimeout) {
  std::shared_ptr<ProcessGroup> group = group_with_timeout(1234ms);
  EXPECT_EQ(group->split(world().rank() % 2, 0)->timeout(), 1234ms);
  std::vector<int> everyone = iota_ranks(world().size());
  EXPECT_EQ(group->new_group(everyone)->timeout(), 1234ms);
}

// The host computes for longer than the timeout between issuing the all_reduce and waiting: the
// operation completed meanwhile, so nothing ends. The timeout, 1.5 s, is 15 watchdog polls: the
// nonblocking all-reduce at 4 ranks needs a few rounds of progress, one per poll when only the
// watchdog's thread drives it.
TEST(TimeoutMpi, WaitingLateForCompletedWorkIsNotATimeout) {
  std::shared_ptr<ProcessGroup> group = group_with_timeout(1500ms);
  group->barrier();
  Tensor t = full({5}, static_cast<double>(world().rank() + 1), DType::f32);
  Work work = group->all_reduce(t, ReduceOp::sum, /*async=*/true);
  std::this_thread::sleep_for(2500ms);
  work.wait();
  EXPECT_TRUE(values_equal(t, std::vector<double>(5, expected_sum(world().size()))));
}

TEST(TimeoutMpi, PollingIsCompletedFinishes) {
  std::shared_ptr<ProcessGroup> group = group_with_timeout(1500ms);
  Tensor t = full({3}, static_cast<double>(world().rank() + 1), DType::f64);
  Work work = group->all_reduce(t, ReduceOp::sum, /*async=*/true);
  while (!work.is_completed()) std::this_thread::yield();
  EXPECT_TRUE(values_equal(t, std::vector<double>(3, expected_sum(world().size()))));
}

TEST(TimeoutMpi, DroppedWorkIsWaitedForWithinTheTimeout) {
  std::shared_ptr<ProcessGroup> group = group_with_timeout(1500ms);
  Tensor t = full({3}, 1.0, DType::f32);
  // The Work's destructor waits for the requests, with the deadline check of every wait.
  group->all_reduce(t, ReduceOp::sum, /*async=*/true);
  group->barrier();
  EXPECT_TRUE(values_equal(t, std::vector<double>(3, static_cast<double>(world().size()))));
}

// Every kind of operation under a short timeout, each waited on at once: normal traffic never trips it.
TEST(TimeoutMpi, EveryOperationCompletesUnderAShortTimeout) {
  std::shared_ptr<ProcessGroup> group = group_with_timeout(1500ms);
  const int n = world().size(), rank = world().rank();
  Tensor t = full({4}, static_cast<double>(rank + 1), DType::f32);
  group->all_reduce(t);
  EXPECT_TRUE(values_equal(t, std::vector<double>(4, expected_sum(n))));
  Tensor gathered = empty({4 * n}, DType::f32);
  group->all_gather(gathered, t);
  Tensor chunk = empty({4}, DType::f32);
  group->reduce_scatter(chunk, gathered);
  EXPECT_TRUE(values_equal(chunk, std::vector<double>(4, expected_sum(n) * n)));
  group->broadcast(t, 0);
  group->reduce(t, 0);
  Tensor exchanged = empty({4 * n}, DType::f32);
  group->all_to_all(exchanged, gathered);
  Tensor received = empty({4}, DType::f32);
  group->batch_send_recv(
      {P2POp{P2POp::Kind::send, t, (rank + 1) % n, 0}, P2POp{P2POp::Kind::recv, received, (rank + n - 1) % n, 0}});
  group->barrier();
}

}  // namespace
}  // namespace colossal::comm::testing

int main(int argc, char** argv) {
  return colossal::comm::testing::run_mpi_tests(argc, argv);
}
