// Initialisation schemes: fan and gain arithmetic against PyTorch's formulas, sample statistics
// within bounds set by the sampling error, trunc_normal_'s support and moments, erfinv accuracy,
// reproducibility from a seed, and the default Linear/Conv2d initialisation bounds.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <numeric>

#include "colossal/nn/init.h"
#include "gradcheck.h"

namespace colossal {
namespace {

namespace init = nn::init;

struct Moments {
  double mean = 0.0;
  double std = 0.0;
  double min = 0.0;
  double max = 0.0;
};

Moments moments_of(const Tensor& t) {
  const std::vector<double> v = t.to_vector<double>();
  Moments m;
  m.mean = std::accumulate(v.begin(), v.end(), 0.0) / static_cast<double>(v.size());
  double sq = 0.0;
  for (double x : v) sq += (x - m.mean) * (x - m.mean);
  m.std = std::sqrt(sq / static_cast<double>(v.size()));
  m.min = *std::min_element(v.begin(), v.end());
  m.max = *std::max_element(v.begin(), v.end());
  return m;
}

// Statistics below use n = 200,000 samples. The sample mean's standard error is std / sqrt(n) =
// 0.0022 std and the sample std's about std / sqrt(2n) = 0.0016 std; tolerances of 0.01 std are
// over 4 standard errors, so a correct sampler fails them with probability below 1e-4 (and the
// seeds are fixed, so the outcome is deterministic anyway), while a wrong scale (off by sqrt(3),
// sqrt(2) or the truncation factor) misses by far more.
constexpr int64_t kSamples = 200000;

TEST(Init, ComputeFans) {
  const auto linear = init::compute_fans(core::empty({5, 3}));
  EXPECT_EQ(linear.fan_in, 3);
  EXPECT_EQ(linear.fan_out, 5);
  const auto conv = init::compute_fans(core::empty({8, 4, 3, 2}));  // receptive field 3 * 2
  EXPECT_EQ(conv.fan_in, 24);
  EXPECT_EQ(conv.fan_out, 48);
  EXPECT_ERROR_CONTAINS(init::compute_fans(core::empty({7})), "at least 2 dimensions, got shape [7]");
}

TEST(Init, Gains) {
  EXPECT_DOUBLE_EQ(init::calculate_gain(init::Nonlinearity::linear), 1.0);
  EXPECT_DOUBLE_EQ(init::calculate_gain(init::Nonlinearity::tanh), 5.0 / 3.0);
  EXPECT_DOUBLE_EQ(init::calculate_gain(init::Nonlinearity::relu), std::sqrt(2.0));
  // leaky_relu with slope sqrt(5): sqrt(2 / 6), what PyTorch's Linear default uses.
  EXPECT_DOUBLE_EQ(init::calculate_gain(init::Nonlinearity::leaky_relu, std::sqrt(5.0)), std::sqrt(1.0 / 3.0));
  EXPECT_DOUBLE_EQ(init::calculate_gain(init::Nonlinearity::selu), 0.75);
}

TEST(Init, UniformAndNormalStatistics) {
  core::Generator gen(1);
  Tensor t = core::empty({kSamples});
  init::uniform_(t, -0.5, 1.5, &gen);
  Moments m = moments_of(t);
  EXPECT_GE(m.min, -0.5);
  EXPECT_LT(m.max, 1.5);
  EXPECT_NEAR(m.mean, 0.5, 0.01 * 2.0 / std::sqrt(12.0));
  EXPECT_NEAR(m.std, 2.0 / std::sqrt(12.0), 0.01 * 2.0 / std::sqrt(12.0));

  init::normal_(t, 3.0, 0.02, &gen);
  m = moments_of(t);
  EXPECT_NEAR(m.mean, 3.0, 0.01 * 0.02);
  EXPECT_NEAR(m.std, 0.02, 0.01 * 0.02);
}

TEST(Init, TruncNormalStaysInBoundsWithTheTruncatedMoments) {
  core::Generator gen(2);
  Tensor t = core::empty({kSamples}, DType::f64);
  // Truncation at +-1 std: the truncated normal's std is sqrt(1 - 2 phi(1) / (Phi(1) - Phi(-1)))
  // = sqrt(1 - 2 * 0.2419707 / 0.6826895) = 0.5395865.
  init::trunc_normal_(t, 0.0, 1.0, -1.0, 1.0, &gen);
  Moments m = moments_of(t);
  EXPECT_GE(m.min, -1.0);
  EXPECT_LE(m.max, 1.0);
  EXPECT_NEAR(m.mean, 0.0, 0.01 * 0.54);
  EXPECT_NEAR(m.std, 0.5395865, 0.01 * 0.54);
  // Near both ends: the support is covered, not just the middle.
  EXPECT_LT(m.min, -0.99);
  EXPECT_GT(m.max, 0.99);

  // timm's ViT default: std 0.02 with absolute bounds +-2 (100 std away) is a plain normal(0, 0.02).
  init::trunc_normal_(t, 0.0, 0.02, -2.0, 2.0, &gen);
  m = moments_of(t);
  EXPECT_NEAR(m.std, 0.02, 0.01 * 0.02);
  EXPECT_NEAR(m.mean, 0.0, 0.01 * 0.02);

  // An asymmetric window that excludes the mean: all samples in [0.5, 3] around mean 1, std 2.
  init::trunc_normal_(t, 1.0, 2.0, 0.5, 3.0, &gen);
  m = moments_of(t);
  EXPECT_GE(m.min, 0.5);
  EXPECT_LE(m.max, 3.0);

  // f32 and a non-contiguous target take the same path.
  Tensor f32 = core::empty({64, 32});
  init::trunc_normal_(f32.t(), 0.0, 1.0, -0.25, 0.25, &gen);
  m = moments_of(f32);
  EXPECT_GE(m.min, -0.25);
  EXPECT_LE(m.max, 0.25);

  EXPECT_ERROR_CONTAINS(init::trunc_normal_(t, 0.0, 1.0, 2.0, 1.0), "need a < b, got a = 2, b = 1");
  EXPECT_ERROR_CONTAINS(init::trunc_normal_(t, 0.0, 0.0), "std must be positive, got 0");
  EXPECT_ERROR_CONTAINS(init::trunc_normal_(t, 0.0, 1.0, 50.0, 60.0), "no mass representable");
  EXPECT_ERROR_CONTAINS(init::trunc_normal_(core::empty({2}, DType::i64)), "needs a floating tensor, got i64");
}

TEST(Init, ErfinvInvertsErf) {
  // erf(erfinv(y)) = y to f64 rounding; the tails (|y| near 1) are where approximations break.
  for (double y : {-0.999999999, -0.9, -0.3, 0.0, 1e-12, 0.5, 0.95, 0.999999}) {
    EXPECT_NEAR(std::erf(init::erfinv(y)), y, 4e-16) << "y = " << y;
  }
  EXPECT_NEAR(init::erfinv(0.5), 0.4769362762044699, 1e-15);  // tabulated value
  EXPECT_TRUE(std::isinf(init::erfinv(1.0)));
}

TEST(Init, SameSeedSameValues) {
  core::Generator a(7), b(7);
  Tensor x = core::empty({100}), y = core::empty({100});
  init::trunc_normal_(x, 0.0, 1.0, -2.0, 2.0, &a);
  init::trunc_normal_(y, 0.0, 1.0, -2.0, 2.0, &b);
  EXPECT_EQ(x.to_vector<float>(), y.to_vector<float>());
  // The generator advances, so the next draw differs.
  init::trunc_normal_(y, 0.0, 1.0, -2.0, 2.0, &b);
  EXPECT_NE(x.to_vector<float>(), y.to_vector<float>());
}

TEST(Init, KaimingAndXavierScales) {
  core::Generator gen(3);
  // [400, 500]: fan_in 500, fan_out 400; 200,000 samples as above.
  Tensor w = core::empty({400, 500});
  init::kaiming_uniform_(w, std::sqrt(5.0), init::FanMode::fan_in, init::Nonlinearity::leaky_relu, &gen);
  Moments m = moments_of(w);
  const double linear_bound = 1.0 / std::sqrt(500.0);  // PyTorch's Linear default
  EXPECT_GE(m.min, -linear_bound);
  EXPECT_LE(m.max, linear_bound);
  EXPECT_NEAR(m.std, linear_bound / std::sqrt(3.0), 0.01 * linear_bound / std::sqrt(3.0));

  init::kaiming_normal_(w, 0.0, init::FanMode::fan_out, init::Nonlinearity::relu, &gen);
  EXPECT_NEAR(moments_of(w).std, std::sqrt(2.0 / 400.0), 0.01 * std::sqrt(2.0 / 400.0));

  init::xavier_uniform_(w, 1.0, &gen);
  m = moments_of(w);
  const double xavier_bound = std::sqrt(6.0 / 900.0);
  EXPECT_GE(m.min, -xavier_bound);
  EXPECT_LE(m.max, xavier_bound);
  EXPECT_NEAR(m.std, xavier_bound / std::sqrt(3.0), 0.01 * xavier_bound / std::sqrt(3.0));

  init::xavier_normal_(w, 2.0, &gen);
  EXPECT_NEAR(moments_of(w).std, 2.0 * std::sqrt(2.0 / 900.0), 0.01 * 2.0 * std::sqrt(2.0 / 900.0));
}

TEST(Init, DefaultLinearInitBounds) {
  core::Generator gen(4);
  Tensor w = core::empty({16, 3, 3, 3});  // a Conv2d weight: fan_in 27
  Tensor b = core::empty({16});
  init::default_linear_init_(w, b, &gen);
  const double bound = 1.0 / std::sqrt(27.0);
  for (const Tensor& t : {w, b}) {
    const Moments m = moments_of(t);
    EXPECT_GE(m.min, -bound);
    EXPECT_LE(m.max, bound);
    EXPECT_GT(m.max - m.min, bound);  // spread over the range, not collapsed
  }
}

TEST(Init, ConstantFills) {
  Tensor t = core::empty({2, 3});
  init::constant_(t, 0.25);
  testing::expect_values(t, std::vector<double>(6, 0.25));
  init::ones_(t);
  testing::expect_values(t, std::vector<double>(6, 1.0));
  init::zeros_(t);
  testing::expect_values(t, std::vector<double>(6, 0.0));
}

TEST(Init, ParametersRequiringGradCanBeInitialised) {
  // Initialisation writes outside autograd, so a parameter (a leaf requiring grad) is fine.
  Tensor p = core::empty({4, 4}, TensorOptions(DType::f32, core::kCpu, true));
  init::trunc_normal_(p, 0.0, 0.02);
  init::kaiming_uniform_(p);
  EXPECT_TRUE(p.requires_grad());
  EXPECT_TRUE(p.is_leaf());
}

}  // namespace
}  // namespace colossal
