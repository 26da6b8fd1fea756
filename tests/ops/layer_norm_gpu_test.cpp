// CUDA layer_norm against the CPU kernels on fresh random inputs, f32/bf16/f16, forward and the
// gradients of x, weight and bias: the GPT-2 widths (768, 1024, 1600, 3072) on the register path,
// odd widths (element loads), rows too wide for the registers (the streaming kernels), no or
// partial affine parameters, many rows (several rows per team in the backward), run-to-run
// determinism of the weight gradient, the input gradient added into a residual's waiting sum, and
// parameters on the wrong device.
#include <gtest/gtest.h>

#include "colossal/autograd/engine.h"  // fused_gradient_accumulations
#include "gpu_compare.h"

namespace colossal {
namespace {

using testing::expect_close;
using testing::expect_cuda_matches_cpu;
using testing::random_input;

constexpr DType kDtypes[] = {DType::f32, DType::bf16, DType::f16};

enum class Affine { both, weight_only, bias_only, none };

/// Inputs: x [rows, cols] and (per `affine`) weight and bias [cols]; weight around 1 like a
/// trained one, so that no gradient is a near-cancellation of O(1) terms.
void check(int64_t rows, int64_t cols, Affine affine = Affine::both, double scale = 1.0) {
  for (DType dtype : kDtypes) {
    SCOPED_TRACE(fmt::format("layer_norm [{}, {}] ({}, affine {})", rows, cols, dtype, static_cast<int>(affine)));
    expect_cuda_matches_cpu(
        {.make_inputs =
             [=](DType d) {
               return std::vector<Tensor>{
                   random_input({rows, cols}, 21, d, -2, 2),
                   affine == Affine::both || affine == Affine::weight_only ? random_input({cols}, 22, d, 0.5, 1.5)
                                                                           : Tensor(),
                   affine == Affine::both || affine == Affine::bias_only ? random_input({cols}, 23, d, -0.5, 0.5)
                                                                         : Tensor()};
             },
         .fn = [=](const std::vector<Tensor>& in) { return ops::layer_norm(in[0], {cols}, in[1], in[2]); },
         .tolerance_scale = scale},
        dtype, "layer_norm");
  }
}

TEST(LayerNormGpu, ModelWidths) {
  COLOSSAL_REQUIRE_GPU();
  // The weight and bias gradients sum over the rows (64 here) in a different order than the CPU:
  // 2x the base tolerance.
  for (int64_t cols : {768, 1024, 1600, 3072}) check(64, cols, Affine::both, 2.0);
}

TEST(LayerNormGpu, OddWidths) {
  COLOSSAL_REQUIRE_GPU();
  for (int64_t cols : {1, 37, 129, 769}) check(33, cols, Affine::both, 2.0);
}

TEST(LayerNormGpu, WideRows) {
  COLOSSAL_REQUIRE_GPU();
  // Wider than the registers hold (8192 elements forward, 4096 backward): the streaming kernels and
  // the column-parallel weight gradient.
  check(6, 5000, Affine::both, 2.0);
  check(5, 10000, Affine::both, 2.0);
  check(3, 8193, Affine::both, 2.0);  // odd and wide
}

TEST(LayerNormGpu, AffineVariants) {
  COLOSSAL_REQUIRE_GPU();
  check(16, 768, Affine::none);
  check(16, 768, Affine::weight_only, 2.0);
  check(16, 768, Affine::bias_only, 2.0);
  check(16, 129, Affine::none);
  check(16, 129, Affine::bias_only, 2.0);
}

TEST(LayerNormGpu, ManyRows) {
  COLOSSAL_REQUIRE_GPU();
  // 4096 rows: each team of the persistent backward visits many rows, and the weight/bias
  // gradients sum 4096 terms in an order unlike the CPU's 64 row blocks (4x, as the reduction
  // tests' long sums).
  check(4096, 768, Affine::both, 4.0);
  check(3000, 1600, Affine::both, 4.0);
}

TEST(LayerNormGpu, HigherDimensionalInput) {
  COLOSSAL_REQUIRE_GPU();
  for (DType dtype : kDtypes) {
    expect_cuda_matches_cpu({.make_inputs =
                                 [](DType d) {
                                   return std::vector<Tensor>{random_input({4, 5, 6, 8}, 24, d, -2, 2),
                                                              random_input({6, 8}, 25, d, 0.5, 1.5),
                                                              random_input({6, 8}, 26, d, -0.5, 0.5)};
                                 },
                             .fn =
                                 [](const std::vector<Tensor>& in) {
                                   return ops::layer_norm(in[0], {6, 8}, in[1], in[2]);
                                 },
                             .tolerance_scale = 2.0},
                            dtype, "layer_norm over two dimensions");
  }
}

TEST(LayerNormGpu, InputGradientAddedIntoTheResidualsSum) {
  COLOSSAL_REQUIRE_GPU();
  // h + layer_norm(h) * 0.5 with h computed: layer norm's backward adds its input gradient into the
  // sum the add left waiting at h (Note [Gradient accumulation in the op], case (c)), on the register
  // path (768, 1024) and the streaming one (5000), against the CPU doing the same.
  for (int64_t cols : {768, 1024, 5000}) {
    for (DType dtype : kDtypes) {
      SCOPED_TRACE(fmt::format("residual layer_norm [48, {}] ({})", cols, dtype));
      const int64_t before = autograd::fused_gradient_accumulations();
      expect_cuda_matches_cpu({.make_inputs =
                                   [=](DType d) {
                                     return std::vector<Tensor>{random_input({48, cols}, 29, d, -2, 2),
                                                                random_input({cols}, 30, d, 0.5, 1.5),
                                                                random_input({cols}, 31, d, -0.5, 0.5)};
                                   },
                               .fn =
                                   [=](const std::vector<Tensor>& in) {
                                     const Tensor h = ops::mul(in[0], 1.5);
                                     // The last mul makes the add's incoming gradient a fresh tensor, not the caller's.
                                     return ops::mul(
                                         ops::add(h, ops::mul(ops::layer_norm(h, {cols}, in[1], in[2]), 0.5)), 1.0);
                                   },
                               .tolerance_scale = 2.0},
                              dtype, "residual layer_norm");
      EXPECT_GE(autograd::fused_gradient_accumulations() - before, 2) << "the CPU's and the GPU's backward";
    }
  }
}

TEST(LayerNormGpu, WeightGradientIsDeterministic) {
  COLOSSAL_REQUIRE_GPU();
  const Device gpu = core::cuda_device(0);
  Tensor x = random_input({2048, 1024}, 27, DType::f32, -2, 2, false).to(gpu);
  Tensor upstream = random_input({2048, 1024}, 28, DType::f32, -1, 1, false).to(gpu);
  auto weight_grad = [&] {
    Tensor weight = core::ones({1024}, TensorOptions(DType::f32, gpu)).set_requires_grad(true);
    Tensor bias = core::zeros({1024}, TensorOptions(DType::f32, gpu)).set_requires_grad(true);
    autograd::backward(ops::layer_norm(x, {1024}, weight, bias), upstream);
    return std::pair{weight.grad().to(core::kCpu), bias.grad().to(core::kCpu)};
  };
  const auto [w1, b1] = weight_grad();
  const auto [w2, b2] = weight_grad();
  expect_close(w2, w1, 0, 0, "weight gradient, second run");
  expect_close(b2, b1, 0, 0, "bias gradient, second run");
}

TEST(LayerNormGpu, ParametersOnAnotherDevice) {
  COLOSSAL_REQUIRE_GPU();
  Tensor x = core::ones({2, 4}, TensorOptions(DType::f32, core::cuda_device(0)));
  EXPECT_ERROR_CONTAINS(ops::layer_norm(x, {4}, core::ones({4})),
                        "layer_norm: weight is on cpu but the input is on cuda:0");
  EXPECT_ERROR_CONTAINS(ops::layer_norm(x, {4}, Tensor(), core::ones({4})), "bias is on cpu");
}

}  // namespace
}  // namespace colossal
