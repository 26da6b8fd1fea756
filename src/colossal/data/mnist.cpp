// IDX parsing and the MNIST-style dataset.
#include "colossal/data/mnist.h"

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <filesystem>

#include "colossal/core/error.h"
#include "colossal/data/file_io.h"

namespace colossal::data {
namespace {

uint32_t read_be32(const uint8_t* p) {
  return (uint32_t{p[0]} << 24) | (uint32_t{p[1]} << 16) | (uint32_t{p[2]} << 8) | uint32_t{p[3]};
}

struct IdxType {
  uint8_t code;
  const char* name;
  int64_t bytes;
  DType dtype;
};
constexpr IdxType kIdxTypes[] = {
    {0x08, "unsigned byte", 1, DType::u8}, {0x09, "signed byte", 1, DType::i32}, {0x0B, "short", 2, DType::i32},
    {0x0C, "int", 4, DType::i32},          {0x0D, "float", 4, DType::f32},       {0x0E, "double", 8, DType::f64},
};

template <class T>
void decode_values(const uint8_t* src, int64_t count, int64_t width, uint8_t code, T* dst) {
  for (int64_t i = 0; i < count; ++i) {
    const uint8_t* p = src + i * width;
    if (code == 0x08) {
      dst[i] = static_cast<T>(p[0]);
    } else if (code == 0x09) {
      dst[i] = static_cast<T>(static_cast<int8_t>(p[0]));
    } else if (code == 0x0B) {
      dst[i] = static_cast<T>(static_cast<int16_t>((p[0] << 8) | p[1]));
    } else if (code == 0x0C) {
      dst[i] = static_cast<T>(static_cast<int32_t>(read_be32(p)));
    } else if (code == 0x0D) {
      const uint32_t bits = read_be32(p);
      float f;
      std::memcpy(&f, &bits, 4);
      dst[i] = static_cast<T>(f);
    } else {
      const uint64_t bits = (uint64_t{read_be32(p)} << 32) | read_be32(p + 4);
      double d;
      std::memcpy(&d, &bits, 8);
      dst[i] = static_cast<T>(d);
    }
  }
}

}  // namespace

Tensor read_idx(const std::string& path, int64_t expected_rank) {
  const std::vector<uint8_t> bytes = read_file(path, "IDX file");
  const bool gz = is_gzip_file(path);
  const std::string where = gz ? path + " (after gzip decompression)" : path;
  COLOSSAL_CHECK(bytes.size() >= 4,
                 "{}: {} bytes long, too short for the 4-byte IDX magic number (0x00 0x00 <type> <rank>)", where,
                 bytes.size());
  COLOSSAL_CHECK(bytes[0] == 0 && bytes[1] == 0,
                 "{}: bad magic number at offset 0: expected 0x00 0x00 <type> <rank>, found {:02x} {:02x} {:02x} "
                 "{:02x}; this is not an IDX file",
                 where, bytes[0], bytes[1], bytes[2], bytes[3]);
  const IdxType* type = nullptr;
  for (const IdxType& t : kIdxTypes) {
    if (t.code == bytes[2]) type = &t;
  }
  COLOSSAL_CHECK(type != nullptr,
                 "{}: unknown IDX data type 0x{:02x} at offset 2; valid are 0x08 (u8), 0x09 (i8), 0x0B (i16), 0x0C "
                 "(i32), 0x0D (f32), 0x0E (f64)",
                 where, bytes[2]);
  const int64_t rank = bytes[3];
  COLOSSAL_CHECK(rank >= 1, "{}: the IDX header at offset 3 declares 0 dimensions; an array needs at least 1", where);
  COLOSSAL_CHECK(expected_rank <= 0 || rank == expected_rank,
                 "{}: the IDX header declares {} dimensions (offset 3), expected {}", where, rank, expected_rank);
  const auto header_bytes = static_cast<size_t>(4 + 4 * rank);
  COLOSSAL_CHECK(bytes.size() >= header_bytes,
                 "{}: truncated header: {} dimension sizes need bytes 4 to {}, but the file has {} bytes", where, rank,
                 header_bytes, bytes.size());
  // Each size is checked before it multiplies (4 sizes of 2^32 - 1 overflow 64 bits), and zero sizes
  // count as 1 in the bound: an empty array's other sizes still make its strides.
  constexpr int64_t kMaxElements = int64_t{1} << 40;
  Shape dims;
  int64_t count = 1;
  int64_t nonzero_count = 1;
  for (int64_t d = 0; d < rank; ++d) {
    const int64_t size = read_be32(bytes.data() + 4 + 4 * d);
    dims.push_back(size);
    COLOSSAL_CHECK(size <= kMaxElements / nonzero_count,
                   "{}: dimension {} (offset {}) is {}: dimension sizes {} declare an implausibly large array (over "
                   "2^40 elements, zero sizes counted as 1)",
                   where, d, 4 + 4 * d, size, dims);
    nonzero_count *= std::max<int64_t>(size, 1);
    count *= size;
  }
  const int64_t expected = count * type->bytes;
  const auto actual = static_cast<int64_t>(bytes.size() - header_bytes);
  if (actual < expected) {
    const int64_t record_bytes = count / std::max<int64_t>(dims[0], 1) * type->bytes;
    COLOSSAL_FAIL(
        "{}: truncated: dims {} of {} ({} bytes each) need {} data bytes after the {}-byte header, found {}; record {} "
        "(at offset {}) is the first incomplete one",
        where, dims, type->name, type->bytes, expected, header_bytes, actual,
        record_bytes > 0 ? actual / record_bytes : 0,
        header_bytes + static_cast<size_t>(record_bytes > 0 ? actual / record_bytes * record_bytes : 0));
  }
  COLOSSAL_CHECK(actual == expected,
                 "{}: {} unexpected trailing bytes at offset {}: dims {} of {} need exactly {} data bytes after the "
                 "{}-byte header",
                 where, actual - expected, header_bytes + static_cast<size_t>(expected), dims, type->name, expected,
                 header_bytes);
  Tensor out = core::empty(dims, type->dtype);
  const uint8_t* src = bytes.data() + header_bytes;
  switch (type->dtype) {
    case DType::u8:
      if (count > 0) std::memcpy(out.raw_data(), src, static_cast<size_t>(count));
      break;
    case DType::i32:
      decode_values(src, count, type->bytes, type->code, out.data<int32_t>());
      break;
    case DType::f32:
      decode_values(src, count, type->bytes, type->code, out.data<float>());
      break;
    default:
      decode_values(src, count, type->bytes, type->code, out.data<double>());
      break;
  }
  return out;
}

std::string find_mnist_file(const std::string& directory, const std::string& stem) {
  namespace fs = std::filesystem;
  const fs::path gz = fs::path(directory) / (stem + ".gz");
  const fs::path plain = fs::path(directory) / stem;
  std::error_code ec;
  if (fs::exists(gz, ec)) return gz.string();
  if (fs::exists(plain, ec)) return plain.string();
  COLOSSAL_FAIL(
      "MNIST-style file not found: neither {} nor {} exists (Fashion-MNIST: apt-get install "
      "dataset-fashion-mnist puts it in /usr/share/datasets/fashion-mnist)",
      gz.string(), plain.string());
}

MnistDataset::MnistDataset(const std::string& directory, Split split) {
  const bool train = split == Split::train;
  const std::string images = find_mnist_file(directory, train ? "train-images-idx3-ubyte" : "t10k-images-idx3-ubyte");
  const std::string labels = find_mnist_file(directory, train ? "train-labels-idx1-ubyte" : "t10k-labels-idx1-ubyte");
  load(images, labels);
}

MnistDataset::MnistDataset(const std::string& images_path, const std::string& labels_path) {
  load(images_path, labels_path);
}

void MnistDataset::load(const std::string& images_path, const std::string& labels_path) {
  images_ = read_idx(images_path, 3);
  COLOSSAL_CHECK(images_.dtype() == DType::u8, "{}: MNIST images must be unsigned bytes (IDX type 0x08), found {}",
                 images_path, images_.dtype());
  const Tensor raw_labels = read_idx(labels_path, 1);
  COLOSSAL_CHECK(raw_labels.dtype() == DType::u8, "{}: MNIST labels must be unsigned bytes (IDX type 0x08), found {}",
                 labels_path, raw_labels.dtype());
  const int64_t n = raw_labels.numel();
  COLOSSAL_CHECK(images_.size(0) == n, "{} has {} images but {} has {} labels; they must pair up one to one",
                 images_path, images_.size(0), labels_path, n);
  labels_ = core::empty({n}, DType::i64);
  const uint8_t* src = raw_labels.data<uint8_t>();
  int64_t* dst = labels_.data<int64_t>();
  for (int64_t i = 0; i < n; ++i) {
    COLOSSAL_CHECK(src[i] < kNumClasses, "{}: label {} of record {} (offset {}) is outside 0..{}", labels_path, src[i],
                   i, 8 + i, kNumClasses - 1);
    dst[i] = src[i];
  }
}

Example MnistDataset::get(int64_t index) const {
  check_index(index, size(), "MnistDataset");
  const int64_t h = images_.size(1), w = images_.size(2);
  Tensor image = core::empty({1, h, w}, DType::u8);
  if (h * w > 0) std::memcpy(image.raw_data(), images_.data<uint8_t>() + index * h * w, static_cast<size_t>(h * w));
  return {image, label_tensor(labels_.data<int64_t>()[index])};
}

std::optional<std::string> find_fashion_mnist() {
  namespace fs = std::filesystem;
  std::vector<std::string> candidates;
  if (const char* env = std::getenv("COLOSSAL_FASHION_MNIST_DIR"); env != nullptr && *env != '\0') {
    candidates.emplace_back(env);
  }
  // Debian's dataset-fashion-mnist package; the second is where a future layout might put it.
  candidates.emplace_back("/usr/share/datasets/fashion-mnist");
  candidates.emplace_back("/usr/share/dataset-fashion-mnist");
  for (const std::string& dir : candidates) {
    std::error_code ec;
    if (fs::exists(fs::path(dir) / "train-images-idx3-ubyte.gz", ec) ||
        fs::exists(fs::path(dir) / "train-images-idx3-ubyte", ec)) {
      return dir;
    }
  }
  return std::nullopt;
}

}  // namespace colossal::data
