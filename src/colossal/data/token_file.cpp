// Token files: header detection, size checks and window reads.
#include "colossal/data/token_file.h"

#include <cstring>
#include <vector>

#include "colossal/core/error.h"
#include "colossal/data/random.h"

namespace colossal::data {

TokenFileDataset::TokenFileDataset(const std::string& path, TokenFileOptions options)
    : file_(path, "token file"), options_(options) {
  const int64_t T = options_.sequence_length;
  COLOSSAL_CHECK(T >= 1, "TokenFileDataset: sequence_length must be at least 1, got {}", T);
  COLOSSAL_CHECK(options_.dtype == DType::i64 || options_.dtype == DType::i32,
                 "TokenFileDataset: dtype must be i64 or i32 (embedding indices), got {}", options_.dtype);
  COLOSSAL_CHECK(options_.num_samples >= 0, "TokenFileDataset: num_samples must be 0 (one pass) or more, got {}",
                 options_.num_samples);
  const int64_t size = file_.size();
  // llm.c files start with int32 20240520, whose low half (0xd888 = 55432) is no GPT-2 token, so a
  // flat GPT-2 file can never be mistaken for one.
  int32_t header[3] = {0, 0, 0};
  if (size >= 12) file_.read_at(0, header, 12, "the header");
  if (header[0] == kLlmcMagic) {
    COLOSSAL_CHECK(size >= kLlmcHeaderBytes,
                   "{}: has the llm.c magic 20240520 but is only {} bytes, shorter than the {}-byte header", path, size,
                   kLlmcHeaderBytes);
    COLOSSAL_CHECK(header[1] == 1,
                   "{}: llm.c token file version {} at offset 4; only version 1 (uint16 GPT-2 tokens) is supported",
                   path, header[1]);
    data_offset_ = kLlmcHeaderBytes;
    num_tokens_ = header[2];
    const int64_t expected = kLlmcHeaderBytes + 2 * num_tokens_;
    COLOSSAL_CHECK(num_tokens_ >= 0 && size == expected,
                   "{}: the llm.c header (offset 8) declares {} tokens, which needs {} bytes, but the file has {} ({})",
                   path, num_tokens_, expected, size, size < expected ? "truncated" : "trailing bytes");
  } else {
    COLOSSAL_CHECK(size % 2 == 0,
                   "{}: {} bytes is not a whole number of 2-byte tokens; the last token at offset {} is cut short "
                   "(truncated file?)",
                   path, size, size - 1);
    num_tokens_ = size / 2;
  }
  COLOSSAL_CHECK(num_tokens_ >= T + 1, "{}: has {} tokens, too few for one window of sequence_length + 1 = {} tokens",
                 path, num_tokens_, T + 1);
  num_samples_ = options_.num_samples > 0 ? options_.num_samples : (num_tokens_ - 1) / T;
  if (!options_.random_windows) {
    COLOSSAL_CHECK(num_samples_ <= (num_tokens_ - 1) / T,
                   "{}: {} consecutive windows of {} + 1 tokens need {} tokens, but the file has {}", path,
                   num_samples_, T, num_samples_ * T + 1, num_tokens_);
  }
}

int64_t TokenFileDataset::window_start(int64_t index) const {
  check_index(index, num_samples_, "TokenFileDataset");
  const int64_t T = options_.sequence_length;
  if (!options_.random_windows) return index * T;
  core::Generator generator = derive_generator(options_.seed, RandomStream::token_window, epoch_.load(), index);
  Rng rng(generator);
  return rng.integer(0, num_tokens_ - T);  // start + T + 1 <= num_tokens
}

Example TokenFileDataset::get(int64_t index) const {
  const int64_t T = options_.sequence_length;
  const int64_t start = window_start(index);
  std::vector<uint16_t> tokens(static_cast<size_t>(T + 1));
  const int64_t offset = data_offset_ + 2 * start;
  file_.read_at(offset, tokens.data(), 2 * (T + 1),
                fmt::format("window {} (tokens {} to {})", index, start, start + T));
  if (options_.vocab_size > 0) {
    for (int64_t i = 0; i <= T; ++i) {
      COLOSSAL_CHECK(tokens[static_cast<size_t>(i)] < options_.vocab_size,
                     "{}: token {} at offset {} is {}, outside the vocabulary (size {}); is this the right tokenizer's "
                     "file?",
                     file_.path(), start + i, offset + 2 * i, tokens[static_cast<size_t>(i)], options_.vocab_size);
    }
  }
  Tensor input = core::empty({T}, options_.dtype);
  Tensor target = core::empty({T}, options_.dtype);
  auto fill = [&]<class I>(I* in, I* out) {
    for (int64_t i = 0; i < T; ++i) {
      in[i] = static_cast<I>(tokens[static_cast<size_t>(i)]);
      out[i] = static_cast<I>(tokens[static_cast<size_t>(i + 1)]);
    }
  };
  if (options_.dtype == DType::i64) {
    fill(input.data<int64_t>(), target.data<int64_t>());
  } else {
    fill(input.data<int32_t>(), target.data<int32_t>());
  }
  return {input, target};
}

}  // namespace colossal::data
