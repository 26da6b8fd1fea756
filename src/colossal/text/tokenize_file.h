// Text file -> token file: the GPT-2 tokenizer streamed over a UTF-8 text of any size, writing the
// flat uint16 little-endian token files the token dataset (data/) reads and `colossal tokenize` makes.
#pragma once

#include <cstddef>
#include <cstdint>
#include <filesystem>

#include "colossal/text/tokenizer.h"

namespace colossal::text {

struct TokenizeFileOptions {
  /// "<|endoftext|>" in the text becomes the end-of-text token, as corpora that join documents with
  /// it expect; false encodes it as plain text.
  bool special_tokens = true;
  /// Bytes read at a time. The file is streamed, so it may be larger than memory.
  std::size_t chunk_bytes = std::size_t{1} << 20;
};

struct TokenizeFileResult {
  uint64_t bytes_read = 0;
  uint64_t tokens_written = 0;
};

/// Encodes the UTF-8 text at `in_path` and writes its tokens to `out_path` as uint16 little-endian,
/// nothing else (2 bytes per token). The tokens equal those of encoding the whole text at once.
/// The output is written under a temporary name beside out_path and renamed over it once complete;
/// on any error (unreadable input, invalid UTF-8, named by byte offset; a token id >= 65536, which
/// uint16 cannot hold; a failed write) no file is left at out_path and colossal::Error is thrown.
TokenizeFileResult tokenize_file(const std::filesystem::path& in_path, const std::filesystem::path& out_path,
                                 const Gpt2Tokenizer& tokenizer, const TokenizeFileOptions& options = {});

}  // namespace colossal::text
