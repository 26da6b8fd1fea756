// The GEMM tuning file: see gemm_tuning_file.h.
#include "colossal/ops/gemm_tuning_file.h"

#include <fcntl.h>
#include <fmt/format.h>
#include <unistd.h>

#include <cerrno>
#include <charconv>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>

namespace colossal::ops {

// Note [GEMM tuning file]
// Autotuning (Note [GEMM autotuning]) picks among cuBLASLt's candidates by timing them, and for
// many of a model's GEMMs the best few are within 2-5% of each other: which one wins then depends
// on what else the GPU did while they were timed. Two ranks of one data-parallel run on 2 H100s
// picked different kernels for 5 of GPT-2's GEMMs, and one-GPU runs of the same config moved by
// 0.3-0.8 ms a step (1-2.5%) from run to run (session 14). So the choices are kept in a file per
// kind of GPU and library version (cuBLASLt documents its algorithm structs as reusable under the
// same version): a process asks the file before tuning a problem, and appends what it tuned. The
// second run of a config, and every rank of it, then runs the same kernels as the first, and
// tunes nothing.
// - Where: COLOSSAL_GEMM_CACHE (a folder; "off", "0" or empty turns the file off), else
//   $XDG_CACHE_HOME/colossal, else $HOME/.cache/colossal.
// - One line per problem, written with one write() to a file opened for appending, so ranks that
//   tune at once interleave whole lines; each line ends with a checksum of the rest, so a line cut
//   short (a reader racing a writer, a full disk) is skipped rather than misread. The first line of
//   a key wins: every process reading the same file makes the same choice, whichever rank wrote
//   first.
// - An algorithm read from the file is checked against the problem (cublasLtMatmulAlgoCheck) before
//   it is used; one the library refuses is tuned again.
// - Delete the file to tune afresh (after a driver update, say: the key does not hold the driver).

namespace {

constexpr std::string_view kTag = "colossal-gemm-v1";

uint64_t fnv1a(std::string_view text) {
  uint64_t h = 1469598103934665603ull;
  for (const char c : text) h = (h ^ static_cast<unsigned char>(c)) * 1099511628211ull;
  return h;
}

/// The next space-separated field of `rest`, advancing it; empty at the end.
std::string_view next_field(std::string_view& rest) {
  const size_t start = rest.find_first_not_of(' ');
  if (start == std::string_view::npos) {
    rest = {};
    return {};
  }
  rest.remove_prefix(start);
  const size_t end = rest.find(' ');
  const std::string_view field = rest.substr(0, end);
  rest.remove_prefix(end == std::string_view::npos ? rest.size() : end);
  return field;
}

template <typename T>
bool parse_number(std::string_view field, T* value, int base) {
  if (field.empty()) return false;
  const auto [end, ec] = std::from_chars(field.data(), field.data() + field.size(), *value, base);
  return ec == std::errc() && end == field.data() + field.size();
}

}  // namespace

std::optional<std::string> gemm_tuning_dir() {
  if (const char* dir = std::getenv("COLOSSAL_GEMM_CACHE"); dir != nullptr) {
    const std::string_view value(dir);
    if (value.empty() || value == "off" || value == "0") return std::nullopt;
    return std::string(value);
  }
  if (const char* xdg = std::getenv("XDG_CACHE_HOME"); xdg != nullptr && *xdg != '\0') {
    return (std::filesystem::path(xdg) / "colossal").string();
  }
  if (const char* home = std::getenv("HOME"); home != nullptr && *home != '\0') {
    return (std::filesystem::path(home) / ".cache" / "colossal").string();
  }
  return std::nullopt;
}

std::string gemm_tuning_path(std::string_view dir, std::string_view signature) {
  std::string name = "gemm-";
  for (const char c : signature) {
    const bool keep =
        (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '.' || c == '-';
    name.push_back(keep ? c : '_');
  }
  name += ".txt";
  return (std::filesystem::path(dir) / name).string();
}

std::string format_gemm_tuning_line(const GemmTuningKey& key, const GemmTuningAlgo& algo) {
  std::string text(kTag);
  for (size_t i = 0; i < key.size(); ++i) text += fmt::format(" {}", i == 0 ? 0 : key[i]);
  for (const uint64_t word : algo) text += fmt::format(" {:x}", word);
  return fmt::format("{} {:x}\n", text, fnv1a(text));
}

std::optional<std::pair<GemmTuningKey, GemmTuningAlgo>> parse_gemm_tuning_line(std::string_view line) {
  while (!line.empty() && (line.back() == '\n' || line.back() == '\r')) line.remove_suffix(1);
  const size_t last_space = line.rfind(' ');
  if (last_space == std::string_view::npos) return std::nullopt;
  uint64_t checksum = 0;
  if (!parse_number(line.substr(last_space + 1), &checksum, 16)) return std::nullopt;
  const std::string_view text = line.substr(0, last_space);
  if (fnv1a(text) != checksum) return std::nullopt;
  std::string_view rest = text;
  if (next_field(rest) != kTag) return std::nullopt;
  GemmTuningKey key{};
  GemmTuningAlgo algo{};
  for (int64_t& value : key) {
    if (!parse_number(next_field(rest), &value, 10)) return std::nullopt;
  }
  for (uint64_t& word : algo) {
    if (!parse_number(next_field(rest), &word, 16)) return std::nullopt;
  }
  if (!next_field(rest).empty()) return std::nullopt;
  return std::pair(key, algo);
}

size_t GemmKeyHash::operator()(const GemmTuningKey& key) const {
  uint64_t h = 1469598103934665603ull;
  for (const int64_t v : key) h = (h ^ static_cast<uint64_t>(v)) * 1099511628211ull;
  return static_cast<size_t>(h);
}

GemmTuningFile::GemmTuningFile(std::string path) : path_(std::move(path)) {
  std::ifstream in(path_);
  std::string line;
  while (std::getline(in, line)) {
    if (auto entry = parse_gemm_tuning_line(line)) algos_.try_emplace(entry->first, entry->second);
  }
}

std::optional<GemmTuningAlgo> GemmTuningFile::find(const GemmTuningKey& key) const {
  GemmTuningKey normal = key;
  normal[0] = 0;
  const auto it = algos_.find(normal);
  if (it == algos_.end()) return std::nullopt;
  return it->second;
}

std::string GemmTuningFile::append(const GemmTuningKey& key, const GemmTuningAlgo& algo) {
  GemmTuningKey normal = key;
  normal[0] = 0;
  if (!algos_.try_emplace(normal, algo).second) return {};
  std::error_code ec;
  const std::filesystem::path parent = std::filesystem::path(path_).parent_path();
  if (!parent.empty()) std::filesystem::create_directories(parent, ec);
  if (ec) return fmt::format("cannot create {}: {}", parent.string(), ec.message());
  const std::string line = format_gemm_tuning_line(normal, algo);
  const int fd = ::open(path_.c_str(), O_WRONLY | O_APPEND | O_CREAT | O_CLOEXEC, 0644);
  if (fd < 0) return fmt::format("cannot open {}: {}", path_, std::strerror(errno));
  const ssize_t written = ::write(fd, line.data(), line.size());
  const int write_errno = errno;
  ::close(fd);
  if (written != static_cast<ssize_t>(line.size())) {
    return fmt::format("cannot write {}: {}", path_, written < 0 ? std::strerror(write_errno) : "short write");
  }
  return {};
}

}  // namespace colossal::ops
