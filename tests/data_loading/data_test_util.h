// Helpers for the data-loading tests: a fresh temporary directory per test, writers for plain and
// gzip files, and the deterministic test images that golden/make_torchvision_golden.py also builds.
#pragma once

#include <gtest/gtest.h>
#include <unistd.h>  // getpid
#include <zlib.h>

#include <cstdint>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "colossal/core/tensor.h"

namespace colossal::data::testing {

namespace fs = std::filesystem;

/// A fresh directory per test, removed afterwards.
class TempDirTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::path(::testing::TempDir()) /
           fmt::format("colossal_data_{}_{}_{}", ::getpid(),
                       ::testing::UnitTest::GetInstance()->current_test_info()->test_suite_name(),
                       ::testing::UnitTest::GetInstance()->current_test_info()->name());
    fs::remove_all(dir_);
    fs::create_directories(dir_);
  }
  void TearDown() override { fs::remove_all(dir_); }

  std::string path(const std::string& name) const { return (dir_ / name).string(); }

  fs::path dir_;
};

inline void write_bytes(const std::string& file, const std::vector<uint8_t>& bytes) {
  std::ofstream out(file, std::ios::binary | std::ios::trunc);
  out.write(reinterpret_cast<const char*>(bytes.data()), static_cast<std::streamsize>(bytes.size()));
}

/// Writes `bytes` gzip-compressed through zlib's gzopen/gzwrite.
inline void write_gzip(const std::string& file, const std::vector<uint8_t>& bytes) {
  gzFile out = gzopen(file.c_str(), "wb");
  ASSERT_NE(out, nullptr) << "gzopen " << file;
  if (!bytes.empty()) {
    ASSERT_EQ(gzwrite(out, bytes.data(), static_cast<unsigned>(bytes.size())), static_cast<int>(bytes.size()));
  }
  ASSERT_EQ(gzclose(out), Z_OK);
}

inline std::vector<uint8_t> read_bytes(const std::string& file) {
  std::ifstream in(file, std::ios::binary);
  return {std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
}

inline void append_be32(std::vector<uint8_t>& out, uint32_t v) {
  for (int s = 24; s >= 0; s -= 8) out.push_back(static_cast<uint8_t>(v >> s));
}

/// An IDX file's bytes: magic 0 0 type rank, big-endian dims, then `data` as given.
inline std::vector<uint8_t> idx_bytes(uint8_t type, const std::vector<uint32_t>& dims,
                                      const std::vector<uint8_t>& data) {
  std::vector<uint8_t> out = {0, 0, type, static_cast<uint8_t>(dims.size())};
  for (uint32_t d : dims) append_be32(out, d);
  out.insert(out.end(), data.begin(), data.end());
  return out;
}

/// Byte i of the test images: the top byte of (i * 2654435761 + salt) mod 2^32 (as the golden script).
inline std::vector<uint8_t> test_pixels(int64_t count, uint32_t salt) {
  std::vector<uint8_t> out(static_cast<size_t>(count));
  for (int64_t i = 0; i < count; ++i) {
    out[static_cast<size_t>(i)] = static_cast<uint8_t>((static_cast<uint32_t>(i) * 2654435761u + salt) >> 24);
  }
  return out;
}

inline Tensor test_image(int64_t c, int64_t h, int64_t w, uint32_t salt) {
  return core::from_vector<uint8_t>(test_pixels(c * h * w, salt), {c, h, w});
}

inline std::vector<uint8_t> from_hex(const std::string& hex) {
  std::vector<uint8_t> out(hex.size() / 2);
  for (size_t i = 0; i < out.size(); ++i) out[i] = static_cast<uint8_t>(std::stoi(hex.substr(2 * i, 2), nullptr, 16));
  return out;
}

/// Runs `f`, expecting a colossal::Error whose message contains every string in `parts`.
template <class F>
void expect_error(F&& f, const std::vector<std::string>& parts) {
  try {
    f();
    ADD_FAILURE() << "expected an error mentioning " << ::testing::PrintToString(parts);
  } catch (const Error& e) {
    const std::string message = e.what();
    for (const std::string& part : parts) {
      EXPECT_NE(message.find(part), std::string::npos) << "error message lacks \"" << part << "\":\n" << message;
    }
  }
}

}  // namespace colossal::data::testing
