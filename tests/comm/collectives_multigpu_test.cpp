// NcclProcessGroup between processes, one per GPU (label multigpu; started by `colossal run`, or by
// mpirun in a build with MPI, so both ways of handing out NCCL's unique id run): every collective,
// reduce op and dtype against the reference each rank computes from what every rank contributes
// (tests/support/collective_reference.h), at lengths that are multiples of nothing; in-place forms;
// async Work against the caller's stream; barrier; sub-groups from split() and new_group(); point to
// point in both directions and crossing batches. Values compare exactly: the inputs make every sum
// exact in every dtype up to four ranks.
#include <algorithm>
#include <chrono>
#include <thread>

#include "collective_reference.h"           // input_value, input_slice, make_input, reference_values, values_equal
#include "colossal/comm/pair_all_reduce.h"  // use_pair_all_reduce, use_pair_p2p
#include "colossal/core/build_config.h"     // COLOSSAL_WITH_MPI
#include "colossal/core/cuda_device.h"      // device_count, StreamGuard, create_stream
#include "colossal/core/random.h"           // uniform_, Generator
#include "gradcheck.h"                      // EXPECT_ERROR_CONTAINS
#include "multigpu_main.h"                  // world, gpu, run_multigpu_tests

namespace colossal::comm::testing {
namespace {

const std::vector<ReduceOp> kAllOps{ReduceOp::sum, ReduceOp::avg, ReduceOp::max, ReduceOp::min};

/// Lengths that are multiples of nothing NCCL divides work by: one element, a handful, and a prime past
/// a million (many chunks over several channels, with a ragged tail).
const std::vector<int64_t> kLengths{1, 7, 1000003};

Tensor gpu_input(DType dtype, int rank, const Shape& shape) {
  return make_input(dtype, rank, shape).to(gpu());
}

Tensor gpu_zeros(const Shape& shape, DType dtype) {
  return zeros(shape, TensorOptions(dtype, gpu()));
}

/// NCCL's float avg multiplies by 1/size, which is exact when size is a power of two (the 2 and 4 ranks
/// these tests run at); otherwise it may differ from sum / size in the dtype's last bit.
double avg_tolerance(DType dtype, ReduceOp op, int size) {
  // Exact for power-of-two sizes (1/size is exact). Otherwise NCCL premultiplies each input by
  // 1/size rounded to the dtype and sums, rounding after each step; the inputs (collective_reference.h)
  // have magnitudes up to 8.5 and cancel, so the error is bounded relative to them, not to the
  // average: size roundings of at most half an ulp of 8.5, i.e. size * 8.5 * eps, which this returns
  // as an absolute tolerance (used by values_near's absolute term).
  if (op != ReduceOp::avg || !core::is_floating(dtype) || (size & (size - 1)) == 0) return 0.0;
  double eps = 0x1p-52;
  switch (dtype) {
    case DType::f16:
      eps = 0x1p-10;
      break;
    case DType::bf16:
      eps = 0x1p-7;
      break;
    case DType::f32:
      eps = 0x1p-23;
      break;
    default:
      break;
  }
  return static_cast<double>(size) * 8.5 * eps;
}

/// Chunk `chunk` of length n of every member's input (members are world ranks), concatenated in
/// member order: what all_gather of those chunks gives.
std::vector<double> concatenated(DType dtype, const std::vector<int>& members, int64_t n, int64_t first = 0) {
  std::vector<double> out;
  out.reserve(members.size() * static_cast<size_t>(n));
  for (int member : members) {
    const std::vector<double> part = input_slice(dtype, member, n, first);
    out.insert(out.end(), part.begin(), part.end());
  }
  return out;
}

// ---- the world ----------------------------------------------------------------------------------

TEST(NcclWorld, MatchesTheLaunchersEnvironment) {
  const DistEnv env = read_dist_env();
  EXPECT_EQ(world().backend_name(), "nccl");
  EXPECT_EQ(world().rank(), env.rank);
  EXPECT_EQ(world().size(), env.world_size);
  EXPECT_EQ(world().global_ranks(), iota_ranks(env.world_size));
  EXPECT_EQ(gpu(), core::cuda_device(env.local_rank % core::cuda::device_count())) << env.describe();
  // Who started the ranks decides how rank 0's NCCL unique id reached the others
  // (NcclProcessGroup::create_world): `colossal run` -> the TCP rendezvous; mpirun -> MPI_Bcast in a
  // build with MPI (the TCP rendezvous without). Both are registered with CTest where the build allows.
  EXPECT_TRUE(env.source == EnvSource::launcher || env.source == EnvSource::openmpi)
      << "multigpu tests are started by colossal run or mpirun, got " << env.describe();
  if (world().rank() == 0) {
    const bool by_mpi = env.source == EnvSource::openmpi && COLOSSAL_WITH_MPI;
    std::printf("NCCL unique id exchanged by %s [%s]\n", by_mpi ? "MPI_Bcast" : "the TCP rendezvous",
                env.describe().c_str());
  }
  // One GPU per rank: the devices the ranks of this node chose are all different.
  Tensor devices = gpu_zeros({world().size()}, DType::i32);
  world().all_gather(devices, from_vector<int32_t>({gpu().index}, {1}, TensorOptions(DType::i32, gpu())));
  if (env.local_world_size == env.world_size) {
    std::vector<int32_t> seen = devices.to(core::kCpu).to_vector<int32_t>();
    std::sort(seen.begin(), seen.end());
    EXPECT_EQ(std::adjacent_find(seen.begin(), seen.end()), seen.end()) << "two ranks share a GPU";
  }
}

TEST(NcclWorld, ASecondWorldFromTheSameEnvironmentIsItsOwnCommunicator) {
  // The unique-id exchange runs again (a fresh id from rank 0, the rendezvous port bound anew), and
  // the new communicator works beside the first.
  InitOptions options;
  options.backend = Backend::nccl;
  std::shared_ptr<ProcessGroup> second = init_process_group(options, read_dist_env());
  ASSERT_NE(second, nullptr);
  EXPECT_EQ(second->rank(), world().rank());
  EXPECT_EQ(second->size(), world().size());
  EXPECT_EQ(second->device(), gpu());
  const int size = world().size();
  Tensor on_second = from_vector<int64_t>({world().rank() + 1}, {1}, TensorOptions(DType::i64, gpu()));
  Tensor on_first = on_second.clone();
  second->all_reduce(on_second, ReduceOp::sum);
  world().all_reduce(on_first, ReduceOp::max);
  EXPECT_EQ(on_second.to(core::kCpu).item<int64_t>(), size * (size + 1) / 2);
  EXPECT_EQ(on_first.to(core::kCpu).item<int64_t>(), size);
}

// ---- collectives --------------------------------------------------------------------------------

TEST(NcclCollectives, AllReduceEveryOpDtypeAndLength) {
  const int size = world().size(), rank = world().rank();
  for (DType dtype : all_dtypes()) {
    for (int64_t n : kLengths) {
      for (ReduceOp op : kAllOps) {
        SCOPED_TRACE(fmt::format("{} {} of {} elements", dtype, reduce_op_name(op), n));
        Tensor t = gpu_input(dtype, rank, {n});
        world().all_reduce(t, op);
        EXPECT_TRUE(
            values_near(t, reference_values(dtype, op, iota_ranks(size), n), 0.0, avg_tolerance(dtype, op, size)));
      }
    }
  }
}

// The packed collectives' parts: lengths that are multiples of nothing, and a hole (part 2).
const std::vector<int64_t> kPackedLengths{7, 1000003, 5, 11};
const std::vector<int64_t> kPackedOffsets{0, 7, 1000010, 1000015};
constexpr int64_t kPackedEnd = 1000026;

/// `whole` (the reduction of the parts laid at kPackedOffsets): each part the ranks' average, the
/// hole zeros.
void expect_packed_average(const Tensor& whole, DType dtype, int size) {
  for (size_t i = 0; i < kPackedLengths.size(); ++i) {
    const Tensor got = whole.narrow(0, kPackedOffsets[i], kPackedLengths[i]);
    if (i == 2) {
      EXPECT_TRUE(values_equal(got, std::vector<double>(5, 0.0))) << "the hole";
    } else {
      EXPECT_TRUE(values_near(got, reference_values(dtype, ReduceOp::avg, iota_ranks(size), kPackedLengths[i]), 0.0,
                              avg_tolerance(dtype, ReduceOp::avg, size)))
          << "part " << i;
    }
  }
}

TEST(NcclCollectives, AllReducePackedFromPartsAHoleAndAnInPlaceView) {
  // Data parallelism's buckets (Note [Packing off the compute stream] in parallel/dp): the parts
  // packed on the group's stream into one flat tensor and averaged there; an undefined part zeroes
  // its slice; a part that is already its slice is reduced in place.
  const int size = world().size(), rank = world().rank();
  for (DType dtype : {DType::f32, DType::bf16}) {
    SCOPED_TRACE(fmt::format("{}", dtype));
    Tensor flat = gpu_zeros({kPackedEnd}, dtype);
    std::vector<Tensor> parts{gpu_input(dtype, rank, {7}), gpu_input(dtype, rank, {1000003}), Tensor(),
                              flat.narrow(0, 1000015, 11)};
    parts[3].copy_(gpu_input(dtype, rank, {11}));
    flat.narrow(0, 1000010, 5).fill_(3.0);  // the hole: must come back zero
    world().all_reduce_packed(flat, parts, kPackedOffsets, ReduceOp::avg);
    expect_packed_average(flat, dtype, size);
  }
}

TEST(NcclCollectives, ReduceScatterPackedFromPartsAndHoles) {
  // ZeRO's buckets (Note [Parameters in their buckets] in parallel/zero): the parts packed on the
  // group's stream, the hole and the padding at the tail zeroed, averaged, each rank keeping its chunk.
  const int size = world().size(), rank = world().rank();
  for (DType dtype : {DType::f32, DType::bf16}) {
    SCOPED_TRACE(fmt::format("{}", dtype));
    const int64_t chunk = (kPackedEnd + size - 1) / size + 3;  // padding after the last part
    Tensor flat = gpu_zeros({chunk * size}, dtype);
    flat.fill_(3.0);  // the hole and the padding must come back zero
    std::vector<Tensor> parts{gpu_input(dtype, rank, {7}), gpu_input(dtype, rank, {1000003}), Tensor(),
                              gpu_input(dtype, rank, {11}), Tensor()};
    std::vector<int64_t> offsets = kPackedOffsets;
    offsets.push_back(kPackedEnd);
    Tensor output = gpu_zeros({chunk}, dtype);
    world().reduce_scatter_packed(output, flat, parts, offsets, ReduceOp::avg);
    Tensor whole = gpu_zeros({chunk * size}, dtype);  // the whole reduction, gathered back
    world().all_gather(whole, output);
    expect_packed_average(whole, dtype, size);
    EXPECT_TRUE(values_equal(whole.narrow(0, kPackedEnd, chunk * size - kPackedEnd),
                             std::vector<double>(static_cast<size_t>(chunk * size - kPackedEnd), 0.0)))
        << "the padding";
  }
}

TEST(NcclCollectives, AllReduceBoolMaxIsOrMinIsAnd) {
  const int size = world().size(), rank = world().rank();
  for (int64_t n : kLengths) {
    SCOPED_TRACE(n);
    Tensor any = gpu_input(DType::boolean, rank, {n});
    Tensor all = gpu_input(DType::boolean, rank, {n});
    world().all_reduce(any, ReduceOp::max);
    world().all_reduce(all, ReduceOp::min);
    std::vector<double> expected_any(static_cast<size_t>(n), 0.0), expected_all(static_cast<size_t>(n), 1.0);
    for (int r = 0; r < size; ++r) {
      for (int64_t i = 0; i < n; ++i) {
        const double v = input_value(DType::boolean, r, i);
        expected_any[static_cast<size_t>(i)] = std::max(expected_any[static_cast<size_t>(i)], v);
        expected_all[static_cast<size_t>(i)] = std::min(expected_all[static_cast<size_t>(i)], v);
      }
    }
    EXPECT_TRUE(values_equal(any, expected_any));
    EXPECT_TRUE(values_equal(all, expected_all));
  }
}

TEST(NcclCollectives, AllReduceOfEmptyAndScalarTensors) {
  const int size = world().size();
  Tensor nothing = gpu_zeros({0, 3}, DType::f32);
  world().all_reduce(nothing);
  EXPECT_EQ(nothing.numel(), 0);
  Tensor scalar = scalar_tensor(world().rank() + 1.0, DType::f64).to(gpu());
  world().all_reduce(scalar);
  EXPECT_EQ(scalar.to(core::kCpu).item<double>(), size * (size + 1) / 2.0);
}

TEST(NcclCollectives, ReduceScatterEveryOpDtypeAndLength) {
  const int size = world().size(), rank = world().rank();
  for (DType dtype : all_dtypes()) {
    for (int64_t n : kLengths) {
      for (ReduceOp op : kAllOps) {
        SCOPED_TRACE(fmt::format("{} {}, {} elements per rank", dtype, reduce_op_name(op), n));
        Tensor input = gpu_input(dtype, rank, {size * n});
        Tensor output = gpu_zeros({n}, dtype);
        world().reduce_scatter(output, input, op);
        EXPECT_TRUE(values_near(output, reference_values(dtype, op, iota_ranks(size), n, n * rank), 0.0,
                                avg_tolerance(dtype, op, size)));
        EXPECT_TRUE(values_equal(input, input_slice(dtype, rank, size * n))) << "the input must stay as it was";
      }
    }
  }
}

TEST(NcclCollectives, ReduceScatterIntoOwnChunkOfInput) {
  const int size = world().size(), rank = world().rank();
  for (DType dtype : {DType::f32, DType::bf16}) {
    SCOPED_TRACE(fmt::format("{}", dtype));
    Tensor input = gpu_input(dtype, rank, {7 * size, 3});
    Tensor output = input.narrow(0, 7 * rank, 7);
    ASSERT_TRUE(output.is_contiguous());
    world().reduce_scatter(output, input, ReduceOp::sum);
    EXPECT_TRUE(values_equal(output, reference_values(dtype, ReduceOp::sum, iota_ranks(size), 21, 21 * rank)));
  }
}

TEST(NcclCollectives, AllGatherEveryDtypeAndLength) {
  const int size = world().size(), rank = world().rank();
  std::vector<DType> dtypes = all_dtypes();
  dtypes.push_back(DType::boolean);
  for (DType dtype : dtypes) {
    for (int64_t n : kLengths) {
      SCOPED_TRACE(fmt::format("{}, {} elements per rank", dtype, n));
      Tensor output = gpu_zeros({size * n}, dtype);
      world().all_gather(output, gpu_input(dtype, rank, {n}));
      EXPECT_TRUE(values_equal(output, concatenated(dtype, iota_ranks(size), n)));
    }
  }
}

TEST(NcclCollectives, AllGatherFromOwnChunkOfOutput) {
  const int size = world().size(), rank = world().rank();
  const int64_t n = kLengths.back();
  Tensor output = gpu_zeros({size * n}, DType::i64);
  output.narrow(0, n * rank, n).copy_(gpu_input(DType::i64, rank, {n}));
  world().all_gather(output, output.narrow(0, n * rank, n));
  EXPECT_TRUE(values_equal(output, concatenated(DType::i64, iota_ranks(size), n)));
}

TEST(NcclCollectives, BroadcastFromEveryRoot) {
  const int rank = world().rank();
  std::vector<DType> dtypes = all_dtypes();
  dtypes.push_back(DType::boolean);
  for (DType dtype : dtypes) {
    for (int64_t n : kLengths) {
      for (int root = 0; root < world().size(); ++root) {
        SCOPED_TRACE(fmt::format("{} of {} elements from root {}", dtype, n, root));
        Tensor t = gpu_input(dtype, rank, {n});
        world().broadcast(t, root);
        EXPECT_TRUE(values_equal(t, input_slice(dtype, root, n)));
      }
    }
  }
}

TEST(NcclCollectives, ReduceToEveryRootLeavesOthersUnchanged) {
  const int size = world().size(), rank = world().rank();
  for (DType dtype : all_dtypes()) {
    for (int64_t n : kLengths) {
      const std::vector<double> own = input_slice(dtype, rank, n);
      for (ReduceOp op : kAllOps) {
        const std::vector<double> reduced = reference_values(dtype, op, iota_ranks(size), n);
        for (int root = 0; root < size; ++root) {
          SCOPED_TRACE(fmt::format("{} {} of {} elements to root {}", dtype, reduce_op_name(op), n, root));
          Tensor t = gpu_input(dtype, rank, {n});
          world().reduce(t, root, op);
          if (rank == root) {
            EXPECT_TRUE(values_near(t, reduced, 0.0, avg_tolerance(dtype, op, size)));
          } else {
            EXPECT_TRUE(values_equal(t, own));
          }
        }
      }
    }
  }
}

TEST(NcclCollectives, AllToAllEveryDtypeAndLength) {
  const int size = world().size(), rank = world().rank();
  std::vector<DType> dtypes = all_dtypes();
  dtypes.push_back(DType::boolean);
  for (DType dtype : dtypes) {
    for (int64_t n : kLengths) {
      SCOPED_TRACE(fmt::format("{}, chunks of {} elements", dtype, n));
      // Chunk j of rank r's input holds r's elements [n j, n j + n); rank r receives chunk r of each.
      Tensor input = gpu_input(dtype, rank, {size * n});
      Tensor output = gpu_zeros({size * n}, dtype);
      world().all_to_all(output, input);
      EXPECT_TRUE(values_equal(output, concatenated(dtype, iota_ranks(size), n, n * rank)));
    }
  }
}

TEST(NcclCollectives, AllToAllInPlace) {
  const int size = world().size(), rank = world().rank();
  Tensor t = gpu_input(DType::f32, rank, {7 * size, 2});
  world().all_to_all(t, t);  // overlapping: staged through a copy
  EXPECT_TRUE(values_equal(t, concatenated(DType::f32, iota_ranks(size), 14, 14 * rank)));
}

TEST(NcclCollectives, BarrierHoldsEveryRankUntilTheLastArrives) {
  const int size = world().size(), rank = world().rank();
  if (size < 2) GTEST_SKIP() << "needs two ranks";
  // The last rank arrives late; rank 0 must not leave the barrier before it does. The delay is far
  // above the skew of two hosts that both just left a barrier, so the bound cannot fail by chance.
  constexpr auto kDelay = std::chrono::milliseconds(500);
  for (bool async : {false, true}) {
    SCOPED_TRACE(async ? "async, then wait()" : "blocking");
    world().barrier();
    if (rank == size - 1) std::this_thread::sleep_for(kDelay);
    const auto start = std::chrono::steady_clock::now();
    Work work = world().barrier(async);
    work.wait();  // host-blocking for barriers
    const auto waited = std::chrono::duration_cast<std::chrono::milliseconds>(std::chrono::steady_clock::now() - start);
    EXPECT_TRUE(work.is_completed());
    if (rank == 0) {
      EXPECT_GE(waited.count(), (kDelay / 2).count());
    }
  }
}

// ---- Work and streams ---------------------------------------------------------------------------

TEST(NcclWork, AsyncWorkCompletesInAnyWaitOrder) {
  const int size = world().size(), rank = world().rank();
  std::vector<Tensor> tensors;
  std::vector<Work> works;
  for (int k = 0; k < 6; ++k) {
    const int64_t n = k == 5 ? kLengths.back() : 64 + k;
    tensors.push_back(gpu_input(DType::f32, rank, {n}));
    works.push_back(world().all_reduce(tensors.back(), kAllOps[static_cast<size_t>(k) % kAllOps.size()], true));
  }
  Tensor gathered = gpu_zeros({size, 2}, DType::i32);
  Work gather = world().all_gather(gathered, gpu_input(DType::i32, rank, {1, 2}), /*async=*/true);
  Work barrier = world().barrier(/*async=*/true);
  // Poll one to completion, wait on the others in reverse order; copies share the state.
  while (!barrier.is_completed()) std::this_thread::yield();
  Work copy = gather;
  copy.wait();
  for (int k = 5; k >= 0; --k) works[static_cast<size_t>(k)].wait();
  EXPECT_TRUE(values_equal(gathered, concatenated(DType::i32, iota_ranks(size), 2)));
  for (int k = 0; k < 6; ++k) {
    SCOPED_TRACE(k);
    const ReduceOp op = kAllOps[static_cast<size_t>(k) % kAllOps.size()];
    const Tensor& t = tensors[static_cast<size_t>(k)];
    EXPECT_TRUE(values_near(t, reference_values(DType::f32, op, iota_ranks(size), t.numel()), 0.0,
                            avg_tolerance(DType::f32, op, size)));
    works[static_cast<size_t>(k)].synchronize();
    EXPECT_TRUE(works[static_cast<size_t>(k)].is_completed());
  }
}

TEST(NcclWork, OrderedAfterTheCallersStreamAndBeforeItsNextWork) {
  // A fill queued on the caller's stream must land before the all-reduce reads it, and the copy to the
  // host queued after wait() must see the all-reduce's result. Big enough that a missing wait shows.
  const int size = world().size(), rank = world().rank();
  const int64_t n = 1 << 24;
  for (int round = 0; round < 3; ++round) {
    SCOPED_TRACE(round);
    Tensor t = core::empty({n}, TensorOptions(DType::f32, gpu()));
    t.fill_(rank + round + 1.5);
    Work work = world().all_reduce(t, ReduceOp::sum, /*async=*/true);
    work.wait();
    double expected = 0;
    for (int r = 0; r < size; ++r) expected += r + round + 1.5;
    const std::vector<float> host = t.to(core::kCpu).to_vector<float>();
    EXPECT_EQ(host.front(), expected);
    EXPECT_EQ(host[static_cast<size_t>(n / 2 + 1)], expected);
    EXPECT_EQ(host.back(), expected);
  }
}

TEST(NcclWork, FromAnotherCurrentStream) {
  const int size = world().size(), rank = world().rank();
  core::Stream side = core::cuda::create_stream(gpu());
  {
    core::cuda::StreamGuard guard(side);
    Tensor t = gpu_input(DType::f64, rank, {kLengths.back()});
    Work work = world().all_reduce(t, ReduceOp::max, /*async=*/true);
    work.synchronize();
    EXPECT_TRUE(work.is_completed());
    EXPECT_TRUE(values_equal(t, reference_values(DType::f64, ReduceOp::max, iota_ranks(size), t.numel())));
  }
  core::cuda::synchronize(gpu());
  core::cuda::destroy_stream(side);
}

TEST(NcclWork, AbandonedAsyncWorkStillFinishes) {
  const int size = world().size(), rank = world().rank();
  Tensor t = gpu_input(DType::bf16, rank, {kLengths.back()});
  { Work dropped = world().all_reduce(t, ReduceOp::sum, /*async=*/true); }  // the destructor orders the stream
  EXPECT_TRUE(values_equal(t, reference_values(DType::bf16, ReduceOp::sum, iota_ranks(size), t.numel())));
}

TEST(NcclWork, TensorOnAnotherRanksGpuIsRefusedByName) {
  const int devices = core::cuda::device_count();
  if (devices < 2) GTEST_SKIP() << "needs a second GPU";
  const Device other = core::cuda_device((gpu().index + 1) % devices);
  EXPECT_ERROR_CONTAINS(
      world().all_reduce(zeros({3}, TensorOptions(DType::f32, other))),
      fmt::format("all_reduce: tensor (shape [3]) is on {}, but this nccl group works on {}", other, gpu()));
}

// ---- sub-groups ---------------------------------------------------------------------------------

/// Every collective on `group` gives what its members' inputs (keyed by world rank) say it should.
void expect_collectives_work(ProcessGroup& group) {
  const std::vector<int>& members = group.global_ranks();
  const int me = members[static_cast<size_t>(group.rank())];
  const int n = group.size(), my_rank = group.rank();
  EXPECT_EQ(group.backend_name(), "nccl");
  EXPECT_EQ(group.device(), gpu());
  for (DType dtype : {DType::f32, DType::bf16, DType::i64}) {
    for (ReduceOp op : kAllOps) {
      SCOPED_TRACE(fmt::format("all_reduce {} {} over {}", dtype, reduce_op_name(op), group.describe()));
      Tensor t = gpu_input(dtype, me, {kLengths.back()});
      group.all_reduce(t, op);
      EXPECT_TRUE(values_near(t, reference_values(dtype, op, members, t.numel()), 0.0, avg_tolerance(dtype, op, n)));
    }
  }
  Tensor scattered = gpu_zeros({7}, DType::f32);
  group.reduce_scatter(scattered, gpu_input(DType::f32, me, {7 * n}), ReduceOp::sum);
  EXPECT_TRUE(values_equal(scattered, reference_values(DType::f32, ReduceOp::sum, members, 7, 7 * my_rank)))
      << group.describe();

  Tensor gathered = gpu_zeros({n}, DType::i32);
  group.all_gather(gathered, from_vector<int32_t>({me}, {1}, TensorOptions(DType::i32, gpu())));
  EXPECT_TRUE(values_equal(gathered, std::vector<double>(members.begin(), members.end()))) << group.describe();

  Tensor from_last = gpu_input(DType::i64, me, {7});
  group.broadcast(from_last, n - 1);
  EXPECT_TRUE(values_equal(from_last, input_slice(DType::i64, members.back(), 7))) << group.describe();

  Tensor exchanged = gpu_zeros({2 * n}, DType::bf16);
  group.all_to_all(exchanged, gpu_input(DType::bf16, me, {2 * n}));
  EXPECT_TRUE(values_equal(exchanged, concatenated(DType::bf16, members, 2, 2 * my_rank))) << group.describe();

  if (n >= 2) {
    const int next = (my_rank + 1) % n, previous = (my_rank + n - 1) % n;
    Tensor incoming = gpu_zeros({7}, DType::f16);
    group.batch_send_recv(
        {{P2POp::Kind::send, gpu_input(DType::f16, me, {7}), next, 0}, {P2POp::Kind::recv, incoming, previous, 0}});
    EXPECT_TRUE(values_equal(incoming, input_slice(DType::f16, members[static_cast<size_t>(previous)], 7)))
        << group.describe();
  }
}

TEST(NcclSubGroups, SplitIntoSingleRanks) {
  const int rank = world().rank();
  auto alone = world().split(/*color=*/rank, /*key=*/0);
  ASSERT_NE(alone, nullptr);
  EXPECT_EQ(alone->size(), 1);
  EXPECT_EQ(alone->rank(), 0);
  EXPECT_EQ(alone->global_ranks(), std::vector<int>{rank});
  // Alone, every collective is an identity.
  expect_collectives_work(*alone);
}

TEST(NcclSubGroups, NewGroupOfEachSingleRank) {
  const int size = world().size(), rank = world().rank();
  for (int r = 0; r < size; ++r) {
    SCOPED_TRACE(r);
    auto group = world().new_group({r});  // collective over the world: every rank calls it
    if (rank != r) {
      EXPECT_EQ(group, nullptr);
      continue;
    }
    ASSERT_NE(group, nullptr);
    EXPECT_EQ(group->global_ranks(), std::vector<int>{r});
    expect_collectives_work(*group);
  }
}

TEST(NcclSubGroups, SplitWithKeysReversingTheOrder) {
  const int size = world().size(), rank = world().rank();
  auto reversed = world().split(/*color=*/0, /*key=*/-rank);
  ASSERT_NE(reversed, nullptr);
  std::vector<int> expected_members = iota_ranks(size);
  std::reverse(expected_members.begin(), expected_members.end());
  EXPECT_EQ(reversed->global_ranks(), expected_members);
  EXPECT_EQ(reversed->rank(), size - 1 - rank);
  expect_collectives_work(*reversed);
}

TEST(NcclSubGroups, NewGroupInListedOrder) {
  const int size = world().size(), rank = world().rank();
  std::vector<int> listed = iota_ranks(size);
  std::reverse(listed.begin(), listed.end());
  auto group = world().new_group(listed);
  ASSERT_NE(group, nullptr);
  EXPECT_EQ(group->global_ranks(), listed);
  EXPECT_EQ(group->rank(), size - 1 - rank);
  expect_collectives_work(*group);
}

TEST(NcclSubGroups, NoColorLeavesARankOut) {
  const int size = world().size(), rank = world().rank();
  if (size < 2) GTEST_SKIP() << "needs two ranks";
  auto rest = world().split(rank == 0 ? kNoColor : 5, rank);
  if (rank == 0) {
    EXPECT_EQ(rest, nullptr);
    return;
  }
  ASSERT_NE(rest, nullptr);
  EXPECT_EQ(rest->size(), size - 1);
  EXPECT_EQ(rest->rank(), rank - 1);
  expect_collectives_work(*rest);
}

// ---- point to point -----------------------------------------------------------------------------

/// Ranks 0 and 1 of `group` send each other every dtype at every length, blocking and async: 0 -> 1
/// first, then 1 -> 0, each send meeting the receive its peer issued in the same order.
void expect_sends_both_ways(ProcessGroup& group) {
  const int rank = group.rank();
  if (rank > 1) return;  // ranks 0 and 1 talk; point to point involves no one else
  const int peer = 1 - rank;
  std::vector<DType> dtypes = all_dtypes();
  dtypes.push_back(DType::boolean);
  for (DType dtype : dtypes) {
    for (int64_t n : kLengths) {
      for (bool async : {false, true}) {
        SCOPED_TRACE(fmt::format("{} of {} elements{}", dtype, n, async ? ", async" : ""));
        Tensor outgoing = gpu_input(dtype, rank, {n});
        Tensor incoming = gpu_zeros({n}, dtype);
        Work first, second;
        if (rank == 0) {
          first = group.send(outgoing, peer, /*tag=*/0, async);
          second = group.recv(incoming, peer, /*tag=*/0, async);
        } else {
          first = group.recv(incoming, peer, /*tag=*/0, async);
          second = group.send(outgoing, peer, /*tag=*/0, async);
        }
        second.wait();
        first.wait();
        EXPECT_TRUE(values_equal(incoming, input_slice(dtype, peer, n)));
        EXPECT_TRUE(values_equal(outgoing, input_slice(dtype, rank, n))) << "a send leaves its tensor as it was";
      }
    }
  }
}

TEST(NcclPointToPoint, SendRecvInBothDirections) {
  if (world().size() < 2) GTEST_SKIP() << "needs two ranks";
  expect_sends_both_ways(world());
}

TEST(NcclPointToPoint, BatchWithSendsCrossingBothWays) {
  const int size = world().size(), rank = world().rank();
  if (size < 2) GTEST_SKIP() << "needs two ranks";
  const int next = (rank + 1) % size, previous = (rank + size - 1) % size;
  for (int64_t n : kLengths) {
    SCOPED_TRACE(n);
    Tensor to_next = gpu_input(DType::f64, rank, {n});
    Tensor to_previous = gpu_input(DType::f64, rank + 100, {n});
    Tensor from_previous = gpu_zeros({n}, DType::f64), from_next = gpu_zeros({n}, DType::f64);
    // Every rank sends both ways at once. With two ranks next == previous and NCCL has no tags: it pairs
    // the sends and receives between two ranks in the order they are listed, which this order respects
    // (each rank's first send is its peer's first receive).
    world().batch_send_recv({{P2POp::Kind::send, to_next, next, 1},
                             {P2POp::Kind::send, to_previous, previous, 2},
                             {P2POp::Kind::recv, from_previous, previous, 1},
                             {P2POp::Kind::recv, from_next, next, 2}});
    EXPECT_TRUE(values_equal(from_previous, input_slice(DType::f64, previous, n)));
    EXPECT_TRUE(values_equal(from_next, input_slice(DType::f64, next + 100, n)));
  }
}

TEST(NcclPointToPoint, AsyncBatchOfMixedDtypes) {
  const int size = world().size(), rank = world().rank();
  if (size < 2) GTEST_SKIP() << "needs two ranks";
  const int next = (rank + 1) % size, previous = (rank + size - 1) % size;
  std::vector<P2POp> ops;
  std::vector<Tensor> received;
  for (DType dtype : all_dtypes()) {
    ops.push_back({P2POp::Kind::send, gpu_input(dtype, rank, {7, 3}), next, 0});
    received.push_back(gpu_zeros({7, 3}, dtype));
    ops.push_back({P2POp::Kind::recv, received.back(), previous, 0});
  }
  Work work = world().batch_send_recv(ops, /*async=*/true);
  work.wait();
  for (size_t d = 0; d < all_dtypes().size(); ++d) {
    SCOPED_TRACE(fmt::format("{}", all_dtypes()[d]));
    EXPECT_TRUE(values_equal(received[d], input_slice(all_dtypes()[d], previous, 21)));
  }
}

// ---- the copy-engine all-reduce of a pair (Note [Pair all-reduce by the copy engines]) ------------

/// A group of the world's two ranks whose sums of at least 4 KiB go through the copy engines, with a
/// window of 1 MiB (so larger tensors go in pieces).
std::shared_ptr<ProcessGroup> pair_group() {
  std::shared_ptr<ProcessGroup> pair = world().new_group({0, 1});
  std::string why;
  EXPECT_TRUE(use_pair_all_reduce(*pair, int64_t{1} << 20, 4096, &why)) << why;
  return pair;
}

TEST(NcclPairAllReduce, EverySizeAndDtypeGivesNcclsBits) {
  if (world().size() != 2) GTEST_SKIP() << "a pair of ranks";
  std::shared_ptr<ProcessGroup> pair = pair_group();
  core::Generator gen(1234 + static_cast<uint64_t>(world().rank()));
  // Below the 4 KiB threshold (NCCL's), one piece with odd halves, exactly the window, several
  // pieces with a ragged tail.
  for (DType dtype : {DType::f32, DType::bf16, DType::f16}) {
    for (int64_t n : {int64_t{7}, int64_t{100003}, int64_t{1} << 18, int64_t{2'500'009}}) {
      SCOPED_TRACE(fmt::format("{} of {} elements", dtype, n));
      Tensor x = core::empty({n}, TensorOptions(DType::f32, core::kCpu));
      core::uniform_(x, -4.0, 4.0, &gen);
      const Tensor by_pair = x.to(dtype).to(gpu());
      const Tensor by_nccl = x.to(dtype).to(gpu());
      pair->all_reduce(by_pair, ReduceOp::sum);
      world().all_reduce(by_nccl, ReduceOp::sum);
      EXPECT_TRUE(values_equal(by_pair.to(core::kCpu), by_nccl.to(core::kCpu).to(DType::f64).to_vector<double>()));
    }
  }
}

TEST(NcclPairAllReduce, BackToBackAsyncSumsBesideNcclOnesAndTheCallersWork) {
  if (world().size() != 2) GTEST_SKIP() << "a pair of ranks";
  std::shared_ptr<ProcessGroup> pair = pair_group();
  const int rank = world().rank();
  // Twelve sums in flight at once through one window, every third an average (NCCL's), each filled
  // on the caller's stream just before: the window is reused only once both ranks are done with it.
  std::vector<Tensor> tensors;
  std::vector<Work> works;
  for (int i = 0; i < 12; ++i) {
    Tensor t = core::empty({(int64_t{1} << 19) + 13 * i}, TensorOptions(DType::f32, gpu()));
    t.fill_(rank + i + 0.5);
    works.push_back(pair->all_reduce(t, i % 3 == 2 ? ReduceOp::avg : ReduceOp::sum, /*async=*/true));
    tensors.push_back(t);
  }
  for (Work& w : works) w.wait();
  for (int i = 0; i < 12; ++i) {
    SCOPED_TRACE(i);
    const double sum = (0 + i + 0.5) + (1 + i + 0.5);
    const float expected = static_cast<float>(i % 3 == 2 ? sum / 2 : sum);
    const std::vector<float> host = tensors[static_cast<size_t>(i)].to(core::kCpu).to_vector<float>();
    EXPECT_EQ(host.front(), expected);
    EXPECT_EQ(host[host.size() / 2], expected);
    EXPECT_EQ(host.back(), expected);
    EXPECT_EQ(std::count(host.begin(), host.end(), expected), static_cast<std::ptrdiff_t>(host.size()));
  }
}

// ---- a pair's sends and receives by the copy engines (Note [Pair sends and receives by the copy
// engines]) ---------------------------------------------------------------------------------------

/// A group of the world's two ranks whose sends and receives go through `slots` slots of `slot_bytes`.
std::shared_ptr<ProcessGroup> p2p_group(int64_t slot_bytes, int64_t slots) {
  std::shared_ptr<ProcessGroup> pair = world().new_group({0, 1});
  std::string why;
  EXPECT_TRUE(use_pair_p2p(*pair, slot_bytes, slots, &why)) << why;
  return pair;
}

TEST(NcclPairP2P, EveryDtypeAndLengthBothWaysInPieces) {
  if (world().size() != 2) GTEST_SKIP() << "a pair of ranks";
  // 3 slots of 4 KiB: the prime length's messages go in hundreds of pieces round the slots.
  expect_sends_both_ways(*p2p_group(4096, 3));
}

TEST(NcclPairP2P, ManyBatchesInFlightCrossingBothWays) {
  if (world().size() != 2) GTEST_SKIP() << "a pair of ranks";
  // 2 slots of 1 KiB, 24 batches each sending one message and receiving the other's, all issued before
  // any is waited for, their tensors filled on the caller's stream just before and dropped at once:
  // each sender waits for its slots many times over, and no receive waits for its own rank's sends.
  std::shared_ptr<ProcessGroup> pair = p2p_group(1024, 2);
  const int rank = world().rank(), peer = 1 - rank;
  std::vector<Work> works;
  std::vector<Tensor> received;
  for (int i = 0; i < 24; ++i) {
    const int64_t n = 100 + 37 * i;
    Tensor outgoing = gpu_zeros({n}, DType::f32);
    outgoing.copy_(gpu_input(DType::f32, 10 * i + rank, {n}));
    received.push_back(gpu_zeros({n}, DType::f32));
    works.push_back(pair->batch_send_recv(
        {{P2POp::Kind::send, outgoing, peer, 0}, {P2POp::Kind::recv, received.back(), peer, 0}}, /*async=*/true));
  }
  for (Work& w : works) w.wait();
  for (int i = 0; i < 24; ++i) {
    SCOPED_TRACE(i);
    EXPECT_TRUE(values_equal(received[static_cast<size_t>(i)], input_slice(DType::f32, 10 * i + peer, 100 + 37 * i)));
  }
}

TEST(NcclPairP2P, ASendCompletesBeforeItsReceiveIsPosted) {
  if (world().size() != 2) GTEST_SKIP() << "a pair of ranks";
  // NCCL's send waits for its receive; the copy engines' only for a free slot. Rank 1 posts its
  // receive only after rank 0 has seen its send complete.
  std::shared_ptr<ProcessGroup> pair = p2p_group(int64_t{1} << 20, 4);
  const int rank = world().rank();
  const Tensor outgoing = gpu_input(DType::f32, 0, {300000});  // 1.2 MB: two pieces
  if (rank == 0) {
    Work work = pair->send(outgoing, 1, /*tag=*/0, /*async=*/true);
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(20);
    while (!work.is_completed() && std::chrono::steady_clock::now() < deadline) {
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
    }
    EXPECT_TRUE(work.is_completed()) << "the send waited for its receive";
    world().barrier();
  } else {
    world().barrier();
    Tensor incoming = gpu_zeros({300000}, DType::f32);
    pair->recv(incoming, 0, /*tag=*/0);
    EXPECT_TRUE(values_equal(incoming, input_slice(DType::f32, 0, 300000)));
  }
}

TEST(NcclPairP2P, AReceiveOfAnotherSizeIsReportedWithBothSizes) {
  if (world().size() != 2) GTEST_SKIP() << "a pair of ranks";
  std::shared_ptr<ProcessGroup> pair = p2p_group(4096, 2);
  if (world().rank() == 0) {
    pair->send(gpu_input(DType::f32, 0, {100}), 1, /*tag=*/0);
    core::cuda::synchronize(gpu());
  } else {
    Tensor incoming = gpu_zeros({50}, DType::f32);
    pair->recv(incoming, 0, /*tag=*/0);
    EXPECT_ERROR_CONTAINS(core::cuda::synchronize(gpu()),
                          "rank 1 posted a receive of 200 bytes (a f32 tensor of shape [50]) but rank 0's message in "
                          "its place is 400 bytes");
  }
  world().barrier();
}

}  // namespace
}  // namespace colossal::comm::testing

int main(int argc, char** argv) {
  return colossal::comm::testing::run_multigpu_tests(argc, argv);
}
