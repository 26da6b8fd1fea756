// Inputs and host references for the collective tests of every backend (the MPI ranks of
// tests/comm/*_mpi_test.cpp, the NCCL ranks of tests/comm/*_multigpu_test.cpp): each rank's input is a
// function of (rank, index), so every rank computes what any collective must give without asking the
// others, and the values are chosen so that every reduction is exact and compares bit for bit.
#pragma once

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <vector>

#include "colossal/comm/process_group.h"  // ReduceOp
#include "colossal/core/tensor.h"

namespace colossal::comm::testing {

using core::empty;
using core::from_vector;
using core::full;
using core::ones;
using core::scalar_tensor;
using core::zeros;

/// The dtypes every reduction takes (bool takes max and min only, and is tested on its own).
inline const std::vector<DType>& all_dtypes() {
  static const std::vector<DType> dtypes{DType::f32, DType::f64, DType::f16, DType::bf16,
                                         DType::i32, DType::i64, DType::u8};
  return dtypes;
}

/// Element i of `rank`'s input: small integers and halves (-8 to 8.5; 0 to 16 for u8) whose sums over
/// four ranks (at most 34 in magnitude, in steps of 0.5) are exact in every dtype, bf16's 8 bits
/// included, so reductions compare exactly in any order of summation.
inline double input_value(DType dtype, int rank, int64_t i) {
  const double base = static_cast<double>((i * 7 + rank * 13 + 3) % 17);
  if (dtype == DType::u8) return base;
  if (dtype == DType::boolean) return static_cast<double>((i + rank) % 3 == 0);
  if (core::is_floating(dtype)) return base - 8.0 + 0.5 * static_cast<double>((i + rank) % 2);
  return base - 8.0;
}

/// Elements [first, first + n) of `rank`'s input.
inline std::vector<double> input_slice(DType dtype, int rank, int64_t n, int64_t first = 0) {
  std::vector<double> out(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) out[static_cast<size_t>(i)] = input_value(dtype, rank, first + i);
  return out;
}

/// `rank`'s input of `shape`, on the CPU (move it with .to(device)).
inline Tensor make_input(DType dtype, int rank, const Shape& shape) {
  const int64_t n = core::shape_numel(shape);
  Tensor t = empty(shape, dtype);
  t.copy_(from_vector<double>(input_slice(dtype, rank, n), shape));
  return t;
}

/// `op` over the inputs of `ranks` (element i of each), rounded as the tensor's dtype would hold it;
/// avg is sum / size in the dtype (integer division, truncating, for integers).
inline double reference_value(DType dtype, ReduceOp op, const std::vector<int>& ranks, int64_t i) {
  double acc = op == ReduceOp::max ? -INFINITY : op == ReduceOp::min ? INFINITY : 0.0;
  for (int r : ranks) {
    const double v = input_value(dtype, r, i);
    if (op == ReduceOp::max) {
      acc = std::max(acc, v);
    } else if (op == ReduceOp::min) {
      acc = std::min(acc, v);
    } else {
      acc += v;
    }
  }
  if (op != ReduceOp::avg) return acc;
  const auto n = static_cast<int64_t>(ranks.size());
  if (core::is_integral(dtype)) return static_cast<double>(static_cast<int64_t>(acc) / n);
  if (dtype == DType::f64) return acc / static_cast<double>(n);
  // f32, f16, bf16 divide in float and round to their own dtype.
  const float quotient = static_cast<float>(acc) / static_cast<float>(n);
  if (dtype == DType::f16) return static_cast<float>(core::Half(quotient));
  if (dtype == DType::bf16) return static_cast<float>(core::BFloat16(quotient));
  return quotient;
}

/// Elements [first, first + n) of the reduction over `ranks`.
inline std::vector<double> reference_values(DType dtype, ReduceOp op, const std::vector<int>& ranks, int64_t n,
                                            int64_t first = 0) {
  std::vector<double> out(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) out[static_cast<size_t>(i)] = reference_value(dtype, op, ranks, first + i);
  return out;
}

inline std::vector<int> iota_ranks(int size) {
  std::vector<int> ranks(static_cast<size_t>(size));
  for (int r = 0; r < size; ++r) ranks[static_cast<size_t>(r)] = r;
  return ranks;
}

/// Compares `actual` (on any device) with `expected`, each element equal, both NaN, or within
/// tolerance * |expected| + absolute (0, 0: exactly), and reports the first mismatch only.
inline ::testing::AssertionResult values_near(const Tensor& actual, const std::vector<double>& expected,
                                              double tolerance, double absolute = 0.0) {
  const std::vector<double> got = actual.to(core::kCpu).to_vector<double>();
  if (got.size() != expected.size()) {
    return ::testing::AssertionFailure() << got.size() << " elements, expected " << expected.size();
  }
  for (size_t i = 0; i < got.size(); ++i) {
    const bool both_nan = std::isnan(got[i]) && std::isnan(expected[i]);
    if (got[i] != expected[i] && !both_nan &&
        !(std::abs(got[i] - expected[i]) <= tolerance * std::abs(expected[i]) + absolute)) {
      return ::testing::AssertionFailure() << "element " << i << " is " << got[i] << ", expected " << expected[i]
                                           << " (" << got.size() << " elements)";
    }
  }
  return ::testing::AssertionSuccess();
}

/// Compares `actual` exactly with `expected` and reports the first mismatch only.
inline ::testing::AssertionResult values_equal(const Tensor& actual, const std::vector<double>& expected) {
  return values_near(actual, expected, 0.0);
}

}  // namespace colossal::comm::testing
