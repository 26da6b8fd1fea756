// Helpers shared by the engine tests: a seeded f64 Linear model, an MSE criterion, deterministic
// batches, a small in-memory classification dataset for the Trainer, and a file-size limit that
// makes writes fail as on a full disk.
#pragma once

#include <sys/resource.h>  // setrlimit(RLIMIT_FSIZE)

#include <csignal>
#include <cstdint>
#include <memory>
#include <vector>

#include "colossal/core/random.h"  // Generator
#include "colossal/core/tensor.h"
#include "colossal/data/data_loader.h"  // DataLoaderOptions
#include "colossal/data/dataset.h"      // Dataset, label_tensor
#include "colossal/nn/linear.h"
#include "colossal/ops/elementwise.h"  // sub, mul
#include "colossal/ops/reduction.h"    // mean

namespace colossal::engine::testing {

/// nn::Linear(in, out) in f64, initialised from Generator(seed): two calls with one seed agree bitwise.
inline std::shared_ptr<nn::Linear> make_linear(int64_t in, int64_t out, uint64_t seed) {
  core::Generator generator(seed);
  auto model = std::make_shared<nn::Linear>(in, out, true, &generator);
  model->to(DType::f64);
  return model;
}

/// Mean squared error over every element.
inline Tensor mse(const Tensor& output, const Tensor& target) {
  Tensor diff = ops::sub(output, target);
  return ops::mean(ops::mul(diff, diff));
}

/// rows x cols f64 values that vary smoothly with (row, col, salt), no generator needed.
inline std::vector<double> pattern(int64_t rows, int64_t cols, double salt) {
  std::vector<double> values;
  for (int64_t r = 0; r < rows; ++r) {
    for (int64_t c = 0; c < cols; ++c) values.push_back(0.1 * static_cast<double>((r * 7 + c * 3) % 11) - 0.4 + salt);
  }
  return values;
}

/// Rows [begin, end) of a row-major rows x cols matrix as an (end - begin) x cols f64 tensor.
inline Tensor rows_of(const std::vector<double>& values, int64_t cols, int64_t begin, int64_t end) {
  std::vector<double> slice(values.begin() + begin * cols, values.begin() + end * cols);
  return core::from_vector(slice, {end - begin, cols}, DType::f64);
}

/// Sequential, single-threaded loading in batches of `batch_size`.
inline data::DataLoaderOptions batches_of(int64_t batch_size) {
  data::DataLoaderOptions options;
  options.batch_size = batch_size;
  return options;
}

/// `size` samples of 3 f64 features with class label (index % 2).
class TinyClassificationDataset : public data::Dataset {
 public:
  explicit TinyClassificationDataset(int64_t size) : size_(size) {}
  int64_t size() const override { return size_; }
  data::Example get(int64_t index) const override {
    const double x = static_cast<double>(index);
    const double sign = index % 2 == 0 ? 1.0 : -1.0;
    return {core::from_vector(std::vector<double>{sign, 0.5 * sign + 0.01 * x, 0.25}, {3}, DType::f64),
            data::label_tensor(index % 2)};
  }

 private:
  int64_t size_;
};

/// While alive, writes that would grow any file of this process past `bytes` fail with EFBIG
/// ("File too large"), as writes to a full disk fail with ENOSPC: the same failed write() reaches
/// the writer, without needing a small filesystem. SIGXFSZ, which would kill the process, is
/// ignored meanwhile.
class FileSizeLimit {
 public:
  explicit FileSizeLimit(rlim_t bytes) {
    previous_handler_ = std::signal(SIGXFSZ, SIG_IGN);
    ::getrlimit(RLIMIT_FSIZE, &previous_);
    rlimit limit = previous_;
    limit.rlim_cur = bytes;
    ::setrlimit(RLIMIT_FSIZE, &limit);
  }
  ~FileSizeLimit() {
    ::setrlimit(RLIMIT_FSIZE, &previous_);
    std::signal(SIGXFSZ, previous_handler_);
  }
  FileSizeLimit(const FileSizeLimit&) = delete;
  FileSizeLimit& operator=(const FileSizeLimit&) = delete;

 private:
  rlimit previous_{};
  void (*previous_handler_)(int) = SIG_DFL;
};

}  // namespace colossal::engine::testing
