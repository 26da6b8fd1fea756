// Inputs the fuzz targets (fuzz/, tools/fuzz) found a bug with, kept as ordinary tests: each must now
// give a clear error naming the offending field. The bytes are the crashing inputs as found (minimised
// where noted).
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "colossal/data/mnist.h"
#include "data_test_util.h"

namespace colossal::data {
namespace {

using testing::expect_error;
using testing::write_bytes;
using testing::write_gzip;

class FuzzRegressions : public testing::TempDirTest {};

// fuzz_idx_gzip: four sizes whose product overflows int64 (4294967295 * ...): signed overflow in
// read_idx before its size check ran.
TEST_F(FuzzRegressions, IdxSizesWhoseProductOverflowsAreRefused) {
  const std::vector<uint8_t> bytes = {0x00, 0x00, 0x08, 0x03, 0x00, 0x00, 0x00, 0xff, 0xff, 0x00,
                                      0x00, 0x02, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff,
                                      0x04, 0x05, 0x06, 0x07, 0x08, 0x09, 0x0a, 0x0b};
  write_gzip(path("overflow.idx.gz"), bytes);
  expect_error([&] { read_idx(path("overflow.idx.gz")); },
               {"overflow.idx.gz", "dimension 2 (offset 12) is 4294967295", "implausibly large"});
  expect_error([&] { MnistDataset(path("overflow.idx.gz"), path("overflow.idx.gz")); },
               {"overflow.idx.gz", "implausibly large"});
}

// fuzz_idx: a zero size among huge ones: 0 elements, so the data-size check passed, and the tensor's
// strides (the product of the other sizes) overflowed int64 in core::empty.
TEST_F(FuzzRegressions, IdxZeroSizeAmongHugeSizesIsRefused) {
  const std::vector<uint8_t> bytes = {0x00, 0x00, 0x09, 0x09, 0x01, 0x00, 0x88, 0x00, 0x00, 0x00,
                                      0x09, 0x01, 0x00, 0x00, 0x00, 0x00, 0x03, 0xff, 0xff, 0x00,
                                      0x01, 0x01, 0x00, 0x88, 0x00, 0x00, 0x00, 0x09, 0x01, 0x00,
                                      0x00, 0x00, 0x00, 0x03, 0xff, 0xff, 0x00, 0x01, 0x00, 0x01};
  write_bytes(path("zero.idx"), bytes);
  expect_error([&] { read_idx(path("zero.idx")); },
               {"zero.idx", "dimension 3 (offset 16) is 67108608", "implausibly large"});
  // An empty array with modest other sizes is still fine.
  write_bytes(path("empty.idx"), testing::idx_bytes(0x08, {0, 28, 28}, {}));
  EXPECT_EQ(read_idx(path("empty.idx")).shape(), (Shape{0, 28, 28}));
}

}  // namespace
}  // namespace colossal::data
