// Inputs that found a bug in the GPT-2 BPE loader (fuzz/tokenizer_fuzz.cpp), kept as ordinary tests:
// each must give a clear error naming the file at fault.
#include <gtest/gtest.h>

#include "colossal/text/tokenizer.h"
#include "gradcheck.h"  // EXPECT_ERROR_CONTAINS

namespace colossal::text {
namespace {

// A number too large for a double makes nlohmann::json throw out_of_range, not parse_error: it escaped
// from_strings as a foreign exception (the safetensors fuzz target found it; the loader had the same).
TEST(FuzzRegressions, EncoderJsonNumberOverflowIsAJsonError) {
  EXPECT_ERROR_CONTAINS(Gpt2Tokenizer::from_strings(R"({"a": 1E400})", "#version: 0.2\n"),
                        "encoder.json: not valid JSON");
  EXPECT_ERROR_CONTAINS(Gpt2Tokenizer::from_strings(R"({"a": 1E400})", "#version: 0.2\n"), "number overflow");
}

}  // namespace
}  // namespace colossal::text
