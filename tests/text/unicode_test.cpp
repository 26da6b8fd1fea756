// The Unicode pieces of the tokenizer: the generated class tables (sorted, disjoint, spot checks
// across scripts), the classification of ASCII and beyond, and UTF-8 decoding of valid and broken
// sequences.
#include <gtest/gtest.h>

#include <string>

#include "colossal/text/unicode.h"

namespace colossal::text {
namespace {

void expect_sorted_and_disjoint(std::span<const detail::CodePointRange> ranges, const char* name) {
  ASSERT_FALSE(ranges.empty()) << name;
  for (std::size_t i = 0; i < ranges.size(); ++i) {
    EXPECT_LE(ranges[i].first, ranges[i].last) << name << " range " << i;
    if (i > 0) {
      EXPECT_LT(ranges[i - 1].last + 1, ranges[i].first) << name << " ranges " << i - 1 << ", " << i;
    }
  }
  EXPECT_LE(ranges.back().last, 0x10FFFFu) << name;
}

TEST(Unicode, TablesAreSortedDisjointAndOfTheExpectedSize) {
  expect_sorted_and_disjoint(detail::letter_ranges(), "letters");
  expect_sorted_and_disjoint(detail::number_ranges(), "numbers");
  expect_sorted_and_disjoint(detail::whitespace_ranges(), "whitespace");
  // Unicode 17.0 has 145,672 letters, 1,924 numbers and 25 White_Space characters; a table cut short
  // by a broken regeneration would miss these counts.
  const auto count = [](std::span<const detail::CodePointRange> ranges) {
    std::size_t n = 0;
    for (const auto& range : ranges) n += range.last - range.first + 1;
    return n;
  };
  EXPECT_EQ(count(detail::letter_ranges()), 145672u);
  EXPECT_EQ(count(detail::number_ranges()), 1924u);
  EXPECT_EQ(count(detail::whitespace_ranges()), 25u);
}

TEST(Unicode, ClassifiesAscii) {
  for (char32_t c = 0; c < 0x80; ++c) {
    CharClass expected = CharClass::kOther;
    if ((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z')) expected = CharClass::kLetter;
    if (c >= '0' && c <= '9') expected = CharClass::kNumber;
    if (c == ' ' || (c >= 0x09 && c <= 0x0D)) expected = CharClass::kWhitespace;
    EXPECT_EQ(classify(c), expected) << "U+" << std::hex << static_cast<uint32_t>(c);
  }
}

TEST(Unicode, ClassifiesBeyondAscii) {
  // Letters: Latin-1, Greek, Cyrillic, Arabic, CJK, kana, Hangul, a modifier letter (Lm), a titlecase
  // letter (Lt), a supplementary-plane ideograph.
  for (char32_t c : {U'é', U'ß', U'Ω', U'Ж', U'ع', U'日', U'の', U'한', U'ʰ', U'ǅ', U'\U00020000'}) {
    EXPECT_EQ(classify(c), CharClass::kLetter) << "U+" << std::hex << static_cast<uint32_t>(c);
  }
  // Numbers: Arabic-Indic digit (Nd), Roman numeral (Nl), vulgar fraction and superscript (No).
  for (char32_t c : {U'٣', U'Ⅻ', U'½', U'²', U'\U0001D7CE'}) {
    EXPECT_EQ(classify(c), CharClass::kNumber) << "U+" << std::hex << static_cast<uint32_t>(c);
  }
  // White_Space: NEL, no-break space, ogham space, em space, line separator, ideographic space.
  for (char32_t c : {U'\u0085', U'\u00A0', U'\u1680', U'\u2003', U'\u2028', U'\u3000'}) {
    EXPECT_EQ(classify(c), CharClass::kWhitespace) << "U+" << std::hex << static_cast<uint32_t>(c);
  }
  // Other: punctuation, symbols, emoji, combining marks (Mn: not \p{L}), zero-width space (not
  // White_Space), unassigned, private use, and U+001C (str.isspace() says yes; \s says no).
  for (char32_t c : {U'¿', U'€', U'🙂', U'\u0301', U'\u200B', U'\u0378', U'\uE000', U'\u001C'}) {
    EXPECT_EQ(classify(c), CharClass::kOther) << "U+" << std::hex << static_cast<uint32_t>(c);
  }
}

TEST(Unicode, DecodesValidUtf8) {
  const std::string text = "a\u00E9\u65E5\U0001F642";  // 1, 2, 3 and 4 bytes
  std::size_t pos = 0;
  for (auto [code_point, length] : {std::pair{U'a', 1}, {U'é', 2}, {U'日', 3}, {U'🙂', 4}}) {
    const Utf8Char c = decode_utf8(text, pos);
    EXPECT_TRUE(c.valid);
    EXPECT_EQ(c.code_point, code_point);
    EXPECT_EQ(c.length, length);
    pos += c.length;
  }
  EXPECT_EQ(find_invalid_utf8(text), std::string::npos);
}

TEST(Unicode, BrokenUtf8DecodesAsSingleInvalidBytes) {
  const struct {
    std::string bytes;
    const char* what;
  } cases[] = {
      {"\x80", "a stray continuation byte"},       {"\xC3", "a truncated 2-byte sequence"},
      {"\xE6\x97", "a truncated 3-byte sequence"}, {"\xC0\xAF", "an overlong '/'"},
      {"\xE0\x80\xAF", "an overlong 3-byte '/'"},  {"\xED\xA0\x80", "a surrogate (U+D800)"},
      {"\xF4\x90\x80\x80", "past U+10FFFF"},       {"\xFF", "0xFF, never in UTF-8"},
      {"\xC3(", "a lead byte followed by ASCII"},
  };
  for (const auto& c : cases) {
    const Utf8Char decoded = decode_utf8(c.bytes, 0);
    EXPECT_FALSE(decoded.valid) << c.what;
    EXPECT_EQ(decoded.length, 1) << c.what;
    EXPECT_EQ(classify_at(c.bytes, 0), CharClass::kOther) << c.what;
    EXPECT_EQ(find_invalid_utf8("ok " + c.bytes), 3u) << c.what;
  }
}

}  // namespace
}  // namespace colossal::text
