// Derived generators and host-side draws on core's Philox stream.
#include "colossal/data/random.h"

#include <cmath>
#include <numbers>

#include "colossal/core/error.h"
#include "colossal/core/philox.h"  // philox_block, uniform_double

namespace colossal::data {

core::Generator derive_generator(uint64_t seed, RandomStream stream, int64_t epoch, int64_t index) {
  // The stream tag goes into the key (spread by the golden-ratio constant so tags differ in many bits);
  // epoch and index form the counter. Philox's ten rounds make the result a good 64-bit hash.
  const uint64_t key = seed ^ (static_cast<uint64_t>(stream) * 0x9E3779B97F4A7C15ull);
  const core::PhiloxBlock block = core::philox_block(key, static_cast<uint64_t>(epoch), static_cast<uint64_t>(index));
  return core::Generator((static_cast<uint64_t>(block.x[1]) << 32) | block.x[0]);
}

uint64_t Rng::bits64() {
  const core::PhiloxBlock block = core::philox_block(generator_.seed(), generator_.next_offset(1), 0);
  return (static_cast<uint64_t>(block.x[0]) << 32) | block.x[1];
}

double Rng::uniform() {
  const core::PhiloxBlock block = core::philox_block(generator_.seed(), generator_.next_offset(1), 0);
  return core::uniform_double(block.x[0], block.x[1]);
}

int64_t Rng::integer(int64_t low, int64_t high) {
  COLOSSAL_CHECK(low < high, "Rng::integer: empty range [{}, {})", low, high);
  const uint64_t range = static_cast<uint64_t>(high) - static_cast<uint64_t>(low);
  // Lemire's multiply-and-reject: unbiased for every range.
  uint64_t x = bits64();
  __uint128_t m = static_cast<__uint128_t>(x) * range;
  auto low_bits = static_cast<uint64_t>(m);
  if (low_bits < range) {
    const uint64_t threshold = (0 - range) % range;
    while (low_bits < threshold) {
      x = bits64();
      m = static_cast<__uint128_t>(x) * range;
      low_bits = static_cast<uint64_t>(m);
    }
  }
  return low + static_cast<int64_t>(m >> 64);
}

double Rng::normal() {
  const double u1 = uniform();
  const double u2 = uniform();
  return std::sqrt(-2.0 * std::log(1.0 - u1)) * std::cos(2.0 * std::numbers::pi * u2);
}

double Rng::gamma(double shape) {
  COLOSSAL_CHECK(shape > 0.0 && std::isfinite(shape), "Rng::gamma: shape must be positive and finite, got {}", shape);
  if (shape < 1.0) {
    // Gamma(a) = Gamma(a + 1) * U^(1/a) (Marsaglia and Tsang, section 6).
    const double boosted = gamma(shape + 1.0);
    return boosted * std::pow(1.0 - uniform(), 1.0 / shape);
  }
  const double d = shape - 1.0 / 3.0;
  const double c = 1.0 / std::sqrt(9.0 * d);
  while (true) {
    double x, v;
    do {
      x = normal();
      v = 1.0 + c * x;
    } while (v <= 0.0);
    v = v * v * v;
    const double u = 1.0 - uniform();  // (0, 1]: log(u) stays finite
    if (u < 1.0 - 0.0331 * x * x * x * x) return d * v;
    if (std::log(u) < 0.5 * x * x + d * (1.0 - v + std::log(v))) return d * v;
  }
}

double Rng::beta(double a, double b) {
  COLOSSAL_CHECK(a > 0.0 && b > 0.0, "Rng::beta: both parameters must be positive, got a={} b={}", a, b);
  const double x = gamma(a);
  const double y = gamma(b);
  // For tiny parameters both gammas can underflow to 0; the distribution then sits at 0 and 1
  // with weights b/(a+b) and a/(a+b).
  if (x + y == 0.0) return uniform() < a / (a + b) ? 1.0 : 0.0;
  return x / (x + y);
}

std::vector<int64_t> Rng::permutation(int64_t n) {
  COLOSSAL_CHECK(n >= 0, "Rng::permutation: n must be non-negative, got {}", n);
  std::vector<int64_t> out(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) out[static_cast<size_t>(i)] = i;
  // One offset for the whole shuffle; swap i draws from Philox block i of it. The 64-bit multiply
  // maps a draw to [0, i] with a bias below 2^-32 for any n a dataset can have.
  const uint64_t seed = generator_.seed();
  const uint64_t offset = generator_.next_offset(1);
  for (int64_t i = n - 1; i > 0; --i) {
    const core::PhiloxBlock block = core::philox_block(seed, offset, static_cast<uint64_t>(i));
    const uint64_t x = (static_cast<uint64_t>(block.x[0]) << 32) | block.x[1];
    const auto j = static_cast<int64_t>((static_cast<__uint128_t>(x) * static_cast<uint64_t>(i + 1)) >> 64);
    std::swap(out[static_cast<size_t>(i)], out[static_cast<size_t>(j)]);
  }
  return out;
}

}  // namespace colossal::data
