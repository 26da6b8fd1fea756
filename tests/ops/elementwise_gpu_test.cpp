// CUDA elementwise and reduction kernels against the CPU on fresh random inputs, in f32, bf16 and
// f16 (tolerances in tests/support/gpu_compare.h), forward and backward.
#include <fmt/format.h>
#include <gtest/gtest.h>

#include <cmath>
#include <tuple>

#include "gpu_compare.h"

namespace colossal {
namespace {

using testing::DeviceCase;
using testing::expect_cuda_matches_cpu;
using testing::random_input;

constexpr DType kDtypes[] = {DType::f32, DType::bf16, DType::f16};

/// A unary op on a [37, 129] input (odd sizes exercise the vector tails) and on a transposed view.
void check_unary(const char* name, const std::function<Tensor(const Tensor&)>& op, double low, double high) {
  for (DType dtype : kDtypes) {
    expect_cuda_matches_cpu({.make_inputs =
                                 [=](DType d) {
                                   return std::vector<Tensor>{random_input({37, 129}, 1, d, low, high)};
                                 },
                             .fn = [=](const std::vector<Tensor>& in) { return op(in[0]); }},
                            dtype, name);
    expect_cuda_matches_cpu({.make_inputs =
                                 [=](DType d) {
                                   return std::vector<Tensor>{random_input({129, 37}, 2, d, low, high)};
                                 },
                             .fn = [=](const std::vector<Tensor>& in) { return op(in[0].t()); }},
                            dtype, std::string(name) + " (strided)");
  }
}

void check_binary(const char* name, const std::function<Tensor(const Tensor&, const Tensor&)>& op, double low,
                  double high) {
  for (DType dtype : kDtypes) {
    expect_cuda_matches_cpu({.make_inputs =
                                 [=](DType d) {
                                   return std::vector<Tensor>{random_input({64, 257}, 3, d, low, high),
                                                              random_input({64, 257}, 4, d, low, high)};
                                 },
                             .fn = [=](const std::vector<Tensor>& in) { return op(in[0], in[1]); }},
                            dtype, name);
    expect_cuda_matches_cpu({.make_inputs =
                                 [=](DType d) {
                                   return std::vector<Tensor>{random_input({8, 1, 33}, 5, d, low, high),
                                                              random_input({7, 33}, 6, d, low, high)};
                                 },
                             .fn = [=](const std::vector<Tensor>& in) { return op(in[0], in[1]); }},
                            dtype, std::string(name) + " (broadcast)");
    // A row broadcast over the leading dimensions on either side (a bias; the vectorised row path
    // when the row is a multiple of 16 bytes: 64 of every dtype here), and a row of 33 (strided path).
    for (const int64_t row : {int64_t{64}, int64_t{33}}) {
      expect_cuda_matches_cpu({.make_inputs =
                                   [=](DType d) {
                                     return std::vector<Tensor>{random_input({3, 5, row}, 7, d, low, high),
                                                                random_input({row}, 8, d, low, high)};
                                   },
                               .fn = [=](const std::vector<Tensor>& in) { return op(in[0], in[1]); }},
                              dtype, fmt::format("{} (row of {} second)", name, row));
      expect_cuda_matches_cpu({.make_inputs =
                                   [=](DType d) {
                                     return std::vector<Tensor>{random_input({row}, 9, d, low, high),
                                                                random_input({4, row}, 10, d, low, high)};
                                   },
                               .fn = [=](const std::vector<Tensor>& in) { return op(in[0], in[1]); }},
                              dtype, fmt::format("{} (row of {} first)", name, row));
    }
  }
}

TEST(ElementwiseGpu, Unary) {
  COLOSSAL_REQUIRE_GPU();
  check_unary(
      "exp", [](const Tensor& x) { return ops::exp(x); }, -2, 2);
  check_unary(
      "log", [](const Tensor& x) { return ops::log(x); }, 0.5, 3);
  check_unary(
      "tanh", [](const Tensor& x) { return ops::tanh(x); }, -2, 2);
  check_unary(
      "sqrt", [](const Tensor& x) { return ops::sqrt(x); }, 0.5, 3);
  check_unary(
      "rsqrt", [](const Tensor& x) { return ops::rsqrt(x); }, 0.5, 3);
  check_unary(
      "abs", [](const Tensor& x) { return ops::abs(x); }, -1, 1);
  check_unary(
      "relu", [](const Tensor& x) { return ops::relu(x); }, -1, 1);
  check_unary(
      "sigmoid", [](const Tensor& x) { return ops::sigmoid(x); }, -3, 3);
  check_unary(
      "silu", [](const Tensor& x) { return ops::silu(x); }, -3, 3);
  check_unary(
      "gelu", [](const Tensor& x) { return ops::gelu(x); }, -3, 3);
  // bf16/f16 exact GELU evaluates the normal tail by its own erfc (elementwise_kernels.cu): the
  // tails, where 1 + erf cancels on the CPU, and the large arguments where t = 1 / (1 + z/2) is small.
  check_unary(
      "gelu (wide)", [](const Tensor& x) { return ops::gelu(x); }, -12, 12);
  check_unary(
      "gelu_tanh", [](const Tensor& x) { return ops::gelu(x, ops::GeluApproximation::tanh); }, -3, 3);
  check_unary(
      "pow", [](const Tensor& x) { return ops::pow(x, 1.5); }, 0.5, 2);
  check_unary(
      "affine", [](const Tensor& x) { return x * 3.0 + 1.0; }, -1, 1);
  check_unary(
      "neg", [](const Tensor& x) { return -x; }, -1, 1);
  check_unary(
      "clamp", [](const Tensor& x) { return ops::clamp(x, -0.5, 0.5); }, -1, 1);
}

/// Exact GELU in bf16/f16 against a double reference, x on a grid over [-12, 12] (the CUDA kernels
/// compute the normal tail with their own erfc): the output and the derivative are within one ulp
/// of the exact value, 2^-7 relative for bf16 and 2^-10 for f16 (plus f16's subnormal spacing 2^-24
/// absolute), down to the smallest outputs in the far negative tail. Rounding alone takes half of it.
TEST(ElementwiseGpu, GeluErfMatchesDoubleToOneUlp) {
  COLOSSAL_REQUIRE_GPU();
  constexpr int kPoints = 6001;
  std::vector<float> grid(kPoints);
  for (int i = 0; i < kPoints; ++i) grid[i] = static_cast<float>(-12.0 + 24.0 * i / (kPoints - 1));
  const double inv_sqrt2 = 0.70710678118654752440, inv_sqrt2pi = 0.39894228040143267794;
  const std::tuple<DType, double, double> dtypes[] = {{DType::bf16, 0x1p-7, 1e-37}, {DType::f16, 0x1p-10, 0x1p-24}};
  for (const auto& [dtype, ulp, tiny] : dtypes) {
    Tensor x = core::from_vector(grid, {kPoints}).to(dtype);  // the grid as the dtype holds it
    Tensor xs = x.to(DType::f64);
    Tensor gx = x.to(core::cuda_device(0)).set_requires_grad(true);
    Tensor y = ops::gelu(gx);
    autograd::backward(y, core::ones_like(y));
    Tensor got = y.to(core::kCpu).to(DType::f64), dgot = gx.grad().to(core::kCpu).to(DType::f64);
    const double* xv = xs.data<double>();
    for (int i = 0; i < kPoints; ++i) {
      const double v = xv[i], cdf = 0.5 * std::erfc(-v * inv_sqrt2), pdf = inv_sqrt2pi * std::exp(-0.5 * v * v);
      const double want = v * cdf, dwant = cdf + v * pdf;
      ASSERT_LE(std::abs(got.data<double>()[i] - want), ulp * std::abs(want) + tiny)
          << core::dtype_name(dtype) << " gelu(" << v << ") = " << got.data<double>()[i] << ", want " << want;
      ASSERT_LE(std::abs(dgot.data<double>()[i] - dwant), ulp * std::abs(dwant) + tiny)
          << core::dtype_name(dtype) << " gelu'(" << v << ") = " << dgot.data<double>()[i] << ", want " << dwant;
    }
  }
}

TEST(ElementwiseGpu, Binary) {
  COLOSSAL_REQUIRE_GPU();
  check_binary(
      "add", [](const Tensor& a, const Tensor& b) { return ops::add(a, b, 0.5); }, -1, 1);
  check_binary(
      "sub", [](const Tensor& a, const Tensor& b) { return a - b; }, -1, 1);
  check_binary(
      "mul", [](const Tensor& a, const Tensor& b) { return a * b; }, -1, 1);
  check_binary(
      "div", [](const Tensor& a, const Tensor& b) { return a / b; }, 0.5, 2);
  check_binary(
      "maximum", [](const Tensor& a, const Tensor& b) { return ops::maximum(a, b); }, -1, 1);
  check_binary(
      "pow", [](const Tensor& a, const Tensor& b) { return ops::pow(a, b); }, 0.5, 2);
}

TEST(ElementwiseGpu, ComparisonsAndInPlace) {
  COLOSSAL_REQUIRE_GPU();
  Tensor a = random_input({1000}, 7, DType::f32, -1, 1, false);
  Tensor b = random_input({1000}, 8, DType::f32, -1, 1, false);
  Tensor ga = a.to(core::cuda_device(0)), gb = b.to(core::cuda_device(0));
  testing::expect_close(ops::gt(ga, gb).to(core::kCpu), ops::gt(a, b), 0, 0, "gt");
  ops::addcmul_(ga, gb, gb, 0.5);
  ops::addcmul_(a, b, b, 0.5);
  testing::expect_close(ga.to(core::kCpu), a, 1e-6, 1e-6, "addcmul_");
}

TEST(ReductionGpu, SumMeanVarMax) {
  COLOSSAL_REQUIRE_GPU();
  for (DType dtype : kDtypes) {
    // Long reductions accumulate rounding on both sides: 4x the base tolerance.
    auto reduce_case = [&](const Shape& shape, std::function<Tensor(const Tensor&)> op, const char* name) {
      expect_cuda_matches_cpu({.make_inputs = [=](DType d) { return std::vector<Tensor>{random_input(shape, 9, d)}; },
                               .fn = [=](const std::vector<Tensor>& in) { return op(in[0]); },
                               .tolerance_scale = 4.0},
                              dtype, name);
    };
    reduce_case(
        {300, 500}, [](const Tensor& x) { return ops::sum(x, {1}); }, "sum rows");
    reduce_case(
        {300, 500}, [](const Tensor& x) { return ops::sum(x, {0}); }, "sum columns");
    // Columns in 16-byte groups (the vectorised column sums): a bias gradient's shape with many
    // splits, an outer dimension with an odd number of rows (the unrolled loop's tail), and a
    // contiguous view starting 3 elements into its storage (not 16-byte aligned: the scalar kernel).
    reduce_case(
        {16384, 768}, [](const Tensor& x) { return ops::sum(x, {0}); }, "sum columns 16384x768");
    reduce_case(
        {3, 333, 64}, [](const Tensor& x) { return ops::sum(x, {1}); }, "sum middle 3x333x64");
    reduce_case(
        {200 * 64 + 3},
        [](const Tensor& x) {
          return ops::sum(x.narrow(0, 3, 200 * 64).view({200, 64}), {0});
        },
        "sum columns, misaligned");
    reduce_case(
        {4, 300, 50},
        [](const Tensor& x) {
          return ops::sum(x, {0, 2});
        },
        "sum scattered");
    reduce_case(
        {1 << 16}, [](const Tensor& x) { return ops::sum(x); }, "sum all");
    reduce_case(
        {64, 100}, [](const Tensor& x) { return ops::mean(x, {1}); }, "mean");
    reduce_case(
        {64, 100}, [](const Tensor& x) { return ops::var(x, {1}); }, "var");
    reduce_case(
        {64, 100}, [](const Tensor& x) { return ops::max(x, 1).values; }, "max");
  }
}

TEST(CoreGpu, CopiesCastsAndRandom) {
  COLOSSAL_REQUIRE_GPU();
  Tensor x = random_input({33, 65}, 10, DType::f32, -1, 1, false);
  Tensor g = x.to(core::cuda_device(0));
  testing::expect_close(g.to(DType::bf16).to(core::kCpu), x.to(DType::bf16), 0, 0, "f32 -> bf16 rounding");
  testing::expect_close(g.t().contiguous().to(core::kCpu), x.t().contiguous(), 0, 0, "strided copy");
  // The Philox stream gives the same numbers on both devices.
  core::Generator cpu_gen(99), gpu_gen(99);
  Tensor on_cpu = core::empty({1001}, DType::f32);
  Tensor on_gpu = core::empty({1001}, TensorOptions(DType::f32, core::cuda_device(0)));
  core::uniform_(on_cpu, 0, 1, &cpu_gen);
  core::uniform_(on_gpu, 0, 1, &gpu_gen);
  testing::expect_close(on_gpu.to(core::kCpu), on_cpu, 0, 0, "uniform");
  core::normal_(on_cpu, 0, 1, &cpu_gen);
  core::normal_(on_gpu, 0, 1, &gpu_gen);
  testing::expect_close(on_gpu.to(core::kCpu), on_cpu, 1e-5, 1e-5, "normal");  // libm vs CUDA log/cos
}

TEST(CoreGpu, MemoryStatsTrackAllocations) {
  COLOSSAL_REQUIRE_GPU();
  const Device gpu = core::cuda_device(0);
  const int64_t before = core::memory_stats(gpu).allocated_bytes;
  {
    Tensor t = core::empty({1 << 20}, TensorOptions(DType::f32, gpu));
    EXPECT_EQ(core::memory_stats(gpu).allocated_bytes, before + (int64_t{4} << 20));
    EXPECT_GE(core::memory_stats(gpu).reserved_bytes, int64_t{4} << 20);
  }
  EXPECT_EQ(core::memory_stats(gpu).allocated_bytes, before);
}

TEST(CoreGpu, BadUseIsAClearError) {
  COLOSSAL_REQUIRE_GPU();
  Tensor cpu = core::ones({4});
  Tensor gpu = core::ones({4}, TensorOptions(DType::f32, core::cuda_device(0)));
  EXPECT_ERROR_CONTAINS(cpu + gpu, "different devices: cpu (shape [4]) and cuda:0");
  const auto [free_bytes, total_bytes] = core::cuda::memory_info(0);
  EXPECT_ERROR_CONTAINS(core::empty({total_bytes}, TensorOptions(DType::f32, core::cuda_device(0))),
                        "CUDA out of memory");
  EXPECT_ERROR_CONTAINS(core::empty({4}, TensorOptions(DType::f32, core::cuda_device(99))), "does not exist");
}

}  // namespace
}  // namespace colossal
