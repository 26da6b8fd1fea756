// GPT-2's pre-tokenization: the split of text into the pieces BPE then encodes one by one, written out
// by hand from the reference pattern so that it needs no regex engine with Unicode classes.
#pragma once

#include <cstddef>
#include <string_view>
#include <vector>

namespace colossal::text {

/// End (exclusive byte offset) of the piece that starts at byte `pos` of `text` (pos < text.size()),
/// exactly as the leftmost match of GPT-2's pattern
///   's|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+
/// would find it (see Note [GPT-2 pattern by hand] in pretokenize.cpp). Bytes that are not valid UTF-8
/// count as characters of their own outside \p{L}, \p{N} and \s, so every byte lands in some piece.
std::size_t next_piece_end(std::string_view text, std::size_t pos);

/// Every piece of `text`, in order; they concatenate back to `text`.
std::vector<std::string_view> pretokenize(std::string_view text);

/// How far the matcher may look past a piece's end: deciding a piece reads at most the two characters
/// after it (8 bytes of UTF-8). A piece found in a prefix of a longer text is the piece the whole text
/// would give when at least this many bytes of the prefix follow it; streaming encoders rely on it.
inline constexpr std::size_t kPieceLookaheadBytes = 8;

}  // namespace colossal::text
