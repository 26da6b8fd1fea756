// The collective timeout: how long any operation of a ProcessGroup may stay outstanding before the
// watchdog (comm/watchdog.h) ends the process. Its default, the environment variable that overrides
// it, and the exit code a timed-out rank ends with. For init_process_group, the backends and tests.
#pragma once

#include <chrono>
#include <optional>
#include <string_view>

namespace colossal::comm {

/// Five minutes: longer than any healthy collective waits (a slow rank's checkpoint save included),
/// short enough that a hung job is noticed.
inline constexpr std::chrono::milliseconds kDefaultCollectiveTimeout = std::chrono::seconds(300);
/// The largest timeout accepted (a week), from the config key or the environment: a guard against a
/// stray extra digit, and far below where the deadline's arithmetic could overflow.
inline constexpr double kMaxCollectiveTimeoutSeconds = 7 * 24 * 3600;

/// The exit code of a rank the watchdog ends (a collective timed out or its transport failed while
/// it waited). Distinct from an exception's 1 and from a signal's 128 + n, so that a launcher's
/// "rank 0 exited with code 75" says what happened.
inline constexpr int kCollectiveTimeoutExitCode = 75;

/// `seconds` (from the config key or the variable) as a duration; throws naming `source` unless it
/// is a finite number in (0, kMaxCollectiveTimeoutSeconds].
std::chrono::milliseconds collective_timeout_from_seconds(double seconds, std::string_view source);

/// Parses a value of COLOSSAL_COLLECTIVE_TIMEOUT: seconds, a positive number ("300", "2.5").
/// Throws colossal::Error naming the variable and the value when it is anything else.
std::chrono::milliseconds parse_collective_timeout(std::string_view text);

/// COLOSSAL_COLLECTIVE_TIMEOUT from this process's environment; nullopt when unset or empty.
std::optional<std::chrono::milliseconds> collective_timeout_from_env();

/// The timeout a world group gets: COLOSSAL_COLLECTIVE_TIMEOUT when set (it overrides what the
/// program asked for, so a test or a rank started by torchrun or mpirun can change it without a
/// config), else `requested`. Sub-groups inherit their parent's (ProcessGroup::split).
std::chrono::milliseconds resolve_collective_timeout(std::chrono::milliseconds requested);

}  // namespace colossal::comm
