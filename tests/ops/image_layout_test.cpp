// The nhwc layout of the image ops (Note [image layouts] in ops/conv.h) on the CPU: f64 gradient
// checks through the layout plumbing (the conv bias added after the kernel, the filter transposed
// for it, the global pool as a mean), nhwc results equal to the nchw op's transposed, bit for bit
// in f32 where the same kernels run, and errors that name the layout. The CUDA nhwc kernels are
// checked against these in tests/ops/conv_gpu_test.cpp.
#include <gtest/gtest.h>

#include "gradcheck.h"

namespace colossal {
namespace {

using ops::ImageLayout;
using testing::check_gradients;
using testing::expect_close;
using testing::random_leaf;
using testing::random_tensor;

constexpr ImageLayout kNhwc = ImageLayout::nhwc;

TEST(GradCheck, conv2d_nhwc) {
  // x [2, 5, 5, 4] nhwc, groups 2, stride, padding, dilation and a bias.
  check_gradients({.make_inputs =
                       [] {
                         return std::vector<Tensor>{random_leaf({2, 5, 5, 4}, 1), random_leaf({4, 2, 3, 2}, 2),
                                                    random_leaf({4}, 3)};
                       },
                   .fn =
                       [](const std::vector<Tensor>& in) {
                         return ops::conv2d(in[0], in[1], in[2], {2, 2}, {1, 1}, {2, 1}, 2, kNhwc);
                       }});
}

TEST(ImageLayout, PointwiseNhwcConvInBf16IsALinear) {
  // bf16 pointwise nhwc convs run as ops::linear: the same values as the nchw conv to bf16 rounding.
  const Tensor x = random_tensor({2, 6, 3, 4}, 14, -1.0, 1.0, DType::bf16);
  const Tensor w = random_tensor({5, 6, 1, 1}, 15, -1.0, 1.0, DType::bf16);
  const Tensor b = random_tensor({5}, 16, -1.0, 1.0, DType::bf16);
  const Tensor nhwc = ops::conv2d(ops::to_nhwc(x), w, b, {1, 1}, {0, 0}, {1, 1}, 1, kNhwc);
  expect_close(nhwc.to(DType::f32), ops::to_nhwc(ops::conv2d(x, w, b)).to(DType::f32), 2e-2, 2e-2, "bf16 pointwise");
}

TEST(GradCheck, conv2d_nhwc_pointwise) {
  check_gradients({.make_inputs =
                       [] {
                         return std::vector<Tensor>{random_leaf({2, 3, 4, 5}, 11), random_leaf({6, 5, 1, 1}, 12),
                                                    random_leaf({6}, 13)};
                       },
                   .fn =
                       [](const std::vector<Tensor>& in) {
                         return ops::conv2d(in[0], in[1], in[2], {1, 1}, {0, 0}, {1, 1}, 1, kNhwc);
                       }});
}

TEST(GradCheck, batch_norm2d_nhwc) {
  check_gradients({.make_inputs =
                       [] {
                         return std::vector<Tensor>{random_leaf({3, 4, 2, 5}, 4), random_leaf({5}, 5, 0.5, 1.5),
                                                    random_leaf({5}, 6)};
                       },
                   .fn =
                       [](const std::vector<Tensor>& in) {
                         Tensor mean = core::zeros({5}, DType::f64), var = core::ones({5}, DType::f64);
                         return ops::batch_norm2d(in[0], mean, var, in[1], in[2], true, 0.1, 1e-5, kNhwc);
                       }});
}

TEST(GradCheck, pooling_nhwc) {
  check_gradients({.make_inputs =
                       [] {
                         return std::vector<Tensor>{random_leaf({2, 7, 6, 3}, 7)};
                       },
                   .fn =
                       [](const std::vector<Tensor>& in) {
                         return ops::max_pool2d(in[0], {3, 3}, {2, 2}, {1, 1}, kNhwc);
                       }});
  check_gradients({.make_inputs =
                       [] {
                         return std::vector<Tensor>{random_leaf({2, 7, 6, 3}, 8)};
                       },
                   .fn =
                       [](const std::vector<Tensor>& in) {
                         return ops::avg_pool2d(in[0], {3, 2}, {2, 1}, {1, 1}, false, kNhwc);
                       }});
  check_gradients({.make_inputs =
                       [] {
                         return std::vector<Tensor>{random_leaf({2, 5, 4, 3}, 9)};
                       },
                   .fn =
                       [](const std::vector<Tensor>& in) {
                         return ops::adaptive_avg_pool2d(in[0], {1, 1}, kNhwc);
                       }});
  check_gradients({.make_inputs =
                       [] {
                         return std::vector<Tensor>{random_leaf({2, 5, 4, 3}, 10)};
                       },
                   .fn =
                       [](const std::vector<Tensor>& in) {
                         return ops::adaptive_avg_pool2d(in[0], {2, 3}, kNhwc);
                       }});
}

/// Runs `op` on an nchw f32 x and on its nhwc copy, backpropagates the same (transposed) upstream
/// gradient through both, and expects the nhwc output and x gradient to be the nchw ones
/// transposed, together with equal gradients of `params`, within `tol` (0: bit for bit).
void expect_layouts_agree(const char* name, const Shape& nchw_shape, std::vector<Tensor> params,
                          const std::function<Tensor(const Tensor&, ImageLayout)>& op, double tol = 0.0) {
  SCOPED_TRACE(name);
  Tensor x = random_tensor(nchw_shape, 21, -1.0, 1.0, DType::f32);
  x.set_requires_grad(true);
  Tensor x_nhwc = ops::to_nhwc(x.detach());
  x_nhwc.set_requires_grad(true);
  for (Tensor& p : params) p.set_requires_grad(true);

  const Tensor y = op(x, ImageLayout::nchw);
  const Tensor upstream = random_tensor(y.shape(), 22, -1.0, 1.0, DType::f32);
  autograd::backward(y, upstream);
  std::vector<Tensor> nchw_grads;
  for (Tensor& p : params) {
    nchw_grads.push_back(p.grad().detach().clone());
    p.set_grad(Tensor());
  }
  const Tensor y_nhwc = op(x_nhwc, kNhwc);
  autograd::backward(y_nhwc, ops::to_nhwc(upstream));

  expect_close(y_nhwc, ops::to_nhwc(y.detach()), tol, tol, "output");
  expect_close(x_nhwc.grad(), ops::to_nhwc(x.grad()), tol, tol, "x gradient");
  for (size_t i = 0; i < params.size(); ++i) {
    expect_close(params[i].grad(), nchw_grads[i], tol, tol, "parameter gradient " + std::to_string(i));
  }
}

TEST(ImageLayout, NhwcIsTheTransposedNchw) {
  Tensor w = random_tensor({6, 2, 3, 3}, 31, -1.0, 1.0, DType::f32);
  Tensor b = random_tensor({6}, 32, -1.0, 1.0, DType::f32);
  expect_layouts_agree("conv2d", {2, 4, 7, 6}, {w, b}, [&](const Tensor& x, ImageLayout layout) {
    return ops::conv2d(x, w, b, {2, 1}, {1, 1}, {1, 1}, 2, layout);
  });
  // A pointwise conv runs as a matrix product in nhwc: the same products summed in another order.
  Tensor w1 = random_tensor({5, 4, 1, 1}, 35, -1.0, 1.0, DType::f32);
  expect_layouts_agree(
      "pointwise conv2d", {2, 4, 3, 5}, {w1},
      [&](const Tensor& x, ImageLayout layout) {
        return ops::conv2d(x, w1, Tensor(), {1, 1}, {0, 0}, {1, 1}, 1, layout);
      },
      1e-6);
  Tensor gamma = random_tensor({4}, 33, 0.5, 1.5, DType::f32);
  Tensor beta = random_tensor({4}, 34, -1.0, 1.0, DType::f32);
  expect_layouts_agree("batch_norm2d", {3, 4, 5, 6}, {gamma, beta}, [&](const Tensor& x, ImageLayout layout) {
    Tensor mean = core::zeros({4}), var = core::ones({4});
    return ops::batch_norm2d(x, mean, var, gamma, beta, true, 0.1, 1e-5, layout);
  });
  expect_layouts_agree("max_pool2d", {2, 3, 9, 8}, {}, [](const Tensor& x, ImageLayout layout) {
    return ops::max_pool2d(x, {3, 3}, {2, 2}, {1, 1}, layout);
  });
  // The global pool is a mean over H and W in nhwc, the adaptive kernel in nchw: the same sums in
  // another order, so equal to f32 rounding.
  expect_layouts_agree(
      "adaptive_avg_pool2d", {2, 3, 7, 7}, {},
      [](const Tensor& x, ImageLayout layout) {
        return ops::adaptive_avg_pool2d(x, {1, 1}, layout);
      },
      1e-6);
}

TEST(ImageLayout, ToNhwcAndBack) {
  const Tensor x = random_tensor({2, 3, 4, 5}, 41, -1.0, 1.0, DType::f32);
  const Tensor nhwc = ops::to_nhwc(x);
  EXPECT_EQ(nhwc.shape(), (Shape{2, 4, 5, 3}));
  EXPECT_TRUE(nhwc.is_contiguous());
  expect_close(nhwc, x.permute({0, 2, 3, 1}).contiguous(), 0, 0, "to_nhwc");
  expect_close(ops::to_nchw(nhwc), x, 0, 0, "to_nchw(to_nhwc(x))");
  EXPECT_ERROR_CONTAINS(ops::to_nhwc(random_tensor({2, 3, 4}, 42)), "[2, 3, 4]");
}

TEST(ImageLayout, BadInputsNameTheLayout) {
  const Tensor x = random_tensor({2, 5, 5, 4}, 51);  // nhwc, 4 channels
  EXPECT_ERROR_CONTAINS(ops::conv2d(random_tensor({2, 5, 4}, 52), random_tensor({6, 4, 3, 3}, 53), Tensor(), {1, 1},
                                    {0, 0}, {1, 1}, 1, kNhwc),
                        "[N, H, W, C] (nhwc layout)");
  // weight [6, 2, 3, 3] wants 2 input channels; nhwc x has 4 in its last dimension.
  EXPECT_ERROR_CONTAINS(ops::conv2d(x, random_tensor({6, 2, 3, 3}, 54), Tensor(), {1, 1}, {0, 0}, {1, 1}, 1, kNhwc),
                        "expects 2 input channels, but x of shape [2, 5, 5, 4] has 4");
  Tensor mean = core::zeros({5}, DType::f64), var = core::ones({5}, DType::f64);
  EXPECT_ERROR_CONTAINS(ops::batch_norm2d(x, mean, var, Tensor(), Tensor(), true, 0.1, 1e-5, kNhwc),
                        "running_mean of shape [4]");
  EXPECT_ERROR_CONTAINS(ops::max_pool2d(random_tensor({2, 5, 5}, 55), {2, 2}, {0, 0}, {0, 0}, kNhwc), "nhwc layout");
  // A 5x5 window fits the 5x5 nhwc image (the nchw reading of this shape, 5x4, would not).
  EXPECT_EQ(ops::max_pool2d(x, {5, 5}, {1, 1}, {0, 0}, kNhwc).shape(), (Shape{2, 1, 1, 4}));
  EXPECT_ERROR_CONTAINS(ops::max_pool2d(x, {5, 5}, {1, 1}, {0, 0}), "larger than the padded input");
}

}  // namespace
}  // namespace colossal
