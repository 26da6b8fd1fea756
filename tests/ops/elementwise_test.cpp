// Elementwise ops: gradient checks for every differentiable op, values derived by hand,
// broadcasting, dtype promotion, half-precision agreement and bad input.
#include <gtest/gtest.h>

#include <cmath>

#include "gradcheck.h"

namespace colossal {
namespace {

using testing::check_gradients;
using testing::expect_close;
using testing::expect_values;
using testing::random_leaf;
using testing::random_tensor;

/// Gradient check of a unary op on inputs drawn from [low, high).
void check_unary(const std::function<Tensor(const Tensor&)>& op, double low, double high) {
  check_gradients({.make_inputs = [=] { return std::vector<Tensor>{random_leaf({3, 4}, 11, low, high)}; },
                   .fn = [=](const std::vector<Tensor>& in) { return op(in[0]); }});
}

/// Gradient check of a binary op, broadcasting [3, 1, 4] against [2, 4].
void check_binary(const std::function<Tensor(const Tensor&, const Tensor&)>& op, double low, double high) {
  check_gradients({.make_inputs =
                       [=] {
                         return std::vector<Tensor>{random_leaf({3, 1, 4}, 21, low, high), random_leaf({2, 4}, 22, low, high)};
                       },
                   .fn = [=](const std::vector<Tensor>& in) { return op(in[0], in[1]); }});
}

TEST(GradCheck, add) { check_binary([](const Tensor& a, const Tensor& b) { return ops::add(a, b, 0.5); }, -1, 1); }
TEST(GradCheck, sub) { check_binary([](const Tensor& a, const Tensor& b) { return ops::sub(a, b, 2.0); }, -1, 1); }
TEST(GradCheck, mul) { check_binary([](const Tensor& a, const Tensor& b) { return a * b; }, -1, 1); }
// Denominators in [0.5, 2) keep 1/b smooth.
TEST(GradCheck, div) { check_binary([](const Tensor& a, const Tensor& b) { return a / b; }, 0.5, 2); }
TEST(GradCheck, pow_tensor) { check_binary([](const Tensor& a, const Tensor& b) { return ops::pow(a, b); }, 0.5, 2); }
// Separate draws never tie, so maximum/minimum are differentiable at every sample.
TEST(GradCheck, maximum) { check_binary([](const Tensor& a, const Tensor& b) { return ops::maximum(a, b); }, -1, 1); }
TEST(GradCheck, minimum) { check_binary([](const Tensor& a, const Tensor& b) { return ops::minimum(a, b); }, -1, 1); }
TEST(GradCheck, scalar_arithmetic) {
  check_unary([](const Tensor& a) { return (a * 3.0 + 1.5) / 2.0 - 0.25; }, -1, 1);
}
TEST(GradCheck, neg) { check_unary([](const Tensor& a) { return -a; }, -1, 1); }
TEST(GradCheck, pow) { check_unary([](const Tensor& a) { return ops::pow(a, 3.5); }, 0.5, 2); }
TEST(GradCheck, exp) { check_unary([](const Tensor& a) { return ops::exp(a); }, -2, 2); }
TEST(GradCheck, log) { check_unary([](const Tensor& a) { return ops::log(a); }, 0.5, 3); }
TEST(GradCheck, tanh) { check_unary([](const Tensor& a) { return ops::tanh(a); }, -2, 2); }
TEST(GradCheck, sqrt) { check_unary([](const Tensor& a) { return ops::sqrt(a); }, 0.5, 3); }
TEST(GradCheck, rsqrt) { check_unary([](const Tensor& a) { return ops::rsqrt(a); }, 0.5, 3); }
// Kinked ops: inputs drawn from [0.1, 1) with random sign flips stay 0.1 away from the kink.
Tensor away_from_zero(uint64_t seed) {
  Tensor magnitude = random_tensor({3, 4}, seed, 0.1, 1.0);
  Tensor sign = random_tensor({3, 4}, seed + 1, -1.0, 1.0);
  Tensor x = core::empty({3, 4}, DType::f64);
  for (int64_t i = 0; i < 12; ++i) {
    x.data<double>()[i] = magnitude.data<double>()[i] * (sign.data<double>()[i] < 0 ? -1.0 : 1.0);
  }
  x.set_requires_grad(true);
  return x;
}
TEST(GradCheck, abs) {
  check_gradients({.make_inputs = [] { return std::vector<Tensor>{away_from_zero(5)}; },
                   .fn = [](const std::vector<Tensor>& in) { return ops::abs(in[0]); }});
}
TEST(GradCheck, relu) {
  check_gradients({.make_inputs = [] { return std::vector<Tensor>{away_from_zero(6)}; },
                   .fn = [](const std::vector<Tensor>& in) { return ops::relu(in[0]); }});
}
TEST(GradCheck, clamp) { check_unary([](const Tensor& a) { return ops::clamp(a, -0.503, 0.497); }, -1, 1); }
TEST(GradCheck, sigmoid) { check_unary([](const Tensor& a) { return ops::sigmoid(a); }, -3, 3); }
TEST(GradCheck, silu) { check_unary([](const Tensor& a) { return ops::silu(a); }, -3, 3); }
TEST(GradCheck, gelu) { check_unary([](const Tensor& a) { return ops::gelu(a); }, -3, 3); }
TEST(GradCheck, gelu_tanh) { check_unary([](const Tensor& a) { return ops::gelu(a, ops::GeluApproximation::tanh); }, -3, 3); }
TEST(GradCheck, same_input_twice) {
  // x * x routes two gradients into one leaf: the engine must add them (d/dx x^2 = 2x).
  check_unary([](const Tensor& a) { return a * a + a; }, -1, 1);
}

TEST(Elementwise, ValuesByHand) {
  Tensor a = core::from_vector<double>({1, 2, 3, 4}, {2, 2});
  Tensor b = core::from_vector<double>({10, 20}, {2});
  expect_values(a + b, {11, 22, 13, 24});          // b broadcast over rows
  expect_values(ops::sub(a, b, 0.5), {-4, -8, -2, -6});  // a - 0.5 b
  expect_values(a * b, {10, 40, 30, 80});
  expect_values(b / a, {10, 10, 10.0 / 3, 5}, 1e-15);
  expect_values(ops::pow(a, 2.0), {1, 4, 9, 16});
  expect_values(ops::relu(core::from_vector<double>({-1, 0, 2}, {3})), {0, 0, 2});
  // exact GELU at 1: 0.5 * (1 + erf(1/sqrt 2)) = 0.8413447460685429 (Phi(1)).
  expect_values(ops::gelu(core::from_vector<double>({1.0}, {1})), {0.8413447460685429}, 1e-15);
  // tanh GELU at 1: 0.5 * (1 + tanh(sqrt(2/pi) * 1.044715)) = 0.8411919906082768.
  expect_values(ops::gelu(core::from_vector<double>({1.0}, {1}), ops::GeluApproximation::tanh), {0.8411919906082768}, 1e-15);
  expect_values(ops::sigmoid(core::from_vector<double>({0.0}, {1})), {0.5});
  expect_values(ops::silu(core::from_vector<double>({2.0}, {1})), {2.0 / (1.0 + std::exp(-2.0))}, 1e-15);
  expect_values(ops::rsqrt(core::from_vector<double>({4.0}, {1})), {0.5});
  expect_values(ops::maximum(core::from_vector<double>({1, 5}, {2}), core::from_vector<double>({3, 2}, {2})), {3, 5});
  expect_values(ops::clamp(core::from_vector<double>({-2, 0.5, 9}, {3}), -1, 1), {-1, 0.5, 1});
}

TEST(Elementwise, ComparisonsGiveBool) {
  Tensor a = core::from_vector<float>({1, 2, 3}, {3});
  Tensor b = core::from_vector<float>({3, 2, 1}, {3});
  Tensor lt = ops::lt(a, b);
  EXPECT_EQ(lt.dtype(), DType::boolean);
  expect_values(lt, {1, 0, 0});
  expect_values(ops::eq(a, b), {0, 1, 0});
  expect_values(ops::ge(a, b), {0, 1, 1});
  expect_values(ops::gt(a, 1.5), {0, 1, 1});
}

TEST(Elementwise, PromotesMixedDtypes) {
  Tensor i = core::from_vector<int64_t>({1, 2}, {2});
  Tensor f = core::from_vector<float>({0.5f, 0.25f}, {2});
  Tensor sum = i + f;
  EXPECT_EQ(sum.dtype(), DType::f32);
  expect_values(sum, {1.5, 2.25});
  EXPECT_EQ((i + i).dtype(), DType::i64);
  expect_values(i * 3.0, {3, 6});
}

TEST(Elementwise, NonContiguousOperands) {
  Tensor a = random_tensor({4, 3}, 3);
  Tensor at = a.t();  // [3, 4], strides (1, 3)
  Tensor b = random_tensor({3, 4}, 4);
  Tensor out = at * b;
  Tensor expected = at.contiguous() * b;
  expect_close(out, expected, 0, 0, "transposed operand");
}

TEST(Elementwise, HalfPrecisionAgreesWithDouble) {
  // One rounding of the f32-computed result to bf16 (8 bits of mantissa) or f16 (11 bits):
  // relative error <= 2^-8 and 2^-11, plus rounding of the inputs themselves (same size).
  Tensor x = random_tensor({257}, 9, -3, 3);
  for (auto [dtype, rel] : {std::pair{DType::bf16, 2.0 * std::ldexp(1.0, -8)}, std::pair{DType::f16, 2.0 * std::ldexp(1.0, -11)}}) {
    Tensor xh = x.to(dtype);
    Tensor reference = ops::gelu(xh.to(DType::f64));
    expect_close(ops::gelu(xh), reference, 1e-3, rel, "gelu in reduced precision");
    expect_close(ops::exp(xh), ops::exp(xh.to(DType::f64)), 1e-3, rel, "exp in reduced precision");
  }
}

TEST(Elementwise, LargeParallelAddMatchesSerialDefinition) {
  // Sizes past the parallel grain exercise the threaded path.
  Tensor a = random_tensor({300, 1000}, 1, -1, 1, DType::f32);
  Tensor b = random_tensor({1000}, 2, -1, 1, DType::f32);
  Tensor out = a + b;
  const auto va = a.to_vector<float>(), vb = b.to_vector<float>(), vo = out.to_vector<float>();
  for (size_t i = 0; i < va.size(); i += 997) ASSERT_EQ(vo[i], va[i] + vb[i % 1000]);
}

TEST(Elementwise, InPlaceUpdates) {
  Tensor a = core::from_vector<double>({1, 2}, {2});
  Tensor b = core::from_vector<double>({3, 4}, {2});
  ops::add_(a, b, 2.0);
  expect_values(a, {7, 10});
  ops::mul_(a, 0.5);
  expect_values(a, {3.5, 5});
  ops::addcmul_(a, b, b, 0.5);
  expect_values(a, {8, 13});
  ops::addcdiv_(a, b, b, -1.0);
  expect_values(a, {7, 12});
}

TEST(Elementwise, BadInput) {
  Tensor a = core::zeros({2, 3});
  Tensor b = core::zeros({4});
  EXPECT_ERROR_CONTAINS(a + b, "[2, 3] and [4] cannot be broadcast");
  Tensor ints = core::zeros({2}, DType::i64);
  EXPECT_ERROR_CONTAINS(ops::exp(ints), "expected a floating tensor, got i64");
  Tensor leaf = core::ones({2});
  leaf.set_requires_grad(true);
  EXPECT_ERROR_CONTAINS(ops::mul_(leaf, 2.0), "NoGradGuard");
  {
    autograd::NoGradGuard no_grad;
    ops::mul_(leaf, 2.0);
  }
  expect_values(leaf.detach(), {2, 2});
}

}  // namespace
}  // namespace colossal
