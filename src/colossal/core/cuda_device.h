// The CUDA runtime as colossal uses it, with no CUDA types in the interface: devices, the current
// stream per device, events, pinned host memory and device properties. Every function exists in
// every build; without CUDA (or without a GPU) is_available() is false and the rest throw an
// error that says so.
#pragma once

#include <cstdint>
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
  int previous_ = -1;
};

/// The stream ops on `device` enqueue work on, for this thread. Starts as a non-blocking stream
/// colossal creates per device (so work never serialises against the legacy default stream).
Stream current_stream(Device device);
/// Sets this thread's current stream for stream.device.
void set_current_stream(Stream stream);
/// A new non-blocking stream on device; the caller owns it (destroy_stream). Tensors allocated while
/// it was current are freed in its order, so drop them before destroying it.
Stream create_stream(Device device, bool high_priority = false);
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

/// Waits for all work on the device.
void synchronize(Device device);
/// Waits for the work queued on stream.
void synchronize(Stream stream);

/// A CUDA event: record on a stream, make another stream wait for it, time between two.
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
};

/// Page-locked host memory, so host<->device copies run asynchronously at full speed.
Tensor pinned_empty(const Shape& shape, DType dtype);
bool is_pinned(const Tensor& t);

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
