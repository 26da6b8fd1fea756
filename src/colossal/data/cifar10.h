// CIFAR-10 in its binary version (cifar-10-binary.tar.gz): data_batch_1.bin .. data_batch_5.bin and
// test_batch.bin, each a run of 3073-byte records (one label byte, then 1024 red, 1024 green and
// 1024 blue bytes of a 32x32 image, rows top to bottom).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "colossal/data/dataset.h"
#include "colossal/data/mnist.h"  // Split

namespace colossal::data {

class Cifar10Dataset final : public Dataset {
 public:
  static constexpr int64_t kNumClasses = 10;
  static constexpr int64_t kImageBytes = 3 * 32 * 32;
  static constexpr int64_t kRecordBytes = 1 + kImageBytes;

  /// `directory` holds the .bin files (or a cifar-10-batches-bin folder that does).
  Cifar10Dataset(const std::string& directory, Split split);
  /// Explicit batch files, read in order.
  explicit Cifar10Dataset(const std::vector<std::string>& files);

  int64_t size() const override { return static_cast<int64_t>(labels_.size()); }
  /// input: u8 [3, 32, 32] (CHW, RGB); target: 0-d i64 label.
  Example get(int64_t index) const override;
  /// The class names, by label.
  static const std::vector<std::string>& class_names();

 private:
  std::vector<uint8_t> pixels_;  // N * 3072
  std::vector<uint8_t> labels_;
};

/// The batch file names of a split: data_batch_1.bin .. data_batch_5.bin, or test_batch.bin.
std::vector<std::string> cifar10_files(Split split);

}  // namespace colossal::data
