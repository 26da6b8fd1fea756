// The CPU allocator (aligned, with statistics) and the per-device-type allocator registry.
#include "colossal/core/allocator.h"

#include <malloc.h>  // mallopt

#include <array>
#include <atomic>
#include <cstdlib>
#include <new>

#include "colossal/core/error.h"

namespace colossal::core {
namespace {

class CpuAllocator final : public Allocator {
 public:
  CpuAllocator() {
    // Training frees and reallocates the same activation-sized blocks every step. By default glibc
    // serves blocks over its mmap threshold with fresh mappings and trims freed heap tops, so each
    // step page-faults its activations in again (a third of the CPU time of a small ViT step went
    // to the kernel). Large fixed thresholds keep freed blocks in the heap for reuse; the cost is
    // that the process keeps its peak heap, as a caching allocator would.
    mallopt(M_MMAP_THRESHOLD, 512 << 20);
    mallopt(M_TRIM_THRESHOLD, 1 << 30);
  }
  void* allocate(size_t nbytes, Stream) override {
    const size_t rounded = (std::max<size_t>(nbytes, 1) + kCpuAlignment - 1) / kCpuAlignment * kCpuAlignment;
    // Past int64 (the statistics' type) no request can succeed, and the rounding above may wrap.
    void* ptr = nbytes <= static_cast<size_t>(INT64_MAX) ? std::aligned_alloc(kCpuAlignment, rounded) : nullptr;
    COLOSSAL_CHECK(ptr != nullptr, "out of CPU memory allocating {} bytes ({} already allocated)", nbytes,
                   allocated_.load());
    const int64_t now = allocated_.fetch_add(static_cast<int64_t>(nbytes)) + static_cast<int64_t>(nbytes);
    int64_t peak = peak_.load();
    while (now > peak && !peak_.compare_exchange_weak(peak, now)) {
    }
    ++num_allocations_;
    return ptr;
  }
  /// The free memory the thresholds above keep in glibc's heaps (every arena, not only each heap's
  /// top) back to the kernel.
  void release_cached(Device) override { malloc_trim(0); }
  void deallocate(void* ptr, size_t nbytes, Stream) override {
    std::free(ptr);
    allocated_.fetch_sub(static_cast<int64_t>(nbytes));
  }
  MemoryStats stats(Device) const override {
    MemoryStats s;
    s.allocated_bytes = allocated_.load();
    s.reserved_bytes = s.allocated_bytes;  // malloc's own caching is invisible to us
    s.peak_allocated_bytes = peak_.load();
    s.num_allocations = num_allocations_.load();
    return s;
  }
  void reset_peak(Device) override { peak_.store(allocated_.load()); }

 private:
  std::atomic<int64_t> allocated_{0};
  std::atomic<int64_t> peak_{0};
  std::atomic<int64_t> num_allocations_{0};
};

std::array<std::atomic<Allocator*>, kNumDeviceTypes>& registry() {
  static CpuAllocator cpu;
  static std::array<std::atomic<Allocator*>, kNumDeviceTypes> table{&cpu, nullptr};
  return table;
}

}  // namespace

Allocator& allocator_for(Device device) {
  Allocator* a = registry()[static_cast<size_t>(device.type)].load();
  COLOSSAL_CHECK(a != nullptr, "no allocator for device {}: this build of colossal has no {} backend", device,
                 device.is_cuda() ? "CUDA" : "such");
  return *a;
}

void register_allocator(DeviceType type, Allocator* allocator) {
  registry()[static_cast<size_t>(type)].store(allocator);
}

MemoryStats memory_stats(Device device) {
  return allocator_for(device).stats(device);
}
void reset_peak_memory(Device device) {
  allocator_for(device).reset_peak(device);
}
void empty_cache(Device device) {
  allocator_for(device).release_cached(device);
}

}  // namespace colossal::core
