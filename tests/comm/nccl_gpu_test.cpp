// NcclProcessGroup on one GPU (a world of one process, label gpu): every collective, dtype and op
// goes through the real NCCL calls, stream ordering against the caller's stream, Work, splits and
// argument errors. One rank makes every collective an identity (avg divides by 1), so the reference
// is the input; what this checks is the plumbing (events, streams, in-place forms, grouped calls).
// Several ranks need several GPUs (NCCL refuses two ranks on one device).
#include <gtest/gtest.h>

#include <cmath>
#include <vector>

#include "colossal/comm/init.h"
#include "colossal/core/cuda_device.h"
#include "gradcheck.h"  // EXPECT_ERROR_CONTAINS

namespace colossal::comm {
namespace {

using core::kCpu;

class NcclOneRank : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    if (!backend_available(Backend::nccl)) return;
    InitOptions options;
    options.backend = Backend::nccl;
    options.device = 0;
    group_ = init_process_group(options, DistEnv{});
  }
  static void TearDownTestSuite() { group_.reset(); }
  void SetUp() override {
    if (!group_) GTEST_SKIP() << "needs a CUDA build with NCCL and a visible GPU";
  }
  static Device gpu() { return group_->device(); }
  static std::shared_ptr<ProcessGroup> group_;
};
std::shared_ptr<ProcessGroup> NcclOneRank::group_;

/// Distinct values exactly representable in `dtype` (bf16 included), on the CPU.
Tensor cpu_values(DType dtype, int64_t n) {
  std::vector<double> values(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) {
    double v = static_cast<double>(i % 61) - 30.0;
    if (dtype == DType::u8) v = static_cast<double>(i % 200);
    if (dtype == DType::boolean) v = static_cast<double>(i % 2);
    values[static_cast<size_t>(i)] = v;
  }
  Tensor t = core::empty({n}, dtype);
  t.copy_(core::from_vector<double>(values, {n}));
  return t;
}

std::vector<double> on_cpu(const Tensor& t) {
  return t.to(kCpu).to_vector<double>();
}

TEST_F(NcclOneRank, Identity) {
  EXPECT_EQ(group_->backend_name(), "nccl");
  EXPECT_EQ(group_->rank(), 0);
  EXPECT_EQ(group_->size(), 1);
  EXPECT_TRUE(gpu().is_cuda());
  EXPECT_EQ(group_->global_ranks(), std::vector<int>{0});
}

TEST_F(NcclOneRank, EveryCollectiveDtypeAndOp) {
  for (DType dtype : {DType::f32, DType::f64, DType::f16, DType::bf16, DType::i32, DType::i64, DType::u8}) {
    SCOPED_TRACE(fmt::format("{}", dtype));
    const Tensor reference = cpu_values(dtype, 1000);
    const std::vector<double> expected = reference.to_vector<double>();
    for (ReduceOp op : {ReduceOp::sum, ReduceOp::avg, ReduceOp::max, ReduceOp::min}) {
      Tensor t = reference.to(gpu());
      group_->all_reduce(t, op);
      EXPECT_EQ(on_cpu(t), expected) << "all_reduce " << reduce_op_name(op);
      Tensor r = reference.to(gpu());
      group_->reduce(r, 0, op);
      EXPECT_EQ(on_cpu(r), expected) << "reduce " << reduce_op_name(op);
      Tensor out = core::zeros({1000}, TensorOptions(dtype, gpu()));
      group_->reduce_scatter(out, reference.to(gpu()), op);
      EXPECT_EQ(on_cpu(out), expected) << "reduce_scatter " << reduce_op_name(op);
    }
    Tensor gathered = core::zeros({1000}, TensorOptions(dtype, gpu()));
    group_->all_gather(gathered, reference.to(gpu()));
    EXPECT_EQ(on_cpu(gathered), expected);
    Tensor b = reference.to(gpu());
    group_->broadcast(b, 0);
    EXPECT_EQ(on_cpu(b), expected);
    Tensor a2a = core::zeros({1000}, TensorOptions(dtype, gpu()));
    group_->all_to_all(a2a, reference.to(gpu()));  // a grouped send/recv to itself
    EXPECT_EQ(on_cpu(a2a), expected);
  }
}

TEST_F(NcclOneRank, BoolAndInPlaceForms) {
  Tensor flags = cpu_values(DType::boolean, 64).to(gpu());
  const auto expected_flags = on_cpu(flags);
  group_->all_reduce(flags, ReduceOp::max);
  EXPECT_EQ(on_cpu(flags), expected_flags);
  Tensor t = cpu_values(DType::f32, 256).to(gpu());
  const auto expected = on_cpu(t);
  group_->all_gather(t, t);      // input is chunk 0 of output
  group_->reduce_scatter(t, t);  // output is chunk 0 of input
  group_->all_to_all(t, t);      // overlapping: staged through a copy
  EXPECT_EQ(on_cpu(t), expected);
}

TEST_F(NcclOneRank, OrderedAfterTheCallersStreamAndBeforeItsNextWork) {
  // A fill queued on the caller's stream must land before the all-reduce reads; the copy queued
  // after wait() must see the all-reduce's result. Big enough that a missing wait would show.
  const int64_t n = 1 << 24;
  for (int round = 0; round < 3; ++round) {
    Tensor t = core::empty({n}, TensorOptions(DType::f32, gpu()));
    t.fill_(round + 1.5);
    Work work = group_->all_reduce(t, ReduceOp::sum, /*async=*/true);
    work.wait();
    const std::vector<float> host = t.to(kCpu).to_vector<float>();
    EXPECT_EQ(host.front(), round + 1.5f);
    EXPECT_EQ(host.back(), round + 1.5f);
    EXPECT_TRUE(work.is_completed() || (work.synchronize(), work.is_completed()));
  }
}

TEST_F(NcclOneRank, WorksFromAnotherCurrentStream) {
  core::Stream side = core::cuda::create_stream(gpu());
  {
    core::cuda::StreamGuard guard(side);
    Tensor t = core::full({4096}, 2.0, TensorOptions(DType::f64, gpu()));
    Work work = group_->all_reduce(t, ReduceOp::avg, /*async=*/true);
    work.synchronize();
    EXPECT_TRUE(work.is_completed());
    EXPECT_EQ(on_cpu(t).back(), 2.0);
  }
  core::cuda::synchronize(gpu());
  core::cuda::destroy_stream(side);
}

TEST_F(NcclOneRank, AbandonedWorkAndBarrier) {
  Tensor t = core::full({1 << 20}, 3.0, TensorOptions(DType::f32, gpu()));
  { Work dropped = group_->all_reduce(t, ReduceOp::max, /*async=*/true); }
  EXPECT_EQ(on_cpu(t)[17], 3.0);
  group_->barrier();
  Work async_barrier = group_->barrier(/*async=*/true);
  async_barrier.wait();  // host-blocking for barriers
  EXPECT_TRUE(async_barrier.is_completed());
}

TEST_F(NcclOneRank, SplitAndNewGroup) {
  auto same = group_->split(0, 0);
  ASSERT_NE(same, nullptr);
  EXPECT_EQ(same->backend_name(), "nccl");
  EXPECT_EQ(same->size(), 1);
  EXPECT_EQ(same->device(), gpu());
  Tensor t = core::full({8}, 4.0, TensorOptions(DType::bf16, gpu()));
  same->all_reduce(t);
  EXPECT_EQ(on_cpu(t)[0], 4.0);
  EXPECT_EQ(group_->split(kNoColor, 0), nullptr);
  auto listed = group_->new_group({0});
  ASSERT_NE(listed, nullptr);
  EXPECT_EQ(listed->global_ranks(), std::vector<int>{0});
}

TEST_F(NcclOneRank, BadArguments) {
  EXPECT_ERROR_CONTAINS(group_->all_reduce(core::zeros({3})),
                        "all_reduce: tensor (shape [3]) is on cpu, but this nccl group works on cuda:");
  EXPECT_ERROR_CONTAINS(group_->send(core::zeros({3}, TensorOptions(DType::f32, gpu())), 0), "cannot send to itself");
  EXPECT_ERROR_CONTAINS(group_->all_reduce(core::zeros({2}, TensorOptions(DType::boolean, gpu()))),
                        "ReduceOp::sum on a bool tensor");
}

}  // namespace
}  // namespace colossal::comm
