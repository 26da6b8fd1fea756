// Inputs that found a bug in the safetensors reader (fuzz/safetensors_fuzz.cpp), kept as ordinary
// tests: each must give a clear error naming the file and what is wrong with it.
#include <gtest/gtest.h>

#include <unistd.h>  // getpid

#include <filesystem>
#include <fstream>
#include <string>

#include "colossal/nn/safetensors.h"
#include "gradcheck.h"  // EXPECT_ERROR_CONTAINS

namespace colossal {
namespace {

namespace fs = std::filesystem;

std::string write_file(const std::string& name, const std::string& bytes) {
  const fs::path path =
      fs::path(::testing::TempDir()) / fmt::format("colossal_fuzz_regression_{}_{}", ::getpid(), name);
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
  return path.string();
}

// A number too large for a double (6666664444444444E4444444444444444) makes nlohmann::json throw
// out_of_range, not parse_error: it escaped the reader as a foreign exception.
TEST(FuzzRegressions, SafetensorsHeaderNumberOverflowIsAJsonError) {
  using namespace std::string_literals;
  // As the fuzzer found it: an 8-byte length of 64, then 64 bytes of header text.
  const std::string found =
      "\x40\0\0\0\0\0\0\0"
      "6666664444444444E4444444444444444\0\0\0\0\0\0\0?s\":type@\0\0\0\0\0\0\0{666666\0\00066666\00066\0?66P"s;
  const std::string path = write_file("overflow.safetensors", found);
  EXPECT_ERROR_CONTAINS(nn::load_safetensors(path), "overflow.safetensors': the header is not valid JSON");
  EXPECT_ERROR_CONTAINS(nn::read_safetensors_header(path), "number overflow");
  fs::remove(path);

  // The same inside a well-formed header.
  std::string header = R"({"w":{"dtype":"F32","shape":[1E400],"data_offsets":[0,4]}})";
  header.resize((header.size() + 7) / 8 * 8, ' ');
  std::string bytes(8, '\0');
  bytes[0] = static_cast<char>(header.size());
  const std::string readable = write_file("shape.safetensors", bytes + header + "abcd");
  EXPECT_ERROR_CONTAINS(nn::load_safetensors(readable), "shape.safetensors': the header is not valid JSON");
  fs::remove(readable);
}

}  // namespace
}  // namespace colossal
