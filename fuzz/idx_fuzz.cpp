// Fuzzes the IDX reader (data/mnist.h, read_idx) on the bytes as a file: raw IDX, and gzip streams
// (a file starting 1f 8b is decompressed whatever its name), corrupt ones included.
#include "colossal/data/mnist.h"  // read_idx
#include "fuzz_support.h"         // TemporaryFile, accept_errors

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace colossal;
  const fuzz::TemporaryFile file("idx", {data, size});
  return fuzz::accept_errors([&] {
    const Tensor t = data::read_idx(file.path());
    if (t.numel() > 0) {
      volatile uint8_t last = static_cast<const uint8_t*>(t.raw_data())[t.nbytes() - 1];
      (void)last;
    }
  });
}
