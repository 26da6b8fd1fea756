// Allocator: the interface every device's memory goes through, stream-ordered so that a CUDA
// caching allocator (cudaMallocAsync on a pool) can reuse memory without device syncs. The CPU
// allocator hands out 64-byte-aligned blocks. Both keep statistics users and benchmarks read.
#pragma once

#include <cstddef>
#include <cstdint>

#include "colossal/core/device.h"

namespace colossal::core {

struct MemoryStats {
  int64_t allocated_bytes = 0;       ///< bytes held by live tensors now
  int64_t reserved_bytes = 0;        ///< bytes the allocator holds from the system (>= allocated)
  int64_t peak_allocated_bytes = 0;  ///< highest allocated_bytes since the last reset_peak()
  int64_t num_allocations = 0;       ///< allocate() calls since start
  int64_t cached_bytes = 0;          ///< freed blocks the allocator keeps for reuse (part of reserved)
};

class Allocator {
 public:
  virtual ~Allocator() = default;
  /// Returns memory usable by work queued on `stream` (and, on the CPU, right away).
  virtual void* allocate(size_t nbytes, Stream stream) = 0;
  /// Returns memory once the work queued on `stream` so far has finished with it.
  virtual void deallocate(void* ptr, size_t nbytes, Stream stream) = 0;
  /// Statistics of `device` (allocators serving several devices keep them per device).
  virtual MemoryStats stats(Device device) const = 0;
  virtual void reset_peak(Device device) = 0;
  /// Hands the blocks kept for reuse back to the system (the CUDA pool); a no-op where none are kept.
  virtual void release_cached(Device) {}
  /// Hands back the blocks kept for reuse on `stream`, which is about to be destroyed.
  virtual void release_stream(Stream) {}
};

/// The allocator for a device type. CUDA's is registered by the CUDA backend when compiled in;
/// asking for it otherwise throws an error that says the build has no CUDA.
Allocator& allocator_for(Device device);
void register_allocator(DeviceType type, Allocator* allocator);

/// Alignment of every CPU allocation: a cache line, and enough for any vector load.
inline constexpr size_t kCpuAlignment = 64;

MemoryStats memory_stats(Device device);
void reset_peak_memory(Device device);
/// Returns the memory `device`'s allocator keeps cached for reuse to the system (CUDA: its cached
/// blocks to the memory pool and the pool's unused memory to the driver; synchronises the device. CPU:
/// the free memory glibc's heaps keep, which the CPU allocator's thresholds make the whole of a freed
/// model built on the host).
void empty_cache(Device device);

}  // namespace colossal::core
