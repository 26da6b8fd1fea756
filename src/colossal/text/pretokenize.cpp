// GPT-2's pre-tokenization pattern as a hand-written matcher over UTF-8.
#include "colossal/text/pretokenize.h"

#include "colossal/text/unicode.h"

namespace colossal::text {

// Note [GPT-2 pattern by hand]
// The pattern's alternatives are tried in order at each position and the first that matches wins
// (leftmost, not longest):
//   1. 's 't 're 've 'm 'll 'd    ASCII apostrophe and lower-case letters only, as in the reference.
//   2. ' ?\p{L}+'  3. ' ?\p{N}+'  4. ' ?[^\s\p{L}\p{N}]+'
//      The optional prefix is U+0020 alone, never another space character. Each run is greedy and
//      its class check is all that backtracking could revisit, so taking the maximal run is exact.
//   5. '\s+(?!\S)'  a whitespace run, less its last character when a non-space follows it: the
//      greedy run backtracks one character, after which the lookahead sees that (space) character.
//      A single whitespace character followed by a non-space cannot match here.
//   6. '\s+'        what 5 left: one whitespace character before a non-space.
// So "a  b" splits as "a", " ", " b": the space next to the word joins it, the rest stay apart.
// Looking ahead: 1 reads up to three characters, 2-4 one past their run, 5 one past its run, so a
// piece is decided by its own characters and at most the two after it (kPieceLookaheadBytes).

namespace {

struct Cursor {
  std::string_view text;
  std::size_t pos;

  bool at_end() const { return pos >= text.size(); }
  CharClass char_class() const { return classify_at(text, pos); }
  std::size_t char_length() const { return static_cast<std::size_t>(decode_utf8(text, pos).length); }
  void advance() { pos += char_length(); }
};

/// Length of the contraction (alternative 1) at `pos`, or 0.
std::size_t contraction_length(std::string_view text, std::size_t pos) {
  if (text[pos] != '\'' || pos + 1 >= text.size()) return 0;
  const char c1 = text[pos + 1];
  if (c1 == 's' || c1 == 't' || c1 == 'm' || c1 == 'd') return 2;
  if (pos + 2 >= text.size()) return 0;
  const char c2 = text[pos + 2];
  if ((c1 == 'r' && c2 == 'e') || (c1 == 'v' && c2 == 'e') || (c1 == 'l' && c2 == 'l')) return 3;
  return 0;
}

}  // namespace

std::size_t next_piece_end(std::string_view text, std::size_t pos) {
  if (const std::size_t length = contraction_length(text, pos); length != 0) return pos + length;

  // Alternatives 2-4: an optional single space, then a maximal run of one non-space class.
  Cursor run{text, pos};
  if (text[pos] == ' ' && pos + 1 < text.size()) run.advance();
  const CharClass run_class = run.char_class();
  if (run_class != CharClass::kWhitespace) {
    while (!run.at_end() && run.char_class() == run_class) run.advance();
    return run.pos;
  }

  // Alternatives 5-6: the character at pos is whitespace (a lone space before a non-space was taken
  // above, as the prefix of 2-4).
  Cursor space{text, pos};
  std::size_t last_start = pos;  // start of the run's last character
  while (!space.at_end() && space.char_class() == CharClass::kWhitespace) {
    last_start = space.pos;
    space.advance();
  }
  if (space.at_end()) return space.pos;     // 5: nothing follows, the whole run
  if (last_start > pos) return last_start;  // 5: all but the last character
  return space.pos;                         // 6: a single whitespace character
}

std::vector<std::string_view> pretokenize(std::string_view text) {
  std::vector<std::string_view> pieces;
  std::size_t pos = 0;
  while (pos < text.size()) {
    const std::size_t end = next_piece_end(text, pos);
    pieces.push_back(text.substr(pos, end - pos));
    pos = end;
  }
  return pieces;
}

}  // namespace colossal::text
