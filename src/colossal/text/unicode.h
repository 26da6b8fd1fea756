// The little Unicode the GPT-2 tokenizer needs: a UTF-8 decoder that never throws (a bad byte is a
// one-byte character of its own) and the three classes of GPT-2's pre-tokenization pattern.
#pragma once

#include <cstddef>
#include <span>
#include <string_view>

namespace colossal::text {

/// The classes GPT-2's pattern tells apart: \p{L}, \p{N}, \s and everything else.
/// Coverage: the full code space, as Unicode 17.0 assigns it (the tables in unicode_tables.cpp come
/// from the Python `regex` module that OpenAI's reference encoder uses; tools/gen_unicode_tables.py
/// regenerates them). Letters are Lu Ll Lt Lm Lo, numbers Nd Nl No, whitespace White_Space (which,
/// unlike Python's str.isspace, leaves out U+001C..U+001F, as `regex` does).
enum class CharClass : unsigned char { kLetter, kNumber, kWhitespace, kOther };

CharClass classify(char32_t code_point);

/// One character decoded from UTF-8. A byte that starts no valid sequence (a stray continuation byte,
/// a truncated, overlong or surrogate sequence, a value past U+10FFFF) decodes as itself, one byte
/// long, with valid = false; such characters classify as kOther.
struct Utf8Char {
  char32_t code_point = 0;
  int length = 1;  ///< bytes, 1 to 4
  bool valid = true;
};

/// Decodes the character starting at byte `pos` of `text` (pos < text.size()).
Utf8Char decode_utf8(std::string_view text, std::size_t pos);

/// Byte offset of the first byte that starts no valid UTF-8 sequence, or std::string_view::npos.
std::size_t find_invalid_utf8(std::string_view text);

/// The class of the character at byte `pos` (kOther for an invalid byte).
inline CharClass classify_at(std::string_view text, std::size_t pos) {
  const Utf8Char c = decode_utf8(text, pos);
  return c.valid ? classify(c.code_point) : CharClass::kOther;
}

namespace detail {
/// An inclusive range of code points; the tables are sorted and disjoint.
struct CodePointRange {
  char32_t first;
  char32_t last;
};
std::span<const CodePointRange> letter_ranges();
std::span<const CodePointRange> number_ranges();
std::span<const CodePointRange> whitespace_ranges();
}  // namespace detail

}  // namespace colossal::text
