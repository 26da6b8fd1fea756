// The CUDA caching allocator: stream-ordered cudaMallocAsync on each device's default memory
// pool, with the pool's release threshold raised so freed memory stays cached for reuse instead
// of going back to the driver at every synchronisation, and in front of the pool a cache of freed
// blocks per stream and size that serves most allocations without a driver call (Note [Block
// cache]). Tracks allocated/peak/cached bytes itself and reads reserved bytes from the pool.
#include <cuda_runtime_api.h>

#include <array>
#include <atomic>
#include <cstdint>
#include <cstdlib>
#include <limits>
#include <mutex>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

#include "colossal/core/allocator.h"
#include "colossal/core/cuda/cuda_check.h"
#include "colossal/core/cuda_device.h"
#include "colossal/core/error.h"

namespace colossal::core {
namespace {

constexpr int kMaxDevices = 64;

// Note [Block cache]
// cudaMallocAsync and cudaFreeAsync each cost the host a driver call with a lock (together ~20%
// of the host time of a small op on an H100 machine, by gpu_kernels_bench --host-profile), and every
// op allocates its output and drops temporaries, so steps whose GPU waits on the host (small batches)
// spend much of their time there. Freed blocks therefore go to a free list per (stream, size rounded
// up to 512 bytes), and an allocation of that size on that stream takes one back without a driver
// call. Reuse on the freeing stream is ordered after every kernel queued there before the free, the
// same guarantee as cudaFreeAsync followed by cudaMallocAsync on one stream, so no event is needed.
// The cache keeps at most COLOSSAL_CUDA_CACHE_MB (default 4096) per device; a free beyond that goes
// to the pool, which reuses memory across sizes. An allocation the pool cannot serve first hands
// every cached block back and synchronises the device (so frees queued on other streams have
// happened) and trims the pool, then tries once more before reporting out-of-memory. A stream's blocks are handed back
// before the stream is destroyed (destroy_stream), as a new stream may reuse its handle.

constexpr size_t kBlockRounding = 512;

size_t rounded_size(size_t nbytes) {
  return (std::max<size_t>(nbytes, 1) + kBlockRounding - 1) / kBlockRounding * kBlockRounding;
}

/// The cache's limit per device in bytes, from COLOSSAL_CUDA_CACHE_MB (0 turns the cache off).
int64_t cache_limit_bytes() {
  static const int64_t limit = [] {
    const char* text = std::getenv("COLOSSAL_CUDA_CACHE_MB");
    if (text == nullptr || *text == '\0') return int64_t{4096} << 20;
    char* end = nullptr;
    const long long mb = std::strtoll(text, &end, 10);
    COLOSSAL_CHECK(end != text && *end == '\0' && mb >= 0,
                   "COLOSSAL_CUDA_CACHE_MB='{}': expected a whole number of MiB (0 turns the block cache off)", text);
    return static_cast<int64_t>(mb) << 20;
  }();
  return limit;
}

/// Freed blocks of one device, by stream and rounded size.
class BlockCache {
 public:
  using Blocks = std::vector<std::pair<cudaStream_t, void*>>;

  /// A cached block of `size` bytes freed on `stream`, or nullptr.
  void* take(cudaStream_t stream, size_t size) {
    std::lock_guard lock(mutex_);
    auto it = free_.find(Key{stream, size});
    if (it == free_.end() || it->second.empty()) return nullptr;
    void* ptr = it->second.back();
    it->second.pop_back();
    bytes_ -= static_cast<int64_t>(size);
    return ptr;
  }

  /// Keeps the block unless that would take the cache past `limit`; false when not kept.
  bool put(cudaStream_t stream, size_t size, void* ptr, int64_t limit) {
    std::lock_guard lock(mutex_);
    if (bytes_ + static_cast<int64_t>(size) > limit) return false;
    free_[Key{stream, size}].push_back(ptr);
    bytes_ += static_cast<int64_t>(size);
    return true;
  }

  /// Removes and returns every block (of `stream` alone when `only` is set).
  Blocks drain(const cudaStream_t* only = nullptr) {
    std::lock_guard lock(mutex_);
    Blocks out;
    for (auto it = free_.begin(); it != free_.end();) {
      if (only != nullptr && it->first.stream != *only) {
        ++it;
        continue;
      }
      for (void* ptr : it->second) out.emplace_back(it->first.stream, ptr);
      bytes_ -= static_cast<int64_t>(it->first.size * it->second.size());
      it = free_.erase(it);
    }
    return out;
  }

  int64_t bytes() const {
    std::lock_guard lock(mutex_);
    return bytes_;
  }

 private:
  struct Key {
    cudaStream_t stream;
    size_t size;
    bool operator==(const Key&) const = default;
  };
  struct KeyHash {
    size_t operator()(const Key& k) const {
      return std::hash<const void*>()(k.stream) ^ (std::hash<size_t>()(k.size) * 0x9e3779b97f4a7c15ull);
    }
  };

  mutable std::mutex mutex_;
  std::unordered_map<Key, std::vector<void*>, KeyHash> free_;
  int64_t bytes_ = 0;
};

class CudaAllocator final : public Allocator {
 public:
  void* allocate(size_t nbytes, Stream stream) override {
    const int device = stream.device.index;
    ensure_pool(device);
    const cudaStream_t s = resolve(stream);
    const size_t size = rounded_size(nbytes);
    void* ptr = caches_[device].take(s, size);
    if (ptr == nullptr) ptr = allocate_from_pool(stream.device, s, size, nbytes);
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
    const cudaStream_t s = resolve(stream);
    stats_[device].allocated.fetch_sub(static_cast<int64_t>(nbytes));
    if (caches_[device].put(s, rounded_size(nbytes), ptr, cache_limit_bytes())) return;
    cuda::DeviceGuard guard(stream.device);
    // Freeing on the allocating stream orders the reuse after every kernel queued there.
    cudaFreeAsync(ptr, s);
  }

  MemoryStats stats(Device device) const override { return stats_for(device.index); }
  void reset_peak(Device device) override { stats_[device.index].peak.store(stats_[device.index].allocated.load()); }

  void release_cached(Device device) override {
    if (!pool_ready_[device.index].load()) return;
    free_to_pool(device, caches_[device.index].drain());
    cuda::DeviceGuard guard(device);
    COLOSSAL_CUDA_CHECK(cudaDeviceSynchronize());
    // The pool keeps what is freed (release threshold); give its unused memory back to the driver
    // so that an allocation of any size can have it.
    cudaMemPool_t pool;
    COLOSSAL_CUDA_CHECK(cudaDeviceGetDefaultMemPool(&pool, device.index));
    COLOSSAL_CUDA_CHECK(cudaMemPoolTrimTo(pool, 0));
  }

  void release_stream(Stream stream) override {
    if (!pool_ready_[stream.device.index].load()) return;
    const cudaStream_t s = resolve(stream);
    free_to_pool(stream.device, caches_[stream.device.index].drain(&s));
  }

  MemoryStats stats_for(int device) const {
    MemoryStats s;
    s.allocated_bytes = stats_[device].allocated.load();
    s.peak_allocated_bytes = stats_[device].peak.load();
    s.num_allocations = stats_[device].count.load();
    s.reserved_bytes = pool_ready_[device].load() ? reserved(device) : 0;
    s.cached_bytes = caches_[device].bytes();
    return s;
  }

 private:
  struct DeviceStats {
    std::atomic<int64_t> allocated{0};
    std::atomic<int64_t> peak{0};
    std::atomic<int64_t> count{0};
  };

  static double gib(double bytes) { return bytes / double(1ull << 30); }

  static cudaStream_t resolve(Stream stream) {
    return static_cast<cudaStream_t>(stream.handle ? stream.handle : cuda::current_stream(stream.device).handle);
  }

  static void free_to_pool(Device device, const BlockCache::Blocks& blocks) {
    if (blocks.empty()) return;
    cuda::DeviceGuard guard(device);
    for (const auto& [stream, ptr] : blocks) cudaFreeAsync(ptr, stream);
  }

  void* allocate_from_pool(Device device, cudaStream_t s, size_t size, size_t nbytes) {
    cuda::DeviceGuard guard(device);
    void* ptr = nullptr;
    cudaError_t status = cudaMallocAsync(&ptr, size, s);
    if (status == cudaErrorMemoryAllocation && caches_[device.index].bytes() > 0) {
      cudaGetLastError();
      release_cached(device);  // other sizes' cached blocks may make room
      status = cudaMallocAsync(&ptr, size, s);
    }
    if (status == cudaErrorMemoryAllocation) {
      cudaGetLastError();
      const auto [free_bytes, total_bytes] = cuda::memory_info(device.index);
      COLOSSAL_FAIL(
          "CUDA out of memory on cuda:{} allocating {} bytes ({:.2f} GiB): {:.2f} GiB allocated by colossal, "
          "{:.2f} GiB reserved, {:.2f} GiB free of {:.2f} GiB. Reduce the batch size or enable activation "
          "checkpointing / ZeRO offload",
          device.index, nbytes, gib(nbytes), gib(stats_[device.index].allocated.load()), gib(reserved(device.index)),
          gib(free_bytes), gib(total_bytes));
    }
    COLOSSAL_CUDA_CHECK(status);
    return ptr;
  }

  void ensure_pool(int device) {
    if (pool_ready_[device].load()) return;
    std::lock_guard lock(mutex_);
    if (pool_ready_[device].load()) return;
    // Parsed here, on the first allocation, where a bad value can throw: deallocate runs in
    // destructors.
    cache_limit_bytes();
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
  std::array<BlockCache, kMaxDevices> caches_;
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
