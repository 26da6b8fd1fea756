// Dataset readers on small files written here: IDX (plain and gzip, every type), MNIST-style
// directories, CIFAR-10 binary batches, token files (flat and llm.c), synthetic images, and every
// way a file can be broken, each giving an error that names the file, where and what was expected.
// Also the real Fashion-MNIST when Debian's dataset-fashion-mnist is installed.
#include <gtest/gtest.h>

#include <cstring>
#include <set>

#include "colossal/data/cifar10.h"
#include "colossal/data/file_io.h"
#include "colossal/data/mnist.h"
#include "colossal/data/synthetic.h"
#include "colossal/data/token_file.h"
#include "colossal/ops.h"
#include "data_test_util.h"

namespace colossal::data {
namespace {

namespace fs = std::filesystem;
using testing::expect_error;
using testing::idx_bytes;
using testing::read_bytes;
using testing::write_bytes;
using testing::write_gzip;

class Readers : public testing::TempDirTest {
 protected:
  /// A 5-image 2x3 MNIST-style pair (images i: pixel j = 10 i + j; label i = (3 i) % 10).
  void write_mnist(const std::string& dir, const std::string& prefix, bool gzip, int n = 5) {
    std::vector<uint8_t> pixels, labels;
    for (int i = 0; i < n; ++i) {
      for (int j = 0; j < 6; ++j) pixels.push_back(static_cast<uint8_t>(10 * i + j));
      labels.push_back(static_cast<uint8_t>((3 * i) % 10));
    }
    const auto images = idx_bytes(0x08, {static_cast<uint32_t>(n), 2, 3}, pixels);
    const auto label_file = idx_bytes(0x08, {static_cast<uint32_t>(n)}, labels);
    const std::string ext = gzip ? ".gz" : "";
    auto write = gzip ? write_gzip : write_bytes;
    write((fs::path(dir) / (prefix + "-images-idx3-ubyte" + ext)).string(), images);
    write((fs::path(dir) / (prefix + "-labels-idx1-ubyte" + ext)).string(), label_file);
  }
};

TEST_F(Readers, IdxReadsEveryTypeBigEndianPlainAndGzip) {
  write_bytes(path("u8.idx"), idx_bytes(0x08, {2, 3}, {1, 2, 3, 4, 5, 255}));
  Tensor u8 = read_idx(path("u8.idx"));
  EXPECT_EQ(u8.dtype(), DType::u8);
  EXPECT_EQ(u8.shape(), (Shape{2, 3}));
  EXPECT_EQ(u8.to_vector<int64_t>(), (std::vector<int64_t>{1, 2, 3, 4, 5, 255}));

  write_bytes(path("i8.idx"), idx_bytes(0x09, {2}, {0xff, 0x05}));
  EXPECT_EQ(read_idx(path("i8.idx")).to_vector<int64_t>(), (std::vector<int64_t>{-1, 5}));
  write_bytes(path("i16.idx"), idx_bytes(0x0B, {2}, {0xff, 0xfe, 0x01, 0x00}));
  EXPECT_EQ(read_idx(path("i16.idx")).to_vector<int64_t>(), (std::vector<int64_t>{-2, 256}));
  write_bytes(path("i32.idx"), idx_bytes(0x0C, {1}, {0x00, 0x01, 0x00, 0x02}));
  EXPECT_EQ(read_idx(path("i32.idx")).to_vector<int64_t>(), (std::vector<int64_t>{65538}));
  write_bytes(path("f32.idx"), idx_bytes(0x0D, {1}, {0x3f, 0xc0, 0x00, 0x00}));  // 1.5f big-endian
  Tensor f32 = read_idx(path("f32.idx"));
  EXPECT_EQ(f32.dtype(), DType::f32);
  EXPECT_EQ(f32.to_vector<float>()[0], 1.5f);
  write_bytes(path("f64.idx"), idx_bytes(0x0E, {1}, {0xc0, 0x04, 0, 0, 0, 0, 0, 0}));  // -2.5 big-endian
  EXPECT_EQ(read_idx(path("f64.idx")).to_vector<double>()[0], -2.5);

  write_gzip(path("u8.idx.gz"), idx_bytes(0x08, {2, 3}, {1, 2, 3, 4, 5, 255}));
  EXPECT_TRUE(is_gzip_file(path("u8.idx.gz")));
  EXPECT_FALSE(is_gzip_file(path("u8.idx")));
  EXPECT_EQ(read_idx(path("u8.idx.gz")).to_vector<int64_t>(), u8.to_vector<int64_t>());
}

TEST_F(Readers, IdxRejectsBrokenFilesNamingFileOffsetAndExpectation) {
  expect_error([&] { read_idx(path("missing.idx")); }, {"missing.idx", "No such file"});
  write_bytes(path("short.idx"), {0, 0});
  expect_error([&] { read_idx(path("short.idx")); }, {"short.idx", "2 bytes", "magic"});
  write_bytes(path("magic.idx"), {0x50, 0x4b, 0x03, 0x04, 0, 0, 0, 0});
  expect_error([&] { read_idx(path("magic.idx")); }, {"magic.idx", "bad magic number at offset 0", "50 4b 03 04"});
  write_bytes(path("type.idx"), idx_bytes(0x07, {1}, {0}));
  expect_error([&] { read_idx(path("type.idx")); }, {"type.idx", "unknown IDX data type 0x07", "offset 2"});
  write_bytes(path("rank0.idx"), {0, 0, 8, 0});
  expect_error([&] { read_idx(path("rank0.idx")); }, {"rank0.idx", "0 dimensions"});
  write_bytes(path("header.idx"), {0, 0, 8, 3, 0, 0, 0, 5, 0, 0});
  expect_error([&] { read_idx(path("header.idx")); }, {"header.idx", "truncated header", "bytes 4 to 16", "10 bytes"});
  write_bytes(path("rank.idx"), idx_bytes(0x08, {2}, {1, 2}));
  expect_error([&] { read_idx(path("rank.idx"), 3); }, {"rank.idx", "declares 1 dimensions", "expected 3"});
  // 3 records of 2x2; the third is cut after one byte.
  write_bytes(path("data.idx"), idx_bytes(0x08, {3, 2, 2}, std::vector<uint8_t>(9, 7)));
  expect_error(
      [&] { read_idx(path("data.idx")); },
      {"data.idx", "truncated", "need 12 data bytes after the 16-byte header, found 9", "record 2", "offset 24"});
  write_bytes(path("trailing.idx"), idx_bytes(0x08, {2}, {1, 2, 3}));
  expect_error([&] { read_idx(path("trailing.idx")); }, {"trailing.idx", "1 unexpected trailing bytes at offset 10"});
}

TEST_F(Readers, CorruptAndTruncatedGzipGiveClearErrors) {
  std::vector<uint8_t> payload = idx_bytes(0x08, {4000}, testing::test_pixels(4000, 3));
  write_gzip(path("good.gz"), payload);
  std::vector<uint8_t> gz = read_bytes(path("good.gz"));
  ASSERT_GT(gz.size(), 100u);

  std::vector<uint8_t> truncated(gz.begin(), gz.begin() + static_cast<std::ptrdiff_t>(gz.size() / 2));
  write_bytes(path("truncated.gz"), truncated);
  expect_error([&] { read_idx(path("truncated.gz")); }, {"truncated.gz", "truncated or corrupt", "decompressed bytes"});

  std::vector<uint8_t> corrupt = gz;
  for (size_t i = 20; i < 60; ++i) corrupt[i] ^= 0x5a;  // inside the deflate stream
  write_bytes(path("corrupt.gz"), corrupt);
  expect_error([&] { read_idx(path("corrupt.gz")); }, {"corrupt.gz", "corrupt"});

  std::vector<uint8_t> bad_crc = gz;
  bad_crc[bad_crc.size() - 8] ^= 0xff;  // the CRC-32 in the trailer
  write_bytes(path("crc.gz"), bad_crc);
  expect_error([&] { read_idx(path("crc.gz")); }, {"crc.gz", "corrupt"});
}

TEST_F(Readers, MnistDatasetReadsADirectoryOfGzipOrPlainFiles) {
  write_mnist(dir_.string(), "train", /*gzip=*/true);
  write_mnist(dir_.string(), "t10k", /*gzip=*/false, 3);
  MnistDataset train(dir_.string(), Split::train);
  ASSERT_EQ(train.size(), 5);
  Example e = train.get(4);
  EXPECT_EQ(e.input.dtype(), DType::u8);
  EXPECT_EQ(e.input.shape(), (Shape{1, 2, 3}));
  EXPECT_EQ(e.input.to_vector<int64_t>(), (std::vector<int64_t>{40, 41, 42, 43, 44, 45}));
  EXPECT_EQ(e.target.dtype(), DType::i64);
  EXPECT_EQ(e.target.dim(), 0);
  EXPECT_EQ(e.target.item<int64_t>(), 2);
  MnistDataset test(dir_.string(), Split::test);
  EXPECT_EQ(test.size(), 3);
  EXPECT_EQ(test.get(1).target.item<int64_t>(), 3);
  expect_error([&] { train.get(5); }, {"index 5 is out of range", "5 samples"});
  expect_error([&] { MnistDataset(path("nowhere"), Split::train); },
               {"nowhere/train-images-idx3-ubyte.gz", "dataset-fashion-mnist"});
}

TEST_F(Readers, MnistDatasetChecksPairingAndLabels) {
  write_bytes(path("images"), idx_bytes(0x08, {2, 1, 1}, {1, 2}));
  write_bytes(path("labels3"), idx_bytes(0x08, {3}, {1, 2, 3}));
  expect_error([&] { MnistDataset(path("images"), path("labels3")); }, {"has 2 images", "has 3 labels"});
  write_bytes(path("labels_bad"), idx_bytes(0x08, {2}, {1, 12}));
  expect_error([&] { MnistDataset(path("images"), path("labels_bad")); },
               {"labels_bad", "label 12 of record 1", "offset 9", "0..9"});
  write_bytes(path("images_f32"), idx_bytes(0x0D, {1, 1, 1}, {0, 0, 0, 0}));
  write_bytes(path("labels1"), idx_bytes(0x08, {1}, {0}));
  expect_error([&] { MnistDataset(path("images_f32"), path("labels1")); }, {"images_f32", "unsigned bytes"});
}

std::vector<uint8_t> cifar_records(int n, int label_offset = 0) {
  std::vector<uint8_t> out;
  for (int r = 0; r < n; ++r) {
    out.push_back(static_cast<uint8_t>((r + label_offset) % 10));
    for (int j = 0; j < 3072; ++j) out.push_back(static_cast<uint8_t>((r * 7 + j) & 0xff));
  }
  return out;
}

TEST_F(Readers, Cifar10ReadsRecordsAsChwImagesWithLabels) {
  fs::create_directories(dir_ / "cifar-10-batches-bin");
  for (int b = 1; b <= 5; ++b) {
    write_bytes((dir_ / "cifar-10-batches-bin" / fmt::format("data_batch_{}.bin", b)).string(), cifar_records(2, b));
  }
  write_bytes((dir_ / "cifar-10-batches-bin" / "test_batch.bin").string(), cifar_records(3));
  Cifar10Dataset train(dir_.string(), Split::train);  // the archive's parent folder works too
  ASSERT_EQ(train.size(), 10);
  Example e = train.get(3);  // batch 2, record 1: label (1 + 2) % 10
  EXPECT_EQ(e.target.item<int64_t>(), 3);
  ASSERT_EQ(e.input.shape(), (Shape{3, 32, 32}));
  const std::vector<int64_t> px = e.input.to_vector<int64_t>();
  EXPECT_EQ(px[0], 7);                     // red (0, 0)
  EXPECT_EQ(px[1024], (7 + 1024) & 0xff);  // green plane starts at byte 1024 of the image
  EXPECT_EQ(px[3071], (7 + 3071) & 0xff);
  Cifar10Dataset test((dir_ / "cifar-10-batches-bin").string(), Split::test);
  EXPECT_EQ(test.size(), 3);
  EXPECT_EQ(test.get(2).target.item<int64_t>(), 2);
  EXPECT_EQ(Cifar10Dataset::class_names()[9], "truck");
}

TEST_F(Readers, Cifar10RejectsMissingTruncatedAndForeignFiles) {
  expect_error([&] { Cifar10Dataset(dir_.string(), Split::test); }, {"test_batch.bin", "not found", "binary version"});
  std::vector<uint8_t> records = cifar_records(3);
  records.resize(records.size() - 100);
  write_bytes(path("test_batch.bin"), records);
  expect_error([&] { Cifar10Dataset(dir_.string(), Split::test); },
               {"test_batch.bin", "truncated", "3073-byte records", "record 2 at offset 6146 has only 2973 bytes"});
  records = cifar_records(3);
  records[3073] = 57;  // record 1's label
  write_bytes(path("test_batch.bin"), records);
  expect_error([&] { Cifar10Dataset(dir_.string(), Split::test); },
               {"test_batch.bin", "record 1 (offset 3073) has label 57", "0..9"});
  write_bytes(path("test_batch.bin"), {});
  expect_error([&] { Cifar10Dataset(dir_.string(), Split::test); }, {"test_batch.bin", "empty"});
}

std::vector<uint8_t> flat_tokens(int n) {
  std::vector<uint8_t> out;
  for (int i = 0; i < n; ++i) {
    const auto t = static_cast<uint16_t>(1000 + i);
    out.push_back(static_cast<uint8_t>(t & 0xff));
    out.push_back(static_cast<uint8_t>(t >> 8));
  }
  return out;
}

std::vector<uint8_t> llmc_file(int n, int32_t declared) {
  std::vector<int32_t> header(256, 0);
  header[0] = 20240520;
  header[1] = 1;
  header[2] = declared;
  std::vector<uint8_t> out(1024);
  std::memcpy(out.data(), header.data(), 1024);
  const std::vector<uint8_t> tokens = flat_tokens(n);
  out.insert(out.end(), tokens.begin(), tokens.end());
  return out;
}

TEST_F(Readers, TokenFileConsecutiveWindowsAreShiftedByOne) {
  write_bytes(path("tokens.bin"), flat_tokens(23));
  TokenFileDataset ds(path("tokens.bin"), {.sequence_length = 5, .random_windows = false});
  EXPECT_EQ(ds.num_tokens(), 23);
  EXPECT_EQ(ds.size(), 4);  // (23 - 1) / 5
  Example e = ds.get(2);
  EXPECT_EQ(e.input.dtype(), DType::i64);
  EXPECT_EQ(e.input.to_vector<int64_t>(), (std::vector<int64_t>{1010, 1011, 1012, 1013, 1014}));
  EXPECT_EQ(e.target.to_vector<int64_t>(), (std::vector<int64_t>{1011, 1012, 1013, 1014, 1015}));
  TokenFileDataset i32(path("tokens.bin"), {.sequence_length = 5, .random_windows = false, .dtype = DType::i32});
  EXPECT_EQ(i32.get(0).input.dtype(), DType::i32);
}

TEST_F(Readers, TokenFileRandomWindowsDependOnSeedEpochAndIndexOnly) {
  write_bytes(path("tokens.bin"), flat_tokens(1000));
  TokenFileOptions options{.sequence_length = 8, .random_windows = true, .seed = 7, .num_samples = 50};
  TokenFileDataset a(path("tokens.bin"), options);
  TokenFileDataset b(path("tokens.bin"), options);
  ASSERT_EQ(a.size(), 50);
  std::set<int64_t> starts;
  for (int64_t i = 0; i < 50; ++i) {
    const int64_t start = a.window_start(i);
    starts.insert(start);
    ASSERT_GE(start, 0);
    ASSERT_LE(start + 9, 1000);
    Example e = a.get(i);
    EXPECT_EQ(e.input.to_vector<int64_t>()[0], 1000 + start);
    EXPECT_EQ(e.target.to_vector<int64_t>()[7], 1000 + start + 8);
  }
  EXPECT_GT(starts.size(), 40u);  // 50 draws from 992 positions: collisions are rare
  b.get(49);                      // order of calls does not matter
  EXPECT_EQ(b.window_start(3), a.window_start(3));
  b.set_epoch(1);
  int same = 0;
  for (int64_t i = 0; i < 50; ++i) same += b.window_start(i) == a.window_start(i);
  EXPECT_LT(same, 5);
}

TEST_F(Readers, TokenFileReadsTheLlmcHeaderAndRejectsBrokenFiles) {
  write_bytes(path("llmc.bin"), llmc_file(30, 30));
  TokenFileDataset ds(path("llmc.bin"), {.sequence_length = 4, .random_windows = false});
  EXPECT_EQ(ds.data_offset(), 1024);
  EXPECT_EQ(ds.num_tokens(), 30);
  EXPECT_EQ(ds.get(0).input.to_vector<int64_t>()[0], 1000);

  write_bytes(path("llmc_short.bin"), llmc_file(20, 30));
  expect_error([&] { TokenFileDataset(path("llmc_short.bin"), {.sequence_length = 4}); },
               {"llmc_short.bin", "declares 30 tokens", "needs 1084 bytes", "1064", "truncated"});
  std::vector<uint8_t> v2 = llmc_file(30, 30);
  v2[4] = 2;
  write_bytes(path("llmc_v2.bin"), v2);
  expect_error([&] { TokenFileDataset(path("llmc_v2.bin"), {.sequence_length = 4}); }, {"llmc_v2.bin", "version 2"});
  std::vector<uint8_t> odd = flat_tokens(10);
  odd.push_back(1);
  write_bytes(path("odd.bin"), odd);
  expect_error([&] { TokenFileDataset(path("odd.bin"), {.sequence_length = 4}); },
               {"odd.bin", "21 bytes is not a whole number of 2-byte tokens", "offset 20"});
  write_bytes(path("tiny.bin"), flat_tokens(4));
  expect_error([&] { TokenFileDataset(path("tiny.bin"), {.sequence_length = 4}); },
               {"tiny.bin", "has 4 tokens", "5 tokens"});
  expect_error([&] { TokenFileDataset(path("absent.bin"), {.sequence_length = 4}); }, {"absent.bin", "No such file"});
  write_bytes(path("vocab.bin"), flat_tokens(30));
  TokenFileDataset vocab(path("vocab.bin"), {.sequence_length = 4, .random_windows = false, .vocab_size = 1010});
  EXPECT_NO_THROW(vocab.get(1));  // tokens 1004..1008
  expect_error([&] { vocab.get(2); }, {"vocab.bin", "token 10 at offset 20 is 1010", "vocabulary (size 1010)"});
}

TEST(Synthetic, ImagesAndLabelsArePureFunctionsOfSeedAndIndex) {
  SyntheticImageDataset a({.size = 100, .image_shape = {3, 4, 5}, .num_classes = 7, .seed = 3});
  SyntheticImageDataset b({.size = 100, .image_shape = {3, 4, 5}, .num_classes = 7, .seed = 3});
  SyntheticImageDataset c({.size = 100, .image_shape = {3, 4, 5}, .num_classes = 7, .seed = 4});
  std::set<int64_t> labels;
  double sum = 0, sum_sq = 0;
  for (int64_t i = 0; i < 100; ++i) {
    Example ea = a.get(i), eb = b.get(i);
    EXPECT_EQ(ea.input.to_vector<float>(), eb.input.to_vector<float>());
    EXPECT_EQ(ea.target.item<int64_t>(), eb.target.item<int64_t>());
    labels.insert(ea.target.item<int64_t>());
    for (float v : ea.input.to_vector<float>()) sum += v, sum_sq += v * v;
  }
  EXPECT_NE(a.get(0).input.to_vector<float>(), c.get(0).input.to_vector<float>());
  EXPECT_EQ(labels.size(), 7u);
  // 6000 standard normal draws: the mean's standard error is 1/sqrt(6000) = 0.013, so 0.06 is 4.6
  // sigma; the variance's is sqrt(2/6000) = 0.018, so 0.09 is 5 sigma.
  EXPECT_NEAR(sum / 6000, 0.0, 0.06);
  EXPECT_NEAR(sum_sq / 6000, 1.0, 0.09);
  SyntheticImageDataset u8({.size = 2, .image_shape = {1, 2, 2}, .dtype = DType::u8});
  EXPECT_EQ(u8.get(1).input.dtype(), DType::u8);
}

TEST(FashionMnist, TheDebianPackageLoadsWhenInstalled) {
  const std::optional<std::string> dir = find_fashion_mnist();
  if (!dir) GTEST_SKIP() << "Fashion-MNIST not installed (apt-get install dataset-fashion-mnist)";
  MnistDataset train(*dir, Split::train);
  MnistDataset test(*dir, Split::test);
  ASSERT_EQ(train.size(), 60000);
  ASSERT_EQ(test.size(), 10000);
  EXPECT_EQ(train.images().shape(), (Shape{60000, 28, 28}));
  // Fashion-MNIST is balanced: 6000 training and 1000 test images per class.
  std::vector<int64_t> counts(10, 0);
  for (int64_t label : train.labels().to_vector<int64_t>()) ++counts[static_cast<size_t>(label)];
  EXPECT_EQ(counts, std::vector<int64_t>(10, 6000));
  EXPECT_EQ(train.get(0).target.item<int64_t>(), 9);  // the first training image is an ankle boot
}

}  // namespace
}  // namespace colossal::data
