// The CUDA runtime layer on a GPU: pinned host memory and asynchronous copies, streams and events
// ordering work between streams, the allocator's statistics (peak and its reset) and its block cache,
// the f16/bf16 conversions against the CPU's, and accumulate_many_ against accumulate_.
#include <gtest/gtest.h>

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstring>
#include <string>
#include <vector>

#include "colossal/core/view.h"  // accumulate_, accumulate_many_
#include "gpu_compare.h"

namespace colossal {
namespace {

using core::cuda_device;
using testing::random_input;

TEST(CudaRuntime, PinnedHostMemoryRoundTripsThroughTheGpu) {
  COLOSSAL_REQUIRE_GPU();
  const int64_t n = (int64_t{1} << 22) + 3;  // 16 MiB and an odd tail
  Tensor host = core::cuda::pinned_empty({n}, DType::f32);
  ASSERT_TRUE(core::cuda::is_pinned(host));
  EXPECT_FALSE(core::cuda::is_pinned(core::empty({4})));
  float* data = host.data<float>();
  for (int64_t i = 0; i < n; ++i) data[i] = static_cast<float>(i % 1000) * 0.5f - 7.0f;

  Tensor device = core::empty({n}, TensorOptions(DType::f32, cuda_device(0)));
  device.copy_(host);  // asynchronous from pinned memory, on the current stream
  Tensor doubled = device * 2.0;
  Tensor back = core::cuda::pinned_empty({n}, DType::f32);
  back.copy_(doubled);  // device -> host waits for the stream, so the values are there on return
  for (int64_t i : {int64_t{0}, int64_t{1}, n / 2, n - 1}) {
    EXPECT_EQ(back.data<float>()[i], 2.0f * data[i]) << "element " << i;
  }
  testing::expect_close(back, host * 2.0, 0, 0, "pinned round trip");
}

TEST(CudaRuntime, EventsOrderWorkAcrossStreams) {
  COLOSSAL_REQUIRE_GPU();
  const Device gpu = cuda_device(0);
  const core::Stream side = core::cuda::create_stream(gpu);
  Tensor x = core::full({1 << 24}, 1.5, TensorOptions(DType::f32, gpu));
  Tensor y;
  core::cuda::Event produced(/*enable_timing=*/true), start(/*enable_timing=*/true);
  {
    core::cuda::StreamGuard on_side(side);
    EXPECT_EQ(core::cuda::current_stream(gpu).handle, side.handle);
    start.record(side);
    y = x * 3.0;
    for (int i = 0; i < 4; ++i) y = y + 1.0;  // enough work that an unordered reader would see garbage
    produced.record(side);
  }
  EXPECT_NE(core::cuda::current_stream(gpu).handle, side.handle);  // the guard restored the stream
  produced.block(core::cuda::current_stream(gpu));                 // the default stream waits on the device
  Tensor total = ops::sum(y.to(DType::f64));
  EXPECT_DOUBLE_EQ(total.to(core::kCpu).item<double>(), (1.5 * 3.0 + 4.0) * (1 << 24));
  produced.synchronize();
  EXPECT_TRUE(produced.query());
  EXPECT_GE(start.elapsed_ms(produced), 0.0f);
  core::cuda::synchronize(side);
  y = Tensor();  // memory allocated on `side` is returned on it: free it before the stream goes
  core::cuda::destroy_stream(side);
}

TEST(CudaRuntime, HoldKeepsTheStreamBusyWhileTheHostQueues) {
  COLOSSAL_REQUIRE_GPU();
  const Device gpu = cuda_device(0);
  const core::Stream stream = core::cuda::current_stream(gpu);
  Tensor x = core::full({1 << 20}, 2.0, TensorOptions(DType::f32, gpu));
  // The addition's kernel loaded first: a kernel's first launch loads its module (CUDA's lazy
  // loading), which waits for the device, the hold included.
  Tensor warm = x + 1.0;
  core::cuda::synchronize(stream);
  core::cuda::Event before(/*enable_timing=*/true), held(/*enable_timing=*/true), done(/*enable_timing=*/true);
  before.record(stream);
  core::cuda::hold(stream, 20.0);
  held.record(stream);
  Tensor y = x;
  for (int i = 0; i < 50; ++i) y = y + 1.0;  // queued behind the hold
  done.record(stream);
  EXPECT_FALSE(done.query());  // the host got here well inside the 20 ms
  EXPECT_EQ(ops::sum(y.to(DType::f64)).to(core::kCpu).item<double>(), 52.0 * (1 << 20));
  EXPECT_GE(before.elapsed_ms(held), 19.5f);
  EXPECT_LT(before.elapsed_ms(held), 40.0f);
  // Queued while the stream was held, the 50 additions ran back to back.
  EXPECT_LT(held.elapsed_ms(done), 5.0f);
  EXPECT_THROW(core::cuda::hold(stream, -1.0), Error);
}

TEST(CudaRuntime, PeakStatisticsAndTheirReset) {
  COLOSSAL_REQUIRE_GPU();
  const Device gpu = cuda_device(0);
  const int64_t base = core::memory_stats(gpu).allocated_bytes;
  {
    Tensor big = core::empty({int64_t{64} << 20}, TensorOptions(DType::u8, gpu));  // 64 MiB
    EXPECT_GE(core::memory_stats(gpu).peak_allocated_bytes, base + (int64_t{64} << 20));
  }
  EXPECT_GE(core::memory_stats(gpu).peak_allocated_bytes, base + (int64_t{64} << 20));
  core::reset_peak_memory(gpu);
  EXPECT_EQ(core::memory_stats(gpu).peak_allocated_bytes, core::memory_stats(gpu).allocated_bytes);
  // The pool keeps what it reserved (high release threshold), so a second 64 MiB reuses it.
  const int64_t reserved = core::memory_stats(gpu).reserved_bytes;
  Tensor again = core::empty({int64_t{64} << 20}, TensorOptions(DType::u8, gpu));
  EXPECT_GE(core::memory_stats(gpu).reserved_bytes, reserved);
}

/// Every f16 and bf16 bit pattern widened to f32 on the GPU, and f32 values narrowed (each 16-bit
/// value, the midpoints between neighbours and one f32 step either side of them, subnormals and the
/// overflow edge), must give the CPU's bits: the GPU converts with cvt instructions, the CPU with
/// integer code (Note [Hardware conversions]). NaN only has to stay NaN (its payload may differ).
TEST(CudaRuntime, AccumulateManyEqualsAccumulateBitForBit) {
  // 70 pairs (two launches of at most 64) of every size from 1 to past a block's 1024 elements, in
  // each floating dtype, with a strided destination among them (added on its own): each element as
  // the one-pair kernel adds it.
  COLOSSAL_REQUIRE_GPU();
  const Device gpu = cuda_device(0);
  for (DType dtype : {DType::f32, DType::f64, DType::bf16, DType::f16}) {
    SCOPED_TRACE(std::string(core::dtype_name(dtype)));
    std::vector<Tensor> one_by_one, together, sources;
    for (int i = 0; i < 70; ++i) {
      const Shape shape = i == 69 ? Shape{37, 41} : Shape{1 + (i * 97) % 3000};
      const Tensor dst = random_input(shape, 100 + i, dtype, -1.0, 1.0, false).to(gpu);
      one_by_one.push_back(dst.clone());
      together.push_back(i == 69 ? dst.clone().t() : dst.clone());
      if (i == 69) one_by_one.back() = one_by_one.back().t();
      sources.push_back(random_input(together.back().shape(), 500 + i, dtype, -1.0, 1.0, false).to(gpu));
    }
    for (size_t i = 0; i < sources.size(); ++i) core::accumulate_(one_by_one[i], sources[i]);
    core::accumulate_many_(together, sources);
    for (size_t i = 0; i < sources.size(); ++i) {
      const Tensor a = together[i].contiguous().to(core::kCpu), b = one_by_one[i].contiguous().to(core::kCpu);
      ASSERT_EQ(a.nbytes(), b.nbytes());
      EXPECT_EQ(std::memcmp(a.raw_data(), b.raw_data(), a.nbytes()), 0) << "pair " << i;
    }
  }
}

TEST(CudaRuntime, HalfConversionsMatchTheCpuBitForBit) {
  COLOSSAL_REQUIRE_GPU();
  const Device gpu = cuda_device(0);
  for (DType narrow : {DType::f16, DType::bf16}) {
    SCOPED_TRACE(std::string(core::dtype_name(narrow)));
    const bool half = narrow == DType::f16;
    auto value_of = [&](uint16_t bits) {
      return half ? static_cast<float>(core::Half::from_bits(bits))
                  : static_cast<float>(core::BFloat16::from_bits(bits));
    };
    // Widening: all 65536 patterns.
    Tensor patterns = core::empty({65536}, TensorOptions(narrow));
    auto* raw = static_cast<uint16_t*>(patterns.raw_data());
    for (uint32_t b = 0; b < 65536; ++b) raw[b] = static_cast<uint16_t>(b);
    const Tensor wide = patterns.to(gpu).to(DType::f32).to(core::kCpu);
    for (uint32_t b = 0; b < 65536; ++b) {
      const float expected = value_of(static_cast<uint16_t>(b)), got = wide.data<float>()[b];
      if (std::isnan(expected)) {
        ASSERT_TRUE(std::isnan(got)) << "pattern " << b;
      } else {
        ASSERT_EQ(std::bit_cast<uint32_t>(got), std::bit_cast<uint32_t>(expected)) << "pattern " << b;
      }
    }
    // Narrowing: each finite value, the midpoint to the next (ties round to even) and one f32 step
    // either side of it, and values beyond the largest finite one.
    std::vector<float> inputs;
    for (uint32_t b = 0; b < 65536; ++b) {
      const float v = value_of(static_cast<uint16_t>(b)), next = value_of(static_cast<uint16_t>(b + 1));
      if (!std::isfinite(v)) continue;
      inputs.push_back(v);
      if (std::isfinite(next) && (b & 0x7fff) != 0x7fff && std::signbit(v) == std::signbit(next)) {
        const float mid = v + (next - v) / 2;
        inputs.insert(inputs.end(), {mid, std::nextafter(mid, 0.0f), std::nextafter(mid, 2 * mid)});
      }
    }
    for (float v : {65504.0f, 65519.0f, 65520.0f, 1e30f, 3.3e38f, 1e-45f, 1e-40f, 6e-8f, 2.9e-8f, 3e-8f}) {
      inputs.insert(inputs.end(), {v, -v});
    }
    Tensor floats = core::empty({static_cast<int64_t>(inputs.size())});
    std::copy(inputs.begin(), inputs.end(), floats.data<float>());
    const Tensor on_cpu = floats.to(narrow);
    const Tensor on_gpu = floats.to(gpu).to(narrow).to(core::kCpu);
    const auto* want = static_cast<const uint16_t*>(on_cpu.raw_data());
    const auto* got = static_cast<const uint16_t*>(on_gpu.raw_data());
    for (size_t i = 0; i < inputs.size(); ++i) {
      ASSERT_EQ(got[i], want[i]) << "narrowing " << inputs[i] << " (f32 bits " << std::hex
                                 << std::bit_cast<uint32_t>(inputs[i]) << ")";
    }
  }
}

/// Note [Block cache]: a block freed on a stream comes back for the next allocation of its rounded
/// size on that stream, not on another stream; destroying a stream and empty_cache hand the blocks
/// back; an allocation the pool cannot serve while blocks are cached gets them back and succeeds.
TEST(CudaRuntime, FreedBlocksAreReusedPerStreamAndHandedBack) {
  COLOSSAL_REQUIRE_GPU();
  const Device gpu = cuda_device(0);
  const TensorOptions bytes(DType::u8, gpu);
  core::empty_cache(gpu);
  EXPECT_EQ(core::memory_stats(gpu).cached_bytes, 0);
  const void* first = nullptr;
  {
    Tensor t = core::empty({1000}, bytes);
    first = t.raw_data();
  }
  EXPECT_EQ(core::memory_stats(gpu).cached_bytes, 1024);  // 1000 bytes round up to 1024
  {
    Tensor again = core::empty({1000 - 7}, bytes);  // same rounded size, same stream: the same block
    EXPECT_EQ(again.raw_data(), first);
    EXPECT_EQ(core::memory_stats(gpu).cached_bytes, 0);
  }
  const core::Stream side = core::cuda::create_stream(gpu);
  {
    core::cuda::StreamGuard guard(side);
    Tensor other = core::empty({1000}, bytes);  // another stream never takes the first stream's block
    EXPECT_NE(other.raw_data(), first);
  }
  EXPECT_EQ(core::memory_stats(gpu).cached_bytes, 2048);
  core::cuda::destroy_stream(side);
  EXPECT_EQ(core::memory_stats(gpu).cached_bytes, 1024);
  // Values survive reuse in stream order: a block refilled right after its last reader was queued.
  Tensor source = core::full({1 << 20}, 3.0f, TensorOptions(DType::f32, gpu));
  Tensor sum;
  const void* scratch_block = nullptr;
  {
    Tensor scratch = source * 2.0;
    scratch_block = scratch.raw_data();
    sum = scratch + 1.0;
  }  // scratch's block is cached while `sum`'s kernel may still be reading it
  Tensor reused = core::full({1 << 20}, -5.0f, TensorOptions(DType::f32, gpu));
  EXPECT_EQ(reused.raw_data(), scratch_block);
  testing::expect_close(sum, core::full({1 << 20}, 7.0f, TensorOptions(DType::f32, gpu)), 0, 0, "sum after reuse");
  core::empty_cache(gpu);
  EXPECT_EQ(core::memory_stats(gpu).cached_bytes, 0);

  const int64_t gib = int64_t{1} << 30;
  const auto [free_bytes, total_bytes] = core::cuda::memory_info(0);
  if (free_bytes < 8 * gib) GTEST_SKIP() << "needs 8 GiB free, has " << free_bytes;
  Tensor filler = core::empty({free_bytes - 3 * gib}, bytes);
  { Tensor a = core::empty({gib}, bytes), b = core::empty({gib}, bytes); }
  EXPECT_EQ(core::memory_stats(gpu).cached_bytes, 2 * gib);
  Tensor big = core::empty({2 * gib + 4096}, bytes);  // fits only once the cached blocks are back
  EXPECT_EQ(core::memory_stats(gpu).cached_bytes, 0);
}

TEST(CudaRuntime, BadUseNamesTheTensors) {
  COLOSSAL_REQUIRE_GPU();
  Tensor cpu = core::ones({2, 3});
  Tensor gpu = core::ones({3, 2}, TensorOptions(DType::f32, cuda_device(0)));
  EXPECT_ERROR_CONTAINS(ops::matmul(cpu, gpu), "a [2, 3] is on cpu but b [3, 2] is on cuda:0");
  EXPECT_ERROR_CONTAINS(core::cuda::pinned_empty({-1}, DType::f32), "negative size");
}

}  // namespace
}  // namespace colossal
