// GPT-2 BPE: loading and checking encoder.json and vocab.bpe, the byte alphabet, rank-ordered pair
// merges with a cache of encoded pieces, and decoding.
#include "colossal/text/tokenizer.h"

#include <cerrno>
#include <cstring>
#include <fstream>
#include <mutex>
#include <sstream>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "colossal/core/error.h"        // COLOSSAL_CHECK
#include "colossal/text/pretokenize.h"  // next_piece_end
#include "colossal/text/unicode.h"      // decode_utf8

namespace colossal::text {

namespace {

/// Ids at or past this are refused: a corrupt id must not make the id table allocate gigabytes.
/// GPT-2 uses 50257; the largest published BPE vocabularies stay well under a million.
constexpr int64_t kMaxTokenId = int64_t{1} << 24;

/// Pieces remembered by the cache before it starts over; GPT-2 text has far fewer distinct words.
constexpr std::size_t kMaxCachedPieces = std::size_t{1} << 20;

/// The bytes encoder.py's bytes_to_unicode keeps as themselves: printable ASCII and Latin-1.
bool stands_for_itself(unsigned byte) {
  return (byte >= '!' && byte <= '~') || (byte >= 0xA1 && byte <= 0xAC) || (byte >= 0xAE && byte <= 0xFF);
}

std::string read_file(const std::filesystem::path& path, std::string_view what) {
  std::error_code error;
  const bool is_file = std::filesystem::is_regular_file(path, error);
  COLOSSAL_CHECK(is_file, "cannot read GPT-2 {} '{}': {}", what, path.string(),
                 error ? error.message() : (std::filesystem::exists(path) ? "not a regular file" : "no such file"));
  std::ifstream in(path, std::ios::binary);
  COLOSSAL_CHECK(in.is_open(), "cannot open GPT-2 {} '{}': {}", what, path.string(), std::strerror(errno));
  std::ostringstream contents;
  contents << in.rdbuf();
  COLOSSAL_CHECK(!in.bad(), "reading GPT-2 {} '{}' failed: {}", what, path.string(), std::strerror(errno));
  return std::move(contents).str();
}

/// The bytes a token written in the byte alphabet stands for ("Ġthe" -> " the").
std::optional<std::string> alphabet_to_bytes(std::string_view token) {
  std::string bytes;
  bytes.reserve(token.size());
  std::size_t pos = 0;
  while (pos < token.size()) {
    const Utf8Char c = decode_utf8(token, pos);
    if (!c.valid) return std::nullopt;
    const std::optional<unsigned char> byte = unicode_to_byte(c.code_point);
    if (!byte) return std::nullopt;
    bytes.push_back(static_cast<char>(*byte));
    pos += c.length;
  }
  return bytes;
}

std::string_view trim_line_end(std::string_view line) {
  if (!line.empty() && line.back() == '\r') line.remove_suffix(1);
  return line;
}

}  // namespace

char32_t byte_to_unicode(unsigned char byte) {
  if (stands_for_itself(byte)) return byte;
  // The others take U+0100 upwards in byte order.
  char32_t next = 0x100;
  for (unsigned b = 0; b < byte; ++b) {
    if (!stands_for_itself(b)) ++next;
  }
  return next;
}

std::optional<unsigned char> unicode_to_byte(char32_t code_point) {
  if (code_point < 0x100) {
    if (stands_for_itself(code_point)) return static_cast<unsigned char>(code_point);
    return std::nullopt;
  }
  char32_t next = 0x100;
  for (unsigned b = 0; b < 256; ++b) {
    if (stands_for_itself(b)) continue;
    if (next == code_point) return static_cast<unsigned char>(b);
    ++next;
  }
  return std::nullopt;
}

struct Gpt2Tokenizer::Cache {
  std::mutex mutex;
  std::unordered_map<std::string, std::vector<int32_t>, StringHash, std::equal_to<>> pieces;
};

Gpt2Tokenizer::Gpt2Tokenizer() : cache_(std::make_unique<Cache>()) {}
Gpt2Tokenizer::Gpt2Tokenizer(Gpt2Tokenizer&&) noexcept = default;
Gpt2Tokenizer& Gpt2Tokenizer::operator=(Gpt2Tokenizer&&) noexcept = default;
Gpt2Tokenizer::~Gpt2Tokenizer() = default;

Gpt2Tokenizer Gpt2Tokenizer::from_directory(const std::filesystem::path& dir) {
  return from_files(dir / "encoder.json", dir / "vocab.bpe");
}

Gpt2Tokenizer Gpt2Tokenizer::from_files(const std::filesystem::path& encoder_json,
                                        const std::filesystem::path& vocab_bpe) {
  const std::string encoder = read_file(encoder_json, "encoder file (encoder.json)");
  const std::string merges = read_file(vocab_bpe, "merges file (vocab.bpe)");
  return from_strings(encoder, merges, encoder_json.string(), vocab_bpe.string());
}

Gpt2Tokenizer Gpt2Tokenizer::from_strings(std::string_view encoder_json, std::string_view vocab_bpe,
                                          std::string_view encoder_name, std::string_view vocab_name) {
  Gpt2Tokenizer tokenizer;

  // encoder.json: {"token in the byte alphabet": id, ...}
  nlohmann::json json;
  try {
    json = nlohmann::json::parse(encoder_json);
  } catch (const nlohmann::json::exception& e) {
    // Not only parse_error: a number too large for a double (1E400) is out_of_range.
    COLOSSAL_FAIL("{}: not valid JSON ({}); expected GPT-2's encoder.json, an object of token -> id", encoder_name,
                  e.what());
  }
  COLOSSAL_CHECK(json.is_object() && !json.empty(),
                 "{}: expected GPT-2's encoder.json, a non-empty JSON object of token -> id, got a JSON {}",
                 encoder_name, json.empty() && json.is_object() ? "empty object" : json.type_name());
  std::vector<std::string> id_names;  // for the message about an id given twice
  for (const auto& [token, value] : json.items()) {
    COLOSSAL_CHECK(value.is_number_integer(), "{}: token \"{}\" has id {}, expected an integer", encoder_name, token,
                   value.dump());
    const int64_t id = value.get<int64_t>();
    COLOSSAL_CHECK(id >= 0 && id < kMaxTokenId, "{}: token \"{}\" has id {}, outside [0, {})", encoder_name, token, id,
                   kMaxTokenId);
    std::optional<std::string> bytes = alphabet_to_bytes(token);
    COLOSSAL_CHECK(bytes.has_value(),
                   "{}: token \"{}\" has a character outside GPT-2's byte alphabet (bytes_to_unicode); is this a "
                   "GPT-2 byte-level BPE vocabulary?",
                   encoder_name, token);
    if (static_cast<std::size_t>(id) >= tokenizer.id_to_bytes_.size()) {
      tokenizer.id_to_bytes_.resize(id + 1);
      tokenizer.id_defined_.resize(id + 1, false);
      id_names.resize(id + 1);
    }
    COLOSSAL_CHECK(!tokenizer.id_defined_[id], "{}: id {} is given to both \"{}\" and \"{}\"", encoder_name, id,
                   id_names[id], token);
    tokenizer.id_defined_[id] = true;
    id_names[id] = token;
    tokenizer.bytes_to_id_.emplace(*bytes, static_cast<int32_t>(id));
    tokenizer.id_to_bytes_[id] = std::move(*bytes);
  }
  for (unsigned byte = 0; byte < 256; ++byte) {
    const auto it = tokenizer.bytes_to_id_.find(std::string(1, static_cast<char>(byte)));
    COLOSSAL_CHECK(it != tokenizer.bytes_to_id_.end(),
                   "{}: no token for byte 0x{:02X} (\"{}\" in the byte alphabet); byte-level BPE needs all 256, or "
                   "some texts could not be encoded",
                   encoder_name, byte, fmt::format("\\u{:04X}", static_cast<uint32_t>(byte_to_unicode(byte))));
    tokenizer.byte_ids_[byte] = it->second;
  }

  // vocab.bpe: "#version: 0.2", then one merge "left right" per line, the most frequent pair first.
  std::vector<int> merge_lines;  // line of each rank, for the message about a merge listed twice
  int line_number = 0;
  std::size_t pos = 0;
  while (pos < vocab_bpe.size()) {
    std::size_t end = vocab_bpe.find('\n', pos);
    if (end == std::string_view::npos) end = vocab_bpe.size();
    const std::string_view line = trim_line_end(vocab_bpe.substr(pos, end - pos));
    pos = end + 1;
    ++line_number;
    if (line_number == 1) {
      COLOSSAL_CHECK(line.starts_with("#version"),
                     "{}:1: expected the header \"#version: 0.2\" of GPT-2's vocab.bpe, got \"{}\"", vocab_name,
                     line.substr(0, 40));
      continue;
    }
    if (line.empty()) continue;
    const std::size_t space = line.find(' ');
    const bool two_parts = space != std::string_view::npos && space > 0 && space + 1 < line.size() &&
                           line.find(' ', space + 1) == std::string_view::npos;
    COLOSSAL_CHECK(two_parts, "{}:{}: expected a merge, two tokens separated by one space, got \"{}\"", vocab_name,
                   line_number, line);
    const std::string_view left = line.substr(0, space);
    const std::string_view right = line.substr(space + 1);
    const auto id_of = [&](std::string_view token) -> int32_t {
      const std::optional<std::string> bytes = alphabet_to_bytes(token);
      const auto it = bytes ? tokenizer.bytes_to_id_.find(*bytes) : tokenizer.bytes_to_id_.end();
      COLOSSAL_CHECK(it != tokenizer.bytes_to_id_.end(),
                     "{}:{}: merge \"{}\" needs the token \"{}\", which {} does not have; do the two files belong "
                     "together?",
                     vocab_name, line_number, line, token, encoder_name);
      return it->second;
    };
    const int32_t left_id = id_of(left);
    const int32_t right_id = id_of(right);
    const int32_t result_id = id_of(std::string(left) + std::string(right));
    const uint64_t key = (static_cast<uint64_t>(left_id) << 32) | static_cast<uint32_t>(right_id);
    const int32_t rank = static_cast<int32_t>(merge_lines.size());
    const auto [it, inserted] = tokenizer.merges_.emplace(key, Merge{rank, result_id});
    COLOSSAL_CHECK(inserted, "{}:{}: merge \"{}\" repeats line {}", vocab_name, line_number, line,
                   merge_lines[it->second.rank]);
    merge_lines.push_back(line_number);
  }
  COLOSSAL_CHECK(line_number >= 1, "{}: empty; expected GPT-2's vocab.bpe (\"#version: 0.2\", then merges)",
                 vocab_name);
  return tokenizer;
}

std::vector<int32_t> Gpt2Tokenizer::encode(std::string_view text) const {
  std::vector<int32_t> tokens;
  encode_append(text, tokens);
  return tokens;
}

std::vector<int32_t> Gpt2Tokenizer::encode_with_special(std::string_view text) const {
  const std::optional<int32_t> eot = end_of_text();
  COLOSSAL_CHECK(eot.has_value(), "this vocabulary has no \"{}\" token; use encode()", kEndOfText);
  std::vector<int32_t> tokens;
  std::size_t pos = 0;
  while (pos <= text.size()) {
    const std::size_t special = text.find(kEndOfText, pos);
    const std::size_t end = special == std::string_view::npos ? text.size() : special;
    encode_append(text.substr(pos, end - pos), tokens);
    if (special == std::string_view::npos) break;
    tokens.push_back(*eot);
    pos = special + kEndOfText.size();
  }
  return tokens;
}

void Gpt2Tokenizer::encode_append(std::string_view text, std::vector<int32_t>& out) const {
  std::size_t pos = 0;
  while (pos < text.size()) {
    const std::size_t end = next_piece_end(text, pos);
    encode_piece(text.substr(pos, end - pos), out);
    pos = end;
  }
}

void Gpt2Tokenizer::encode_piece(std::string_view piece, std::vector<int32_t>& out) const {
  if (piece.size() == 1) {
    out.push_back(byte_ids_[static_cast<unsigned char>(piece[0])]);
    return;
  }
  {
    std::lock_guard lock(cache_->mutex);
    if (const auto it = cache_->pieces.find(piece); it != cache_->pieces.end()) {
      out.insert(out.end(), it->second.begin(), it->second.end());
      return;
    }
  }
  std::vector<int32_t> tokens = byte_pair_merge(piece);
  out.insert(out.end(), tokens.begin(), tokens.end());
  std::lock_guard lock(cache_->mutex);
  if (cache_->pieces.size() >= kMaxCachedPieces) cache_->pieces.clear();
  cache_->pieces.emplace(std::string(piece), std::move(tokens));
}

std::vector<int32_t> Gpt2Tokenizer::byte_pair_merge(std::string_view piece) const {
  std::vector<int32_t> word(piece.size());
  for (std::size_t i = 0; i < piece.size(); ++i) word[i] = byte_ids_[static_cast<unsigned char>(piece[i])];
  std::vector<int32_t> merged;
  merged.reserve(word.size());
  // As encoder.py's bpe(): find the adjacent pair merged earliest in vocab.bpe, merge each of its
  // occurrences left to right, repeat until no adjacent pair is a merge.
  while (word.size() > 1) {
    const auto key_at = [&](std::size_t i) {
      return (static_cast<uint64_t>(word[i]) << 32) | static_cast<uint32_t>(word[i + 1]);
    };
    const Merge* best = nullptr;
    uint64_t best_key = 0;
    for (std::size_t i = 0; i + 1 < word.size(); ++i) {
      const auto it = merges_.find(key_at(i));
      if (it != merges_.end() && (best == nullptr || it->second.rank < best->rank)) {
        best = &it->second;
        best_key = it->first;
      }
    }
    if (best == nullptr) break;
    merged.clear();
    for (std::size_t i = 0; i < word.size();) {
      if (i + 1 < word.size() && key_at(i) == best_key) {
        merged.push_back(best->result);
        i += 2;
      } else {
        merged.push_back(word[i]);
        i += 1;
      }
    }
    word.swap(merged);
  }
  return word;
}

std::string Gpt2Tokenizer::decode(std::span<const int32_t> tokens) const {
  std::size_t size = 0;
  for (const int32_t id : tokens) size += token_bytes(id).size();
  std::string text;
  text.reserve(size);
  for (const int32_t id : tokens) text += id_to_bytes_[id];
  return text;
}

std::optional<int32_t> Gpt2Tokenizer::token_id(std::string_view bytes) const {
  const auto it = bytes_to_id_.find(bytes);
  if (it == bytes_to_id_.end()) return std::nullopt;
  return it->second;
}

const std::string& Gpt2Tokenizer::token_bytes(int32_t id) const {
  COLOSSAL_CHECK(id >= 0 && id < vocab_size() && id_defined_[id], "token id {} is not in the vocabulary ({} ids{})", id,
                 vocab_size(), id >= 0 && id < vocab_size() ? ", this one unused" : "");
  return id_to_bytes_[id];
}

}  // namespace colossal::text
