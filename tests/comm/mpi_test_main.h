// The main() of the comm mpi tests (each *_mpi_test.cpp runs under mpirun at 2 and 4 ranks): starts
// MPI through the world group before the tests, lets rank 0 print GoogleTest's usual output while the
// other ranks print only their failures (tagged [rank N]), and exits non-zero on every rank when any
// rank failed. Also the inputs and local references the collective tests compare against.
#pragma once

#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <memory>
#include <string>
#include <vector>

#include "colossal/comm/mpi/mpi_process_group.h"

namespace colossal::comm::testing {

using core::empty;
using core::from_vector;
using core::full;
using core::ones;
using core::scalar_tensor;
using core::zeros;

inline std::shared_ptr<MpiProcessGroup>& world_slot() {
  static std::shared_ptr<MpiProcessGroup> world;
  return world;
}
/// The world group every test of the program shares.
inline MpiProcessGroup& world() {
  return *world_slot();
}

/// On ranks other than 0: print failures only, each line tagged with the rank.
class FailurePrinter : public ::testing::EmptyTestEventListener {
 public:
  explicit FailurePrinter(int rank) : rank_(rank) {}
  void OnTestPartResult(const ::testing::TestPartResult& result) override {
    if (!result.failed()) return;
    std::fprintf(stderr, "[rank %d] %s:%d: Failure\n%s\n", rank_, result.file_name() ? result.file_name() : "?",
                 result.line_number(), result.message());
  }
  void OnTestEnd(const ::testing::TestInfo& info) override {
    if (info.result()->Failed()) {
      std::fprintf(stderr, "[rank %d] FAILED %s.%s\n", rank_, info.test_suite_name(), info.name());
    }
  }

 private:
  int rank_;
};

inline int run_mpi_tests(int argc, char** argv) {
  ::testing::InitGoogleTest(&argc, argv);
  world_slot() = MpiProcessGroup::create_world();
  const int rank = world().rank();
  if (rank != 0) {
    auto& listeners = ::testing::UnitTest::GetInstance()->listeners();
    delete listeners.Release(listeners.default_result_printer());
    listeners.Append(new FailurePrinter(rank));
  }
  const int local_result = RUN_ALL_TESTS();
  Tensor failed = from_vector<int32_t>({local_result != 0 ? 1 : 0}, {1});
  world().all_reduce(failed, ReduceOp::max);
  const bool any_failed = failed.item<int32_t>() != 0;
  if (rank == 0 && any_failed && local_result == 0) {
    std::fprintf(stderr, "FAILED on another rank: see the [rank N] lines above\n");
  }
  world_slot().reset();
  return any_failed ? 1 : 0;
}

// ---- inputs and references

inline const std::vector<DType>& all_dtypes() {
  static const std::vector<DType> dtypes{DType::f32, DType::f64, DType::f16, DType::bf16,
                                         DType::i32, DType::i64, DType::u8};
  return dtypes;
}

/// Element i of `rank`'s input: small integers and halves (-8 to 8.5; 0 to 16 for u8) whose sums over
/// four ranks (at most 34 in magnitude, in steps of 0.5) are exact in every dtype, bf16's 8 bits
/// included, so reductions compare exactly.
inline double input_value(DType dtype, int rank, int64_t i) {
  const double base = static_cast<double>((i * 7 + rank * 13 + 3) % 17);
  if (dtype == DType::u8) return base;
  if (dtype == DType::boolean) return static_cast<double>((i + rank) % 3 == 0);
  if (core::is_floating(dtype)) return base - 8.0 + 0.5 * static_cast<double>((i + rank) % 2);
  return base - 8.0;
}

inline Tensor make_input(DType dtype, int rank, const Shape& shape) {
  const int64_t n = core::shape_numel(shape);
  std::vector<double> values(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) values[static_cast<size_t>(i)] = input_value(dtype, rank, i);
  Tensor t = empty(shape, dtype);
  t.copy_(from_vector<double>(values, shape));
  return t;
}

/// `op` over the inputs of `ranks` (element i of each), rounded as the tensor's dtype would hold it;
/// avg is sum / size in the dtype (integer division for integers).
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

inline std::vector<int> iota_ranks(int size) {
  std::vector<int> ranks(static_cast<size_t>(size));
  for (int r = 0; r < size; ++r) ranks[static_cast<size_t>(r)] = r;
  return ranks;
}

/// Compares `actual` exactly with `expected` and reports the first mismatch only.
inline ::testing::AssertionResult values_equal(const Tensor& actual, const std::vector<double>& expected) {
  const std::vector<double> got = actual.to_vector<double>();
  if (got.size() != expected.size()) {
    return ::testing::AssertionFailure() << got.size() << " elements, expected " << expected.size();
  }
  for (size_t i = 0; i < got.size(); ++i) {
    if (got[i] != expected[i] && !(std::isnan(got[i]) && std::isnan(expected[i]))) {
      return ::testing::AssertionFailure() << "element " << i << " is " << got[i] << ", expected " << expected[i]
                                           << " (" << got.size() << " elements)";
    }
  }
  return ::testing::AssertionSuccess();
}

}  // namespace colossal::comm::testing
