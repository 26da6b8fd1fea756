// The CUDA caching allocator: stream-ordered cudaMallocAsync on each device's default memory
// pool, with the pool's release threshold raised so freed memory stays cached for reuse instead
// of going back to the driver at every synchronisation. Tracks allocated/peak bytes itself and
// reads reserved bytes from the pool.
#include <cuda_runtime_api.h>

#include <array>
#include <atomic>
#include <cstdint>
#include <limits>
#include <mutex>

#include "colossal/core/allocator.h"
#include "colossal/core/cuda/cuda_check.h"
#include "colossal/core/cuda_device.h"

namespace colossal::core {
namespace {

constexpr int kMaxDevices = 64;

class CudaAllocator final : public Allocator {
 public:
  void* allocate(size_t nbytes, Stream stream) override {
    const int device = stream.device.index;
    ensure_pool(device);
    cuda::DeviceGuard guard(stream.device);
    cudaStream_t s = stream.handle ? static_cast<cudaStream_t>(stream.handle)
                                   : static_cast<cudaStream_t>(cuda::current_stream(stream.device).handle);
    void* ptr = nullptr;
    const cudaError_t status = cudaMallocAsync(&ptr, std::max<size_t>(nbytes, 1), s);
    if (status == cudaErrorMemoryAllocation) {
      cudaGetLastError();
      const auto [free_bytes, total_bytes] = cuda::memory_info(device);
      COLOSSAL_FAIL(
          "CUDA out of memory on cuda:{} allocating {} bytes ({:.2f} GiB): {:.2f} GiB allocated by colossal, "
          "{:.2f} GiB reserved, {:.2f} GiB free of {:.2f} GiB. Reduce the batch size or enable activation "
          "checkpointing / ZeRO offload",
          device, nbytes, gib(nbytes), gib(stats_[device].allocated.load()), gib(reserved(device)), gib(free_bytes),
          gib(total_bytes));
    }
    COLOSSAL_CUDA_CHECK(status);
    auto& st = stats_[device];
    const int64_t now = st.allocated.fetch_add(static_cast<int64_t>(nbytes)) + static_cast<int64_t>(nbytes);
    int64_t peak = st.peak.load();
    while (now > peak && !st.peak.compare_exchange_weak(peak, now)) {
    }
    ++st.count;
    return ptr;
  }

  void deallocate(void* ptr, size_t nbytes, Stream stream) override {
    const int device = stream.device.index;
    cuda::DeviceGuard guard(stream.device);
    cudaStream_t s = stream.handle ? static_cast<cudaStream_t>(stream.handle)
                                   : static_cast<cudaStream_t>(cuda::current_stream(stream.device).handle);
    // Freeing on the allocating stream orders the reuse after every kernel queued there.
    cudaFreeAsync(ptr, s);
    stats_[device].allocated.fetch_sub(static_cast<int64_t>(nbytes));
  }

  MemoryStats stats(Device device) const override { return stats_for(device.index); }
  void reset_peak(Device device) override { stats_[device.index].peak.store(stats_[device.index].allocated.load()); }

  MemoryStats stats_for(int device) const {
    MemoryStats s;
    s.allocated_bytes = stats_[device].allocated.load();
    s.peak_allocated_bytes = stats_[device].peak.load();
    s.num_allocations = stats_[device].count.load();
    s.reserved_bytes = pool_ready_[device].load() ? reserved(device) : 0;
    return s;
  }

 private:
  struct DeviceStats {
    std::atomic<int64_t> allocated{0};
    std::atomic<int64_t> peak{0};
    std::atomic<int64_t> count{0};
  };

  static double gib(double bytes) { return bytes / double(1ull << 30); }

  void ensure_pool(int device) {
    if (pool_ready_[device].load()) return;
    std::lock_guard lock(mutex_);
    if (pool_ready_[device].load()) return;
    cudaMemPool_t pool;
    COLOSSAL_CUDA_CHECK(cudaDeviceGetDefaultMemPool(&pool, device));
    uint64_t threshold = std::numeric_limits<uint64_t>::max();
    COLOSSAL_CUDA_CHECK(cudaMemPoolSetAttribute(pool, cudaMemPoolAttrReleaseThreshold, &threshold));
    pool_ready_[device].store(true);
  }

  static int64_t reserved(int device) {
    cudaMemPool_t pool;
    if (cudaDeviceGetDefaultMemPool(&pool, device) != cudaSuccess) return 0;
    uint64_t value = 0;
    if (cudaMemPoolGetAttribute(pool, cudaMemPoolAttrReservedMemCurrent, &value) != cudaSuccess) return 0;
    return static_cast<int64_t>(value);
  }

  std::mutex mutex_;
  std::array<std::atomic<bool>, kMaxDevices> pool_ready_{};
  mutable std::array<DeviceStats, kMaxDevices> stats_{};
};

CudaAllocator& instance() {
  static CudaAllocator allocator;
  return allocator;
}

const bool registered = [] {
  register_allocator(DeviceType::cuda, &instance());
  return true;
}();

}  // namespace
}  // namespace colossal::core
