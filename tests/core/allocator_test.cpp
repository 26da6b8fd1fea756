// The CPU allocator: 64-byte alignment for every size, the memory statistics (allocated, peak,
// reset_peak, allocation count) and that a tensor's storage goes back when its last view drops;
// also the errors for impossible sizes and for a device type the build has no allocator for.
#include <gtest/gtest.h>

#include <cstdint>
#include <cstring>
#include <limits>
#include <vector>

#include "colossal/core/allocator.h"
#include "colossal/core/build_config.h"
#include "colossal/core/storage.h"
#include "colossal/core/tensor.h"
#include "colossal/core/view.h"
#include "gradcheck.h"  // EXPECT_ERROR_CONTAINS

namespace colossal::core {
namespace {

const std::vector<size_t> kSizes = {0,   1,   2,   3,   7,    31,   63,   64,    65,
                                    100, 127, 128, 129, 1000, 4095, 4097, 65537, (size_t{1} << 20) + 7};

bool is_aligned(const void* p) {
  return reinterpret_cast<uintptr_t>(p) % kCpuAlignment == 0;
}

TEST(CpuAllocator, EveryAllocationIs64ByteAligned) {
  Allocator& allocator = allocator_for(kCpu);
  // All blocks alive at once, so each comes from a different place.
  std::vector<void*> blocks;
  for (size_t n : kSizes) {
    void* p = allocator.allocate(n, {});
    ASSERT_NE(p, nullptr) << n << " bytes";
    EXPECT_TRUE(is_aligned(p)) << n << " bytes at " << p;
    std::memset(p, 0xab, n);  // the whole block is usable (a sanitizer build checks the bounds)
    blocks.push_back(p);
  }
  for (size_t i = 0; i < kSizes.size(); ++i) allocator.deallocate(blocks[i], kSizes[i], {});
}

TEST(CpuAllocator, TensorDataIsAligned) {
  for (size_t n : kSizes) {
    Tensor t = empty({static_cast<int64_t>(n)}, DType::u8);
    EXPECT_TRUE(is_aligned(t.raw_data())) << n << " bytes";
  }
  for (DType dtype : {DType::f16, DType::f64, DType::boolean}) {
    EXPECT_TRUE(is_aligned(empty({3, 5}, dtype).raw_data())) << dtype_name(dtype);
  }
}

TEST(CpuAllocator, StatsCountLiveBytesAndAllocations) {
  const MemoryStats before = memory_stats(kCpu);
  {
    Tensor t = empty({1000}, DType::u8);
    const MemoryStats during = memory_stats(kCpu);
    // The requested bytes are counted, not the 64-byte rounding.
    EXPECT_EQ(during.allocated_bytes, before.allocated_bytes + 1000);
    EXPECT_EQ(during.num_allocations, before.num_allocations + 1);
    EXPECT_GE(during.reserved_bytes, during.allocated_bytes);
    EXPECT_GE(during.peak_allocated_bytes, during.allocated_bytes);
    Tensor u = empty({10}, DType::f64);
    EXPECT_EQ(memory_stats(kCpu).allocated_bytes, before.allocated_bytes + 1080);
    EXPECT_EQ(memory_stats(kCpu).num_allocations, before.num_allocations + 2);
  }
  const MemoryStats after = memory_stats(kCpu);
  EXPECT_EQ(after.allocated_bytes, before.allocated_bytes);
  EXPECT_EQ(after.num_allocations, before.num_allocations + 2);  // a count of calls, not of live blocks
}

TEST(CpuAllocator, PeakAndResetPeak) {
  reset_peak_memory(kCpu);
  const MemoryStats base = memory_stats(kCpu);
  EXPECT_EQ(base.peak_allocated_bytes, base.allocated_bytes);
  {
    Tensor a = empty({4096}, DType::u8);
    Tensor b = empty({250}, DType::f32);
  }
  {
    Tensor c = empty({100}, DType::u8);  // lower than the earlier high-water mark
  }
  MemoryStats s = memory_stats(kCpu);
  EXPECT_EQ(s.allocated_bytes, base.allocated_bytes);
  EXPECT_EQ(s.peak_allocated_bytes, base.allocated_bytes + 4096 + 1000);
  reset_peak_memory(kCpu);
  s = memory_stats(kCpu);
  EXPECT_EQ(s.peak_allocated_bytes, s.allocated_bytes);
  // After a reset the peak is the current usage while a tensor is alive, not the old maximum.
  Tensor d = empty({10}, DType::u8);
  reset_peak_memory(kCpu);
  EXPECT_EQ(memory_stats(kCpu).peak_allocated_bytes, base.allocated_bytes + 10);
}

TEST(CpuAllocator, StorageIsFreedWhenTheLastViewDrops) {
  const int64_t baseline = memory_stats(kCpu).allocated_bytes;
  Tensor view;
  {
    Tensor base = zeros({64, 16}, DType::f32);  // 4096 bytes
    EXPECT_EQ(memory_stats(kCpu).allocated_bytes, baseline + 4096);
    view = transpose_raw(select_raw(view_raw(base, {4, 16, 16}), 0, 3), 0, 1);
    Tensor handle_copy = base;
  }
  // The base handle is gone but the view holds the storage.
  EXPECT_EQ(memory_stats(kCpu).allocated_bytes, baseline + 4096);
  Tensor detached = view.detach();
  view = Tensor();
  EXPECT_EQ(memory_stats(kCpu).allocated_bytes, baseline + 4096);
  detached = Tensor();
  EXPECT_EQ(memory_stats(kCpu).allocated_bytes, baseline);
}

TEST(CpuAllocator, ContiguousCopiesAreFreedToo) {
  const int64_t baseline = memory_stats(kCpu).allocated_bytes;
  {
    Tensor x = zeros({8, 8}, DType::f64);
    Tensor y = contiguous_raw(transpose_raw(x, 0, 1));
    Tensor z = cast_raw(y, DType::f32);
    EXPECT_EQ(memory_stats(kCpu).allocated_bytes, baseline + 512 + 512 + 256);
  }
  EXPECT_EQ(memory_stats(kCpu).allocated_bytes, baseline);
}

TEST(CpuAllocator, WrappedStorageBypassesTheAllocator) {
  const MemoryStats before = memory_stats(kCpu);
  std::vector<double> buffer(32, 0.0);
  {
    Storage s = Storage::wrap(buffer.data(), buffer.size() * sizeof(double), kCpu, [](void*) {});
    EXPECT_EQ(s.data(), buffer.data());
    EXPECT_EQ(s.nbytes(), 256u);
  }
  const MemoryStats after = memory_stats(kCpu);
  EXPECT_EQ(after.allocated_bytes, before.allocated_bytes);
  EXPECT_EQ(after.num_allocations, before.num_allocations);
}

TEST(CpuAllocator, DefaultStorageIsEmpty) {
  Storage s;
  EXPECT_FALSE(s.defined());
  EXPECT_EQ(s.data(), nullptr);
  EXPECT_EQ(s.nbytes(), 0u);
  EXPECT_EQ(s.device(), kCpu);
}

TEST(CpuAllocator, ImpossibleAllocationFailsWithTheSize) {
  const MemoryStats before = memory_stats(kCpu);
  // 2^50 f32 elements are 4 PiB, more than any x86-64 address space: fails at once, nothing is
  // touched.
  EXPECT_ERROR_CONTAINS(empty({int64_t{1} << 50}), "out of CPU memory allocating 4503599627370496 bytes");
  // A size whose 64-byte rounding overflows must fail too, not wrap around to a tiny block.
  Allocator& allocator = allocator_for(kCpu);
  const size_t huge = std::numeric_limits<size_t>::max() - 10;
  try {
    void* p = allocator.allocate(huge, {});
    ADD_FAILURE() << "allocating " << huge << " bytes returned " << p;
    allocator.deallocate(p, huge, {});
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("out of CPU memory allocating 18446744073709551605 bytes"), std::string::npos)
        << e.what();
  }
  const MemoryStats after = memory_stats(kCpu);
  EXPECT_EQ(after.allocated_bytes, before.allocated_bytes);
  EXPECT_EQ(after.num_allocations, before.num_allocations);
}

TEST(Allocators, DeviceWithoutABackendNamesTheMissingBackend) {
#if COLOSSAL_WITH_CUDA
  GTEST_SKIP() << "this build has the CUDA backend";
#else
  EXPECT_ERROR_CONTAINS(allocator_for(cuda_device(0)),
                        "no allocator for device cuda:0: this build of colossal has no CUDA backend");
  EXPECT_ERROR_CONTAINS(memory_stats(cuda_device(1)), "no allocator for device cuda:1");
#endif
}

}  // namespace
}  // namespace colossal::core
