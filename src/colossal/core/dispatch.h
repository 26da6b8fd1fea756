// DispatchStub: one kernel pointer per device type for an op, filled in by the backend that
// implements it (ops/cpu registers CPU kernels, the CUDA backend CUDA ones). Asking a stub for a
// device it has no kernel for raises an error naming the op and the device; supports() lets a
// caller ask first.
#pragma once

#include <array>
#include <utility>

#include "colossal/core/device.h"
#include "colossal/core/error.h"

namespace colossal::core {

template <class Fn>
class DispatchStub {
 public:
  explicit constexpr DispatchStub(const char* name) : name_(name) {}
  DispatchStub(const DispatchStub&) = delete;
  DispatchStub& operator=(const DispatchStub&) = delete;

  void set(DeviceType type, Fn* fn) { kernels_[static_cast<size_t>(type)] = fn; }
  bool supports(DeviceType type) const { return kernels_[static_cast<size_t>(type)] != nullptr; }
  const char* name() const { return name_; }

  Fn* get(Device device) const {
    Fn* fn = kernels_[static_cast<size_t>(device.type)];
    COLOSSAL_CHECK(fn != nullptr, "{}: no kernel for device {} in this build", name_, device);
    return fn;
  }
  template <class... Args>
  decltype(auto) operator()(Device device, Args&&... args) const {
    return get(device)(std::forward<Args>(args)...);
  }

 private:
  const char* name_;
  std::array<Fn*, kNumDeviceTypes> kernels_{};
};

}  // namespace colossal::core

/// Registers `fn` as `stub`'s kernel for `device_type` during static initialisation. The layer
/// libraries are shared so that no registering file is dropped (see src/colossal/CMakeLists.txt).
#define COLOSSAL_REGISTER_KERNEL(stub, device_type, fn)                               \
  static const bool COLOSSAL_CONCAT(colossal_registered_, __LINE__) = [] {            \
    (stub).set((device_type), (fn));                                                  \
    return true;                                                                      \
  }()
#define COLOSSAL_CONCAT_INNER(a, b) a##b
#define COLOSSAL_CONCAT(a, b) COLOSSAL_CONCAT_INNER(a, b)
