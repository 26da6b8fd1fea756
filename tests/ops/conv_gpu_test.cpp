// CUDA conv2d (cuDNN), batch_norm2d and pooling against the CPU kernels on fresh random inputs, in
// f32, bf16 and f16 (base tolerances in tests/support/gpu_compare.h), forward and backward, with
// odd sizes, stride/padding/dilation/group variants, training and evaluation batch norm (running
// statistics compared too), ties and NaN in max pooling, and bad input; the nhwc kernels (cuDNN's
// NHWC convolutions, our channels-innermost batch norm and max pooling) against the CPU's nhwc ops
// (the nchw kernels between transposes) the same way, and batch norm with a fused relu.
#include <gtest/gtest.h>

#include <cmath>

#include "colossal/core/view.h"         // to_device_raw, cast_raw
#include "colossal/ops/conv_kernels.h"  // stubs, for kernel-level bad input
#include "gpu_compare.h"

namespace colossal {
namespace {

using ops::Pair;
using testing::DeviceCase;
using testing::expect_close;
using testing::expect_cuda_matches_cpu;
using testing::random_input;

constexpr DType kDtypes[] = {DType::f32, DType::bf16, DType::f16};

Device gpu() {
  return core::cuda_device(0);
}

// ---- conv2d

struct ConvCase {
  Shape x, weight;
  bool bias;
  Pair stride{1, 1}, padding{0, 0}, dilation{1, 1};
  int64_t groups = 1;
  const char* name;
  ops::ImageLayout layout = ops::ImageLayout::nchw;  ///< x is given as [N, C, H, W] either way
};

// Tolerance scale 10 for conv2d: on top of the base tolerance (different summation orders over
// C/groups * kH * kW <= 288 products forward and N * oH * oW <= 6272 for the filter gradient),
// cuDNN may pick Winograd or FFT algorithms, whose transforms add f32 rounding of about 1e-5
// relative to the output's scale. bf16/f16 outputs are still rounded once from f32 on both sides,
// so their base tolerance (2 units in the last place) carries most of the margin there.
constexpr double kConvToleranceScale = 10.0;

void check_conv(const ConvCase& c) {
  const bool nhwc = c.layout == ops::ImageLayout::nhwc;
  const Shape x_shape = nhwc ? Shape{c.x[0], c.x[2], c.x[3], c.x[1]} : c.x;
  for (DType dtype : kDtypes) {
    expect_cuda_matches_cpu(
        {.make_inputs =
             [&](DType d) {
               return std::vector<Tensor>{random_input(x_shape, 11, d), random_input(c.weight, 12, d, -0.5, 0.5),
                                          c.bias ? random_input({c.weight[0]}, 13, d) : Tensor()};
             },
         .fn =
             [&](const std::vector<Tensor>& in) {
               return ops::conv2d(in[0], in[1], in[2], c.stride, c.padding, c.dilation, c.groups, c.layout);
             },
         .tolerance_scale = kConvToleranceScale},
        dtype, fmt::format("{}{}", c.name, nhwc ? " (nhwc)" : ""));
  }
}

void check_nchw_cases() {
  check_conv({.x = {2, 3, 11, 13}, .weight = {5, 3, 3, 3}, .bias = true, .padding = {1, 1}, .name = "3x3 same"});
  check_conv({.x = {3, 4, 9, 10}, .weight = {6, 4, 3, 2}, .bias = false, .stride = {2, 2}, .name = "3x2 stride 2"});
  check_conv({.x = {2, 3, 12, 12},
              .weight = {4, 3, 3, 3},
              .bias = true,
              .padding = {2, 2},
              .dilation = {2, 2},
              .name = "dilation 2"});
  check_conv({.x = {2, 4, 7, 9},
              .weight = {6, 2, 3, 3},
              .bias = true,
              .stride = {2, 1},
              .padding = {1, 0},
              .groups = 2,
              .name = "groups 2, stride 2x1, padding 1x0"});
  check_conv({.x = {2, 8, 10, 10},
              .weight = {8, 1, 3, 3},
              .bias = false,
              .padding = {1, 1},
              .groups = 8,
              .name = "depthwise"});
  check_conv({.x = {4, 16, 7, 7}, .weight = {32, 16, 1, 1}, .bias = true, .name = "1x1"});
  check_conv({.x = {1, 3, 5, 5}, .weight = {2, 3, 5, 5}, .bias = true, .name = "kernel covers the input"});
  // The filter gradient sums N * oH * oW = 6272 products in a different order than the CPU: f32
  // algorithms exclude FFT/Winograd (see conv_kernels.cu), so this is summation-order noise only.
  check_conv({.x = {8, 32, 28, 28}, .weight = {64, 32, 3, 3}, .bias = true, .padding = {1, 1}, .name = "larger 3x3"});
}

void check_nhwc_cases() {
  constexpr auto kNhwc = ops::ImageLayout::nhwc;
  check_conv({.x = {2, 3, 11, 13},
              .weight = {5, 3, 3, 3},
              .bias = true,
              .padding = {1, 1},
              .name = "3x3 same",
              .layout = kNhwc});
  check_conv({.x = {3, 4, 9, 10},
              .weight = {6, 4, 3, 2},
              .bias = false,
              .stride = {2, 2},
              .name = "3x2 stride 2",
              .layout = kNhwc});
  check_conv({.x = {2, 4, 7, 9},
              .weight = {6, 2, 3, 3},
              .bias = true,
              .stride = {2, 1},
              .padding = {1, 0},
              .groups = 2,
              .name = "groups 2, stride 2x1, padding 1x0",
              .layout = kNhwc});
  check_conv({.x = {2, 3, 12, 12},
              .weight = {4, 3, 3, 3},
              .bias = false,
              .padding = {2, 2},
              .dilation = {2, 2},
              .name = "dilation 2",
              .layout = kNhwc});
  // ResNet's shapes: the 7x7 stride-2 stem on 3 channels, a strided 1x1 and 3x3 on tensor-core widths.
  check_conv({.x = {2, 3, 32, 32},
              .weight = {16, 3, 7, 7},
              .bias = false,
              .stride = {2, 2},
              .padding = {3, 3},
              .name = "resnet stem",
              .layout = kNhwc});
  check_conv({.x = {4, 32, 14, 14},
              .weight = {64, 32, 1, 1},
              .bias = false,
              .stride = {2, 2},
              .name = "1x1 stride 2",
              .layout = kNhwc});
  // Pointwise: ops::linear (cuBLASLt) rather than cuDNN.
  check_conv({.x = {4, 32, 14, 14}, .weight = {64, 32, 1, 1}, .bias = true, .name = "1x1 pointwise", .layout = kNhwc});
  check_conv({.x = {8, 32, 28, 28},
              .weight = {64, 32, 3, 3},
              .bias = true,
              .padding = {1, 1},
              .name = "larger 3x3",
              .layout = kNhwc});
}

TEST(ConvGpu, Conv2dMatchesCpu) {
  COLOSSAL_REQUIRE_GPU();
  check_nchw_cases();
}

TEST(ConvGpu, Conv2dNhwcMatchesCpu) {
  COLOSSAL_REQUIRE_GPU();
  check_nhwc_cases();
}

TEST(ConvGpu, Conv2dStridedInputAndSameBitsTwice) {
  COLOSSAL_REQUIRE_GPU();
  // A transposed (non-contiguous) x: the op makes it contiguous before the kernel.
  expect_cuda_matches_cpu({.make_inputs =
                               [](DType d) {
                                 return std::vector<Tensor>{random_input({2, 3, 9, 11}, 21, d),
                                                            random_input({4, 3, 3, 3}, 22, d, -0.5, 0.5),
                                                            random_input({4}, 23, d)};
                               },
                           .fn =
                               [](const std::vector<Tensor>& in) {
                                 return ops::conv2d(in[0].transpose(2, 3), in[1], in[2], {1, 2}, {1, 1});
                               },
                           .tolerance_scale = kConvToleranceScale},
                          DType::f32, "conv2d on a transposed x");
  // Deterministic algorithms (forward, data and filter gradients): the same inputs give the same bits.
  auto run = [] {
    Tensor x = random_input({4, 8, 15, 15}, 24, DType::f32, -1, 1, false).to(gpu());
    Tensor w = random_input({16, 8, 3, 3}, 25, DType::f32, -1, 1, false).to(gpu());
    x.set_requires_grad(true);
    w.set_requires_grad(true);
    Tensor y = ops::conv2d(x, w, Tensor(), {2, 2}, {1, 1});
    autograd::backward(y, random_input(y.shape(), 26, DType::f32, -1, 1, false).to(gpu()));
    return std::vector<Tensor>{y.to(core::kCpu), x.grad().to(core::kCpu), w.grad().to(core::kCpu)};
  };
  const auto first = run(), second = run();
  for (size_t i = 0; i < first.size(); ++i)
    expect_close(second[i], first[i], 0, 0, "conv2d repeat " + std::to_string(i));
}

// ---- batch_norm2d

struct BatchNormCase {
  Shape x;  ///< in the case's layout
  bool training;
  bool affine;
  double low = -1.0, high = 1.0;
  const char* name;
  ops::ImageLayout layout = ops::ImageLayout::nchw;
  bool relu = false;      ///< ops::batch_norm_relu2d
  bool residual = false;  ///< ops::batch_norm_add_relu2d (a residual input of x's shape, with its gradient)
};

// Tolerance scale 4 for batch norm: the CPU reduces each channel's N * H * W (up to 65536) values
// in f64, the GPU in f32 (Welford/Chan and pairwise sums), so statistics and the weight/bias
// gradients (sums over the channel) differ by a few f32 ulps of the sum of magnitudes.
constexpr double kBatchNormToleranceScale = 4.0;

void check_batch_norm(const BatchNormCase& c) {
  const int64_t channels = c.layout == ops::ImageLayout::nhwc ? c.x[3] : c.x[1];
  for (DType dtype : kDtypes) {
    expect_cuda_matches_cpu(
        {.make_inputs =
             [&](DType d) {
               // Running statistics in f32 whatever x's dtype (the usual mixed-precision layout).
               return std::vector<Tensor>{random_input(c.x, 31, d, c.low, c.high),
                                          c.affine ? random_input({channels}, 32, d, 0.5, 1.5) : Tensor(),
                                          c.affine ? random_input({channels}, 33, d) : Tensor(),
                                          random_input({channels}, 34, DType::f32, -0.5, 0.5, false),
                                          random_input({channels}, 35, DType::f32, 0.5, 2.0, false),
                                          c.residual ? random_input(c.x, 36, d) : Tensor()};
             },
         .fn =
             [&](const std::vector<Tensor>& in) {
               Tensor running_mean = in[3], running_var = in[4];
               if (c.residual) {
                 return ops::batch_norm_add_relu2d(in[0], in[5], running_mean, running_var, in[1], in[2], c.training,
                                                   0.1, 1e-5, c.layout);
               }
               auto op = c.relu ? ops::batch_norm_relu2d : ops::batch_norm2d;
               return op(in[0], running_mean, running_var, in[1], in[2], c.training, 0.1, 1e-5, c.layout);
             },
         .tolerance_scale = kBatchNormToleranceScale},
        dtype,
        fmt::format("{}{}{}",
                    c.residual ? "relu(batch norm + residual) "
                    : c.relu   ? "relu(batch norm) "
                               : "",
                    c.name, c.layout == ops::ImageLayout::nhwc ? " (nhwc)" : ""));
  }
}

TEST(BatchNormGpu, MatchesCpu) {
  COLOSSAL_REQUIRE_GPU();
  check_batch_norm({.x = {4, 3, 13, 17}, .training = true, .affine = true, .name = "odd area (scalar path)"});
  check_batch_norm({.x = {8, 16, 8, 8}, .training = true, .affine = true, .name = "area 64 (16-byte path)"});
  check_batch_norm({.x = {3, 4, 5, 6}, .training = true, .affine = false, .name = "no affine"});
  check_batch_norm({.x = {2, 5, 7, 7}, .training = false, .affine = true, .name = "eval"});
  check_batch_norm({.x = {2, 5, 7, 7}, .training = false, .affine = false, .name = "eval, no affine"});
  // Several blocks per channel: 65536 values per channel (4 splits in f32, 2 in bf16/f16), and an
  // odd area with 15 splits of single elements.
  check_batch_norm({.x = {16, 4, 64, 64}, .training = true, .affine = true, .name = "split channels"});
  check_batch_norm({.x = {64, 2, 31, 33}, .training = true, .affine = true, .name = "split channels, odd area"});
  // A mean far from zero: E[x^2] - E[x]^2 would lose most digits here; Welford/Chan does not.
  check_batch_norm(
      {.x = {4, 3, 9, 9}, .training = true, .affine = true, .low = 10.0, .high = 12.0, .name = "offset mean"});
}

TEST(BatchNormGpu, NhwcMatchesCpu) {
  COLOSSAL_REQUIRE_GPU();
  constexpr auto kNhwc = ops::ImageLayout::nhwc;
  // C = 5: one channel per lane (the scalar path); C = 16 and 64: 16-byte groups of channels.
  check_batch_norm({.x = {4, 13, 17, 5}, .training = true, .affine = true, .name = "5 channels", .layout = kNhwc});
  check_batch_norm({.x = {8, 8, 8, 16}, .training = true, .affine = true, .name = "16 channels", .layout = kNhwc});
  check_batch_norm({.x = {3, 5, 6, 4}, .training = true, .affine = false, .name = "no affine", .layout = kNhwc});
  check_batch_norm({.x = {2, 7, 7, 24}, .training = false, .affine = true, .name = "eval", .layout = kNhwc});
  check_batch_norm({.x = {2, 7, 7, 5}, .training = false, .affine = false, .name = "eval, no affine", .layout = kNhwc});
  // Many rows (32768 per channel: hundreds of splits), and many channels over few rows (several
  // column tiles, a partial last tile: 1000 = 125 groups of 8 in bf16 / 250 of 4 in f32).
  check_batch_norm({.x = {8, 64, 64, 64}, .training = true, .affine = true, .name = "split rows", .layout = kNhwc});
  check_batch_norm({.x = {4, 7, 7, 1000}, .training = true, .affine = true, .name = "wide", .layout = kNhwc});
  check_batch_norm({.x = {4, 9, 9, 8},
                    .training = true,
                    .affine = true,
                    .low = 10.0,
                    .high = 12.0,
                    .name = "offset mean",
                    .layout = kNhwc});
}

TEST(BatchNormGpu, ReluFusedMatchesCpu) {
  COLOSSAL_REQUIRE_GPU();
  // nhwc runs the fused kernels (the relu's gradient mask recomputed from x and the statistics),
  // nchw runs batch_norm2d then relu; the CPU runs the two ops in turn either way. Inputs around
  // the mean make half of the outputs clip.
  constexpr auto kNhwc = ops::ImageLayout::nhwc;
  for (const bool training : {true, false}) {
    for (const bool affine : {true, false}) {
      check_batch_norm({.x = {4, 13, 17, 5},
                        .training = training,
                        .affine = affine,
                        .name = "5 channels",
                        .layout = kNhwc,
                        .relu = true});
      check_batch_norm({.x = {8, 8, 8, 64},
                        .training = training,
                        .affine = affine,
                        .name = "64 channels",
                        .layout = kNhwc,
                        .relu = true});
    }
  }
  check_batch_norm(
      {.x = {8, 64, 64, 64}, .training = true, .affine = true, .name = "split rows", .layout = kNhwc, .relu = true});
  check_batch_norm({.x = {4, 6, 9, 9}, .training = true, .affine = true, .name = "nchw", .relu = true});
}

TEST(BatchNormGpu, AddReluFusedMatchesCpu) {
  COLOSSAL_REQUIRE_GPU();
  // nhwc runs the fused forward (rounding as the composed ops do, so the relu masks agree) and a
  // backward of the relu's gradient from the output, then batch norm's; nchw and the CPU run
  // batch_norm2d, add and relu in turn. x's gradient, the residual's, weight's and bias's are all
  // compared.
  constexpr auto kNhwc = ops::ImageLayout::nhwc;
  for (const bool training : {true, false}) {
    for (const bool affine : {true, false}) {
      for (const Shape& x : {Shape{4, 13, 17, 5}, Shape{8, 8, 8, 64}}) {
        check_batch_norm({.x = x,
                          .training = training,
                          .affine = affine,
                          .name = x[3] == 5 ? "5 channels" : "64 channels",
                          .layout = kNhwc,
                          .relu = true,
                          .residual = true});
      }
    }
  }
  check_batch_norm({.x = {8, 64, 64, 64},
                    .training = true,
                    .affine = true,
                    .name = "split rows",
                    .layout = kNhwc,
                    .relu = true,
                    .residual = true});
  check_batch_norm(
      {.x = {4, 6, 9, 9}, .training = true, .affine = true, .name = "nchw", .relu = true, .residual = true});
}

TEST(BatchNormGpu, NhwcRunningStatisticsAndSameBitsTwice) {
  COLOSSAL_REQUIRE_GPU();
  for (DType dtype : kDtypes) {
    const Tensor x = random_input({6, 11, 7, 24}, 46, dtype, -2.0, 3.0, false);
    Tensor cpu_mean = random_input({24}, 47, DType::f32, -0.5, 0.5, false);
    Tensor cpu_var = random_input({24}, 48, DType::f32, 0.5, 2.0, false);
    Tensor gpu_mean = cpu_mean.to(gpu()), gpu_var = cpu_var.to(gpu());
    ops::batch_norm2d(x, cpu_mean, cpu_var, Tensor(), Tensor(), true, 0.3, 1e-3, ops::ImageLayout::nhwc);
    ops::batch_norm2d(x.to(gpu()), gpu_mean, gpu_var, Tensor(), Tensor(), true, 0.3, 1e-3, ops::ImageLayout::nhwc);
    const std::string what = fmt::format("nhwc x {}", dtype);
    expect_close(gpu_mean.to(core::kCpu), cpu_mean, 1e-5, 1e-5, what + " running_mean");
    expect_close(gpu_var.to(core::kCpu), cpu_var, 1e-5, 1e-5, what + " running_var");
  }
  auto run = [] {
    Tensor x = random_input({16, 32, 32, 16}, 56, DType::bf16, -1, 1, false).to(gpu());
    Tensor w = random_input({16}, 57, DType::bf16, -1, 1, false).to(gpu());
    x.set_requires_grad(true);
    w.set_requires_grad(true);
    Tensor mean = core::zeros({16}, TensorOptions(DType::f32, gpu())),
           var = core::ones({16}, TensorOptions(DType::f32, gpu()));
    Tensor y = ops::batch_norm2d(x, mean, var, w, Tensor(), true, 0.1, 1e-5, ops::ImageLayout::nhwc);
    autograd::backward(y, random_input(y.shape(), 58, DType::bf16, -1, 1, false).to(gpu()));
    return std::vector<Tensor>{y.to(core::kCpu), x.grad().to(core::kCpu), w.grad().to(core::kCpu), var.to(core::kCpu)};
  };
  const auto first = run(), second = run();
  for (size_t i = 0; i < first.size(); ++i) {
    expect_close(second[i], first[i], 0, 0, "nhwc batch_norm2d repeat " + std::to_string(i));
  }
}

TEST(BatchNormGpu, RunningStatisticsMatchCpu) {
  COLOSSAL_REQUIRE_GPU();
  // Running statistics in several dtypes, also different from x's and from each other's.
  const std::pair<DType, DType> stat_dtypes[] = {
      {DType::f32, DType::f32}, {DType::bf16, DType::bf16}, {DType::f64, DType::f16}};
  for (DType dtype : kDtypes) {
    for (auto [mean_dtype, var_dtype] : stat_dtypes) {
      const Shape shape{6, 5, 11, 7};
      Tensor x = random_input(shape, 41, dtype, -2.0, 3.0, false);
      Tensor cpu_mean = random_input({5}, 42, mean_dtype, -0.5, 0.5, false);
      Tensor cpu_var = random_input({5}, 43, var_dtype, 0.5, 2.0, false);
      Tensor gpu_mean = cpu_mean.to(gpu()), gpu_var = cpu_var.to(gpu());
      Tensor weight = random_input({5}, 44, dtype, 0.5, 1.5, false);
      Tensor bias = random_input({5}, 45, dtype, -1, 1, false);
      const Tensor cpu_y = ops::batch_norm2d(x, cpu_mean, cpu_var, weight, bias, true, 0.3, 1e-3);
      const Tensor gpu_y =
          ops::batch_norm2d(x.to(gpu()), gpu_mean, gpu_var, weight.to(gpu()), bias.to(gpu()), true, 0.3, 1e-3);
      const std::string what = fmt::format("x {}, running {} / {}", dtype, mean_dtype, var_dtype);
      // The statistics agree to f32 rounding (f64 vs f32 reductions) before being stored in their
      // dtype, so their own dtype's base tolerance applies.
      const auto mean_tol = testing::tolerance_for(mean_dtype), var_tol = testing::tolerance_for(var_dtype);
      const double f32_floor = 1e-5;
      expect_close(gpu_mean.to(core::kCpu), cpu_mean, std::max(mean_tol.atol, f32_floor),
                   std::max(mean_tol.rtol, f32_floor), what + " running_mean");
      expect_close(gpu_var.to(core::kCpu), cpu_var, std::max(var_tol.atol, f32_floor),
                   std::max(var_tol.rtol, f32_floor), what + " running_var");
      const auto y_tol = testing::tolerance_for(dtype);
      expect_close(gpu_y.to(core::kCpu), cpu_y, y_tol.atol * kBatchNormToleranceScale,
                   y_tol.rtol * kBatchNormToleranceScale, what + " y");
      // Evaluation from the CPU's updated statistics (a last-place difference in a bf16 statistic
      // would move y by far more than f32's tolerance), which it leaves alone.
      Tensor eval_mean = cpu_mean.to(gpu()), eval_var = cpu_var.to(gpu());
      const Tensor eval_cpu = ops::batch_norm2d(x, cpu_mean, cpu_var, weight, bias, false);
      const Tensor eval_gpu =
          ops::batch_norm2d(x.to(gpu()), eval_mean, eval_var, weight.to(gpu()), bias.to(gpu()), false);
      expect_close(eval_mean.to(core::kCpu), cpu_mean, 0, 0, what + " running_mean after eval");
      expect_close(eval_var.to(core::kCpu), cpu_var, 0, 0, what + " running_var after eval");
      expect_close(eval_gpu.to(core::kCpu), eval_cpu, y_tol.atol * kBatchNormToleranceScale,
                   y_tol.rtol * kBatchNormToleranceScale, what + " eval y");
    }
  }
}

TEST(BatchNormGpu, SameBitsTwice) {
  COLOSSAL_REQUIRE_GPU();
  auto run = [] {
    Tensor x = random_input({16, 4, 64, 64}, 51, DType::f32, -1, 1, false).to(gpu());
    Tensor w = random_input({4}, 52, DType::f32, -1, 1, false).to(gpu());
    x.set_requires_grad(true);
    w.set_requires_grad(true);
    Tensor mean = core::zeros({4}, TensorOptions(DType::f32, gpu())),
           var = core::ones({4}, TensorOptions(DType::f32, gpu()));
    Tensor y = ops::batch_norm2d(x, mean, var, w, Tensor(), true);
    autograd::backward(y, random_input(y.shape(), 53, DType::f32, -1, 1, false).to(gpu()));
    return std::vector<Tensor>{y.to(core::kCpu), x.grad().to(core::kCpu), w.grad().to(core::kCpu), var.to(core::kCpu)};
  };
  const auto first = run(), second = run();
  for (size_t i = 0; i < first.size(); ++i) {
    expect_close(second[i], first[i], 0, 0, "batch_norm2d repeat " + std::to_string(i));
  }
}

// ---- pooling

/// Random values on a grid of 1/4 in [-1, 1]: many ties inside each window, so the first-maximum
/// rule decides where gradients go.
Tensor tied_input(const Shape& shape, uint64_t seed, DType dtype) {
  std::vector<double> values = testing::random_tensor(shape, seed).to_vector<double>();
  for (double& v : values) v = std::floor(v * 4.0) / 4.0;
  Tensor t = core::cast_raw(core::from_vector(values, shape), dtype);
  t.set_requires_grad(true);
  return t;
}

void check_pool(const char* name, const Shape& shape, const std::function<Tensor(const Tensor&)>& op, bool ties = false,
                double tolerance_scale = 1.0) {
  for (DType dtype : kDtypes) {
    expect_cuda_matches_cpu(
        {.make_inputs =
             [&](DType d) { return std::vector<Tensor>{ties ? tied_input(shape, 61, d) : random_input(shape, 61, d)}; },
         .fn = [&](const std::vector<Tensor>& in) { return op(in[0]); },
         .tolerance_scale = tolerance_scale},
        dtype, name);
  }
}

TEST(PoolingGpu, MaxPoolMatchesCpu) {
  COLOSSAL_REQUIRE_GPU();
  check_pool("max 3x3 s2 p1", {2, 3, 11, 13}, [](const Tensor& x) {
    return ops::max_pool2d(x, {3, 3}, {2, 2}, {1, 1});
  });
  check_pool("max 2x2", {2, 3, 8, 9}, [](const Tensor& x) { return ops::max_pool2d(x, {2, 2}); });
  check_pool("max 3x2 s1x2 p1x0", {1, 4, 7, 10}, [](const Tensor& x) {
    return ops::max_pool2d(x, {3, 2}, {1, 2}, {1, 0});
  });
  check_pool(
      "max ties", {2, 2, 12, 12},
      [](const Tensor& x) {
        return ops::max_pool2d(x, {3, 3}, {1, 1}, {1, 1});
      },
      true);
  check_pool("max resnet stem", {8, 16, 56, 56}, [](const Tensor& x) {
    return ops::max_pool2d(x, {3, 3}, {2, 2}, {1, 1});
  });
}

TEST(PoolingGpu, MaxPoolNhwcMatchesCpu) {
  COLOSSAL_REQUIRE_GPU();
  constexpr auto kNhwc = ops::ImageLayout::nhwc;
  check_pool("max 3x3 s2 p1 (nhwc)", {2, 11, 13, 3}, [](const Tensor& x) {
    return ops::max_pool2d(x, {3, 3}, {2, 2}, {1, 1}, kNhwc);
  });
  check_pool("max 3x2 s1x2 p1x0 (nhwc)", {1, 7, 10, 4}, [](const Tensor& x) {
    return ops::max_pool2d(x, {3, 2}, {1, 2}, {1, 0}, kNhwc);
  });
  check_pool(
      "max ties (nhwc)", {2, 12, 12, 2},
      [](const Tensor& x) {
        return ops::max_pool2d(x, {3, 3}, {1, 1}, {1, 1}, kNhwc);
      },
      true);
  check_pool("max resnet stem (nhwc)", {8, 56, 56, 16}, [](const Tensor& x) {
    return ops::max_pool2d(x, {3, 3}, {2, 2}, {1, 1}, kNhwc);
  });
  // Same window order and f32 operations as the CPU: bit for bit in f32, NaN included.
  std::vector<double> values = testing::random_tensor({1, 6, 6, 2}, 82).to_vector<double>();
  values[14] = std::nan("");
  values[16] = std::nan("");
  Tensor x = core::cast_raw(core::from_vector(values, {1, 6, 6, 2}), DType::f32);
  x.set_requires_grad(true);
  Tensor gx = x.detach().to(gpu());
  gx.set_requires_grad(true);
  Tensor y = ops::max_pool2d(x, {3, 3}, {1, 1}, {1, 1}, kNhwc), gy = ops::max_pool2d(gx, {3, 3}, {1, 1}, {1, 1}, kNhwc);
  expect_close(gy.to(core::kCpu), y, 0, 0, "nhwc max_pool2d with NaN");
  const Tensor upstream = random_input(y.shape(), 83, DType::f32, -1, 1, false);
  autograd::backward(y, upstream);
  autograd::backward(gy, upstream.to(gpu()));
  expect_close(gx.grad().to(core::kCpu), x.grad(), 0, 0, "nhwc max_pool2d gradient with NaN");
}

TEST(PoolingGpu, AvgPoolMatchesCpu) {
  COLOSSAL_REQUIRE_GPU();
  for (bool include_pad : {true, false}) {
    const std::string suffix = include_pad ? " (count_include_pad)" : " (count_exclude_pad)";
    check_pool(("avg 3x3 s2 p1" + suffix).c_str(), {2, 3, 11, 13}, [=](const Tensor& x) {
      return ops::avg_pool2d(x, {3, 3}, {2, 2}, {1, 1}, include_pad);
    });
    check_pool(("avg 4x2 s1x2 p2x1" + suffix).c_str(), {2, 2, 9, 8}, [=](const Tensor& x) {
      return ops::avg_pool2d(x, {4, 2}, {1, 2}, {2, 1}, include_pad);
    });
  }
  check_pool("avg 2x2", {3, 5, 10, 7}, [](const Tensor& x) { return ops::avg_pool2d(x, {2, 2}); });
}

TEST(PoolingGpu, AdaptiveAvgPoolMatchesCpu) {
  COLOSSAL_REQUIRE_GPU();
  check_pool("adaptive 7x7 -> 3x5", {2, 3, 7, 7}, [](const Tensor& x) { return ops::adaptive_avg_pool2d(x, {3, 5}); });
  check_pool("adaptive 13x11 -> 4x4", {2, 2, 13, 11}, [](const Tensor& x) {
    return ops::adaptive_avg_pool2d(x, {4, 4});
  });
  check_pool("adaptive 5x5 -> 7x7 (upsampling)", {1, 3, 5, 5}, [](const Tensor& x) {
    return ops::adaptive_avg_pool2d(x, {7, 7});
  });
  check_pool("global average", {4, 8, 7, 7}, [](const Tensor& x) { return ops::adaptive_avg_pool2d(x, {1, 1}); });
}

TEST(PoolingGpu, F32IsBitwiseTheCpu) {
  COLOSSAL_REQUIRE_GPU();
  // The CUDA kernels visit windows and add gradients in the CPU kernels' order, with the same
  // f32 operations (no contractions: sums and IEEE divisions only), so f32 agrees to the bit.
  const std::vector<std::pair<const char*, std::function<Tensor(const Tensor&)>>> ops_to_check = {
      {"max",
       [](const Tensor& x) {
         return ops::max_pool2d(x, {3, 3}, {2, 2}, {1, 1});
       }},
      {"avg",
       [](const Tensor& x) {
         return ops::avg_pool2d(x, {3, 3}, {2, 1}, {1, 1}, false);
       }},
      {"adaptive", [](const Tensor& x) {
         return ops::adaptive_avg_pool2d(x, {4, 6});
       }}};
  for (const auto& [name, op] : ops_to_check) {
    Tensor x = random_input({2, 3, 13, 15}, 71, DType::f32);
    Tensor gx = x.detach().to(gpu());
    gx.set_requires_grad(true);
    Tensor y = op(x), gy = op(gx);
    Tensor upstream = random_input(y.shape(), 72, DType::f32, -1, 1, false);
    autograd::backward(y, upstream);
    autograd::backward(gy, upstream.to(gpu()));
    expect_close(gy.to(core::kCpu), y, 0, 0, std::string(name) + " forward");
    expect_close(gx.grad().to(core::kCpu), x.grad(), 0, 0, std::string(name) + " backward");
  }
}

TEST(PoolingGpu, MaxPoolPropagatesNaN) {
  COLOSSAL_REQUIRE_GPU();
  std::vector<double> values = testing::random_tensor({1, 1, 6, 6}, 81).to_vector<double>();
  values[7] = std::nan("");
  values[8] = std::nan("");  // two NaNs in one window: the gradient goes where the CPU sends it
  Tensor x = core::from_vector(values, {1, 1, 6, 6});
  x = core::cast_raw(x, DType::f32);
  x.set_requires_grad(true);
  Tensor gx = x.detach().to(gpu());
  gx.set_requires_grad(true);
  Tensor y = ops::max_pool2d(x, {3, 3}, {1, 1}, {1, 1}), gy = ops::max_pool2d(gx, {3, 3}, {1, 1}, {1, 1});
  expect_close(gy.to(core::kCpu), y, 0, 0, "max_pool2d with NaN");
  autograd::backward(y, core::ones(y.shape()));
  autograd::backward(gy, core::ones(y.shape(), TensorOptions(DType::f32, gpu())));
  expect_close(gx.grad().to(core::kCpu), x.grad(), 0, 0, "max_pool2d gradient with NaN");
}

// ---- bad input

TEST(ConvGpu, BadInputIsAClearError) {
  COLOSSAL_REQUIRE_GPU();
  const Tensor x = core::ones({1, 2, 5, 5}, TensorOptions(DType::f32, gpu()));
  const Tensor w_cpu = core::ones({3, 2, 3, 3});
  const Tensor w = w_cpu.to(gpu());
  EXPECT_ERROR_CONTAINS(ops::conv2d(x, w_cpu), "conv2d: weight is on cpu but x is on cuda:0");
  EXPECT_ERROR_CONTAINS(ops::conv2d(x, w, core::ones({3})), "conv2d: bias is on cpu but x is on cuda:0");
  Tensor mean_cpu = core::zeros({2}), var_cpu = core::ones({2});
  EXPECT_ERROR_CONTAINS(ops::batch_norm2d(x, mean_cpu, var_cpu, Tensor(), Tensor(), true),
                        "batch_norm2d: running_mean is on cpu but x is on cuda:0");
  Tensor mean = mean_cpu.to(gpu()), var = var_cpu.to(gpu());
  EXPECT_ERROR_CONTAINS(ops::batch_norm2d(x, mean, var, core::ones({2}), Tensor(), true),
                        "batch_norm2d: weight is on cpu but x is on cuda:0");
  // Kernels called directly with a CPU operand name it.
  const ops::Conv2dGeometry g{.batch = 1,
                              .in_channels = 2,
                              .in_height = 5,
                              .in_width = 5,
                              .out_channels = 3,
                              .kernel_height = 3,
                              .kernel_width = 3,
                              .out_height = 3,
                              .out_width = 3};
  const Tensor out = core::empty({1, 3, 3, 3}, TensorOptions(DType::f32, gpu()));
  EXPECT_ERROR_CONTAINS(ops::conv2d_forward_stub(gpu(), out, x, w_cpu, Tensor(), g),
                        "conv2d: weight is on cpu but the op runs on cuda:0");
  const ops::Pool2dGeometry pool{.kernel_h = 2, .kernel_w = 2, .stride_h = 2, .stride_w = 2};
  const Tensor pooled = core::empty({1, 2, 2, 2}, TensorOptions(DType::f32, gpu()));
  EXPECT_ERROR_CONTAINS(ops::max_pool2d_forward_stub(gpu(), pooled, core::empty({1, 2, 2, 2}, DType::i64), x, pool),
                        "max_pool2d: indices is on cpu but the op runs on cuda:0");
  EXPECT_ERROR_CONTAINS(
      ops::avg_pool2d_backward_stub(gpu(), core::empty({1, 2, 5, 5}, TensorOptions(DType::f32, gpu())),
                                    core::empty({1, 2, 2, 2}), pool),
      "avg_pool2d_backward: grad_out is on cpu but the op runs on cuda:0");
}

}  // namespace
}  // namespace colossal
