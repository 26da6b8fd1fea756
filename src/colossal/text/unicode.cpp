// UTF-8 decoding and the letter/number/whitespace classification over the generated range tables.
#include "colossal/text/unicode.h"

#include <algorithm>

namespace colossal::text {

namespace {

bool in_ranges(std::span<const detail::CodePointRange> ranges, char32_t code_point) {
  // The first range whose last code point is >= code_point is the only one that can hold it.
  const auto it = std::lower_bound(ranges.begin(), ranges.end(), code_point,
                                   [](const detail::CodePointRange& range, char32_t c) { return range.last < c; });
  return it != ranges.end() && it->first <= code_point;
}

bool is_continuation(unsigned char byte) {
  return (byte & 0xC0) == 0x80;
}

}  // namespace

CharClass classify(char32_t code_point) {
  // ASCII is nearly all of most training text; answer it without a search.
  if (code_point < 0x80) {
    const char c = static_cast<char>(code_point);
    if ((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z')) return CharClass::kLetter;
    if (c >= '0' && c <= '9') return CharClass::kNumber;
    if (c == ' ' || (c >= '\t' && c <= '\r')) return CharClass::kWhitespace;
    return CharClass::kOther;
  }
  if (in_ranges(detail::letter_ranges(), code_point)) return CharClass::kLetter;
  if (in_ranges(detail::number_ranges(), code_point)) return CharClass::kNumber;
  if (in_ranges(detail::whitespace_ranges(), code_point)) return CharClass::kWhitespace;
  return CharClass::kOther;
}

Utf8Char decode_utf8(std::string_view text, std::size_t pos) {
  const auto byte = [&](std::size_t i) { return static_cast<unsigned char>(text[i]); };
  const unsigned char lead = byte(pos);
  const Utf8Char invalid{lead, 1, false};
  if (lead < 0x80) return {lead, 1, true};
  int length = 0;
  char32_t code_point = 0;
  char32_t minimum = 0;  // the smallest code point that needs this many bytes (shorter forms are overlong)
  if ((lead & 0xE0) == 0xC0) {
    length = 2, code_point = lead & 0x1F, minimum = 0x80;
  } else if ((lead & 0xF0) == 0xE0) {
    length = 3, code_point = lead & 0x0F, minimum = 0x800;
  } else if ((lead & 0xF8) == 0xF0) {
    length = 4, code_point = lead & 0x07, minimum = 0x10000;
  } else {
    return invalid;  // a continuation byte or 0xF8..0xFF
  }
  if (pos + length > text.size()) return invalid;
  for (int i = 1; i < length; ++i) {
    if (!is_continuation(byte(pos + i))) return invalid;
    code_point = (code_point << 6) | (byte(pos + i) & 0x3F);
  }
  if (code_point < minimum || code_point > 0x10FFFF || (code_point >= 0xD800 && code_point <= 0xDFFF)) return invalid;
  return {code_point, length, true};
}

std::size_t find_invalid_utf8(std::string_view text) {
  std::size_t pos = 0;
  while (pos < text.size()) {
    if (static_cast<unsigned char>(text[pos]) < 0x80) {
      ++pos;
      continue;
    }
    const Utf8Char c = decode_utf8(text, pos);
    if (!c.valid) return pos;
    pos += c.length;
  }
  return std::string_view::npos;
}

}  // namespace colossal::text
