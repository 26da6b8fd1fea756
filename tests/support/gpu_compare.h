// CUDA-against-CPU checks for the `gpu` test label: run an op on the CPU and on the GPU from the
// same random inputs, compare the outputs and every input gradient with tolerances per dtype.
//
// Tolerances (see tolerance_for): both sides compute in f32 (f64 for f64) but in different orders
// and with different libm implementations (CUDA's expf/tanhf are within 2 ulp), so f32 results
// agree to a few ulp of f32 times the condition of the op: rtol 1e-5 leaves room for reductions of
// a few thousand terms. bf16 and f16 outputs are each rounded once from nearly equal f32 values,
// so they can differ by one unit in the last place: 2^-7 (bf16) and 2^-10 (f16) relative, doubled
// for ops whose inputs were themselves rounded.
#pragma once

#include <functional>
#include <string>
#include <vector>

#include "colossal/core/cuda_device.h"
#include "gradcheck.h"

/// Skips the current test when no GPU is visible (the gpu label never runs in CI).
#define COLOSSAL_REQUIRE_GPU()                                                  \
  do {                                                                          \
    if (!::colossal::core::cuda::is_available()) GTEST_SKIP() << "no CUDA GPU"; \
  } while (0)

namespace colossal::testing {

struct Tolerance {
  double atol;
  double rtol;
};
Tolerance tolerance_for(DType dtype);

struct DeviceCase {
  /// CPU inputs in the given floating dtype; those to differentiate have requires_grad set.
  std::function<std::vector<Tensor>(DType)> make_inputs;
  std::function<Tensor(const std::vector<Tensor>&)> fn;
  /// Multiplies the dtype's tolerance (ops with long reductions or ill-conditioned outputs).
  double tolerance_scale = 1.0;
  /// Compare gradients too.
  bool check_backward = true;
};

/// Runs the case on the CPU and on cuda:0 in `dtype`; EXPECTs outputs and gradients to match.
void expect_cuda_matches_cpu(const DeviceCase& test_case, DType dtype, const std::string& what);

/// Random CPU tensor of dtype in [low, high), marked requires_grad when asked.
Tensor random_input(const Shape& shape, uint64_t seed, DType dtype, double low = -1.0, double high = 1.0,
                    bool requires_grad = true);

/// The harness's comparison (tests/support/gpu_compare.h) with the absolute tolerance also capped
/// by the data's scale: |gpu - cpu| <= factor * (min(atol, rtol * max|cpu|) + rtol * |cpu|) for the
/// output and every input gradient. Probabilities of wide rows (~1/C) sit below the harness's fixed
/// atol (1e-5 in f32), which would accept any small value; here they are held to the relative
/// precision of the largest entry.
void expect_scaled_match(const DeviceCase& test_case, DType dtype, double factor, const std::string& what);

}  // namespace colossal::testing
