// The GEMM tuning file (Note [GEMM tuning file] in src/colossal/ops/gemm_tuning_file.cpp): its
// lines, what a reader keeps of a file, where it lives. The CUDA backend's use of it is tested in
// linalg_gpu_test.cpp (LinalgGpu.TunedChoicesComeBackFromTheTuningFile).
#include "colossal/ops/gemm_tuning_file.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <optional>
#include <sstream>
#include <string>

#include "env_guard.h"

namespace colossal::ops {
namespace {

using testing::EnvGuard;

/// A fresh folder under the test's temporary directory, removed afterwards.
class TempDir {
 public:
  TempDir() {
    path_ = std::filesystem::temp_directory_path() /
            ("gemm_tuning_file_test_" + std::to_string(::getpid()) + "_" + std::to_string(counter_++));
    std::filesystem::remove_all(path_);
  }
  ~TempDir() { std::filesystem::remove_all(path_); }
  const std::filesystem::path& path() const { return path_; }

 private:
  static inline int counter_ = 0;
  std::filesystem::path path_;
};

GemmTuningKey key_of(int64_t m, int64_t device = 0) {
  GemmTuningKey key{};
  for (size_t i = 0; i < key.size(); ++i) key[i] = static_cast<int64_t>(i) * 7 - 20;  // some negative
  key[0] = device;
  key[6] = m;
  return key;
}

GemmTuningAlgo algo_of(uint64_t seed) {
  GemmTuningAlgo algo{};
  for (size_t i = 0; i < algo.size(); ++i) algo[i] = seed * 0x9e3779b97f4a7c15ull + i;
  return algo;
}

std::string read_all(const std::filesystem::path& path) {
  std::ifstream in(path);
  std::stringstream text;
  text << in.rdbuf();
  return text.str();
}

TEST(GemmTuningFile, ALineReadsBackAsWritten) {
  const GemmTuningKey key = key_of(4096);
  const GemmTuningAlgo algo = algo_of(3);
  const std::string line = format_gemm_tuning_line(key, algo);
  ASSERT_EQ(line.back(), '\n');
  const auto parsed = parse_gemm_tuning_line(line);
  ASSERT_TRUE(parsed.has_value()) << line;
  EXPECT_EQ(parsed->first, key);
  EXPECT_EQ(parsed->second, algo);
  // The device index is not part of the file's key: the file is for a kind of GPU.
  const auto other_device = parse_gemm_tuning_line(format_gemm_tuning_line(key_of(4096, 3), algo));
  ASSERT_TRUE(other_device.has_value());
  EXPECT_EQ(other_device->first, key);
}

TEST(GemmTuningFile, DamagedLinesAreNotRead) {
  const std::string line = format_gemm_tuning_line(key_of(512), algo_of(1));
  EXPECT_FALSE(parse_gemm_tuning_line(line.substr(0, line.size() / 2)).has_value()) << "a line cut short";
  EXPECT_FALSE(parse_gemm_tuning_line("").has_value());
  EXPECT_FALSE(parse_gemm_tuning_line("garbage").has_value());
  for (const size_t at : {size_t{3}, line.size() / 2, line.size() - 3}) {
    std::string flipped = line;
    flipped[at] = flipped[at] == '1' ? '2' : '1';
    EXPECT_FALSE(parse_gemm_tuning_line(flipped).has_value()) << "a character changed at " << at << ": " << flipped;
  }
  std::string other_version = line;
  other_version.replace(other_version.find("-v1"), 3, "-v9");
  EXPECT_FALSE(parse_gemm_tuning_line(other_version).has_value()) << "another version's line";
}

TEST(GemmTuningFile, AppendsReadBackAndTheFirstAnswerWins) {
  const TempDir dir;
  const std::string path = gemm_tuning_path((dir.path() / "nested").string(), "Some GPU/80GB sm90 cublasLt 130100");
  EXPECT_EQ(std::filesystem::path(path).filename().string(), "gemm-Some_GPU_80GB_sm90_cublasLt_130100.txt");
  {
    GemmTuningFile file(path);  // the folder does not exist yet
    EXPECT_EQ(file.size(), 0u);
    EXPECT_FALSE(file.find(key_of(64)).has_value());
    EXPECT_EQ(file.append(key_of(64), algo_of(1)), "");
    EXPECT_EQ(file.append(key_of(128, /*device=*/1), algo_of(2)), "");
    EXPECT_EQ(file.append(key_of(64), algo_of(9)), "") << "a known key is no error";
    EXPECT_EQ(file.find(key_of(64)), algo_of(1)) << "the first answer stays";
  }
  EXPECT_EQ(read_all(path),
            format_gemm_tuning_line(key_of(64), algo_of(1)) + format_gemm_tuning_line(key_of(128), algo_of(2)))
      << "one line per new key, nothing for a key already held";

  // Another process appended a different answer for 64 (both ranks tuned it at once), then a line
  // was cut short, then came garbage: a reader keeps the first answer and skips what does not parse.
  {
    std::ofstream out(path, std::ios::app);
    out << format_gemm_tuning_line(key_of(64), algo_of(5));
    const std::string cut = format_gemm_tuning_line(key_of(256), algo_of(6));
    out << cut.substr(0, cut.size() - 5) << "\n";
    out << "not a line\n";
    out << format_gemm_tuning_line(key_of(1024), algo_of(7));
  }
  const GemmTuningFile reread(path);
  EXPECT_EQ(reread.size(), 3u);
  EXPECT_EQ(reread.find(key_of(64, /*device=*/2)), algo_of(1));
  EXPECT_EQ(reread.find(key_of(128)), algo_of(2));
  EXPECT_FALSE(reread.find(key_of(256)).has_value());
  EXPECT_EQ(reread.find(key_of(1024)), algo_of(7));
}

TEST(GemmTuningFile, AFileThatCannotBeWrittenSaysWhy) {
  const TempDir dir;
  std::filesystem::create_directories(dir.path());
  {
    std::ofstream blocker(dir.path() / "file");  // a file where the folder should be
  }
  GemmTuningFile file(gemm_tuning_path((dir.path() / "file").string(), "gpu"));
  const std::string error = file.append(key_of(64), algo_of(1));
  EXPECT_NE(error.find((dir.path() / "file").string()), std::string::npos) << error;
  EXPECT_EQ(file.find(key_of(64)), algo_of(1)) << "the choice still holds in this process";
}

TEST(GemmTuningFile, ItsFolderComesFromTheEnvironment) {
  {
    const EnvGuard cache("COLOSSAL_GEMM_CACHE", "/some/folder");
    EXPECT_EQ(gemm_tuning_dir(), "/some/folder");
  }
  for (const char* off : {"off", "0", ""}) {
    const EnvGuard cache("COLOSSAL_GEMM_CACHE", off);
    EXPECT_FALSE(gemm_tuning_dir().has_value()) << "COLOSSAL_GEMM_CACHE='" << off << "'";
  }
  const EnvGuard cache("COLOSSAL_GEMM_CACHE", nullptr);
  {
    const EnvGuard xdg("XDG_CACHE_HOME", "/xdg");
    EXPECT_EQ(gemm_tuning_dir(), "/xdg/colossal");
  }
  const EnvGuard xdg("XDG_CACHE_HOME", nullptr);
  {
    const EnvGuard home("HOME", "/home/someone");
    EXPECT_EQ(gemm_tuning_dir(), "/home/someone/.cache/colossal");
  }
  const EnvGuard home("HOME", nullptr);
  EXPECT_FALSE(gemm_tuning_dir().has_value());
}

}  // namespace
}  // namespace colossal::ops
