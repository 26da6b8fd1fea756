// Fuzzes the IDX reader behind a valid gzip stream: the bytes are compressed first, so every mutation
// reaches the IDX parser through read_file's zlib path. The first byte picks the MNIST dataset
// (images and labels files, both the same bytes) or read_idx alone; MnistDataset adds its own checks
// (u8 only, labels 0..9, counts that pair up).
#include <zlib.h>

#include <vector>

#include "colossal/data/mnist.h"  // read_idx, MnistDataset
#include "fuzz_support.h"         // TemporaryFile, accept_errors

namespace {

std::vector<uint8_t> gzip(const uint8_t* data, size_t size) {
  z_stream stream{};
  // 15 + 16: a gzip wrapper (header and CRC trailer) rather than zlib's.
  if (deflateInit2(&stream, Z_DEFAULT_COMPRESSION, Z_DEFLATED, 15 + 16, 8, Z_DEFAULT_STRATEGY) != Z_OK) std::abort();
  std::vector<uint8_t> out(deflateBound(&stream, size) + 32);
  stream.next_in = const_cast<uint8_t*>(data);
  stream.avail_in = static_cast<uInt>(size);
  stream.next_out = out.data();
  stream.avail_out = static_cast<uInt>(out.size());
  if (deflate(&stream, Z_FINISH) != Z_STREAM_END) std::abort();
  out.resize(stream.total_out);
  deflateEnd(&stream);
  return out;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace colossal;
  if (size == 0) return 0;
  const bool as_dataset = data[0] & 1;
  const std::vector<uint8_t> compressed = gzip(data + 1, size - 1);
  const fuzz::TemporaryFile file("idx.gz", compressed);
  return fuzz::accept_errors([&] {
    if (as_dataset) {
      const data::MnistDataset dataset(file.path(), file.path());
      if (dataset.size() > 0) {
        dataset.get(0);
        dataset.get(dataset.size() - 1);
      }
    } else {
      data::read_idx(file.path());
    }
  });
}
