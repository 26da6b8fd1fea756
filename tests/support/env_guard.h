// EnvGuard: sets (or, with nullptr, unsets) an environment variable for a scope and restores what
// was there afterwards, so that a test switching a COLOSSAL_* variable leaves the next test as it
// found it.
#pragma once

#include <cstdlib>
#include <optional>
#include <string>

namespace colossal::testing {

class EnvGuard {
 public:
  EnvGuard(const char* name, const char* value) : name_(name) {
    if (const char* old = std::getenv(name)) previous_ = old;
    set(value);
  }
  ~EnvGuard() { set(previous_ ? previous_->c_str() : nullptr); }
  EnvGuard(const EnvGuard&) = delete;
  EnvGuard& operator=(const EnvGuard&) = delete;

 private:
  void set(const char* value) {
    if (value != nullptr) {
      ::setenv(name_, value, 1);
    } else {
      ::unsetenv(name_);
    }
  }
  const char* name_;
  std::optional<std::string> previous_;
};

}  // namespace colossal::testing
