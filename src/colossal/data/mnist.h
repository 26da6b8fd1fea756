// IDX files (the format of MNIST and Fashion-MNIST, plain or gzip) and the MNIST-style dataset
// read from them, plus where Debian's dataset-fashion-mnist package puts its files.
#pragma once

#include <cstdint>
#include <optional>
#include <string>

#include "colossal/core/tensor.h"
#include "colossal/data/dataset.h"

namespace colossal::data {

enum class Split { train, test };

/// An IDX file as a tensor of the dims it declares: u8 for type 0x08; i32 for 0x09 (i8), 0x0B (i16)
/// and 0x0C (i32); f32 for 0x0D; f64 for 0x0E. Big-endian values are converted. Throws naming the
/// file and offset for a bad magic, an unknown type, a truncated header or data that does not
/// match the dims. expected_rank > 0 also checks the number of dims.
Tensor read_idx(const std::string& path, int64_t expected_rank = 0);

/// MNIST / Fashion-MNIST: images [N, H, W] u8 and labels [N] in 0..9. get(i) returns the image as
/// u8 [1, H, W] (CHW; ToTensor makes it float) and the label as a 0-d i64 tensor.
class MnistDataset final : public Dataset {
 public:
  static constexpr int64_t kNumClasses = 10;

  /// `directory` holds train-images-idx3-ubyte.gz, train-labels-idx1-ubyte.gz,
  /// t10k-images-idx3-ubyte.gz and t10k-labels-idx1-ubyte.gz (or the same names without .gz).
  MnistDataset(const std::string& directory, Split split);
  MnistDataset(const std::string& images_path, const std::string& labels_path);

  int64_t size() const override { return labels_.numel(); }
  Example get(int64_t index) const override;
  const Tensor& images() const { return images_; }  ///< [N, H, W] u8
  const Tensor& labels() const { return labels_; }  ///< [N] i64

 private:
  void load(const std::string& images_path, const std::string& labels_path);

  Tensor images_;
  Tensor labels_;
};

/// Path of `stem` (e.g. "train-images-idx3-ubyte") in directory: stem.gz if present, else stem.
/// Throws naming both candidates when neither exists.
std::string find_mnist_file(const std::string& directory, const std::string& stem);

/// The directory holding Fashion-MNIST, if installed: $COLOSSAL_FASHION_MNIST_DIR, or where Debian's
/// dataset-fashion-mnist package installs it (/usr/share/datasets/fashion-mnist).
std::optional<std::string> find_fashion_mnist();

}  // namespace colossal::data
