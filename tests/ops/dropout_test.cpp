// dropout: gradient check with a re-seeded generator, the mask against the documented Philox rule
// computed here independently, reproducibility per (seed, offset), the kept fraction within a
// binomial bound, eval/p == 0 identity, half precision and bad input.
#include <gtest/gtest.h>

#include <cmath>
#include <vector>

#include "colossal/core/philox.h"
#include "colossal/core/view.h"  // cast_raw
#include "gradcheck.h"

namespace colossal {
namespace {

using testing::check_gradients;
using testing::expect_close;
using testing::random_leaf;
using testing::random_tensor;

/// The documented rule (nn_functional.h), written out directly rather than through the kernel's
/// integer threshold: element i keeps iff uniform_float(word i % 4 of block i / 4) >= p.
std::vector<bool> reference_mask(int64_t n, double p, uint64_t seed, uint64_t offset) {
  std::vector<bool> keep(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) {
    const core::PhiloxBlock block = core::philox_block(seed, offset, static_cast<uint64_t>(i / 4));
    keep[static_cast<size_t>(i)] = core::uniform_float(block.x[i % 4]) >= p;
  }
  return keep;
}

/// Which elements of a dropout output survived (inputs are never 0 in these tests).
std::vector<bool> kept(const Tensor& out) {
  std::vector<bool> keep;
  for (double v : out.to_vector<double>()) keep.push_back(v != 0.0);
  return keep;
}

TEST(GradCheck, dropout) {
  // Re-seeding inside fn gives every evaluation (autograd and both finite-difference sides) the
  // same mask, so the op is a fixed linear map there.
  check_gradients({.make_inputs =
                       [] {
                         return std::vector<Tensor>{random_leaf({3, 7}, 41, 0.5, 1.5)};
                       },
                   .fn =
                       [](const std::vector<Tensor>& in) {
                         static core::Generator gen;
                         gen.manual_seed(42);
                         return ops::dropout(in[0] * in[0], 0.4, true, &gen);
                       }});
}

TEST(DropoutTest, MaskFollowsDocumentedPhiloxRule) {
  // 1001 elements: the last block is partial. p values include ones whose p * 2^24 is not an
  // integer, where a float-width comparison could differ from the documented one.
  for (double p : {0.1, 0.5, 0.3333333333333333, 0.9}) {
    SCOPED_TRACE(p);
    core::Generator gen(1234);
    gen.next_offset(5);  // start mid-stream: the offset used must be the generator's current one
    const Tensor x = random_tensor({7, 11, 13}, 42, 0.5, 1.5);
    const Tensor out = ops::dropout(x, p, true, &gen);
    EXPECT_EQ(gen.state().offset, 6u) << "one offset per call";
    const std::vector<bool> expected = reference_mask(x.numel(), p, 1234, 5);
    EXPECT_EQ(kept(out), expected);
    // Kept values are x / (1 - p), computed in double like the kernel does for f64.
    const std::vector<double> xs = x.to_vector<double>();
    const std::vector<double> ys = out.to_vector<double>();
    int64_t wrong = 0;
    for (size_t i = 0; i < xs.size(); ++i) wrong += expected[i] && ys[i] != xs[i] * (1.0 / (1.0 - p));
    EXPECT_EQ(wrong, 0);
  }
}

TEST(DropoutTest, ThresholdIsExactAtTheUniformGrid) {
  // Find a draw u = k * 2^-24 with k >= 2^23, where float's spacing is 2^-24 too. For p = (k + 0.25)
  // * 2^-24 the documented rule (u >= p, in double) drops the element, although p rounded to float
  // equals u: a kernel comparing against float(p) would keep it. p = k * 2^-24 keeps it.
  uint64_t seed = 0;
  uint32_t k = 0;
  for (; seed < 1000; ++seed) {
    k = core::philox_block(seed, 0, 0).x[0] >> 8;
    if (k >= (1u << 23) && k + 1 < (1u << 24)) break;
  }
  ASSERT_LT(seed, 1000u);
  const Tensor x = random_tensor({1}, 50, 0.5, 1.5);
  for (const auto& [p, keeps] : {std::pair{(k + 0.25) / 16777216.0, false}, std::pair{k / 16777216.0, true}}) {
    SCOPED_TRACE(p);
    ASSERT_EQ(static_cast<double>(static_cast<float>(p)) == k / 16777216.0, true);
    core::Generator gen(seed);
    EXPECT_EQ(ops::dropout(x, p, true, &gen).item<double>() != 0.0, keeps);
    EXPECT_EQ(reference_mask(1, p, seed, 0)[0], keeps);
  }
}

TEST(DropoutTest, MaskIsRowMajorOverNonContiguousInput) {
  // x is a transposed view; element i is the i-th in x's own row-major order, not in memory order.
  const Tensor base = random_tensor({6, 5}, 43, 0.5, 1.5);
  core::Generator gen(9);
  const Tensor out = ops::dropout(base.t(), 0.5, true, &gen);
  EXPECT_EQ(kept(out), reference_mask(30, 0.5, 9, 0));
}

TEST(DropoutTest, SameSeedSameMaskNextOffsetDifferentMask) {
  const Tensor x = random_tensor({4096}, 44, 0.5, 1.5);
  core::Generator gen(77);
  const Tensor first = ops::dropout(x, 0.3, true, &gen);
  const Tensor second = ops::dropout(x, 0.3, true, &gen);  // the next offset
  gen.manual_seed(77);
  const Tensor replay = ops::dropout(x, 0.3, true, &gen);
  expect_close(replay, first, 0.0, 0.0, "same (seed, offset) gives the same bits");
  // Two independent masks differ in ~2 p (1 - p) = 42% of 4096 positions; any sane stream differs
  // in far more than one.
  int64_t differing = 0;
  const std::vector<bool> a = kept(first), b = kept(second);
  for (size_t i = 0; i < a.size(); ++i) differing += a[i] != b[i];
  EXPECT_GT(differing, 1000);
  // The default generator is used when none is given.
  core::manual_seed(77);
  expect_close(ops::dropout(x, 0.3), first, 0.0, 0.0, "default generator");
}

TEST(DropoutTest, KeptFractionWithinBinomialBound) {
  // n = 2^20 draws keep each element with probability 1 - p = 0.7 (up to 2^-24 from the 24-bit
  // uniform grid: n * 2^-24 < 0.1 elements). The count is Binomial(n, 0.7) with sigma = sqrt(n *
  // 0.7 * 0.3) ~ 469; a 6 sigma band fails by chance with probability ~2e-9.
  constexpr int64_t n = int64_t{1} << 20;
  const double p = 0.3;
  core::Generator gen(2024);
  const Tensor out = ops::dropout(core::ones({n}), p, true, &gen);
  double count = 0;
  for (float v : out.to_vector<float>()) count += v != 0.0f;
  const double sigma = std::sqrt(n * p * (1 - p));
  EXPECT_NEAR(count, n * (1 - p), 6 * sigma);
}

TEST(DropoutTest, EvalAndZeroProbabilityReturnTheInput) {
  const Tensor x = random_tensor({3, 4}, 45);
  core::Generator gen(5);
  EXPECT_TRUE(ops::dropout(x, 0.5, /*training=*/false, &gen).is_same(x));
  EXPECT_TRUE(ops::dropout(x, 0.0, true, &gen).is_same(x));
  EXPECT_EQ(gen.state().offset, 0u) << "no draw, no offset consumed";
}

TEST(DropoutTest, ProbabilityOneZeroesEverything) {
  Tensor x = random_leaf({3, 4}, 46, 0.5, 1.5);
  const Tensor out = ops::dropout(x, 1.0);
  testing::expect_values(out, std::vector<double>(12, 0.0));
  autograd::backward(ops::sum(out));
  testing::expect_values(x.grad(), std::vector<double>(12, 0.0));
}

TEST(DropoutTest, GradientIsMaskTimesScale) {
  Tensor x = random_leaf({5, 9}, 47, 0.5, 1.5);
  core::Generator gen(3);
  const Tensor out = ops::dropout(x, 0.25, true, &gen);
  autograd::backward(ops::sum(out));
  const std::vector<bool> keep = reference_mask(45, 0.25, 3, 0);
  std::vector<double> expected;
  for (bool k : keep) expected.push_back(k ? 1.0 / 0.75 : 0.0);
  testing::expect_values(x.grad(), expected, 0.0);
}

TEST(DropoutTest, ReducedPrecisionUsesTheSameMask) {
  // The mask depends only on (seed, offset, i); kept values are x * scale rounded to the dtype:
  // half an ulp relative, 2^-9 for bf16 (the coarsest); rtol 2^-8 leaves a factor 2.
  const Tensor x64 = random_tensor({257}, 48, 0.5, 1.5);
  for (DType dtype : {DType::f32, DType::f16, DType::bf16}) {
    SCOPED_TRACE(core::dtype_name(dtype));
    core::Generator gen(11);
    const Tensor out = ops::dropout(core::cast_raw(x64, dtype), 0.4, true, &gen);
    EXPECT_EQ(out.dtype(), dtype);
    EXPECT_EQ(kept(out), reference_mask(257, 0.4, 11, 0));
    core::Generator gen64(11);
    expect_close(core::cast_raw(out, DType::f64),
                 ops::dropout(core::cast_raw(core::cast_raw(x64, dtype), DType::f64), 0.4, true, &gen64), 0.0,
                 2.0 / 512, "values");
  }
}

// dropout_add: residual + dropout(x) in one pass. With a generator in the same state it draws the
// same mask as dropout and advances the generator as dropout does; in f64 and f32 (whose
// accumulation type is their own) the fused sum is dropout's product rounded, then the add rounded:
// bit-equal to dropout then add. In bf16 and f16 the product is no longer rounded to 16 bits before
// the add: within that rounding of the product plus one of the 16-bit result (2^-8 relative for bf16). The gradients:
// the residual's is the output's, x's dropout's backward.
TEST(DropoutAddTest, EqualsDropoutThenAdd) {
  for (DType dtype : {DType::f64, DType::f32, DType::bf16, DType::f16}) {
    SCOPED_TRACE(core::dtype_name(dtype));
    const Tensor x64 = random_tensor({7, 37}, 51, 0.5, 1.5), r64 = random_tensor({7, 37}, 52, -1.0, 1.0);
    Tensor x = core::cast_raw(x64, dtype).set_requires_grad(true),
           r = core::cast_raw(r64, dtype).set_requires_grad(true);
    Tensor x2 = core::cast_raw(x64, dtype).set_requires_grad(true),
           r2 = core::cast_raw(r64, dtype).set_requires_grad(true);
    core::Generator fused_gen(17), plain_gen(17);
    const Tensor fused = ops::dropout_add(x, r, 0.3, true, &fused_gen);
    const Tensor plain = ops::add(r2, ops::dropout(x2, 0.3, true, &plain_gen));
    EXPECT_EQ(fused_gen.state(), plain_gen.state()) << "the generator advances as dropout's";
    const bool exact = dtype == DType::f64 || dtype == DType::f32;
    // 16-bit: the unfused product x * scale (up to 1.5 / 0.7) is rounded before the add, by up to
    // 2^-8 of itself, which the sum (residual + product, possibly near 0) need not dwarf; then both
    // sums round once more.
    const double kept_max = 1.5 / 0.7;
    expect_close(core::cast_raw(fused, DType::f64), core::cast_raw(plain, DType::f64), exact ? 0.0 : kept_max / 256,
                 exact ? 0.0 : 2.0 / 256, "output");
    const Tensor upstream = core::cast_raw(random_tensor({7, 37}, 53, -1.0, 1.0), dtype);
    autograd::backward(fused, upstream);
    autograd::backward(plain, upstream);
    expect_close(core::cast_raw(x.grad(), DType::f64), core::cast_raw(x2.grad(), DType::f64), 0.0, 0.0, "x's gradient");
    expect_close(core::cast_raw(r.grad(), DType::f64), core::cast_raw(r2.grad(), DType::f64), 0.0, 0.0,
                 "the residual's gradient");
  }
}

TEST(DropoutAddTest, A16BitBranchOnAnF32ResidualPromotesAsAddDoes) {
  // fp16 "torch" mode: the branch's matmul autocasts to f16, the residual stream stays f32.
  const Tensor x64 = random_tensor({5, 11}, 61, 0.5, 1.5), r = random_tensor({5, 11}, 62, -1.0, 1.0);
  const Tensor x = core::cast_raw(x64, DType::f16).set_requires_grad(true);
  const Tensor x2 = core::cast_raw(x64, DType::f16).set_requires_grad(true);
  const Tensor r32 = core::cast_raw(r, DType::f32).set_requires_grad(true);
  const Tensor r32b = core::cast_raw(r, DType::f32).set_requires_grad(true);
  core::Generator fused_gen(23), plain_gen(23);
  const Tensor fused = ops::dropout_add(x, r32, 0.25, true, &fused_gen);
  const Tensor plain = ops::add(r32b, ops::dropout(x2, 0.25, true, &plain_gen));
  EXPECT_EQ(fused.dtype(), DType::f32);
  EXPECT_EQ(fused_gen.state(), plain_gen.state());
  expect_close(core::cast_raw(fused, DType::f64), core::cast_raw(plain, DType::f64), 0.0, 0.0, "output");
  const Tensor upstream = core::cast_raw(random_tensor({5, 11}, 63, -1.0, 1.0), DType::f32);
  autograd::backward(fused, upstream);
  autograd::backward(plain, upstream);
  EXPECT_EQ(x.grad().dtype(), DType::f16);
  expect_close(core::cast_raw(x.grad(), DType::f64), core::cast_raw(x2.grad(), DType::f64), 0.0, 0.0, "x's gradient");
  expect_close(core::cast_raw(r32.grad(), DType::f64), core::cast_raw(r32b.grad(), DType::f64), 0.0, 0.0,
               "the residual's gradient");
}

TEST(GradCheck, dropout_add) {
  check_gradients({.make_inputs =
                       [] {
                         return std::vector<Tensor>{random_leaf({3, 7}, 54, 0.5, 1.5), random_leaf({3, 7}, 55)};
                       },
                   .fn =
                       [](const std::vector<Tensor>& in) {
                         static core::Generator gen;
                         gen.manual_seed(43);
                         return ops::dropout_add(in[0] * in[0], in[1] * in[1], 0.4, true, &gen);
                       }});
}

TEST(DropoutAddTest, EvalIsTheSumAndBadInputsAreNamed) {
  const Tensor x = random_tensor({2, 3}, 56), r = random_tensor({2, 3}, 57);
  core::Generator gen(5);
  expect_close(ops::dropout_add(x, r, 0.5, /*training=*/false, &gen), ops::add(r, x), 0.0, 0.0, "eval");
  EXPECT_EQ(gen.state().offset, 0u) << "eval draws nothing";
  EXPECT_ERROR_CONTAINS(
      ops::dropout_add(x, random_tensor({3, 2}, 58), 0.5),
      "dropout_add: x (f64 [2, 3] on cpu) and the residual (f64 [3, 2] on cpu) must have one shape and device");
  EXPECT_ERROR_CONTAINS(ops::dropout_add(x, r, 1.5), "dropout_add: probability p must be in [0, 1], got 1.5");
}

TEST(DropoutTest, BadInputs) {
  const Tensor x = random_tensor({2, 2}, 49);
  EXPECT_ERROR_CONTAINS(ops::dropout(x, 1.5), "probability p must be in [0, 1], got 1.5");
  EXPECT_ERROR_CONTAINS(ops::dropout(x, -0.1), "got -0.1");
  EXPECT_ERROR_CONTAINS(ops::dropout(x, std::nan("")), "got nan");
  EXPECT_ERROR_CONTAINS(ops::dropout(core::ones({2}, DType::i64), 0.5), "expected a floating tensor");
}

}  // namespace
}  // namespace colossal
