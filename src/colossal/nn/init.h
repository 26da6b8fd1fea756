// Parameter initialisation schemes (torch.nn.init and timm's trunc_normal_): each fills a tensor in
// place, outside autograd, from a Philox generator (nullptr = core::default_generator()), so the
// same seed gives the same parameters on every device.
#pragma once

#include <cstdint>

#include "colossal/core/random.h"
#include "colossal/core/tensor.h"

namespace colossal::nn::init {

struct Fans {
  int64_t fan_in = 0;
  int64_t fan_out = 0;
};
/// fan_in = size(1) * receptive field, fan_out = size(0) * receptive field, where the receptive
/// field is the product of sizes after the first two (1 for a Linear weight [out, in]). Needs at
/// least 2 dimensions.
Fans compute_fans(const Tensor& t);

enum class FanMode { fan_in, fan_out };
enum class Nonlinearity { linear, conv, sigmoid, tanh, relu, leaky_relu, selu };
/// torch.nn.init.calculate_gain: 1 for linear/conv/sigmoid, 5/3 tanh, sqrt(2) relu,
/// sqrt(2 / (1 + slope^2)) leaky_relu (param is the slope), 3/4 selu.
double calculate_gain(Nonlinearity nonlinearity, double param = 0.01);

const Tensor& uniform_(const Tensor& t, double low = 0.0, double high = 1.0, core::Generator* generator = nullptr);
const Tensor& normal_(const Tensor& t, double mean = 0.0, double std = 1.0, core::Generator* generator = nullptr);
/// Normal(mean, std) truncated to [a, b] (absolute bounds, as timm and PyTorch: the ViT default
/// std 0.02 with a = -2, b = 2 truncates nothing in practice). Method (timm's, from JAX): draw
/// u ~ U(2 Phi(alpha) - 1, 2 Phi(beta) - 1) with alpha, beta the standardised bounds, take
/// x = mean + std * sqrt(2) * erfinv(u) and clamp to [a, b] against rounding. The inverse CDF is
/// computed in f64 on the host (erfinv by Giles' approximation refined with one Halley step),
/// so every device gets the same values; initialisation runs once, so the host round trip is cheap.
const Tensor& trunc_normal_(const Tensor& t, double mean = 0.0, double std = 1.0, double a = -2.0, double b = 2.0,
                            core::Generator* generator = nullptr);
const Tensor& constant_(const Tensor& t, double value);
const Tensor& zeros_(const Tensor& t);
const Tensor& ones_(const Tensor& t);

/// U(-bound, bound), bound = gain * sqrt(3 / fan). With the defaults PyTorch's Linear and Conv2d
/// use (a = sqrt(5), fan_in, leaky_relu) the bound is 1 / sqrt(fan_in).
const Tensor& kaiming_uniform_(const Tensor& t, double a = 0.0, FanMode mode = FanMode::fan_in,
                               Nonlinearity nonlinearity = Nonlinearity::leaky_relu,
                               core::Generator* generator = nullptr);
/// Normal(0, gain / sqrt(fan)).
const Tensor& kaiming_normal_(const Tensor& t, double a = 0.0, FanMode mode = FanMode::fan_in,
                              Nonlinearity nonlinearity = Nonlinearity::leaky_relu,
                              core::Generator* generator = nullptr);
/// U(-bound, bound), bound = gain * sqrt(6 / (fan_in + fan_out)).
const Tensor& xavier_uniform_(const Tensor& t, double gain = 1.0, core::Generator* generator = nullptr);
/// Normal(0, gain * sqrt(2 / (fan_in + fan_out))).
const Tensor& xavier_normal_(const Tensor& t, double gain = 1.0, core::Generator* generator = nullptr);

/// PyTorch's Linear/Conv2d default: weight kaiming_uniform_(a = sqrt(5)), bias (when defined)
/// U(-1 / sqrt(fan_in), 1 / sqrt(fan_in)) with the weight's fan_in.
void default_linear_init_(const Tensor& weight, const Tensor& bias, core::Generator* generator = nullptr);

/// erfinv(y) for y in [-1, 1] (infinite at +-1), to about 1e-15 relative.
double erfinv(double y);

}  // namespace colossal::nn::init
