// Streaming text -> uint16 token file, cut at piece boundaries that the rest of the file cannot move.
#include "colossal/text/tokenize_file.h"

#include <unistd.h>  // getpid

#include <cerrno>
#include <cstring>
#include <fstream>
#include <string>
#include <vector>

#include <fmt/format.h>

#include "colossal/core/error.h"        // COLOSSAL_CHECK
#include "colossal/text/pretokenize.h"  // next_piece_end, kPieceLookaheadBytes
#include "colossal/text/unicode.h"      // find_invalid_utf8

namespace colossal::text {

namespace {

constexpr int64_t kMaxUint16Token = 65535;

/// Encodes what it can of the text read so far, leaving in `buffer` the tail that more text could
/// still change: the last pieces (a piece is settled once kPieceLookaheadBytes follow it) and a
/// possible beginning of "<|endoftext|>". At the end of the file everything is settled.
class StreamEncoder {
 public:
  StreamEncoder(const Gpt2Tokenizer& tokenizer, const TokenizeFileOptions& options, std::string_view in_name)
      : tokenizer_(tokenizer), options_(options), in_name_(in_name) {
    if (options_.special_tokens) {
      const std::optional<int32_t> eot = tokenizer_.end_of_text();
      COLOSSAL_CHECK(eot.has_value(), "tokenizing '{}': the vocabulary has no \"{}\" token; turn special_tokens off",
                     in_name_, Gpt2Tokenizer::kEndOfText);
      end_of_text_ = *eot;
    }
  }

  /// Appends the settled tokens of buffer to `tokens` and erases their text from it.
  void encode_settled(std::string& buffer, bool at_end, std::vector<int32_t>& tokens) {
    const std::size_t margin = kPieceLookaheadBytes + (options_.special_tokens ? Gpt2Tokenizer::kEndOfText.size() : 0);
    const std::string_view text(buffer);
    std::size_t pos = 0;
    while (pos < text.size()) {
      const std::size_t special =
          options_.special_tokens ? text.find(Gpt2Tokenizer::kEndOfText, pos) : std::string_view::npos;
      const bool found = special != std::string_view::npos;
      // Pieces see the segment's end as the end of the text: special tokens split text for good.
      const std::string_view segment = text.substr(0, found ? special : text.size());
      const bool settled_end = found || at_end;
      while (pos < segment.size()) {
        const std::size_t end = next_piece_end(segment, pos);
        if (!settled_end && end + margin > segment.size()) break;
        check_utf8(segment.substr(pos, end - pos), pos);
        tokenizer_.encode_append(segment.substr(pos, end - pos), tokens);
        pos = end;
      }
      if (pos < segment.size()) break;  // the rest waits for more text
      if (!found) break;
      tokens.push_back(end_of_text_);
      pos = special + Gpt2Tokenizer::kEndOfText.size();
    }
    buffer.erase(0, pos);
    consumed_ += pos;
  }

 private:
  void check_utf8(std::string_view piece, std::size_t pos) const {
    const std::size_t bad = find_invalid_utf8(piece);
    COLOSSAL_CHECK(bad == std::string_view::npos,
                   "tokenizing '{}': invalid UTF-8 at byte offset {} (byte 0x{:02X}); the input must be UTF-8 text",
                   in_name_, consumed_ + pos + bad, static_cast<unsigned char>(piece[bad]));
  }

  const Gpt2Tokenizer& tokenizer_;
  const TokenizeFileOptions& options_;
  std::string_view in_name_;
  int32_t end_of_text_ = 0;
  uint64_t consumed_ = 0;  ///< file offset of the buffer's first byte
};

}  // namespace

TokenizeFileResult tokenize_file(const std::filesystem::path& in_path, const std::filesystem::path& out_path,
                                 const Gpt2Tokenizer& tokenizer, const TokenizeFileOptions& options) {
  const std::string in_name = in_path.string();
  COLOSSAL_CHECK(options.chunk_bytes > 0, "tokenize_file: chunk_bytes must be positive");
  std::error_code error;
  COLOSSAL_CHECK(std::filesystem::is_regular_file(in_path, error), "cannot tokenize '{}': {}", in_name,
                 error ? error.message() : "no such file (or not a regular file)");
  std::ifstream in(in_path, std::ios::binary);
  COLOSSAL_CHECK(in.is_open(), "cannot open '{}': {}", in_name, std::strerror(errno));

  StreamEncoder encoder(tokenizer, options, in_name);
  TokenizeFileResult result;
  const std::filesystem::path temporary = out_path.string() + fmt::format(".tmp.{}", static_cast<long>(::getpid()));
  try {
    std::ofstream out(temporary, std::ios::binary | std::ios::trunc);
    COLOSSAL_CHECK(out.is_open(), "cannot create '{}': {}", temporary.string(), std::strerror(errno));
    std::string buffer;
    std::vector<int32_t> tokens;
    std::vector<char> bytes;
    bool at_end = false;
    while (!at_end) {
      const std::size_t old_size = buffer.size();
      buffer.resize(old_size + options.chunk_bytes);
      in.read(buffer.data() + old_size, static_cast<std::streamsize>(options.chunk_bytes));
      const auto got = static_cast<std::size_t>(in.gcount());
      buffer.resize(old_size + got);
      COLOSSAL_CHECK(!in.bad(), "reading '{}' failed: {}", in_name, std::strerror(errno));
      result.bytes_read += got;
      at_end = in.eof();

      tokens.clear();
      encoder.encode_settled(buffer, at_end, tokens);
      bytes.resize(2 * tokens.size());
      for (std::size_t i = 0; i < tokens.size(); ++i) {
        COLOSSAL_CHECK(tokens[i] <= kMaxUint16Token,
                       "tokenizing '{}': token id {} does not fit the uint16 token file (ids up to {}); this "
                       "vocabulary needs a wider format",
                       in_name, tokens[i], kMaxUint16Token);
        bytes[2 * i] = static_cast<char>(tokens[i] & 0xFF);
        bytes[2 * i + 1] = static_cast<char>((tokens[i] >> 8) & 0xFF);
      }
      out.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
      COLOSSAL_CHECK(out.good(), "writing '{}' failed: {}", temporary.string(), std::strerror(errno));
      result.tokens_written += tokens.size();
    }
    COLOSSAL_CHECK(buffer.empty(), "tokenize_file: {} bytes of '{}' left unencoded", buffer.size(), in_name);
    out.close();
    COLOSSAL_CHECK(!out.fail(), "closing '{}' failed: {}", temporary.string(), std::strerror(errno));
    std::filesystem::rename(temporary, out_path, error);
    COLOSSAL_CHECK(!error, "renaming '{}' to '{}' failed: {}", temporary.string(), out_path.string(), error.message());
  } catch (...) {
    std::error_code ignored;
    std::filesystem::remove(temporary, ignored);
    throw;
  }
  return result;
}

}  // namespace colossal::text
