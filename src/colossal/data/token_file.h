// Token files for language-model training: GPT-2 token ids as little-endian uint16, either flat or
// with llm.c's 1024-byte header (int32 magic 20240520, version 1, token count). A sample is a window
// of sequence_length + 1 tokens; input is its first T tokens and target the last T (the next token
// at each position). Files are read on demand, so they may be far larger than memory.
#pragma once

#include <atomic>
#include <cstdint>
#include <memory>
#include <string>

#include "colossal/data/dataset.h"
#include "colossal/data/file_io.h"

namespace colossal::data {

struct TokenFileOptions {
  /// T: tokens per input (each window reads T + 1).
  int64_t sequence_length = 1024;
  /// true: window i of an epoch starts at a random position drawn from (seed, epoch, i);
  /// false: windows are consecutive and non-overlapping (window i starts at i * T), for evaluation.
  bool random_windows = true;
  uint64_t seed = 0;
  /// Windows per epoch; 0 means (num_tokens - 1) / T, one pass's worth of tokens.
  int64_t num_samples = 0;
  /// When > 0, every token read is checked to be below it (50257 for GPT-2); a bad token throws
  /// naming its offset.
  int64_t vocab_size = 0;
  /// Of input and target: i64 (default) or i32.
  DType dtype = DType::i64;
};

class TokenFileDataset final : public Dataset {
 public:
  static constexpr int32_t kLlmcMagic = 20240520;
  static constexpr int64_t kLlmcHeaderBytes = 256 * 4;

  TokenFileDataset(const std::string& path, TokenFileOptions options);

  int64_t size() const override { return num_samples_; }
  /// input [T] and target [T] in options.dtype.
  Example get(int64_t index) const override;
  void set_epoch(int64_t epoch) override { epoch_.store(epoch); }

  int64_t num_tokens() const { return num_tokens_; }
  /// Byte offset of the first token (1024 with an llm.c header, else 0).
  int64_t data_offset() const { return data_offset_; }
  /// Where window `index` of the current epoch starts, in tokens.
  int64_t window_start(int64_t index) const;

 private:
  RandomAccessFile file_;
  TokenFileOptions options_;
  int64_t data_offset_ = 0;
  int64_t num_tokens_ = 0;
  int64_t num_samples_ = 0;
  std::atomic<int64_t> epoch_{0};
};

}  // namespace colossal::data
