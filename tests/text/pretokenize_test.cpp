// GPT-2's pre-tokenization: the pieces of each alternative of the pattern and of the whitespace
// rules, checked against the splits OpenAI's encoder.py (Python `regex`) gives for the same strings.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "colossal/text/pretokenize.h"

namespace colossal::text {
namespace {

std::vector<std::string> pieces(std::string_view text) {
  std::vector<std::string> result;
  for (std::string_view piece : pretokenize(text)) result.emplace_back(piece);
  return result;
}

using Pieces = std::vector<std::string>;

TEST(Pretokenize, WordsNumbersAndPunctuationTakeOneLeadingSpace) {
  EXPECT_EQ(pieces("Hello world"), (Pieces{"Hello", " world"}));
  EXPECT_EQ(pieces("Hello, world!"), (Pieces{"Hello", ",", " world", "!"}));
  EXPECT_EQ(pieces("numbers 12345 and 3.14159"), (Pieces{"numbers", " 12345", " and", " 3", ".", "14159"}));
  EXPECT_EQ(pieces("line1"), (Pieces{"line", "1"}));
  EXPECT_EQ(pieces("a ... b"), (Pieces{"a", " ...", " b"}));
  EXPECT_EQ(pieces("<|endoftext|>"), (Pieces{"<|", "endoftext", "|>"}));
}

TEST(Pretokenize, Contractions) {
  EXPECT_EQ(pieces("I'm here, you're there, we'll see; they've said it's done, I'd go"),
            (Pieces{"I", "'m",    " here", ",",     " you", "'re", " there", ",", " we", "'ll", " see",
                    ";", " they", "'ve",   " said", " it",  "'s",  " done",  ",", " I",  "'d",  " go"}));
  // Only lower case, and only after the apostrophe itself: " '" is punctuation with its space.
  EXPECT_EQ(pieces("don'T 'S"), (Pieces{"don", "'", "T", " '", "S"}));
  EXPECT_EQ(pieces("'''s"), (Pieces{"'''", "s"}));
  EXPECT_EQ(pieces("'"), (Pieces{"'"}));
  EXPECT_EQ(pieces("'r"), (Pieces{"'", "r"}));
}

TEST(Pretokenize, WhitespaceRuns) {
  // A run before a word gives its last space to the word; a run at the end stays whole.
  EXPECT_EQ(pieces("  leading and trailing  "), (Pieces{" ", " leading", " and", " trailing", "  "}));
  EXPECT_EQ(pieces("a  b"), (Pieces{"a", " ", " b"}));
  EXPECT_EQ(pieces("a\n\nb"), (Pieces{"a", "\n", "\n", "b"}));
  EXPECT_EQ(pieces("line1\n  indented\n"), (Pieces{"line", "1", "\n ", " indented", "\n"}));
  EXPECT_EQ(pieces("tabs\tand\r\nCRLF"), (Pieces{"tabs", "\t", "and", "\r", "\n", "CRLF"}));
  EXPECT_EQ(pieces("   "), (Pieces{"   "}));
  EXPECT_EQ(pieces(" "), (Pieces{" "}));
  EXPECT_EQ(pieces("\n"), (Pieces{"\n"}));
  // Only U+0020 joins a word; other spaces are whitespace pieces of their own.
  EXPECT_EQ(pieces("mixed\u00A0nbsp"), (Pieces{"mixed", "\u00A0", "nbsp"}));
  EXPECT_EQ(pieces("x\u2028y"), (Pieces{"x", "\u2028", "y"}));
  EXPECT_EQ(pieces("x \u3000 y"), (Pieces{"x", " \u3000", " y"}));
}

TEST(Pretokenize, BeyondAscii) {
  EXPECT_EQ(pieces("naïve café résumé"), (Pieces{"naïve", " café", " résumé"}));
  EXPECT_EQ(pieces("日本語のテキスト"), (Pieces{"日本語のテキスト"}));
  EXPECT_EQ(pieces("Привет, мир!"), (Pieces{"Привет", ",", " мир", "!"}));
  EXPECT_EQ(pieces("emoji 🙂👍 done"), (Pieces{"emoji", " 🙂👍", " done"}));
  EXPECT_EQ(pieces("٣٤٥ Ⅻ ½"), (Pieces{"٣٤٥", " Ⅻ", " ½"}));
  // A combining mark is not a letter (Mn), so a decomposed "é" splits the word, as in the reference.
  EXPECT_EQ(pieces("cafe\u0301s"), (Pieces{"cafe", "\u0301", "s"}));
}

TEST(Pretokenize, InvalidBytesArePunctuationLike) {
  EXPECT_EQ(pieces("ab\xFF\xFE cd \x80"), (Pieces{"ab", "\xFF\xFE", " cd", " \x80"}));
}

TEST(Pretokenize, PiecesCoverTheText) {
  const std::string text = "It's 2024:\tthe  café's 日本 🙂!!\n\n  end  ";
  std::string joined;
  for (std::string_view piece : pretokenize(text)) {
    EXPECT_FALSE(piece.empty());
    joined += piece;
  }
  EXPECT_EQ(joined, text);
  EXPECT_TRUE(pretokenize("").empty());
}

TEST(Pretokenize, APieceIsSettledByTheBytesAfterIt) {
  // kPieceLookaheadBytes' promise: in any prefix, a piece followed by that many bytes is the piece
  // of the whole text. Check every prefix of a text full of places where lookahead matters.
  const std::string text = "a  \n\tb's 're' 'll x\u3000\u3000y  \xE6\x97\xA5 1\u00BD  !!  \n";
  const std::vector<std::string_view> whole = pretokenize(text);
  for (std::size_t cut = 0; cut <= text.size(); ++cut) {
    const std::string_view prefix = std::string_view(text).substr(0, cut);
    std::size_t pos = 0;
    std::size_t index = 0;
    while (pos < prefix.size()) {
      const std::size_t end = next_piece_end(prefix, pos);
      if (end + kPieceLookaheadBytes > prefix.size()) break;
      ASSERT_LT(index, whole.size());
      EXPECT_EQ(prefix.substr(pos, end - pos), whole[index]) << "cut at " << cut << ", piece " << index;
      pos = end;
      ++index;
    }
  }
}

}  // namespace
}  // namespace colossal::text
