// Philox4x32-10 against the Random123 known-answer vectors, the mapping from (seed, offset, element)
// to random words, the Generator's seed/offset bookkeeping (what makes draws reproducible and
// replayable), and the distributions of uniform_, normal_ and randint.
#include <gtest/gtest.h>

#include <algorithm>
#include <array>
#include <cmath>
#include <cstdint>
#include <vector>

#include "colossal/core/philox.h"
#include "colossal/core/random.h"
#include "colossal/core/tensor.h"
#include "colossal/core/view.h"
#include "gradcheck.h"  // EXPECT_ERROR_CONTAINS

namespace colossal::core {
namespace {

void expect_block(const PhiloxBlock& actual, std::array<uint32_t, 4> expected) {
  for (int i = 0; i < 4; ++i) EXPECT_EQ(actual.x[i], expected[i]) << "word " << i;
}

// Known-answer vectors from Random123's kat_vectors (philox4x32_10): counter, key -> output.
TEST(Philox, KnownAnswerZeros) {
  expect_block(philox4x32_10(PhiloxBlock{{0, 0, 0, 0}}, 0, 0), {0x6627e8d5, 0xe169c58d, 0xbc57ac4c, 0x9b00dbd8});
}

TEST(Philox, KnownAnswerAllOnes) {
  expect_block(philox4x32_10(PhiloxBlock{{0xffffffff, 0xffffffff, 0xffffffff, 0xffffffff}}, 0xffffffff, 0xffffffff),
               {0x408f276d, 0x41c83b0e, 0xa20bc7c6, 0x6d5451fd});
}

TEST(Philox, KnownAnswerPiDigits) {
  expect_block(philox4x32_10(PhiloxBlock{{0x243f6a88, 0x85a308d3, 0x13198a2e, 0x03707344}}, 0xa4093822, 0x299f31d0),
               {0xd16cfe09, 0x94fdcceb, 0x5001e420, 0x24126ea1});
}

TEST(Philox, BlockPacksBlockOffsetAndSeedLowWordFirst) {
  // counter = (block lo, block hi, offset lo, offset hi), key = (seed lo, seed hi).
  expect_block(philox_block(0, 0, 0), {0x6627e8d5, 0xe169c58d, 0xbc57ac4c, 0x9b00dbd8});
  expect_block(philox_block(~uint64_t{0}, ~uint64_t{0}, ~uint64_t{0}),
               {0x408f276d, 0x41c83b0e, 0xa20bc7c6, 0x6d5451fd});
  expect_block(philox_block(0x299f31d0a4093822ull, 0x0370734413198a2eull, 0x85a308d3243f6a88ull),
               {0xd16cfe09, 0x94fdcceb, 0x5001e420, 0x24126ea1});
}

TEST(Philox, UniformFromBits) {
  // uniform_float keeps the top 24 bits: k * 2^-24 for k in [0, 2^24), exact in float.
  EXPECT_EQ(uniform_float(0), 0.0f);
  EXPECT_EQ(uniform_float(0xff), 0.0f);
  EXPECT_EQ(uniform_float(0x80000000u), 0.5f);
  EXPECT_EQ(uniform_float(0xffffffffu), 1.0f - 0x1p-24f);
  EXPECT_LT(uniform_float(0xffffffffu), 1.0f);
  // uniform_double takes 32 bits of hi and the top 21 of lo: k * 2^-53 for k in [0, 2^53).
  EXPECT_EQ(uniform_double(0, 0), 0.0);
  EXPECT_EQ(uniform_double(0x80000000u, 0), 0.5);
  EXPECT_EQ(uniform_double(0, 0x800u), 0x1p-53);
  EXPECT_EQ(uniform_double(0, 0x7ffu), 0.0);
  EXPECT_EQ(uniform_double(0xffffffffu, 0xffffffffu), 1.0 - 0x1p-53);
}

TEST(Generator, SeedAndOffsetBookkeeping) {
  Generator g;
  EXPECT_EQ(g.seed(), 0u);
  EXPECT_EQ(g.state(), (GeneratorState{0, 0}));
  Generator h(42);
  EXPECT_EQ(h.seed(), 42u);
  EXPECT_EQ(h.next_offset(), 0u);
  EXPECT_EQ(h.next_offset(3), 1u);
  EXPECT_EQ(h.next_offset(), 4u);
  EXPECT_EQ(h.state(), (GeneratorState{42, 5}));
  h.manual_seed(7);
  EXPECT_EQ(h.state(), (GeneratorState{7, 0}));
  h.set_state({9, 100});
  EXPECT_EQ(h.seed(), 9u);
  EXPECT_EQ(h.next_offset(), 100u);
}

TEST(Generator, F32DrawIsTheDocumentedFunctionOfSeedOffsetAndIndex) {
  // Element i of a draw is uniform_float(word i % 4 of philox_block(seed, offset, i / 4)), with
  // one offset per draw; 11 elements cover a partial last block.
  Generator g(1234);
  g.set_state({1234, 5});
  Tensor t = rand({11}, {}, &g);
  EXPECT_EQ(g.state(), (GeneratorState{1234, 6}));
  const std::vector<float> v = t.to_vector<float>();
  for (uint64_t i = 0; i < v.size(); ++i) {
    EXPECT_EQ(v[i], uniform_float(philox_block(1234, 5, i / 4).x[i % 4])) << "element " << i;
  }
}

TEST(Generator, F64DrawPairsTwoStreams) {
  // f64 uniforms take word i % 4 of block i / 4 from the draw's offset and from offset ^ 2^63.
  Generator g(99);
  Tensor t = rand({6}, DType::f64, &g);
  const std::vector<double> v = t.to_vector<double>();
  for (uint64_t i = 0; i < v.size(); ++i) {
    const PhiloxBlock hi = philox_block(99, 0, i / 4);
    const PhiloxBlock lo = philox_block(99, uint64_t{1} << 63, i / 4);
    EXPECT_EQ(v[i], uniform_double(hi.x[i % 4], lo.x[i % 4])) << "element " << i;
  }
}

TEST(Generator, SameSeedSameStreamDifferentSeedDifferentStream) {
  Generator a(2024), b(2024), c(2025);
  const auto first = rand({64}, {}, &a).to_vector<float>();
  EXPECT_EQ(rand({64}, {}, &b).to_vector<float>(), first);
  EXPECT_NE(rand({64}, {}, &c).to_vector<float>(), first);
  // The next draw from a and b agree with each other but not with their first draw.
  const auto second = rand({64}, {}, &a).to_vector<float>();
  EXPECT_EQ(rand({64}, {}, &b).to_vector<float>(), second);
  EXPECT_NE(second, first);
}

TEST(Generator, EachDrawTakesOneOffsetAndReplaysFromItsState) {
  // A draw of any size advances the offset by one: a draw of n then m is not the first n + m
  // numbers of one stream but two streams (seed, 0) and (seed, 1). Every draw replays exactly
  // from the state before it (how activation checkpointing recomputes dropout).
  Generator g(7);
  const GeneratorState before_first = g.state();
  const auto first = rand({5}, {}, &g).to_vector<float>();
  const GeneratorState before_second = g.state();
  EXPECT_EQ(before_second, (GeneratorState{7, 1}));
  const auto second = rand({3}, {}, &g).to_vector<float>();
  EXPECT_EQ(g.state(), (GeneratorState{7, 2}));
  Generator replay(0);
  replay.set_state(before_second);
  EXPECT_EQ(rand({3}, {}, &replay).to_vector<float>(), second);
  replay.set_state(before_first);
  EXPECT_EQ(rand({5}, {}, &replay).to_vector<float>(), first);
  // Empty draws still take their offset, so later draws do not depend on tensor sizes.
  rand({0}, {}, &g);
  EXPECT_EQ(g.state(), (GeneratorState{7, 3}));
}

TEST(Generator, DrawsArePrefixConsistent) {
  // Element i depends only on (seed, offset, i): a longer draw from the same state extends a
  // shorter one, whatever its shape.
  Generator short_gen(31), long_gen(31);
  const auto head = rand({7}, {}, &short_gen).to_vector<float>();
  const auto all = rand({3, 4}, {}, &long_gen).to_vector<float>();
  EXPECT_EQ(std::vector<float>(all.begin(), all.begin() + 7), head);
}

TEST(Generator, NonContiguousTargetGetsTheContiguousDrawInRowMajorOrder) {
  Tensor base = zeros({4, 3});
  Tensor t = transpose_raw(base, 0, 1);  // [3, 4], not contiguous
  Generator g(5), reference(5);
  uniform_(t, 0.0, 1.0, &g);
  EXPECT_EQ(t.to_vector<float>(), rand({3, 4}, {}, &reference).to_vector<float>());
}

TEST(Generator, HalfPrecisionUniformStaysBelowHigh) {
  // Rounding f32 draws near 1 to bf16/f16 lands on 1.0 about 2000 (bf16) and 250 (f16) times per
  // million; [low, high) must hold in every dtype, also for a negative high.
  for (DType dtype : {DType::bf16, DType::f16}) {
    Generator g(123);
    Tensor t = empty({1 << 20}, dtype);
    uniform_(t, 0.0, 1.0, &g);
    const auto values = t.to(DType::f32).to_vector<float>();
    EXPECT_LT(*std::max_element(values.begin(), values.end()), 1.0f) << dtype_name(dtype);
    EXPECT_GE(*std::min_element(values.begin(), values.end()), 0.0f) << dtype_name(dtype);
    uniform_(t, -3.0, -1.0, &g);
    const auto negative = t.to(DType::f32).to_vector<float>();
    EXPECT_LT(*std::max_element(negative.begin(), negative.end()), -1.0f) << dtype_name(dtype);
  }
}

TEST(Generator, ManualSeedResetsTheDefaultGenerator) {
  manual_seed(77);
  const auto a = rand({100}).to_vector<float>();
  const auto b = randn({10}, DType::f64).to_vector<double>();
  EXPECT_EQ(default_generator().state(), (GeneratorState{77, 2}));
  manual_seed(77);
  EXPECT_EQ(rand({100}).to_vector<float>(), a);
  EXPECT_EQ(randn({10}, DType::f64).to_vector<double>(), b);
  manual_seed(78);
  EXPECT_NE(rand({100}).to_vector<float>(), a);
}

struct Moments {
  double mean = 0, variance = 0, min = 0, max = 0;
};

Moments moments_of(const std::vector<double>& v) {
  Moments m{0, 0, v.at(0), v.at(0)};
  for (double x : v) {
    m.mean += x;
    m.min = std::min(m.min, x);
    m.max = std::max(m.max, x);
  }
  m.mean /= static_cast<double>(v.size());
  for (double x : v) m.variance += (x - m.mean) * (x - m.mean);
  m.variance /= static_cast<double>(v.size() - 1);
  return m;
}

// The statistical tests draw n = 2^16 numbers from fixed seeds, so they are deterministic; the
// bounds are 6 standard errors of the estimate, which a correct generator exceeds with probability
// ~2e-9, while a wrong scale or offset (or a bias in the bit mapping) misses them by far.
constexpr int64_t kSamples = 1 << 16;

TEST(Distributions, UniformRangeMeanAndVariance) {
  Generator g(11);
  for (DType dtype : {DType::f32, DType::f64}) {
    const Moments m = moments_of(rand({kSamples}, dtype, &g).to_vector<double>());
    EXPECT_GE(m.min, 0.0);
    EXPECT_LT(m.max, 1.0);
    // U[0,1): mean 1/2, variance 1/12. SE(mean) = sqrt(1/12 / n) = 1.13e-3. The variance estimate
    // has SE sqrt((E(u-1/2)^4 - 1/144) / n) = sqrt((1/80 - 1/144) / n) = sqrt(1/180 / n) = 2.9e-4.
    EXPECT_NEAR(m.mean, 0.5, 6 * std::sqrt(1.0 / 12 / kSamples)) << dtype_name(dtype);
    EXPECT_NEAR(m.variance, 1.0 / 12, 6 * std::sqrt(1.0 / 180 / kSamples)) << dtype_name(dtype);
  }
}

TEST(Distributions, UniformWithBounds) {
  Generator g(12);
  Tensor t = empty({kSamples}, DType::f64);
  uniform_(t, -2.0, 3.0, &g);
  const Moments m = moments_of(t.to_vector<double>());
  EXPECT_GE(m.min, -2.0);
  EXPECT_LT(m.max, 3.0);
  // U[-2,3): mean 1/2, variance 25/12; the standard errors scale with the width 5 (variance 25).
  EXPECT_NEAR(m.mean, 0.5, 6 * 5 * std::sqrt(1.0 / 12 / kSamples));
  EXPECT_NEAR(m.variance, 25.0 / 12, 6 * 25 * std::sqrt(1.0 / 180 / kSamples));
  // Each tenth of the range holds a tenth of the draws: binomial SE sqrt(0.1 * 0.9 / n) = 1.2e-3.
  std::vector<int64_t> counts(10, 0);
  for (double x : t.to_vector<double>()) ++counts[std::min<size_t>(static_cast<size_t>((x + 2.0) * 2.0), 9)];
  for (int64_t c : counts) EXPECT_NEAR(static_cast<double>(c) / kSamples, 0.1, 6 * std::sqrt(0.09 / kSamples));
}

TEST(Distributions, NormalMeanVarianceAndShape) {
  Generator g(13);
  for (DType dtype : {DType::f32, DType::f64}) {
    const std::vector<double> v = randn({kSamples}, dtype, &g).to_vector<double>();
    const Moments m = moments_of(v);
    // N(0,1): SE(mean) = 1/sqrt(n) = 3.9e-3; the variance estimate has SE sqrt((E x^4 - 1) / n) =
    // sqrt(2 / n) = 5.5e-3.
    EXPECT_NEAR(m.mean, 0.0, 6 / std::sqrt(kSamples)) << dtype_name(dtype);
    EXPECT_NEAR(m.variance, 1.0, 6 * std::sqrt(2.0 / kSamples)) << dtype_name(dtype);
    // P(|x| < 1) = 0.682689 for a normal (a uniform of the same variance gives 0.577): binomial SE
    // sqrt(p (1 - p) / n) = 1.8e-3.
    int64_t inside = 0;
    for (double x : v) inside += std::abs(x) < 1.0;
    const double p = 0.6826894921370859;
    EXPECT_NEAR(static_cast<double>(inside) / kSamples, p, 6 * std::sqrt(p * (1 - p) / kSamples)) << dtype_name(dtype);
  }
}

TEST(Distributions, NormalWithMeanAndStd) {
  Generator g(14);
  Tensor t = empty({kSamples}, DType::f64);
  normal_(t, 3.0, 2.0, &g);
  const Moments m = moments_of(t.to_vector<double>());
  // N(3, 4): SE(mean) = 2 / sqrt(n); SE(variance) = sqrt(2 * 4^2 / n).
  EXPECT_NEAR(m.mean, 3.0, 6 * 2 / std::sqrt(kSamples));
  EXPECT_NEAR(m.variance, 4.0, 6 * std::sqrt(32.0 / kSamples));
  // std 0 is allowed and gives the mean exactly.
  Tensor c = empty({5}, DType::f64);
  normal_(c, -1.5, 0.0, &g);
  EXPECT_EQ(c.to_vector<double>(), (std::vector<double>{-1.5, -1.5, -1.5, -1.5, -1.5}));
}

TEST(Distributions, RandintCoversItsRangeUniformly) {
  Generator g(15);
  constexpr int64_t kDraws = 70000;
  Tensor t = randint(-3, 4, {kDraws}, DType::i64, &g);
  EXPECT_EQ(t.dtype(), DType::i64);
  std::vector<int64_t> counts(7, 0);
  for (int64_t x : t.to_vector<int64_t>()) {
    ASSERT_GE(x, -3);
    ASSERT_LT(x, 4);
    ++counts[static_cast<size_t>(x + 3)];
  }
  // Each value: binomial(n, 1/7), mean 10000, SD sqrt(n * 1/7 * 6/7) = 92.6.
  for (int64_t c : counts) EXPECT_NEAR(static_cast<double>(c), kDraws / 7.0, 6 * std::sqrt(kDraws / 7.0 * 6 / 7));
  Tensor small = randint(5, 6, {4}, DType::i32, &g);
  EXPECT_EQ(small.dtype(), DType::i32);
  EXPECT_EQ(small.to_vector<int32_t>(), (std::vector<int32_t>{5, 5, 5, 5}));
}

TEST(Distributions, ReducedPrecisionDrawsAreInRange) {
  Generator g(16);
  for (DType dtype : {DType::f16, DType::bf16}) {
    const Moments m = moments_of(randn({4096}, dtype, &g).to_vector<double>());
    // A normal from 24-bit uniforms is bounded by sqrt(-2 ln 2^-24) = 5.77.
    EXPECT_LT(std::abs(m.min), 5.8) << dtype_name(dtype);
    EXPECT_LT(m.max, 5.8) << dtype_name(dtype);
    EXPECT_GT(m.variance, 0.5) << dtype_name(dtype);
  }
}

TEST(Distributions, RejectBadArguments) {
  Tensor ints = empty({3}, DType::i32);
  EXPECT_ERROR_CONTAINS(uniform_(ints), "uniform_: needs a floating tensor, got i32");
  EXPECT_ERROR_CONTAINS(normal_(ints), "normal_: needs a floating tensor, got i32");
  Tensor f = empty({3});
  EXPECT_ERROR_CONTAINS(uniform_(f, 2.0, 1.0), "uniform_: low 2 must not exceed high 1");
  EXPECT_ERROR_CONTAINS(normal_(f, 0.0, -1.0), "normal_: std must be >= 0, got -1");
  EXPECT_ERROR_CONTAINS(randint(3, 3, {2}), "randint: empty range [3, 3)");
  EXPECT_ERROR_CONTAINS(rand({2}, DType::i64), "uniform_: needs a floating tensor, got i64");
}

TEST(Distributions, RequiresGradOption) {
  Generator g(17);
  EXPECT_TRUE(rand({2}, TensorOptions(DType::f32, kCpu, true), &g).requires_grad());
  EXPECT_TRUE(randn({2}, TensorOptions(DType::f64, kCpu, true), &g).requires_grad());
}

}  // namespace
}  // namespace colossal::core
