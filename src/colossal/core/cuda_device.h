// The CUDA runtime as colossal uses it, with no CUDA types in the interface: devices, the current
// stream per device, events, pinned host memory and device properties. Every function exists in
// every build; without CUDA (or without a GPU) is_available() is false and the rest throw an
// error that says so.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>

#include "colossal/core/device.h"
#include "colossal/core/tensor.h"

namespace colossal::core::cuda {

/// True when this build has CUDA and at least one GPU is visible.
bool is_available();
/// Visible GPUs (0 without CUDA).
int device_count();
int current_device();
void set_device(int device);

/// Makes `device` current for a scope.
class DeviceGuard {
 public:
  explicit DeviceGuard(Device device);
  ~DeviceGuard();
  DeviceGuard(const DeviceGuard&) = delete;
  DeviceGuard& operator=(const DeviceGuard&) = delete;

 private:
  int previous_ = -1;  ///< the device to restore, -1 when the guard did not switch
};

/// The stream ops on `device` enqueue work on, for this thread. Starts as a non-blocking stream
/// colossal creates per device (so work never serialises against the legacy default stream).
Stream current_stream(Device device);
/// Sets this thread's current stream for stream.device.
void set_current_stream(Stream stream);
/// How the GPU's block scheduler ranks a stream's kernels against other streams' (CUDA stream
/// priorities: where kernels of several streams wait for room on the SMs, the higher stream's blocks
/// go first). `compute` is the device's default stream, where the model runs; `low` is for work that
/// should fill the compute stream's gaps rather than delay it (copies, the update under the next
/// forward: Note [Update under the next forward] in engine/engine.cpp); `high` is for communication,
/// whose kernels everything else waits for.
enum class StreamPriority { low, compute, high };
/// A new non-blocking stream on device; the caller owns it (destroy_stream). Tensors allocated while
/// it was current are freed in its order, so drop them before destroying it.
Stream create_stream(Device device, StreamPriority priority = StreamPriority::low);
void destroy_stream(Stream stream);
/// Sets a stream current for a scope and restores the previous one afterwards.
class StreamGuard {
 public:
  explicit StreamGuard(Stream stream);
  ~StreamGuard();
  StreamGuard(const StreamGuard&) = delete;
  StreamGuard& operator=(const StreamGuard&) = delete;

 private:
  Stream previous_;
};

// Note [Deferred device checks]
// A kernel that validates its input (a class target or an embedding index out of range) reports the
// first bad position into a 64-bit device slot. Reading the slot back at once would stop the host at
// every such op (three per GPT-2 training step), and the GPU would then idle while the host queued
// the next kernels. Instead the op hands the slot to defer_check: an asynchronous copy into pinned
// host memory and an event follow the kernel on its stream, and the check resolves once the event
// has completed. Pending checks are polled (never waited for) whenever another check is deferred,
// and resolved (waiting) at the host's synchronisation points: synchronize() and copies to the host
// (Tensor::item, .to(kCpu)). The first failure is thrown there, with the message its op composed
// (naming the op, the position and the value), and later checks of the same batch are dropped.
// An error so surfaces a few ops after the call that caused it, at the latest when the host next
// reads a result; nothing is written out of bounds in between (the kernels skip bad positions).

/// Defers the check of `slot` (a device pointer to one uint64, written by kernels queued on
/// `stream` before this call): when it resolves to a value other than `ok`, `describe(value)` builds
/// the message of the Error thrown. `keep` holds the slot's memory (and anything describe reads)
/// alive until then. Polls earlier checks first, so it may throw one of theirs.
void defer_check(Stream stream, const void* slot, uint64_t ok, std::shared_ptr<const void> keep,
                 std::function<std::string(uint64_t value)> describe);
/// Resolves pending deferred checks: every one (waiting for their events) when `wait`, else those
/// already complete, in the order they were deferred. Throws the first failure.
void resolve_deferred_checks(bool wait);

/// Queues on `stream` one kernel that keeps it busy for `milliseconds` of the device's clock. Timing
/// a short piece of work between two events after such a hold measures the device's time alone: the
/// host queues the work's kernels while the hold runs, as it runs ahead in training, instead of the
/// device starting each kernel as the host launches it.
void hold(Stream stream, double milliseconds);

/// Queues on `stream` the write of `value` into the 8 bytes of device memory at `address`, once the
/// stream's earlier work is done and visible (the driver's stream memory operation
/// cuStreamWriteValue64; no kernel).
void write_value(Stream stream, void* address, uint64_t value);
/// Holds `stream` (not an SM: the driver's cuStreamWaitValue64) until the 8 bytes at `address` hold
/// a value >= `value`. Something must write it: the stream waits for ever otherwise.
void wait_value(Stream stream, const void* address, uint64_t value);

/// Waits for all work on the device, then resolves the deferred checks (which may throw).
void synchronize(Device device);
/// Waits for the work queued on stream.
void synchronize(Stream stream);

/// A CUDA event: record on a stream, make another stream wait for it, time between two. The CUDA
/// event is made at the first record(), on the device of the stream it is recorded on (an event
/// belongs to the device current at its creation, and recording it on another device's stream
/// fails: a host thread of rank 1 whose current device was still 0 hit that twice), and made again if
/// it is later recorded on another device's stream. Before any record it counts as complete, as a
/// never-recorded CUDA event does.
class Event {
 public:
  explicit Event(bool enable_timing = false);
  ~Event();
  Event(const Event&) = delete;
  Event& operator=(const Event&) = delete;
  Event(Event&& other) noexcept;
  Event& operator=(Event&& other) noexcept;

  void record(Stream stream);
  /// Makes `stream` wait (on the device, not the host) until this event has happened.
  void block(Stream stream) const;
  void synchronize() const;
  bool query() const;
  /// Milliseconds from this event to `end` (both recorded with timing enabled).
  float elapsed_ms(const Event& end) const;

 private:
  void* handle_ = nullptr;
  int device_ = -1;  // the device handle_ was made on
  bool timing_ = false;
};

/// Page-locked host memory, so host<->device copies run asynchronously at full speed.
Tensor pinned_empty(const Shape& shape, DType dtype);
bool is_pinned(const Tensor& t);
/// dst <- src on `stream` without waiting for it: contiguous tensors of one dtype and size, one in
/// pinned host memory and the other on a GPU (or both on GPUs). The host may read dst, and src may be
/// reused, once `stream` has passed the copy (an Event recorded after it); tensors allocated on
/// another stream must be kept alive by the caller until then. ZeRO's offload copies gradient shards
/// to the host and parameters back this way, overlapping the copies with compute.
void copy_async(const Tensor& dst, const Tensor& src, Stream stream);

struct DeviceProperties {
  std::string name;
  int major = 0, minor = 0;
  int multiprocessor_count = 0;
  int64_t total_memory_bytes = 0;
  int64_t l2_cache_bytes = 0;
};
DeviceProperties properties(int device);
/// The CUDA runtime's and the driver's versions (1000 * major + 10 * minor); nullopt without CUDA or
/// without a driver.
std::optional<int> runtime_version();
std::optional<int> driver_version();
/// Free and total bytes on the device as the driver reports them.
std::pair<int64_t, int64_t> memory_info(int device);

}  // namespace colossal::core::cuda
