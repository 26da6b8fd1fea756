// CIFAR-10 binary batches.
#include "colossal/data/cifar10.h"

#include <cstring>
#include <filesystem>

#include "colossal/core/error.h"
#include "colossal/data/file_io.h"

namespace colossal::data {

std::vector<std::string> cifar10_files(Split split) {
  if (split == Split::test) return {"test_batch.bin"};
  return {"data_batch_1.bin", "data_batch_2.bin", "data_batch_3.bin", "data_batch_4.bin", "data_batch_5.bin"};
}

namespace {
std::vector<std::string> resolve_files(const std::string& directory, Split split) {
  namespace fs = std::filesystem;
  std::error_code ec;
  fs::path dir(directory);
  COLOSSAL_CHECK(fs::is_directory(dir, ec), "CIFAR-10 directory {} does not exist or is not a directory", directory);
  // The archive unpacks into cifar-10-batches-bin/; accept its parent too.
  if (!fs::exists(dir / cifar10_files(split)[0], ec) && fs::exists(dir / "cifar-10-batches-bin", ec)) {
    dir /= "cifar-10-batches-bin";
  }
  std::vector<std::string> out;
  for (const std::string& name : cifar10_files(split)) {
    const fs::path p = dir / name;
    COLOSSAL_CHECK(fs::exists(p, ec),
                   "CIFAR-10 batch file {} not found; {} needs {} (the binary version, cifar-10-binary.tar.gz, not "
                   "the Python pickles)",
                   p.string(), directory, fmt::join(cifar10_files(split), ", "));
    out.push_back(p.string());
  }
  return out;
}
}  // namespace

Cifar10Dataset::Cifar10Dataset(const std::string& directory, Split split)
    : Cifar10Dataset(resolve_files(directory, split)) {}

Cifar10Dataset::Cifar10Dataset(const std::vector<std::string>& files) {
  COLOSSAL_CHECK(!files.empty(), "Cifar10Dataset: no batch files given");
  for (const std::string& path : files) {
    const std::vector<uint8_t> bytes = read_file(path, "CIFAR-10 batch");
    const auto size = static_cast<int64_t>(bytes.size());
    COLOSSAL_CHECK(size > 0, "CIFAR-10 batch {} is empty; expected 3073-byte records", path);
    const int64_t records = size / kRecordBytes;
    const int64_t leftover = size % kRecordBytes;
    COLOSSAL_CHECK(leftover == 0,
                   "CIFAR-10 batch {} is truncated or not a CIFAR-10 binary batch: {} bytes is not a whole number of "
                   "{}-byte records (1 label + 3072 pixels); record {} at offset {} has only {} bytes",
                   path, size, kRecordBytes, records, records * kRecordBytes, leftover);
    const size_t first = labels_.size();
    labels_.resize(first + static_cast<size_t>(records));
    pixels_.resize((first + static_cast<size_t>(records)) * kImageBytes);
    for (int64_t r = 0; r < records; ++r) {
      const uint8_t* record = bytes.data() + r * kRecordBytes;
      COLOSSAL_CHECK(record[0] < kNumClasses,
                     "CIFAR-10 batch {}: record {} (offset {}) has label {}, but CIFAR-10 labels are 0..9 (a "
                     "CIFAR-100 file has 2 label bytes per record)",
                     path, r, r * kRecordBytes, record[0]);
      labels_[first + static_cast<size_t>(r)] = record[0];
      std::memcpy(pixels_.data() + (first + static_cast<size_t>(r)) * kImageBytes, record + 1, kImageBytes);
    }
  }
}

Example Cifar10Dataset::get(int64_t index) const {
  check_index(index, size(), "Cifar10Dataset");
  Tensor image = core::empty({3, 32, 32}, DType::u8);
  std::memcpy(image.raw_data(), pixels_.data() + index * kImageBytes, kImageBytes);
  return {image, label_tensor(labels_[static_cast<size_t>(index)])};
}

const std::vector<std::string>& Cifar10Dataset::class_names() {
  static const std::vector<std::string> names = {"airplane", "automobile", "bird",  "cat",  "deer",
                                                 "dog",      "frog",       "horse", "ship", "truck"};
  return names;
}

}  // namespace colossal::data
