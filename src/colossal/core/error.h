// colossal::Error and the CHECK macros every layer uses to reject bad input with a message that
// says what to change. Messages are built with fmt; shapes print as [2, 3].
#pragma once

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <stdexcept>
#include <string>

namespace colossal {

/// The one exception type colossal throws for user errors and broken invariants.
class Error : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

namespace detail {
[[noreturn]] void throw_error(const char* file, int line, std::string message);
}  // namespace detail

}  // namespace colossal

/// COLOSSAL_CHECK(cond, "fmt string", args...): throws colossal::Error with the formatted message
/// and the source location when cond is false.
#define COLOSSAL_CHECK(cond, ...)                                                     \
  do {                                                                                \
    if (!(cond)) [[unlikely]] {                                                       \
      ::colossal::detail::throw_error(__FILE__, __LINE__, ::fmt::format(__VA_ARGS__)); \
    }                                                                                 \
  } while (0)

/// COLOSSAL_FAIL("fmt string", args...): unconditional error.
#define COLOSSAL_FAIL(...) ::colossal::detail::throw_error(__FILE__, __LINE__, ::fmt::format(__VA_ARGS__))
