// Device (cpu, cuda:n) and Stream, an opaque handle to an ordered queue of work on a device.
// Core's public API carries no CUDA types: a CUDA stream travels as a void* handle.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>

#include <fmt/format.h>

namespace colossal::core {

enum class DeviceType : uint8_t { cpu, cuda };
inline constexpr int kNumDeviceTypes = 2;

struct Device {
  DeviceType type = DeviceType::cpu;
  /// CUDA ordinal; always 0 for the CPU.
  int index = 0;

  constexpr Device() = default;
  constexpr Device(DeviceType t, int i = 0) : type(t), index(t == DeviceType::cpu ? 0 : i) {}
  /// "cpu", "cuda" (= cuda:0) or "cuda:N"; throws naming the valid forms.
  static Device parse(std::string_view spec);

  constexpr bool is_cpu() const { return type == DeviceType::cpu; }
  constexpr bool is_cuda() const { return type == DeviceType::cuda; }
  std::string str() const;
  friend constexpr bool operator==(const Device&, const Device&) = default;
};

inline constexpr Device kCpu{};
inline Device cuda_device(int index = 0) { return Device(DeviceType::cuda, index); }

/// Work on a device is ordered by streams. The CPU has a single implicit stream (handle nullptr);
/// a CUDA stream's handle is its cudaStream_t, nullptr meaning the legacy default stream.
struct Stream {
  Device device{};
  void* handle = nullptr;
  friend bool operator==(const Stream&, const Stream&) = default;
};

}  // namespace colossal::core

template <>
struct fmt::formatter<colossal::core::Device> : fmt::formatter<std::string_view> {
  auto format(const colossal::core::Device& d, format_context& ctx) const {
    return fmt::formatter<std::string_view>::format(d.str(), ctx);
  }
};
