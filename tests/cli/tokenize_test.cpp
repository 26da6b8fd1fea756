// Tests of `colossal tokenize` (cli/tokenize.h): GPT-2 token ids of known text, several inputs joined
// with end-of-text separators, the command line (options, --help) and failures that leave no file.
#include "colossal/cli/tokenize.h"

#include <gtest/gtest.h>
#include <stdlib.h>  // setenv, unsetenv

#include <CLI/CLI.hpp>
#include <algorithm>
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <string>
#include <vector>

#include "colossal/core/error.h"

namespace colossal::cli {
namespace {

namespace fs = std::filesystem;

const fs::path kBpeDir = fs::path(COLOSSAL_TEST_DATA_DIR) / "gpt2";
constexpr uint16_t kEndOfText = 50256;

fs::path temp_dir(const std::string& name) {
  const fs::path dir = fs::temp_directory_path() / ("colossal_tokenize_test_" + name);
  fs::remove_all(dir);
  fs::create_directories(dir);
  return dir;
}

fs::path write_text(const fs::path& path, const std::string& text) {
  std::ofstream(path, std::ios::binary) << text;
  return path;
}

std::vector<uint16_t> read_tokens(const fs::path& path) {
  std::ifstream in(path, std::ios::binary);
  const std::vector<unsigned char> bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  EXPECT_EQ(bytes.size() % 2, 0u);
  std::vector<uint16_t> tokens;
  for (size_t i = 0; i + 1 < bytes.size(); i += 2)
    tokens.push_back(static_cast<uint16_t>(bytes[i] | bytes[i + 1] << 8));
  return tokens;
}

TEST(TokenizeCommand, HelloWorldIsGpt2Tokens15496And995) {
  const fs::path dir = temp_dir("hello");
  TokenizeOptions o;
  o.inputs = {write_text(dir / "hello.txt", "Hello world").string()};
  o.output = (dir / "hello.bin").string();
  o.bpe_dir = kBpeDir.string();
  const TokenizeSummary summary = tokenize_command(o);
  EXPECT_EQ(read_tokens(dir / "hello.bin"), (std::vector<uint16_t>{15496, 995}));
  EXPECT_EQ(summary.tokens_written, 2u);
  EXPECT_EQ(summary.bytes_read, 11u);
  EXPECT_EQ(summary.vocab_size, 50257);
  // Nothing but the output is left in the folder (no temporary files).
  EXPECT_EQ(std::distance(fs::directory_iterator(dir), fs::directory_iterator()), 2);
}

TEST(TokenizeCommand, InputsJoinInOrderWithEndOfTextAndSpecialTokens) {
  const fs::path dir = temp_dir("join");
  TokenizeOptions o;
  o.inputs = {write_text(dir / "a.txt", "Hello world").string(),
              write_text(dir / "b.txt", " world<|endoftext|>Hello").string()};
  o.output = (dir / "out.bin").string();
  o.encoder_json = (kBpeDir / "encoder.json").string();
  o.vocab_bpe = (kBpeDir / "vocab.bpe").string();
  o.append_eot = true;
  const TokenizeSummary summary = tokenize_command(o);
  // " world" is 995 as well; "<|endoftext|>" in the text is the special token by default.
  EXPECT_EQ(read_tokens(dir / "out.bin"),
            (std::vector<uint16_t>{15496, 995, kEndOfText, 995, kEndOfText, 15496, kEndOfText}));
  EXPECT_EQ(summary.tokens_written, 7u);
  ASSERT_EQ(summary.inputs.size(), 2u);
  EXPECT_EQ(summary.inputs[1].tokens_written, 3u);

  // As plain text, "<|endoftext|>" is several ordinary tokens.
  o.special_tokens = false;
  o.append_eot = false;
  tokenize_command(o);
  const std::vector<uint16_t> plain = read_tokens(dir / "out.bin");
  EXPECT_GT(plain.size(), 6u);
  EXPECT_EQ(std::count(plain.begin(), plain.end(), kEndOfText), 0);
}

TEST(TokenizeCommand, CommandLineRunsAndHelpNamesTheOptions) {
  const fs::path dir = temp_dir("cli");
  const fs::path a = write_text(dir / "a.txt", "Hello world");
  const fs::path b = write_text(dir / "b.txt", "Hello");
  const fs::path out = dir / "out.bin";
  CLI::App app{"colossal"};
  CLI::App* command = add_tokenize_command(app);
  ASSERT_NE(command, nullptr);
  EXPECT_EQ(command->get_name(), "tokenize");
  const std::string help = command->help();
  for (const char* part : {"--bpe-dir", "--encoder", "--vocab", "--output", "--append-eot", "--plain-special", "uint16",
                           "data.dataset = \"tokens\""}) {
    EXPECT_NE(help.find(part), std::string::npos) << part << " not in\n" << help;
  }
  std::vector<std::string> args = {"colossal", "tokenize",   "--bpe-dir", kBpeDir.string(), "--append-eot",
                                   "-o",       out.string(), a.string(),  b.string()};
  std::vector<char*> argv;
  for (std::string& arg : args) argv.push_back(arg.data());
  app.parse(static_cast<int>(argv.size()), argv.data());
  EXPECT_EQ(read_tokens(out), (std::vector<uint16_t>{15496, 995, kEndOfText, 15496, kEndOfText}));
}

TEST(TokenizeCommand, FailuresLeaveNoOutput) {
  const fs::path dir = temp_dir("errors");
  const fs::path text = write_text(dir / "a.txt", "Hello world");
  const fs::path out = dir / "out.bin";
  TokenizeOptions o;
  o.inputs = {text.string()};
  o.output = out.string();
  // No vocabulary anywhere.
  ASSERT_EQ(::unsetenv("COLOSSAL_GPT2_BPE_DIR"), 0);
  try {
    tokenize_command(o);
    ADD_FAILURE() << "no error without a vocabulary";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("--bpe-dir"), std::string::npos) << e.what();
  }
  // ... which $COLOSSAL_GPT2_BPE_DIR can give.
  ASSERT_EQ(::setenv("COLOSSAL_GPT2_BPE_DIR", kBpeDir.c_str(), 1), 0);
  EXPECT_EQ(tokenize_command(o).tokens_written, 2u);
  ASSERT_EQ(::unsetenv("COLOSSAL_GPT2_BPE_DIR"), 0);
  fs::remove(out);

  // Invalid UTF-8 in the second input: neither the output nor a temporary file stays.
  o.bpe_dir = kBpeDir.string();
  o.inputs.push_back(write_text(dir / "bad.txt", std::string("ok \xff\xfe")).string());
  try {
    tokenize_command(o);
    ADD_FAILURE() << "no error on invalid UTF-8";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("invalid UTF-8"), std::string::npos) << e.what();
  }
  EXPECT_FALSE(fs::exists(out));
  EXPECT_EQ(std::distance(fs::directory_iterator(dir), fs::directory_iterator()), 2);  // a.txt, bad.txt

  // On the command line the failure is printed and parsing ends with exit code 1.
  CLI::App app{"colossal"};
  add_tokenize_command(app);
  std::vector<std::string> args = {"colossal", "tokenize", "-o", out.string(), text.string()};
  std::vector<char*> argv;
  for (std::string& arg : args) argv.push_back(arg.data());
  try {
    app.parse(static_cast<int>(argv.size()), argv.data());
    ADD_FAILURE() << "no error without a vocabulary";
  } catch (const CLI::RuntimeError& e) {
    EXPECT_EQ(e.get_exit_code(), 1);
  }
  EXPECT_FALSE(fs::exists(out));
}

}  // namespace
}  // namespace colossal::cli
