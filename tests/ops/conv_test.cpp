// conv2d: gradient checks (stride, padding, dilation, groups, bias), hand-derived values, agreement
// with a direct-convolution loop on random inputs in every dtype, chunked batches, and bad input.
#include <gtest/gtest.h>

#include <cmath>

#include "colossal/core/view.h"  // cast_raw, narrow_raw, transpose_raw
#include "gradcheck.h"

namespace colossal {
namespace {

using ops::Pair;
using testing::check_gradients;
using testing::expect_close;
using testing::expect_values;
using testing::random_leaf;
using testing::random_tensor;

/// The textbook six-loop convolution in f64, independent of im2col and BLAS.
Tensor direct_conv2d(const Tensor& x_in, const Tensor& w_in, const Tensor& b_in, Pair stride, Pair padding,
                     Pair dilation, int64_t groups) {
  const std::vector<double> x = x_in.to_vector<double>();
  const std::vector<double> w = w_in.to_vector<double>();
  const std::vector<double> b = b_in.defined() ? b_in.to_vector<double>() : std::vector<double>();
  const int64_t n_images = x_in.size(0), channels = x_in.size(1), height = x_in.size(2), width = x_in.size(3);
  const int64_t out_channels = w_in.size(0), group_channels = w_in.size(1), kh = w_in.size(2), kw = w_in.size(3);
  const int64_t out_h = (height + 2 * padding[0] - dilation[0] * (kh - 1) - 1) / stride[0] + 1;
  const int64_t out_w = (width + 2 * padding[1] - dilation[1] * (kw - 1) - 1) / stride[1] + 1;
  const int64_t out_per_group = out_channels / groups;
  std::vector<double> out(static_cast<size_t>(n_images * out_channels * out_h * out_w));
  for (int64_t n = 0; n < n_images; ++n) {
    for (int64_t o = 0; o < out_channels; ++o) {
      const int64_t group = o / out_per_group;
      for (int64_t oh = 0; oh < out_h; ++oh) {
        for (int64_t ow = 0; ow < out_w; ++ow) {
          double total = b.empty() ? 0.0 : b[o];
          for (int64_t ci = 0; ci < group_channels; ++ci) {
            const int64_t c = group * group_channels + ci;
            for (int64_t i = 0; i < kh; ++i) {
              for (int64_t j = 0; j < kw; ++j) {
                const int64_t ih = oh * stride[0] - padding[0] + i * dilation[0];
                const int64_t iw = ow * stride[1] - padding[1] + j * dilation[1];
                if (ih < 0 || ih >= height || iw < 0 || iw >= width) continue;
                total += x[((n * channels + c) * height + ih) * width + iw] *
                         w[((o * group_channels + ci) * kh + i) * kw + j];
              }
            }
          }
          out[((n * out_channels + o) * out_h + oh) * out_w + ow] = total;
        }
      }
    }
  }
  return core::from_vector(out, {n_images, out_channels, out_h, out_w});
}

struct ConvCase {
  Shape x_shape, w_shape;
  bool bias;
  Pair stride, padding, dilation;
  int64_t groups;
};

const ConvCase kCases[] = {
    {{2, 3, 5, 5}, {4, 3, 3, 3}, true, {1, 1}, {0, 0}, {1, 1}, 1},
    {{2, 4, 6, 5}, {6, 2, 3, 2}, true, {2, 1}, {1, 2}, {1, 1}, 2},
    {{1, 2, 7, 7}, {3, 2, 3, 3}, false, {1, 2}, {2, 1}, {2, 3}, 1},
    {{3, 4, 4, 4}, {4, 1, 1, 1}, true, {1, 1}, {0, 0}, {1, 1}, 4},  // depthwise 1x1
};

TEST(GradCheck, conv2d) {
  // Stride, padding, dilation, groups=2 and a bias at once: out is [2, 4, 2, 3].
  check_gradients({.make_inputs =
                       [] {
                         return std::vector<Tensor>{random_leaf({2, 4, 5, 5}, 1), random_leaf({4, 2, 3, 2}, 2),
                                                    random_leaf({4}, 3)};
                       },
                   .fn =
                       [](const std::vector<Tensor>& in) {
                         return ops::conv2d(in[0], in[1], in[2], {2, 2}, {1, 1}, {2, 1}, 2);
                       }});
}

TEST(GradCheck, conv2d_plain_no_bias) {
  check_gradients({.make_inputs =
                       [] {
                         return std::vector<Tensor>{random_leaf({2, 2, 4, 4}, 4), random_leaf({3, 2, 2, 2}, 5)};
                       },
                   .fn = [](const std::vector<Tensor>& in) { return ops::conv2d(in[0], in[1]); }});
}

TEST(GradCheck, conv2d_weight_only) {
  // x without requires_grad: the backward skips grad_x (needs_input_grad) and must still give the weight's.
  check_gradients({.make_inputs =
                       [] {
                         return std::vector<Tensor>{random_tensor({2, 2, 4, 4}, 6), random_leaf({2, 2, 3, 3}, 7),
                                                    random_leaf({2}, 8)};
                       },
                   .fn =
                       [](const std::vector<Tensor>& in) {
                         return ops::conv2d(in[0], in[1], in[2], {1, 1}, {1, 1});
                       }});
}

TEST(Conv2d, HandDerivedValues) {
  // x = 1..9 as 3x3, kernel [[1, 2], [3, 4]], bias 0.5; each output is the dot of a 2x2 window
  // with the kernel: top-left 1*1 + 2*2 + 3*4 + 4*5 + 0.5 = 37.5, then 47.5, 67.5, 77.5.
  Tensor x = core::from_vector<double>({1, 2, 3, 4, 5, 6, 7, 8, 9}, {1, 1, 3, 3});
  Tensor w = core::from_vector<double>({1, 2, 3, 4}, {1, 1, 2, 2});
  Tensor b = core::from_vector<double>({0.5}, {1});
  expect_values(ops::conv2d(x, w, b), {37.5, 47.5, 67.5, 77.5});
  // A 3x3 kernel of ones with padding 1 sums each 3x3 neighbourhood: corner 1+2+4+5 = 12, edge
  // 1+2+3+4+5+6 = 21, centre 45; stride 2 keeps the four corners 12, 16, 24, 28.
  Tensor ones = core::ones({1, 1, 3, 3}, DType::f64);
  expect_values(ops::conv2d(x, ones, Tensor(), {1, 1}, {1, 1}), {12, 21, 16, 27, 45, 33, 24, 39, 28});
  expect_values(ops::conv2d(x, ones, Tensor(), {2, 2}, {1, 1}), {12, 16, 24, 28});
  // Dilation 2 spreads a 2x2 kernel of ones over the corners: 1 + 3 + 7 + 9 = 20.
  expect_values(ops::conv2d(x, core::ones({1, 1, 2, 2}, DType::f64), Tensor(), {1, 1}, {0, 0}, {2, 2}), {20});
}

TEST(Conv2d, HandDerivedGradients) {
  // With the 2x2 kernel [[1, 2], [3, 4]] on a 3x3 input and d(sum)/d(out) = 1: each input pixel's
  // gradient is the sum of the kernel taps that touch it (corner 1, 2, 3, 4; centre 10), the
  // weight's is the sum of its window positions' inputs (1+2+4+5 = 12, 16, 24, 28), the bias's 4.
  Tensor x = core::from_vector<double>({1, 2, 3, 4, 5, 6, 7, 8, 9}, {1, 1, 3, 3});
  x.set_requires_grad(true);
  Tensor w = core::from_vector<double>({1, 2, 3, 4}, {1, 1, 2, 2});
  w.set_requires_grad(true);
  Tensor b = core::from_vector<double>({0.5}, {1});
  b.set_requires_grad(true);
  autograd::backward(ops::sum(ops::conv2d(x, w, b)));
  expect_values(x.grad(), {1, 3, 2, 4, 10, 6, 3, 7, 4});
  expect_values(w.grad(), {12, 16, 24, 28});
  expect_values(b.grad(), {4});
}

TEST(Conv2d, MatchesDirectLoopF64) {
  // Both sides are f64 sums of at most 3*3*4 products of O(1) values: they agree to ~1e-15;
  // 1e-12 only allows for the different summation order.
  uint64_t seed = 100;
  for (const ConvCase& c : kCases) {
    Tensor x = random_tensor(c.x_shape, ++seed);
    Tensor w = random_tensor(c.w_shape, ++seed);
    Tensor b = c.bias ? random_tensor({c.w_shape[0]}, ++seed) : Tensor();
    expect_close(ops::conv2d(x, w, b, c.stride, c.padding, c.dilation, c.groups),
                 direct_conv2d(x, w, b, c.stride, c.padding, c.dilation, c.groups), 1e-12, 1e-12,
                 fmt::format("x {} w {}", c.x_shape, c.w_shape));
  }
}

TEST(Conv2d, ReducedPrecisionMatchesDirectLoop) {
  // Inputs are rounded to the dtype first, so only the output rounding and the f32 accumulation
  // remain: f32 sums of <= 36 O(1) products err ~1e-6; f16 outputs (|out| < 10) round by
  // <= 10 * 2^-11 = 5e-3 and bf16 ones by <= 10 * 2^-8 = 4e-2.
  const std::pair<DType, double> dtypes[] = {{DType::f32, 1e-5}, {DType::f16, 1e-2}, {DType::bf16, 6e-2}};
  uint64_t seed = 200;
  for (auto [dtype, tolerance] : dtypes) {
    for (const ConvCase& c : kCases) {
      Tensor x = random_tensor(c.x_shape, ++seed, -1, 1, dtype);
      Tensor w = random_tensor(c.w_shape, ++seed, -1, 1, dtype);
      Tensor b = c.bias ? random_tensor({c.w_shape[0]}, ++seed, -1, 1, dtype) : Tensor();
      Tensor out = ops::conv2d(x, w, b, c.stride, c.padding, c.dilation, c.groups);
      ASSERT_EQ(out.dtype(), dtype);
      expect_close(out, direct_conv2d(x, w, b, c.stride, c.padding, c.dilation, c.groups), tolerance, 0.0,
                   fmt::format("{} x {} w {}", dtype, c.x_shape, c.w_shape));
    }
  }
}

TEST(Conv2d, ReducedPrecisionBackwardMatchesF64) {
  // Gradients of sum(conv(x, w) * g) in bf16 against f64; bf16 inputs are exact in f64, and the
  // gradients (sums of <= 18 O(1) terms, |grad| < 10) round by <= 10 * 2^-8 = 4e-2.
  Tensor x = random_tensor({2, 2, 4, 4}, 300, -1, 1, DType::bf16);
  Tensor w = random_tensor({2, 1, 3, 3}, 301, -1, 1, DType::bf16);
  Tensor g = random_tensor({2, 2, 2, 2}, 302, -1, 1, DType::bf16);
  auto grads = [&](DType dtype) {
    Tensor xl = core::cast_raw(x, dtype), wl = core::cast_raw(w, dtype);
    xl.set_requires_grad(true);
    wl.set_requires_grad(true);
    autograd::backward(ops::conv2d(xl, wl, Tensor(), {1, 1}, {0, 0}, {1, 1}, 2), core::cast_raw(g, dtype));
    return std::pair{xl.grad(), wl.grad()};
  };
  auto [gx16, gw16] = grads(DType::bf16);
  auto [gx64, gw64] = grads(DType::f64);
  EXPECT_EQ(gx16.dtype(), DType::bf16);
  expect_close(gx16, gx64, 6e-2, 0.0, "grad x");
  expect_close(gw16, gw64, 6e-2, 0.0, "grad weight");
}

TEST(Conv2d, ChunkedBatchMatchesPerImage) {
  // 12 channels x 3x3 taps x 168^2 outputs = 3.0M column entries per image, so the kernel's
  // 8M-entry buffer takes the images two at a time (a full chunk, then a partial one). Every
  // result must equal running each image alone; f64 with the same per-column sums, so only the
  // weight gradient's order of summation differs: 1e-9 on values of size ~1e2..1e4.
  const int64_t batch = 3;
  Tensor x = random_leaf({batch, 12, 168, 168}, 400);
  Tensor w = random_leaf({2, 12, 3, 3}, 401);
  Tensor b = random_leaf({2}, 402);
  Tensor g = random_tensor({batch, 2, 168, 168}, 403);
  Tensor out = ops::conv2d(x, w, b, {1, 1}, {1, 1});
  autograd::backward(out, g);
  Tensor grad_w_total = core::zeros(w.shape(), DType::f64);
  for (int64_t n = 0; n < batch; ++n) {
    Tensor xn = core::contiguous_raw(core::narrow_raw(x.detach(), 0, n, 1));
    xn.set_requires_grad(true);
    Tensor wl = w.detach();  // a separate leaf over the same values
    wl.set_requires_grad(true);
    Tensor out_n = ops::conv2d(xn, wl, b.detach(), {1, 1}, {1, 1});
    expect_close(out_n, core::narrow_raw(out.detach(), 0, n, 1), 1e-12, 1e-12, fmt::format("output {}", n));
    autograd::backward(out_n, core::contiguous_raw(core::narrow_raw(g, 0, n, 1)));
    expect_close(xn.grad(), core::narrow_raw(x.grad(), 0, n, 1), 1e-12, 1e-12, fmt::format("grad x {}", n));
    core::accumulate_(grad_w_total, wl.grad());
  }
  expect_close(w.grad(), grad_w_total, 1e-9, 1e-12, "grad weight");
}

TEST(Conv2d, NonContiguousInput) {
  // A transposed view must give the same result as its contiguous copy (exactly: same arithmetic).
  Tensor base = random_tensor({2, 3, 5, 4}, 500);
  Tensor x = core::transpose_raw(base, 2, 3);
  Tensor w = random_tensor({2, 3, 2, 2}, 501);
  expect_close(ops::conv2d(x, w), ops::conv2d(core::contiguous_raw(x), w), 0.0, 0.0);
}

TEST(Conv2d, EmptyInputs) {
  // An empty batch gives an empty output; zero input channels leave only the bias, and the
  // bias gradient is then the sum of the output gradient over N, H, W: 2 * 2 * 2 = 8 ones.
  Tensor w = random_tensor({3, 2, 3, 3}, 600);
  EXPECT_EQ(ops::conv2d(core::zeros({0, 2, 4, 4}, DType::f64), w).shape(), (Shape{0, 3, 2, 2}));
  Tensor b = core::from_vector<double>({1, 2}, {2});
  b.set_requires_grad(true);
  Tensor out = ops::conv2d(core::zeros({2, 0, 2, 2}, DType::f64), core::zeros({2, 0, 1, 1}, DType::f64), b);
  expect_values(out, {1, 1, 1, 1, 2, 2, 2, 2, 1, 1, 1, 1, 2, 2, 2, 2});
  autograd::backward(ops::sum(out));
  expect_values(b.grad(), {8, 8});
}

TEST(Conv2d, BadInputs) {
  Tensor x = random_tensor({2, 4, 5, 5}, 1);
  Tensor w = random_tensor({6, 2, 3, 3}, 2);
  EXPECT_ERROR_CONTAINS(ops::conv2d(random_tensor({4, 5, 5}, 3), w), "[4, 5, 5]");
  EXPECT_ERROR_CONTAINS(ops::conv2d(x, random_tensor({6, 2, 3}, 3)), "[6, 2, 3]");
  // 4 channels, groups 3.
  EXPECT_ERROR_CONTAINS(ops::conv2d(x, random_tensor({6, 1, 3, 3}, 4), Tensor(), {1, 1}, {0, 0}, {1, 1}, 3),
                        "not divisible by groups=3");
  // weight [6, 2, 3, 3] with groups 1 wants 2 input channels; x has 4.
  EXPECT_ERROR_CONTAINS(ops::conv2d(x, w), "expects 2 input channels, but x of shape [2, 4, 5, 5] has 4");
  EXPECT_ERROR_CONTAINS(ops::conv2d(x, random_tensor({5, 2, 3, 3}, 5), Tensor(), {1, 1}, {0, 0}, {1, 1}, 2),
                        "5 output channels");
  EXPECT_ERROR_CONTAINS(ops::conv2d(x, w, random_tensor({4}, 6), {1, 1}, {0, 0}, {1, 1}, 2), "bias of shape [6]");
  // A 3x3 kernel dilated by 3 spans 7 > 5 pixels.
  EXPECT_ERROR_CONTAINS(ops::conv2d(x, w, Tensor(), {1, 1}, {0, 0}, {3, 3}, 2), "output size would not be positive");
  EXPECT_ERROR_CONTAINS(ops::conv2d(x, w, Tensor(), {0, 1}, {0, 0}, {1, 1}, 2), "stride must be positive");
  EXPECT_ERROR_CONTAINS(ops::conv2d(x, w, Tensor(), {1, 1}, {-1, 0}, {1, 1}, 2), "padding must be non-negative");
  EXPECT_ERROR_CONTAINS(ops::conv2d(x, core::cast_raw(w, DType::f32), Tensor(), {1, 1}, {0, 0}, {1, 1}, 2),
                        "weight is f32 but x is f64");
  EXPECT_ERROR_CONTAINS(ops::conv2d(core::zeros({1, 2, 3, 3}, DType::i64), core::zeros({1, 2, 1, 1}, DType::i64)),
                        "floating");
}

}  // namespace
}  // namespace colossal
