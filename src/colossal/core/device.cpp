// Parsing and printing devices.
#include "colossal/core/device.h"

#include <charconv>

#include "colossal/core/error.h"

namespace colossal::core {

Device Device::parse(std::string_view spec) {
  if (spec == "cpu") return kCpu;
  if (spec == "cuda") return Device(DeviceType::cuda, 0);
  if (spec.starts_with("cuda:")) {
    std::string_view digits = spec.substr(5);
    int index = -1;
    auto [ptr, ec] = std::from_chars(digits.data(), digits.data() + digits.size(), index);
    if (ec == std::errc() && ptr == digits.data() + digits.size() && index >= 0) return Device(DeviceType::cuda, index);
  }
  COLOSSAL_FAIL("unknown device '{}'; valid: cpu, cuda, cuda:N with N >= 0", spec);
}

std::string Device::str() const { return is_cpu() ? std::string("cpu") : fmt::format("cuda:{}", index); }

}  // namespace colossal::core
