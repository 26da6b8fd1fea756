// The GPT-2 tokenizer on OpenAI's own vocabulary (tests/data/gpt2, see its README): ids read
// straight from encoder.json, encodings computed by the reference implementations, round trips of
// ASCII, UTF-8, whitespace and arbitrary bytes, and one test per way the two files can be broken.
#include <gtest/gtest.h>

#include <unistd.h>  // getpid

#include <filesystem>
#include <fstream>
#include <random>
#include <string>
#include <vector>

#include "colossal/text/tokenizer.h"
#include "gradcheck.h"  // EXPECT_ERROR_CONTAINS

namespace colossal::text {
namespace {

namespace fs = std::filesystem;
using Tokens = std::vector<int32_t>;

const fs::path kGpt2Dir = fs::path(COLOSSAL_TEST_DATA_DIR) / "gpt2";

/// Loaded once: parsing 50,257 tokens and 50,000 merges takes a noticeable fraction of a second.
const Gpt2Tokenizer& gpt2() {
  static const Gpt2Tokenizer tokenizer = Gpt2Tokenizer::from_directory(kGpt2Dir);
  return tokenizer;
}

std::string utf8(char32_t c) {
  std::string s;
  if (c < 0x80) {
    s += static_cast<char>(c);
  } else if (c < 0x800) {
    s += static_cast<char>(0xC0 | (c >> 6)), s += static_cast<char>(0x80 | (c & 0x3F));
  } else {
    s += static_cast<char>(0xE0 | (c >> 12)), s += static_cast<char>(0x80 | ((c >> 6) & 0x3F));
    s += static_cast<char>(0x80 | (c & 0x3F));
  }
  return s;
}

TEST(Gpt2Tokenizer, LoadsOpenAIsVocabulary) {
  EXPECT_EQ(gpt2().vocab_size(), 50257);
  EXPECT_EQ(gpt2().num_merges(), 50000u);
  EXPECT_EQ(gpt2().end_of_text(), 50256);
}

TEST(Gpt2Tokenizer, SingleTokensAsEncoderJsonListsThem) {
  // Each pair is an entry of encoder.json ("Ġthe": 262 and so on, keys in the byte alphabet).
  const std::pair<std::string, int32_t> entries[] = {
      {"!", 0},
      {"Hello", 15496},
      {" world", 995},
      {" the", 262},
      {"\n", 198},
      {" ", 220},
      {std::string(1, '\0'), 188},
      {"\xFF", 187},
      {"\xAD", 255},
      {"<|endoftext|>", 50256},
  };
  for (const auto& [bytes, id] : entries) {
    EXPECT_EQ(gpt2().token_id(bytes), id) << bytes;
    EXPECT_EQ(gpt2().token_bytes(id), bytes) << id;
  }
  EXPECT_EQ(gpt2().token_id("  "), std::nullopt);  // GPT-2 has no two-space token
  EXPECT_EQ(gpt2().encode(" the"), (Tokens{262}));
  EXPECT_EQ(gpt2().encode("!"), (Tokens{0}));
}

TEST(Gpt2Tokenizer, EncodesAsTheReferenceImplementations) {
  // Computed with OpenAI's encoder.py algorithm (Python `regex` module) and, independently, with the
  // npm gpt-3-encoder 1.1.4 package; both gave these tokens.
  const std::pair<std::string, Tokens> cases[] = {
      {"Hello world", {15496, 995}},
      {"Hello, world!", {15496, 11, 995, 0}},
      {"The quick brown fox jumps over the lazy dog.", {464, 2068, 7586, 21831, 18045, 625, 262, 16931, 3290, 13}},
      {"I'm here, you're there, we'll see; they've said it's done, I'd go.",
       {40,  1101, 994, 11,  345, 821,  612, 11,  356,  1183, 766, 26,
        484, 1053, 531, 340, 338, 1760, 11,  314, 1549, 467,  13}},
      {"  leading and trailing  ", {220, 3756, 290, 25462, 220, 220}},
      {"a\n\nb", {64, 198, 198, 65}},
      {"tabs\tand\r\nCRLF", {8658, 82, 197, 392, 201, 198, 34, 7836, 37}},
      {"line1\n  indented\n", {1370, 16, 198, 220, 773, 4714, 198}},
      {"numbers 12345 and 3.14159", {77, 17024, 17031, 2231, 290, 513, 13, 1415, 19707}},
      {"naïve café résumé", {2616, 38776, 40304, 40560, 16345, 2634}},
      {"日本語のテキスト", {33768, 98, 17312, 105, 45739, 252, 5641, 24336, 25084, 43302}},
      {"Привет, мир!", {140, 253, 21169, 18849, 38857, 16843, 20375, 11, 12466, 120, 18849, 21169, 0}},
      {"emoji 🙂👍 done", {368, 31370, 32485, 41840, 235, 1760}},
      {"mixed\u00A0nbsp", {76, 2966, 1849, 77, 24145}},
      {"   ", {220, 220, 220}},
      {"don'T 'S", {9099, 6, 51, 705, 50}},
      {"<|endoftext|>", {27, 91, 437, 1659, 5239, 91, 29}},
      {"x\u2028y", {87, 447, 101, 88}},
      {"٣٤٥ Ⅻ ½", {149, 96, 149, 97, 149, 98, 2343, 227, 104, 25208}},
  };
  for (const auto& [text, tokens] : cases) {
    EXPECT_EQ(gpt2().encode(text), tokens) << text;
    EXPECT_EQ(gpt2().decode(tokens), text) << text;
  }
  // The cache must give the same answer the second time.
  EXPECT_EQ(gpt2().encode("Hello world"), (Tokens{15496, 995}));
  EXPECT_TRUE(gpt2().encode("").empty());
}

TEST(Gpt2Tokenizer, SpecialTokenOnlyWhenAsked) {
  EXPECT_EQ(gpt2().encode_with_special("<|endoftext|>"), (Tokens{50256}));
  EXPECT_EQ(gpt2().encode_with_special("Hello<|endoftext|> world<|endoftext|>"), (Tokens{15496, 50256, 995, 50256}));
  // Text on each side is encoded on its own: the space before the token does not join a word.
  EXPECT_EQ(gpt2().encode_with_special("a <|endoftext|>b"), (Tokens{64, 220, 50256, 65}));
  EXPECT_EQ(gpt2().decode(Tokens{15496, 50256, 995}), "Hello<|endoftext|> world");
}

TEST(Gpt2Tokenizer, RoundTripsAsciiUtf8AndWhitespace) {
  const std::string texts[] = {
      "",
      " ",
      "\n",
      "\t\t\n \r\n\r",
      "    indented code\n\tif (x) { return y; }\n",
      "trailing spaces   ",
      "  \n  \n",
      "ALL CAPS and MiXeD cAsE, with 'quotes' and \"double quotes\"",
      "Ünïcödé ñ ß Œ ﬁ",
      "中文，日本語、한국어。",
      "עברית ו العربية",
      "🙂👍🏽👨‍👩‍👧 flags 🇩🇪",
      "zero\u200Bwidth and\u00A0nbsp and\u3000ideographic",
      "\u0085\u2028\u2029",
      std::string("nul\0byte", 8),
  };
  for (const std::string& text : texts) {
    EXPECT_EQ(gpt2().decode(gpt2().encode(text)), text) << text;
  }
  for (char32_t c = 1; c < 0x3000; c += 7) {
    const std::string text = "x" + utf8(c) + " " + utf8(c) + utf8(c);
    EXPECT_EQ(gpt2().decode(gpt2().encode(text)), text) << "U+" << std::hex << static_cast<uint32_t>(c);
  }
}

TEST(Gpt2Tokenizer, RoundTripsArbitraryBytes) {
  // Invalid UTF-8 still encodes (byte-level BPE covers every byte) and decodes to the same bytes.
  std::mt19937 rng(20240611);
  std::uniform_int_distribution<int> byte(0, 255);
  for (int trial = 0; trial < 200; ++trial) {
    std::string text(1 + trial % 40, '\0');
    for (char& c : text) c = static_cast<char>(byte(rng));
    EXPECT_EQ(gpt2().decode(gpt2().encode(text)), text) << "trial " << trial;
  }
}

TEST(Gpt2Tokenizer, DecodeRejectsUnknownIds) {
  EXPECT_ERROR_CONTAINS(gpt2().decode(Tokens{15496, 50257}), "token id 50257 is not in the vocabulary");
  EXPECT_ERROR_CONTAINS(gpt2().decode(Tokens{-1}), "token id -1");
}

TEST(Gpt2Tokenizer, ByteAlphabet) {
  EXPECT_EQ(byte_to_unicode('A'), U'A');
  EXPECT_EQ(byte_to_unicode(' '), U'\u0120');   // 'Ġ'
  EXPECT_EQ(byte_to_unicode('\n'), U'\u010A');  // 'Ċ'
  EXPECT_EQ(byte_to_unicode(0x00), U'\u0100');
  EXPECT_EQ(byte_to_unicode(0xAD), U'\u0143');
  for (unsigned b = 0; b < 256; ++b) {
    EXPECT_EQ(unicode_to_byte(byte_to_unicode(static_cast<unsigned char>(b))), b);
  }
  EXPECT_EQ(unicode_to_byte(U' '), std::nullopt);
  EXPECT_EQ(unicode_to_byte(U'\u0144'), std::nullopt);
}

// ---- broken files -------------------------------------------------------------------------------

/// encoder.json text for the 256 byte tokens (id = byte) plus `extra` entries (already JSON).
std::string byte_encoder_json(const std::string& extra = "", int skip_byte = -1) {
  std::string json = "{";
  for (unsigned b = 0; b < 256; ++b) {
    if (static_cast<int>(b) == skip_byte) continue;
    std::string key = utf8(byte_to_unicode(static_cast<unsigned char>(b)));
    if (key == "\"" || key == "\\") key = "\\" + key;
    json += fmt::format("{}\"{}\": {}", json.size() > 1 ? ", " : "", key, b);
  }
  if (!extra.empty()) json += ", " + extra;
  return json + "}";
}

TEST(Gpt2TokenizerFiles, ASmallVocabularyMergesByRank) {
  // "a b" ranks before "b c", so "abc" goes a|b|c -> ab|c -> abc, never through "bc".
  const Gpt2Tokenizer u = Gpt2Tokenizer::from_strings(byte_encoder_json("\"ab\": 256, \"bc\": 257, \"abc\": 258"),
                                                      "#version: 0.2\na b\nb c\nab c\n");
  EXPECT_EQ(u.encode("abc"), (Tokens{258}));
  EXPECT_EQ(u.encode("bc"), (Tokens{257}));
  EXPECT_EQ(u.encode("cab"), (Tokens{'c', 256}));
  EXPECT_EQ(u.encode("abab"), (Tokens{256, 256}));
  // The reverse ranks give the reverse split: the lowest rank wins, not the leftmost pair.
  const Gpt2Tokenizer v =
      Gpt2Tokenizer::from_strings(byte_encoder_json("\"ab\": 256, \"bc\": 257"), "#version: 0.2\nb c\na b\n");
  EXPECT_EQ(v.encode("abc"), (Tokens{'a', 257}));
  EXPECT_EQ(u.vocab_size(), 259);
  EXPECT_EQ(u.end_of_text(), std::nullopt);
  EXPECT_ERROR_CONTAINS(u.encode_with_special("x"), "no \"<|endoftext|>\" token");
}

TEST(Gpt2TokenizerFiles, MissingFilesNameThePath) {
  EXPECT_ERROR_CONTAINS(
      Gpt2Tokenizer::from_files("/nonexistent/encoder.json", kGpt2Dir / "vocab.bpe"),
      "cannot read GPT-2 encoder file (encoder.json) '/nonexistent/encoder.json': No such file or directory");
  EXPECT_ERROR_CONTAINS(Gpt2Tokenizer::from_files(kGpt2Dir / "encoder.json", "/nonexistent/vocab.bpe"),
                        "merges file (vocab.bpe) '/nonexistent/vocab.bpe'");
  EXPECT_ERROR_CONTAINS(Gpt2Tokenizer::from_files(kGpt2Dir, kGpt2Dir / "vocab.bpe"), "not a regular file");
  EXPECT_ERROR_CONTAINS(Gpt2Tokenizer::from_directory("/nonexistent"), "/nonexistent/encoder.json");
}

TEST(Gpt2TokenizerFiles, SwappedFilesFailClearly) {
  // Read from disk, so the messages carry the real paths.
  const fs::path dir =
      fs::path(::testing::TempDir()) / fmt::format("colossal_tokenizer_{}", static_cast<long>(::getpid()));
  fs::create_directories(dir);
  fs::copy_file(kGpt2Dir / "vocab.bpe", dir / "encoder.json", fs::copy_options::overwrite_existing);
  fs::copy_file(kGpt2Dir / "encoder.json", dir / "vocab.bpe", fs::copy_options::overwrite_existing);
  EXPECT_ERROR_CONTAINS(Gpt2Tokenizer::from_directory(dir), (dir / "encoder.json").string() + ": not valid JSON");
  EXPECT_ERROR_CONTAINS(Gpt2Tokenizer::from_files(kGpt2Dir / "encoder.json", dir / "vocab.bpe"),
                        (dir / "vocab.bpe").string() + ":1: expected the header \"#version: 0.2\"");
  fs::remove_all(dir);
}

TEST(Gpt2TokenizerFiles, BrokenEncoderJson) {
  const std::string merges = "#version: 0.2\n";
  EXPECT_ERROR_CONTAINS(Gpt2Tokenizer::from_strings("{\"a\": 1,", merges), "encoder.json: not valid JSON");
  EXPECT_ERROR_CONTAINS(Gpt2Tokenizer::from_strings("[1, 2]", merges),
                        "non-empty JSON object of token -> id, got a "
                        "JSON array");
  EXPECT_ERROR_CONTAINS(Gpt2Tokenizer::from_strings("{}", merges), "got a JSON empty object");
  EXPECT_ERROR_CONTAINS(Gpt2Tokenizer::from_strings(byte_encoder_json("\"ab\": \"256\""), merges),
                        "token \"ab\" has id \"256\", expected an integer");
  EXPECT_ERROR_CONTAINS(Gpt2Tokenizer::from_strings(byte_encoder_json("\"ab\": 2.5"), merges),
                        "token \"ab\" has id 2.5, expected an integer");
  EXPECT_ERROR_CONTAINS(Gpt2Tokenizer::from_strings(byte_encoder_json("\"ab\": -3"), merges),
                        "token \"ab\" has id -3, outside [0, 16777216)");
  EXPECT_ERROR_CONTAINS(Gpt2Tokenizer::from_strings(byte_encoder_json("\"ab\": 99999999999"), merges),
                        "has id 99999999999, outside");
  EXPECT_ERROR_CONTAINS(Gpt2Tokenizer::from_strings(byte_encoder_json("\"ab\": 65"), merges), "id 65 is given to both");
  // A raw space is not in the byte alphabet (it is written 'Ġ'): not a GPT-2 vocabulary.
  EXPECT_ERROR_CONTAINS(Gpt2Tokenizer::from_strings(byte_encoder_json("\"a b\": 300"), merges),
                        "token \"a b\" has a character outside GPT-2's byte alphabet");
  EXPECT_ERROR_CONTAINS(Gpt2Tokenizer::from_strings(byte_encoder_json("", 'A'), merges), "no token for byte 0x41");
  EXPECT_ERROR_CONTAINS(Gpt2Tokenizer::from_strings(byte_encoder_json("", 0), merges),
                        "no token for byte 0x00 (\"\\u0100\" in the byte alphabet)");
}

TEST(Gpt2TokenizerFiles, BrokenVocabBpe) {
  const std::string encoder = byte_encoder_json("\"ab\": 256, \"abc\": 257, \"Ġt\": 258");
  EXPECT_ERROR_CONTAINS(Gpt2Tokenizer::from_strings(encoder, ""), "vocab.bpe: empty");
  EXPECT_ERROR_CONTAINS(Gpt2Tokenizer::from_strings(encoder, "a b\n"), "vocab.bpe:1: expected the header");
  EXPECT_ERROR_CONTAINS(Gpt2Tokenizer::from_strings(encoder, "#version: 0.2\na b\nab c d\n"),
                        "vocab.bpe:3: expected a merge, two tokens separated by one space, got \"ab c d\"");
  EXPECT_ERROR_CONTAINS(Gpt2Tokenizer::from_strings(encoder, "#version: 0.2\nab\n"), "vocab.bpe:2: expected a merge");
  EXPECT_ERROR_CONTAINS(Gpt2Tokenizer::from_strings(encoder, "#version: 0.2\na  b\n"), "vocab.bpe:2: expected a merge");
  // The merged token must exist, and so must both parts.
  EXPECT_ERROR_CONTAINS(Gpt2Tokenizer::from_strings(encoder, "#version: 0.2\na b\nb c\n"),
                        "vocab.bpe:3: merge \"b c\" needs the token \"bc\", which encoder.json does not have");
  EXPECT_ERROR_CONTAINS(Gpt2Tokenizer::from_strings(encoder, "#version: 0.2\nxy z\n"), "needs the token \"xy\"");
  EXPECT_ERROR_CONTAINS(Gpt2Tokenizer::from_strings(encoder, "#version: 0.2\na b\nĠ t\na b\n"),
                        "vocab.bpe:4: merge \"a b\" repeats line 2");
  // CRLF line ends and a missing final newline are fine.
  const Gpt2Tokenizer t = Gpt2Tokenizer::from_strings(encoder, "#version: 0.2\r\na b\r\nab c");
  EXPECT_EQ(t.encode("abc"), (Tokens{257}));
  EXPECT_EQ(t.num_merges(), 2u);
}

}  // namespace
}  // namespace colossal::text
