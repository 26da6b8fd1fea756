// Helpers of the golden model tests: open a reference file from tests/data/golden, pick the
// tensors under one prefix ("param.", "grad.", "step3.") as a state dict, and the relative error by
// norm that the tests' tolerances are stated in.
#pragma once

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <string>
#include <string_view>

#include "colossal/nn/module.h"
#include "colossal/nn/safetensors.h"

namespace colossal::testing {

inline nn::SafetensorsFile load_golden(const std::string& file_name) {
  return nn::load_safetensors(std::string(COLOSSAL_TEST_DATA_DIR) + "/golden/" + file_name);
}

/// The tensors named "<prefix><name>", under <name>, cast to dtype.
inline nn::StateDict with_prefix(const nn::StateDict& tensors, std::string_view prefix, DType dtype) {
  nn::StateDict out;
  for (const auto& [name, tensor] : tensors) {
    if (name.starts_with(prefix)) out.insert(name.substr(prefix.size()), tensor.to(dtype));
  }
  return out;
}

/// The keys of a state dict, sorted (files list them alphabetically, modules in registration order).
inline std::vector<std::string> sorted_keys(const nn::StateDict& state) {
  std::vector<std::string> keys = state.keys();
  std::sort(keys.begin(), keys.end());
  return keys;
}

/// ||actual - expected|| / ||expected|| over all elements, in f64; infinite on a shape mismatch.
inline double relative_error(const Tensor& actual, const Tensor& expected) {
  if (!actual.defined() || actual.shape() != expected.shape()) return INFINITY;
  const std::vector<double> a = actual.to_vector<double>(), e = expected.to_vector<double>();
  double diff = 0.0, norm = 0.0;
  for (size_t i = 0; i < a.size(); ++i) {
    diff += (a[i] - e[i]) * (a[i] - e[i]);
    norm += e[i] * e[i];
  }
  return std::sqrt(diff) / std::sqrt(norm);
}

/// Tracks the largest relative error of a group of comparisons (printed by the test so that a
/// tolerance's margin stays visible) and EXPECTs each under tolerance.
class ErrorTracker {
 public:
  ErrorTracker(std::string what, double tolerance) : what_(std::move(what)), tolerance_(tolerance) {}
  ~ErrorTracker() {
    std::printf("[ golden ] %-40s max relative error %.3e (tolerance %.0e, worst: %s)\n", what_.c_str(), max_,
                tolerance_, worst_.c_str());
  }
  void check(const Tensor& actual, const Tensor& expected, const std::string& name) {
    const double error = relative_error(actual, expected);
    EXPECT_LE(error, tolerance_) << what_ << ": " << name << " (actual shape "
                                 << (actual.defined() ? fmt::format("{}", actual.shape()) : "undefined")
                                 << ", expected " << fmt::format("{}", expected.shape()) << ")";
    if (!(error <= max_)) {
      max_ = error;
      worst_ = name;
    }
  }

 private:
  std::string what_;
  double tolerance_;
  double max_ = 0.0;
  std::string worst_ = "-";
};

}  // namespace colossal::testing
