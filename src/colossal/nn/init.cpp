// Initialisation schemes: fan arithmetic, gains, and the in-place fills behind them.
#include "colossal/nn/init.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

#include "colossal/autograd/grad_mode.h"  // NoGradGuard
#include "colossal/core/parallel_for.h"   // parallel_for
#include "colossal/core/view.h"           // to_device_raw

namespace colossal::nn::init {

namespace {

constexpr double kSqrt2 = 1.41421356237309504880;

void check_floating(const Tensor& t, const char* op) {
  COLOSSAL_CHECK(t.defined(), "{}: the tensor is undefined", op);
  COLOSSAL_CHECK(core::is_floating(t.dtype()), "{}: needs a floating tensor, got {} of shape {}", op, t.dtype(),
                 t.shape());
}

double normal_cdf(double x) {
  return 0.5 * (1.0 + std::erf(x / kSqrt2));
}

int64_t fan_for(const Tensor& t, FanMode mode) {
  const Fans fans = compute_fans(t);
  const int64_t fan = mode == FanMode::fan_in ? fans.fan_in : fans.fan_out;
  COLOSSAL_CHECK(fan > 0, "kaiming init: the {} of a tensor of shape {} is 0",
                 mode == FanMode::fan_in ? "fan_in" : "fan_out", t.shape());
  return fan;
}

}  // namespace

Fans compute_fans(const Tensor& t) {
  COLOSSAL_CHECK(t.dim() >= 2, "fan in and fan out need a tensor with at least 2 dimensions, got shape {}", t.shape());
  int64_t receptive_field = 1;
  for (int64_t d = 2; d < t.dim(); ++d) receptive_field *= t.size(d);
  return {t.size(1) * receptive_field, t.size(0) * receptive_field};
}

double calculate_gain(Nonlinearity nonlinearity, double param) {
  switch (nonlinearity) {
    case Nonlinearity::linear:
    case Nonlinearity::conv:
    case Nonlinearity::sigmoid:
      return 1.0;
    case Nonlinearity::tanh:
      return 5.0 / 3.0;
    case Nonlinearity::relu:
      return kSqrt2;
    case Nonlinearity::leaky_relu:
      return std::sqrt(2.0 / (1.0 + param * param));
    case Nonlinearity::selu:
      return 0.75;
  }
  COLOSSAL_FAIL("calculate_gain: unknown nonlinearity {}", static_cast<int>(nonlinearity));
}

const Tensor& uniform_(const Tensor& t, double low, double high, core::Generator* generator) {
  check_floating(t, "init::uniform_");
  autograd::NoGradGuard no_grad;
  Tensor handle = t;
  core::uniform_(handle, low, high, generator);
  return t;
}

const Tensor& normal_(const Tensor& t, double mean, double std, core::Generator* generator) {
  check_floating(t, "init::normal_");
  autograd::NoGradGuard no_grad;
  Tensor handle = t;
  core::normal_(handle, mean, std, generator);
  return t;
}

double erfinv(double y) {
  if (y <= -1.0) return -std::numeric_limits<double>::infinity();
  if (y >= 1.0) return std::numeric_limits<double>::infinity();
  // M. Giles, "Approximating the erfinv function" (GPU Gems 4, 2010), single-precision branch:
  // about 1e-7 relative, then one Halley step on erf(x) = y triples the correct digits (to f64's
  // limit) at the cost of one erf and one exp, half of what two Newton steps cost.
  double w = -std::log((1.0 - y) * (1.0 + y));
  double p;
  if (w < 5.0) {
    w -= 2.5;
    p = 2.81022636e-08;
    p = 3.43273939e-07 + p * w;
    p = -3.5233877e-06 + p * w;
    p = -4.39150654e-06 + p * w;
    p = 0.00021858087 + p * w;
    p = -0.00125372503 + p * w;
    p = -0.00417768164 + p * w;
    p = 0.246640727 + p * w;
    p = 1.50140941 + p * w;
  } else {
    w = std::sqrt(w) - 3.0;
    p = -0.000200214257;
    p = 0.000100950558 + p * w;
    p = 0.00134934322 + p * w;
    p = -0.00367342844 + p * w;
    p = 0.00573950773 + p * w;
    p = -0.0076224613 + p * w;
    p = 0.00943887047 + p * w;
    p = 1.00167406 + p * w;
    p = 2.83297682 + p * w;
  }
  double x = p * y;
  constexpr double kTwoOverSqrtPi = 1.12837916709551257390;
  // Halley: x -= f / (f' - f f'' / (2 f')) with f = erf(x) - y, f' = 2 / sqrt(pi) exp(-x^2) and
  // f'' = -2 x f', which simplifies to x -= f / (f' + x f).
  const double f = std::erf(x) - y;
  x -= f / (kTwoOverSqrtPi * std::exp(-x * x) + x * f);
  return x;
}

const Tensor& trunc_normal_(const Tensor& t, double mean, double std, double a, double b, core::Generator* generator) {
  check_floating(t, "init::trunc_normal_");
  COLOSSAL_CHECK(std > 0.0, "init::trunc_normal_: std must be positive, got {}", std);
  COLOSSAL_CHECK(a < b, "init::trunc_normal_: the bounds need a < b, got a = {}, b = {}", a, b);
  const double low = 2.0 * normal_cdf((a - mean) / std) - 1.0;
  const double high = 2.0 * normal_cdf((b - mean) / std) - 1.0;
  COLOSSAL_CHECK(high > low,
                 "init::trunc_normal_: [{}, {}] lies more than ~8 std from mean {} (std {}); the truncated normal "
                 "has no mass representable in f64 there",
                 a, b, mean, std);
  autograd::NoGradGuard no_grad;
  Tensor u = core::empty(t.shape(), DType::f64);
  core::uniform_(u, low, high, generator);
  double* values = u.data<double>();
  // Each element is independent, so the split over threads cannot change the values.
  core::parallel_for(0, u.numel(), core::kParallelGrain, [&](int64_t begin, int64_t end) {
    for (int64_t i = begin; i < end; ++i) values[i] = std::clamp(mean + std * kSqrt2 * erfinv(values[i]), a, b);
  });
  t.copy_(t.device().is_cpu() ? u : core::to_device_raw(u, t.device()));
  return t;
}

const Tensor& constant_(const Tensor& t, double value) {
  COLOSSAL_CHECK(t.defined(), "init::constant_: the tensor is undefined");
  return t.fill_(value);
}
const Tensor& zeros_(const Tensor& t) {
  return constant_(t, 0.0);
}
const Tensor& ones_(const Tensor& t) {
  return constant_(t, 1.0);
}

const Tensor& kaiming_uniform_(const Tensor& t, double a, FanMode mode, Nonlinearity nonlinearity,
                               core::Generator* generator) {
  check_floating(t, "init::kaiming_uniform_");
  const double std = calculate_gain(nonlinearity, a) / std::sqrt(static_cast<double>(fan_for(t, mode)));
  const double bound = std::sqrt(3.0) * std;  // U(-b, b) has std b / sqrt(3)
  return uniform_(t, -bound, bound, generator);
}

const Tensor& kaiming_normal_(const Tensor& t, double a, FanMode mode, Nonlinearity nonlinearity,
                              core::Generator* generator) {
  check_floating(t, "init::kaiming_normal_");
  const double std = calculate_gain(nonlinearity, a) / std::sqrt(static_cast<double>(fan_for(t, mode)));
  return normal_(t, 0.0, std, generator);
}

const Tensor& xavier_uniform_(const Tensor& t, double gain, core::Generator* generator) {
  check_floating(t, "init::xavier_uniform_");
  const Fans fans = compute_fans(t);
  const double bound = gain * std::sqrt(6.0 / static_cast<double>(fans.fan_in + fans.fan_out));
  return uniform_(t, -bound, bound, generator);
}

const Tensor& xavier_normal_(const Tensor& t, double gain, core::Generator* generator) {
  check_floating(t, "init::xavier_normal_");
  const Fans fans = compute_fans(t);
  return normal_(t, 0.0, gain * std::sqrt(2.0 / static_cast<double>(fans.fan_in + fans.fan_out)), generator);
}

void default_linear_init_(const Tensor& weight, const Tensor& bias, core::Generator* generator) {
  kaiming_uniform_(weight, std::sqrt(5.0), FanMode::fan_in, Nonlinearity::leaky_relu, generator);
  if (!bias.defined()) return;
  const int64_t fan_in = compute_fans(weight).fan_in;
  const double bound = fan_in > 0 ? 1.0 / std::sqrt(static_cast<double>(fan_in)) : 0.0;
  uniform_(bias, -bound, bound, generator);
}

}  // namespace colossal::nn::init
