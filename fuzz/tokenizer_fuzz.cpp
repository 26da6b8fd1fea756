// Fuzzes the GPT-2 BPE loader (text/tokenizer.h, from_strings: what from_files reads). The input is
// encoder.json, a NUL byte, vocab.bpe, a NUL byte, and a text; a tokenizer that loads must encode the
// text and decode it back to the same bytes (with and without <|endoftext|> as a special token).
#include <string>
#include <vector>

#include "colossal/text/tokenizer.h"  // Gpt2Tokenizer
#include "fuzz_support.h"             // accept_errors, property_failed

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace colossal;
  const std::string_view input = fuzz::as_text(data, size);
  const size_t first = input.find('\0');
  if (first == std::string_view::npos) return 0;
  const std::string_view encoder = input.substr(0, first);
  std::string_view rest = input.substr(first + 1);
  const size_t second = rest.find('\0');
  const std::string_view vocab = rest.substr(0, second);
  const std::string_view text = second == std::string_view::npos ? std::string_view() : rest.substr(second + 1);
  return fuzz::accept_errors([&] {
    const text::Gpt2Tokenizer tokenizer = text::Gpt2Tokenizer::from_strings(encoder, vocab);
    const std::vector<int32_t> ids = tokenizer.encode(text);
    if (tokenizer.decode(ids) != text) fuzz::property_failed("decode(encode(text)) != text");
    const std::vector<int32_t> special = tokenizer.encode_with_special(text);
    if (tokenizer.decode(special) != text) fuzz::property_failed("decode(encode_with_special(text)) != text");
    for (const int32_t id : ids) {
      if (id < 0 || id >= tokenizer.vocab_size()) fuzz::property_failed("encode gave an id outside the vocabulary");
    }
  });
}
