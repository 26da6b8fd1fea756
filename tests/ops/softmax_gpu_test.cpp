// CUDA softmax and log_softmax against the CPU kernels on fresh random inputs, f32/bf16/f16,
// forward and backward, through every kernel path: warp rows (vectorised and odd widths), block
// rows, the online long-row path (50304), strided rows (softmax over a middle dimension) and a
// misaligned input. Tolerances: tests/support/gpu_compare.h's per dtype, with atol also capped by
// the data's scale (expect_scaled_match).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <string>
#include <vector>

#include "colossal/core/view.h"  // to_device_raw
#include "gpu_compare.h"

namespace colossal {
namespace {

using testing::expect_close;
using testing::expect_scaled_match;
using testing::random_input;

constexpr DType kDtypes[] = {DType::f32, DType::bf16, DType::f16};

Tensor apply(bool log, const Tensor& x, int64_t dim) {
  return log ? ops::log_softmax(x, dim) : ops::softmax(x, dim);
}

void check(bool log, const Shape& shape, int64_t dim, double low = -3, double high = 3, double factor = 1.0) {
  for (DType dtype : kDtypes) {
    SCOPED_TRACE(fmt::format("{} over dim {} of {} ({})", log ? "log_softmax" : "softmax", dim, shape, dtype));
    expect_scaled_match(
        {.make_inputs = [=](DType d) { return std::vector<Tensor>{random_input(shape, 11, d, low, high)}; },
         .fn = [=](const std::vector<Tensor>& in) { return apply(log, in[0], dim); }},
        dtype, factor, log ? "log_softmax" : "softmax");
  }
}

TEST(SoftmaxGpu, WarpRows) {
  COLOSSAL_REQUIRE_GPU();
  for (bool log : {false, true}) {
    check(log, {64, 1024}, -1);  // 16-byte vectors, one warp per row
    check(log, {37, 129}, 1);    // odd width: element loads
    check(log, {5, 37}, -1);
    check(log, {3, 1}, -1);  // a row of one
  }
}

TEST(SoftmaxGpu, BlockRows) {
  COLOSSAL_REQUIRE_GPU();
  for (bool log : {false, true}) {
    check(log, {16, 769}, -1);  // odd, too long for a warp's registers
    check(log, {8, 4000}, -1);  // vectorised block team
  }
}

// Rows of 50304 stream twice (online max/sum, then the output). Sums of 50304 terms in a different
// order: 4x the base tolerance, as for the reduction tests.
TEST(SoftmaxGpu, LongRows) {
  COLOSSAL_REQUIRE_GPU();
  for (bool log : {false, true}) {
    check(log, {4, 50304}, -1, -8, 8, 4.0);
    check(log, {3, 50303}, -1, -8, 8, 4.0);  // odd: element loads
  }
}

TEST(SoftmaxGpu, StridedRows) {
  COLOSSAL_REQUIRE_GPU();
  for (bool log : {false, true}) {
    check(log, {4, 37, 5}, 1);
    check(log, {2, 3, 129, 7}, 2);
    check(log, {300, 40}, 0);  // outer 1
    check(log, {64, 33}, 0);
  }
}

TEST(SoftmaxGpu, MisalignedRows) {
  COLOSSAL_REQUIRE_GPU();
  // A contiguous view starting one element into its storage: 1024 divides into vectors, but the
  // rows are not 16-byte aligned, so the kernel must take element loads.
  for (bool log : {false, true}) {
    for (DType dtype : kDtypes) {
      expect_scaled_match(
          {.make_inputs = [](DType d) { return std::vector<Tensor>{random_input({4 * 1024 + 1}, 14, d, -3, 3)}; },
           .fn =
               [=](const std::vector<Tensor>& in) {
                 return apply(log, in[0].narrow(0, 1, 4 * 1024).view({4, 1024}), 1);
               }},
          dtype, 1.0, "misaligned softmax");
    }
  }
}

TEST(SoftmaxGpu, ExtremeLogits) {
  COLOSSAL_REQUIRE_GPU();
  // Large logits must not overflow, -inf entries get probability 0, and a row of -inf is nan on
  // both devices.
  const float inf = std::numeric_limits<float>::infinity();
  Tensor x = core::from_vector<float>({1000, 999, -inf, 0, -inf, -inf, -inf, -inf}, {2, 4});
  Tensor expected = ops::softmax(x, 1);
  Tensor actual = ops::softmax(x.to(core::cuda_device(0)), 1).to(core::kCpu);
  const std::vector<float> a = actual.to_vector<float>(), e = expected.to_vector<float>();
  for (size_t i = 0; i < 4; ++i) EXPECT_NEAR(a[i], e[i], 1e-6) << "element " << i;  // exp of O(1): f32 ulps
  for (size_t i = 4; i < 8; ++i) EXPECT_TRUE(std::isnan(a[i]) && std::isnan(e[i])) << "element " << i;
  // The online path (a long row) treats -inf the same way.
  Tensor long_row = core::full({1, 50304}, -inf);
  Tensor long_result = ops::softmax(long_row.to(core::cuda_device(0)), 1).to(core::kCpu);
  EXPECT_TRUE(std::isnan(long_result.to_vector<float>()[0]));
}

}  // namespace
}  // namespace colossal
