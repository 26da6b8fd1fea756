// The collective timeout's sources (comm/timeout.h): a number of seconds from the config or from
// COLOSSAL_COLLECTIVE_TIMEOUT, checked with messages that name where the value came from.
#include "colossal/comm/timeout.h"

#include <cmath>
#include <cstdlib>
#include <string>

#include "colossal/comm/launch_env.h"  // kCollectiveTimeout
#include "colossal/core/error.h"

namespace colossal::comm {

std::chrono::milliseconds collective_timeout_from_seconds(double seconds, std::string_view source) {
  COLOSSAL_CHECK(std::isfinite(seconds) && seconds > 0 && seconds <= kMaxCollectiveTimeoutSeconds,
                 "{} = {} is not a valid collective timeout: give a number of seconds > 0 and <= {:g} (default "
                 "{} s)",
                 source, seconds, kMaxCollectiveTimeoutSeconds,
                 std::chrono::duration_cast<std::chrono::seconds>(kDefaultCollectiveTimeout).count());
  // Rounded up, so that a tiny positive value never becomes a zero timeout.
  return std::chrono::milliseconds(static_cast<int64_t>(std::ceil(seconds * 1000.0)));
}

std::chrono::milliseconds parse_collective_timeout(std::string_view text) {
  const std::string copy(text);
  char* end = nullptr;
  const double seconds = copy.empty() ? 0.0 : std::strtod(copy.c_str(), &end);
  COLOSSAL_CHECK(!copy.empty() && end == copy.c_str() + copy.size(),
                 "{}='{}' is not a number of seconds; give a positive number such as 300 or 2.5, or unset it for the "
                 "default ({} s, or parallel.timeout_s under colossal train)",
                 env::kCollectiveTimeout, text,
                 std::chrono::duration_cast<std::chrono::seconds>(kDefaultCollectiveTimeout).count());
  return collective_timeout_from_seconds(seconds, fmt::format("{}='{}'", env::kCollectiveTimeout, text));
}

std::optional<std::chrono::milliseconds> collective_timeout_from_env() {
  const char* text = std::getenv(std::string(env::kCollectiveTimeout).c_str());
  if (text == nullptr || *text == '\0') return std::nullopt;
  return parse_collective_timeout(text);
}

std::chrono::milliseconds resolve_collective_timeout(std::chrono::milliseconds requested) {
  if (auto from_env = collective_timeout_from_env()) return *from_env;
  COLOSSAL_CHECK(requested.count() > 0, "the collective timeout must be positive, got {} ms", requested.count());
  return requested;
}

}  // namespace colossal::comm
