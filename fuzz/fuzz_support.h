// Shared by the libFuzzer targets in fuzz/: a temporary file for the readers that take a path, and
// the rule every target follows: colossal::Error (our clear-error exception) is a valid answer to any
// input; any other exception escapes to libFuzzer, which reports it as a crash, as it does sanitizer
// reports and leaks.
#pragma once

#include <unistd.h>  // getpid

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <span>
#include <string>
#include <string_view>

#include <fmt/format.h>

#include "colossal/core/error.h"  // colossal::Error

namespace colossal::fuzz {

/// The fuzzer's bytes as text.
inline std::string_view as_text(const uint8_t* data, size_t size) {
  return {reinterpret_cast<const char*>(data), size};
}

/// A file holding given bytes, named per process (libFuzzer's -jobs runs several) and removed at exit
/// of the scope. In /dev/shm where it exists: a file write per input, kept off the disk.
class TemporaryFile {
 public:
  TemporaryFile(std::string_view name, std::span<const uint8_t> bytes) {
    const std::filesystem::path dir = std::filesystem::is_directory("/dev/shm")
                                          ? std::filesystem::path("/dev/shm")
                                          : std::filesystem::temp_directory_path();
    path_ = (dir / fmt::format("colossal-fuzz-{}-{}", ::getpid(), name)).string();
    std::FILE* file = std::fopen(path_.c_str(), "wb");
    if (file == nullptr) {
      std::perror(path_.c_str());
      std::abort();  // the harness's own failure, not the reader's: stop rather than fuzz nothing
    }
    if (!bytes.empty() && std::fwrite(bytes.data(), 1, bytes.size(), file) != bytes.size()) std::abort();
    std::fclose(file);
  }
  ~TemporaryFile() { std::remove(path_.c_str()); }
  TemporaryFile(const TemporaryFile&) = delete;
  TemporaryFile& operator=(const TemporaryFile&) = delete;
  const std::string& path() const { return path_; }

 private:
  std::string path_;
};

/// Runs body; a colossal::Error is a clear refusal of the input and ends the run normally.
template <class Body>
int accept_errors(Body&& body) {
  try {
    body();
  } catch (const colossal::Error&) {
  }
  return 0;
}

/// Stops the run as a crash: a property the reader promises does not hold for this input.
[[noreturn]] inline void property_failed(std::string_view what) {
  std::fprintf(stderr, "fuzz property failed: %.*s\n", static_cast<int>(what.size()), what.data());
  std::abort();
}

}  // namespace colossal::fuzz
