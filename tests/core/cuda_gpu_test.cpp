// The CUDA runtime layer on a GPU: pinned host memory and asynchronous copies, streams and events
// ordering work between streams, and the allocator's statistics (peak and its reset).
#include <gtest/gtest.h>

#include <vector>

#include "gpu_compare.h"

namespace colossal {
namespace {

using core::cuda_device;

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

TEST(CudaRuntime, BadUseNamesTheTensors) {
  COLOSSAL_REQUIRE_GPU();
  Tensor cpu = core::ones({2, 3});
  Tensor gpu = core::ones({3, 2}, TensorOptions(DType::f32, cuda_device(0)));
  EXPECT_ERROR_CONTAINS(ops::matmul(cpu, gpu), "a [2, 3] is on cpu but b [3, 2] is on cuda:0");
  EXPECT_ERROR_CONTAINS(core::cuda::pinned_empty({-1}, DType::f32), "negative size");
}

}  // namespace
}  // namespace colossal
