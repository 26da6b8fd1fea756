// The shared harness for op tests: an op test declares how to build its inputs, the function to
// differentiate, and its finite-difference epsilon and tolerances; check_gradients compares the
// autograd gradient of every input that requires grad against central differences in f64.
//
// Tolerances: central differences have truncation error O(eps^2 * f''') and rounding error
// O(ulp(f) / eps). With eps = 1e-6 and O(1) values in f64 (ulp ~ 1e-16) both are around 1e-10,
// so atol 1e-7 / rtol 1e-6 leave two orders of margin while still catching any wrong formula
// (those are off by O(1)). Ops with kinks (relu, abs, max) keep inputs away from them.
#pragma once

#include <functional>
#include <string>
#include <vector>

#include "colossal/ops.h"

namespace colossal::testing {

struct GradCheckCase {
  /// Builds fresh inputs. Inputs to differentiate must be contiguous CPU f64 tensors with
  /// requires_grad set; others (indices, masks, running stats) are passed through untouched.
  std::function<std::vector<Tensor>()> make_inputs;
  /// The computation; any output shape (it is contracted with fixed random weights).
  std::function<Tensor(const std::vector<Tensor>&)> fn;
  double eps = 1e-6;
  double atol = 1e-7;
  double rtol = 1e-6;
};

/// Adds a GoogleTest failure per mismatching element (the first few), naming input and index.
void check_gradients(const GradCheckCase& test_case);

/// Uniform random f64 (or `dtype`) tensor in [low, high) from a seeded generator; never all zeros.
Tensor random_tensor(const Shape& shape, uint64_t seed, double low = -1.0, double high = 1.0, DType dtype = DType::f64);
/// The same, marked requires_grad (a leaf).
Tensor random_leaf(const Shape& shape, uint64_t seed, double low = -1.0, double high = 1.0);

/// EXPECTs that actual and expected have the same shape and |a - e| <= atol + rtol * |e|
/// elementwise, reporting the worst element.
void expect_close(const Tensor& actual, const Tensor& expected, double atol, double rtol, const std::string& what = "");
/// EXPECTs every element of actual equals the corresponding value.
void expect_values(const Tensor& actual, const std::vector<double>& expected, double atol = 0.0,
                   const std::string& what = "");

}  // namespace colossal::testing

/// EXPECTs that `statement` throws colossal::Error whose message contains `substring`.
#define EXPECT_ERROR_CONTAINS(statement, substring)                                                   \
  do {                                                                                                 \
    try {                                                                                              \
      statement;                                                                                       \
      ADD_FAILURE() << "expected colossal::Error containing \"" << (substring) << "\" from " #statement; \
    } catch (const ::colossal::Error& error_) {                                                        \
      EXPECT_NE(std::string(error_.what()).find(substring), std::string::npos)                         \
          << "message \"" << error_.what() << "\" lacks \"" << (substring) << "\"";                     \
    }                                                                                                  \
  } while (0)
