// tokenize_file: the uint16 little-endian layout, equality with encoding the whole text at once for
// every read size (pieces and "<|endoftext|>" cut across reads), and the failures (invalid UTF-8, an
// id uint16 cannot hold, a missing input), each leaving no file behind.
#include <gtest/gtest.h>

#include <unistd.h>  // getpid

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <random>
#include <string>
#include <vector>

#include "colossal/text/tokenize_file.h"
#include "gradcheck.h"  // EXPECT_ERROR_CONTAINS

namespace colossal::text {
namespace {

namespace fs = std::filesystem;
using Tokens = std::vector<int32_t>;

const Gpt2Tokenizer& gpt2() {
  static const Gpt2Tokenizer tokenizer = Gpt2Tokenizer::from_directory(fs::path(COLOSSAL_TEST_DATA_DIR) / "gpt2");
  return tokenizer;
}

class TokenizeFile : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ =
        fs::path(::testing::TempDir()) / fmt::format("colossal_tokenize_file_{}_{}", static_cast<long>(::getpid()),
                                                     ::testing::UnitTest::GetInstance()->current_test_info()->name());
    fs::remove_all(dir_);
    fs::create_directories(dir_);
  }
  void TearDown() override { fs::remove_all(dir_); }

  fs::path write(const std::string& name, const std::string& bytes) const {
    std::ofstream(dir_ / name, std::ios::binary) << bytes;
    return dir_ / name;
  }
  static std::string read_bytes(const fs::path& path) {
    std::ifstream in(path, std::ios::binary);
    return {std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
  }
  static Tokens read_tokens(const fs::path& path) {
    const std::string bytes = read_bytes(path);
    EXPECT_EQ(bytes.size() % 2, 0u);
    Tokens tokens(bytes.size() / 2);
    for (std::size_t i = 0; i < tokens.size(); ++i) {
      tokens[i] = static_cast<unsigned char>(bytes[2 * i]) | (static_cast<unsigned char>(bytes[2 * i + 1]) << 8);
    }
    return tokens;
  }
  /// Only the files the test wrote itself: no output, no temporary left over.
  std::vector<std::string> files() const {
    std::vector<std::string> names;
    for (const auto& entry : fs::directory_iterator(dir_)) names.push_back(entry.path().filename().string());
    std::sort(names.begin(), names.end());
    return names;
  }

  fs::path dir_;
};

TEST_F(TokenizeFile, WritesUint16LittleEndian) {
  const fs::path in = write("in.txt", "Hello world");
  const TokenizeFileResult result = tokenize_file(in, dir_ / "out.bin", gpt2());
  EXPECT_EQ(result.bytes_read, 11u);
  EXPECT_EQ(result.tokens_written, 2u);
  // 15496 = 0x3C88, 995 = 0x03E3.
  EXPECT_EQ(read_bytes(dir_ / "out.bin"), std::string("\x88\x3C\xE3\x03", 4));
  EXPECT_EQ(files(), (std::vector<std::string>{"in.txt", "out.bin"}));
}

TEST_F(TokenizeFile, EqualsEncodingTheWholeTextForEveryReadSize) {
  // Fragments chosen so that cuts land inside words, whitespace runs (whose split depends on what
  // follows), multi-byte characters, contractions and the special token.
  const std::vector<std::string> fragments = {
      "Hello",   " world", "  ",   "\n",     "\n\n", " ",  "\t",  "'s", "'re", "<|endoftext|>",
      "<|endof", "text|>", "café", "日本語", "🙂", "12", "3.5", "!!", " ?",  "\u3000",
      "\u00A0",  "x",      "   ",  "end.\n"};
  std::mt19937 rng(7);
  std::uniform_int_distribution<std::size_t> pick(0, fragments.size() - 1);
  std::string text;
  while (text.size() < 6000) text += fragments[pick(rng)];
  const fs::path in = write("in.txt", text);
  const Tokens expected = gpt2().encode_with_special(text);
  const Tokens expected_plain = gpt2().encode(text);
  for (const std::size_t chunk : {1, 2, 3, 5, 8, 13, 21, 64, 1000, 1 << 20}) {
    const TokenizeFileResult result = tokenize_file(in, dir_ / "out.bin", gpt2(), {.chunk_bytes = chunk});
    EXPECT_EQ(result.bytes_read, text.size());
    EXPECT_EQ(result.tokens_written, expected.size());
    EXPECT_EQ(read_tokens(dir_ / "out.bin"), expected) << "chunk_bytes " << chunk;
    tokenize_file(in, dir_ / "plain.bin", gpt2(), {.special_tokens = false, .chunk_bytes = chunk});
    EXPECT_EQ(read_tokens(dir_ / "plain.bin"), expected_plain) << "chunk_bytes " << chunk;
  }
  EXPECT_EQ(gpt2().decode(read_tokens(dir_ / "out.bin")), text);
}

TEST_F(TokenizeFile, EmptyInputGivesAnEmptyFile) {
  const fs::path in = write("in.txt", "");
  EXPECT_EQ(tokenize_file(in, dir_ / "out.bin", gpt2()).tokens_written, 0u);
  EXPECT_TRUE(fs::exists(dir_ / "out.bin"));
  EXPECT_EQ(fs::file_size(dir_ / "out.bin"), 0u);
}

TEST_F(TokenizeFile, InvalidUtf8NamesTheOffsetAndLeavesNoFile) {
  const fs::path in = write("in.txt", std::string(5000, 'a') + " ok \xC3\x28 more");
  write("out.bin", "old");
  EXPECT_ERROR_CONTAINS(tokenize_file(in, dir_ / "out.bin", gpt2(), {.chunk_bytes = 1000}),
                        "invalid UTF-8 at byte offset 5004 (byte 0xC3)");
  // The previous output is untouched and no temporary is left.
  EXPECT_EQ(read_bytes(dir_ / "out.bin"), "old");
  EXPECT_EQ(files(), (std::vector<std::string>{"in.txt", "out.bin"}));
}

TEST_F(TokenizeFile, IdsPastUint16AreRefused) {
  // A vocabulary of the 256 byte tokens, 'z' given id 70000.
  std::string json = "{";
  for (unsigned b = 0; b < 256; ++b) {
    std::string key;
    const char32_t c = byte_to_unicode(static_cast<unsigned char>(b));
    if (c < 0x80) {
      key = std::string(1, static_cast<char>(c));
      if (key == "\"" || key == "\\") key = "\\" + key;
    } else {
      key = {static_cast<char>(0xC0 | (c >> 6)), static_cast<char>(0x80 | (c & 0x3F))};
    }
    json += fmt::format("{}\"{}\": {}", b ? ", " : "", key, b == 'z' ? 70000 : b);
  }
  json += ", \"<|endoftext|>\": 256}";
  const Gpt2Tokenizer wide = Gpt2Tokenizer::from_strings(json, "#version: 0.2\n");

  tokenize_file(write("ok.txt", "abc"), dir_ / "ok.bin", wide);
  EXPECT_EQ(read_tokens(dir_ / "ok.bin"), (Tokens{'a', 'b', 'c'}));
  EXPECT_ERROR_CONTAINS(tokenize_file(write("in.txt", "xyz"), dir_ / "out.bin", wide),
                        "token id 70000 does not fit the uint16 token file");
  EXPECT_EQ(files(), (std::vector<std::string>{"in.txt", "ok.bin", "ok.txt"}));
}

TEST_F(TokenizeFile, MissingInputOrOutputDirectory) {
  EXPECT_ERROR_CONTAINS(tokenize_file(dir_ / "missing.txt", dir_ / "out.bin", gpt2()),
                        "cannot tokenize '" + (dir_ / "missing.txt").string() + "'");
  EXPECT_ERROR_CONTAINS(tokenize_file(write("in.txt", "hi"), dir_ / "no_dir" / "out.bin", gpt2()), "cannot create");
  EXPECT_EQ(files(), (std::vector<std::string>{"in.txt"}));
}

}  // namespace
}  // namespace colossal::text
