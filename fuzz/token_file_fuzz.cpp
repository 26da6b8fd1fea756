// Fuzzes the token-file reader (data/token_file.h), flat and with llm.c's header. The first byte picks
// the options (sequence length 1 to 8, random or consecutive windows, a vocabulary check, i32 or i64,
// one pass or 5 windows); the rest is the file. Accepted files have a few windows read.
#include <algorithm>

#include "colossal/data/token_file.h"  // TokenFileDataset
#include "fuzz_support.h"              // TemporaryFile, accept_errors

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace colossal;
  if (size == 0) return 0;
  const uint8_t choice = data[0];
  data::TokenFileOptions options;
  options.sequence_length = 1 + (choice & 7);
  options.random_windows = (choice >> 3) & 1;
  options.vocab_size = (choice >> 4) & 1 ? 50257 : 0;
  options.dtype = (choice >> 5) & 1 ? DType::i32 : DType::i64;
  options.num_samples = (choice >> 6) & 1 ? 5 : 0;
  options.seed = choice >> 7;
  const fuzz::TemporaryFile file("tokens.bin", {data + 1, size - 1});
  return fuzz::accept_errors([&] {
    data::TokenFileDataset dataset(file.path(), options);
    for (int64_t epoch = 0; epoch < 2; ++epoch) {
      dataset.set_epoch(epoch);
      for (int64_t i = 0; i < std::min<int64_t>(dataset.size(), 4); ++i) {
        const int64_t start = dataset.window_start(i);
        if (start < 0 || start + options.sequence_length + 1 > dataset.num_tokens()) {
          fuzz::property_failed("a window starts outside the file's tokens");
        }
        dataset.get(i);
      }
      if (dataset.size() > 0) dataset.get(dataset.size() - 1);
    }
  });
}
