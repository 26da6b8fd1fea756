// The gradient handlers' environment overrides (COLOSSAL_DP_*, COLOSSAL_ZERO_*): switches and counts a
// measurement sets without touching the config. A value that is set but malformed is an error naming
// the variable and what it takes.
#pragma once

#include <cstdlib>
#include <optional>
#include <string_view>

#include "colossal/core/error.h"

namespace colossal::parallel {

/// `name` as 0 or 1; nullopt when unset or empty.
inline std::optional<bool> env_switch(const char* name) {
  const char* text = std::getenv(name);
  if (text == nullptr || *text == '\0') return std::nullopt;
  const std::string_view value(text);
  COLOSSAL_CHECK(value == "0" || value == "1", "{} must be 0 or 1, got '{}'", name, value);
  return value == "1";
}

/// `name` as a whole number of `what` from 0 to `most`; nullopt when unset or empty.
inline std::optional<int> env_count(const char* name, std::string_view what, long most) {
  const char* text = std::getenv(name);
  if (text == nullptr || *text == '\0') return std::nullopt;
  char* end = nullptr;
  const long value = std::strtol(text, &end, 10);
  COLOSSAL_CHECK(end != text && *end == '\0' && value >= 0 && value <= most,
                 "{} must be a whole number of {} from 0 to {}, got '{}'", name, what, most, text);
  return static_cast<int>(value);
}

}  // namespace colossal::parallel
