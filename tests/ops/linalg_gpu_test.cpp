// cuBLASLt GEMMs (ops/cuda/linalg_kernels.cpp) against the OpenBLAS CPU kernel on fresh random
// inputs: matmul in every operand-rank case (broadcast batches, transposed, offset and strided
// views, vectors), bmm, linear with and without bias, linear_gelu, gelu_mlp (whose backward fuses
// the GELU gradient into a GEMM), forward and backward, in f64, f32 (TF32 and full f32), bf16 and
// f16, at odd sizes and at GPT-2 sizes with a small batch.
//
// Tolerances. The second operand of every product (the "weight") is drawn in [-s, s] with
// s = sqrt(3 / K), as initialised layers are, so each output is a sum of K products whose total has
// unit-order size whatever K is. The rounding error of such a sum is a random walk whose size is set
// by the partial sums, i.e. by the typical size (rms) of the result rather than by each element, so
// a comparison allows |gpu - cpu| <= rms_fraction * rms(cpu) + rtol * |cpu| (GemmTolerance):
// - f64: 1e-12 of either: f64 roundings (2^-53) of a few thousand terms.
// - f32, full precision: both sides sum in f32 in different orders: sqrt(K) 2^-24 of the rms, 3.3e-6
//   at K = 3072; 2^-14 (6e-5) is ~10x that, rtol 1e-5 as the shared harness.
// - f32 in TF32 (the default): the GPU reads inputs with 10-bit mantissas (relative error up to 2^-10
//   if truncated), a bias of up to 2^-10 relative on every element plus a random walk of about
//   0.5 * 2^-10 of the rms; 2^-8 of each is 4x that.
// - bf16 / f16: both sides read the same rounded inputs and accumulate in f32, so they differ by the
//   f32 summation order (2^-20 of the rms) and then by the final rounding of each output, which can
//   land on neighbouring values: one ulp, 2^-7 (bf16) or 2^-10 (f16) relative; rtol is two ulps.
//   Gradients that pass through a rounded intermediate (the GELU's pre-activation, per-batch GEMM
//   outputs summed over a broadcast) carry those ulps into a second sum: rms_fraction is one ulp.
//   Against the exact product of unrounded inputs the worst case would be K * 2^-8 relative for bf16
//   (every input rounding in the same direction), but that is not what is compared here.
// - linear_gelu: cuBLASLt's GELU epilogue and the CUDA GELU derivative for bf16/f16 may use the
//   hardware tanh approximation (relative error 2^-11), so f32 outputs carry up to 2^-12 times the
//   pre-activation (2^-8 of each allowed), and in bf16/f16 the rounded GELU gradient lands on a
//   neighbouring value in a sizeable fraction p of the entries. The weight gradient sums those
//   one-ulp steps over the rows: a random walk of sqrt(p) ulp of its rms, ~6 sigma at worst over
//   millions of elements, so 4 ulps of the rms (2^-5 bf16, 2^-7 f16).
#include <gtest/gtest.h>

#include <unistd.h>
#include <algorithm>
#include <cmath>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <functional>
#include <optional>
#include <string>

#include "colossal/core/view.h"           // to_device_raw
#include "colossal/ops/linalg_kernels.h"  // batched_gemm_stub, fused_gemm_stub (direct epilogue checks)
#include "env_guard.h"
#include "gpu_compare.h"

namespace colossal {
namespace {

using ops::Float32MatmulPrecision;
using testing::random_input;

struct GemmTolerance {
  double rms_fraction;
  double rtol;
};

/// A dtype and, for f32, the precision cuBLASLt is allowed.
struct Precision {
  DType dtype;
  Float32MatmulPrecision f32_precision;
  const char* name;
};

constexpr Precision kPrecisions[] = {
    {DType::f32, Float32MatmulPrecision::high, "f32 (TF32)"},  // the default
    {DType::f32, Float32MatmulPrecision::highest, "f32"},      // set_float32_matmul_precision(highest)
    {DType::bf16, Float32MatmulPrecision::high, "bf16"},       // f32 accumulation
    {DType::f16, Float32MatmulPrecision::high, "f16"},         // f32 accumulation
    {DType::f64, Float32MatmulPrecision::high, "f64"},         // CUBLAS_COMPUTE_64F
};

/// See the tolerance notes at the top of the file.
GemmTolerance tolerance_for(const Precision& p, bool gelu_epilogue) {
  const auto pow2 = [](int e) { return std::ldexp(1.0, e); };
  switch (p.dtype) {
    case DType::f64:
      return {1e-12, 1e-12};
    case DType::f32:
      if (gelu_epilogue || p.f32_precision == Float32MatmulPrecision::high) return {pow2(-8), pow2(-8)};
      return {pow2(-14), 1e-5};
    case DType::bf16:
      return gelu_epilogue ? GemmTolerance{pow2(-5), pow2(-6)} : GemmTolerance{pow2(-7), pow2(-6)};
    case DType::f16:
      return gelu_epilogue ? GemmTolerance{pow2(-7), pow2(-8)} : GemmTolerance{pow2(-10), pow2(-9)};
    default:
      return {0, 0};
  }
}

/// Sets the f32 matmul precision for a scope.
class PrecisionGuard {
 public:
  explicit PrecisionGuard(Float32MatmulPrecision precision) : previous_(ops::float32_matmul_precision()) {
    ops::set_float32_matmul_precision(precision);
  }
  ~PrecisionGuard() { ops::set_float32_matmul_precision(previous_); }
  PrecisionGuard(const PrecisionGuard&) = delete;
  PrecisionGuard& operator=(const PrecisionGuard&) = delete;

 private:
  Float32MatmulPrecision previous_;
};

void expect_gemm_close(const Tensor& gpu, const Tensor& cpu, const GemmTolerance& tol, const std::string& what) {
  ASSERT_TRUE(gpu.device().is_cuda()) << what << ": the GPU run produced a tensor on " << gpu.device().str();
  const std::vector<double> values = cpu.to_vector<double>();
  double sum_squares = 0;
  for (double v : values) sum_squares += v * v;
  const double rms = values.empty() ? 0.0 : std::sqrt(sum_squares / static_cast<double>(values.size()));
  testing::expect_close(gpu.to(core::kCpu), cpu, tol.rms_fraction * rms, tol.rtol, what);
}

struct GemmCase {
  /// CPU inputs in the given dtype, those to differentiate with requires_grad set.
  std::function<std::vector<Tensor>(DType)> make_inputs;
  std::function<Tensor(const std::vector<Tensor>&)> fn;
  bool gelu_epilogue = false;
};

/// Runs the case on the CPU and on cuda:0 and compares the outputs and every input gradient.
void expect_cuda_matches_cpu(const GemmCase& test_case, const Precision& precision, const std::string& name) {
  const std::string what = name + " (" + precision.name + ")";
  SCOPED_TRACE(what);
  PrecisionGuard guard(precision.f32_precision);
  const GemmTolerance tol = tolerance_for(precision, test_case.gelu_epilogue);
  std::vector<Tensor> cpu_inputs = test_case.make_inputs(precision.dtype);
  std::vector<Tensor> gpu_inputs;
  for (const Tensor& t : cpu_inputs) {
    Tensor g = core::to_device_raw(t.detach(), core::cuda_device(0));
    if (t.requires_grad()) g.set_requires_grad(true);
    gpu_inputs.push_back(g);
  }
  Tensor cpu_out = test_case.fn(cpu_inputs);
  Tensor gpu_out = test_case.fn(gpu_inputs);
  expect_gemm_close(gpu_out, cpu_out, tol, what + " forward");
  if (!cpu_out.requires_grad()) return;
  Tensor upstream = testing::random_tensor(cpu_out.shape(), 777, -1.0, 1.0, cpu_out.dtype());
  autograd::backward(cpu_out, upstream);
  autograd::backward(gpu_out, core::to_device_raw(upstream, core::cuda_device(0)));
  for (size_t i = 0; i < cpu_inputs.size(); ++i) {
    if (!cpu_inputs[i].requires_grad()) continue;
    ASSERT_TRUE(gpu_inputs[i].grad().defined()) << what << ": input " << i << " got no gradient on the GPU";
    expect_gemm_close(gpu_inputs[i].grad(), cpu_inputs[i].grad(), tol,
                      what + " gradient of input " + std::to_string(i));
  }
}

void check_all_precisions(const GemmCase& test_case, const std::string& name) {
  for (const Precision& p : kPrecisions) expect_cuda_matches_cpu(test_case, p, name);
}

/// The "weight" half-width for a reduction over k terms: unit variance of each output.
double weight_scale(int64_t k) {
  return std::sqrt(3.0 / static_cast<double>(k));
}

/// matmul of an activation-like a (in [-1, 1)) and a weight-like b scaled for the reduction over k.
GemmCase matmul_case(const Shape& a_shape, const Shape& b_shape, int64_t k) {
  const double s = weight_scale(k);
  return {.make_inputs =
              [=](DType d) {
                return std::vector<Tensor>{random_input(a_shape, 1, d), random_input(b_shape, 2, d, -s, s)};
              },
          .fn = [](const std::vector<Tensor>& in) { return ops::matmul(in[0], in[1]); }};
}

// ---- matmul

TEST(LinalgGpu, MatmulOddSizes) {
  COLOSSAL_REQUIRE_GPU();
  check_all_precisions(matmul_case({37, 129}, {129, 65}, 129), "matmul [37, 129] @ [129, 65]");
  check_all_precisions(matmul_case({1, 7}, {7, 1}, 7), "matmul [1, 7] @ [7, 1]");
}

TEST(LinalgGpu, MatmulBatchedWithBroadcast) {
  COLOSSAL_REQUIRE_GPU();
  // Batch [4, 1] against [3]: a is broadcast (stride 0) along the inner batch dimension and b along
  // the outer one, so the inner one runs as one strided-batch call and the outer one is looped.
  check_all_precisions(matmul_case({4, 1, 37, 65}, {3, 65, 29}, 65), "matmul [4, 1, 37, 65] @ [3, 65, 29]");
  check_all_precisions(matmul_case({37, 65}, {3, 65, 29}, 65), "matmul [37, 65] @ [3, 65, 29]");
  check_all_precisions(matmul_case({2, 5, 37, 65}, {65, 29}, 65), "matmul [2, 5, 37, 65] @ [65, 29] (folded)");
}

TEST(LinalgGpu, MatmulVectors) {
  COLOSSAL_REQUIRE_GPU();
  check_all_precisions(matmul_case({65}, {65}, 65), "dot [65] @ [65]");
  check_all_precisions(matmul_case({37, 65}, {65}, 65), "matmul [37, 65] @ [65]");
  check_all_precisions(matmul_case({65}, {65, 29}, 65), "matmul [65] @ [65, 29]");
  check_all_precisions(matmul_case({65}, {3, 65, 29}, 65), "matmul [65] @ [3, 65, 29]");
  check_all_precisions(matmul_case({3, 37, 65}, {65}, 65), "matmul [3, 37, 65] @ [65]");
}

TEST(LinalgGpu, MatmulViews) {
  COLOSSAL_REQUIRE_GPU();
  const double s = weight_scale(65);
  // Transposed views reach cuBLASLt as transpose flags, with no copy.
  check_all_precisions(
      {.make_inputs =
           [=](DType d) {
             return std::vector<Tensor>{random_input({65, 37}, 3, d), random_input({29, 65}, 4, d, -s, s)};
           },
       .fn = [](const std::vector<Tensor>& in) { return ops::matmul(in[0].t(), in[1].t()); }},
      "matmul a^T @ b^T");
  // Attention's q @ k^T: batched, b transposed within each batch entry.
  const double s16 = weight_scale(16);
  check_all_precisions(
      {.make_inputs =
           [=](DType d) {
             return std::vector<Tensor>{random_input({2, 3, 37, 16}, 5, d),
                                        random_input({2, 3, 29, 16}, 6, d, -s16, s16)};
           },
       .fn = [](const std::vector<Tensor>& in) { return ops::matmul(in[0], in[1].transpose(-1, -2)); }},
      "matmul q @ k^T");
  // Heads split out of a [T, H, D] tensor: batch stride 65 is smaller than a matrix.
  check_all_precisions(
      {.make_inputs =
           [=](DType d) {
             return std::vector<Tensor>{random_input({37, 4, 65}, 7, d), random_input({4, 65, 29}, 8, d, -s, s)};
           },
       .fn =
           [](const std::vector<Tensor>& in) {
             return ops::matmul(in[0].permute({1, 0, 2}), in[1]);
           }},
      "matmul permuted batch");
  // A step along the last dimension: no unit stride, packed first.
  check_all_precisions(
      {.make_inputs =
           [=](DType d) {
             return std::vector<Tensor>{random_input({37, 130}, 9, d), random_input({65, 29}, 10, d, -s, s)};
           },
       .fn = [](const std::vector<Tensor>& in) { return ops::matmul(in[0].slice(1, 0, 130, 2), in[1]); }},
      "matmul column step 2");
  // Offset views: pointers aligned to one element only, leading dimensions past the width.
  check_all_precisions(
      {.make_inputs =
           [=](DType d) {
             return std::vector<Tensor>{random_input({37, 66}, 11, d), random_input({65, 30}, 12, d, -s, s)};
           },
       .fn = [](const std::vector<Tensor>& in) { return ops::matmul(in[0].narrow(1, 1, 65), in[1].narrow(1, 1, 29)); }},
      "matmul offset views");
}

TEST(LinalgGpu, Bmm) {
  COLOSSAL_REQUIRE_GPU();
  const double s = weight_scale(65);
  check_all_precisions(
      {.make_inputs =
           [=](DType d) {
             return std::vector<Tensor>{random_input({3, 37, 65}, 13, d), random_input({3, 65, 29}, 14, d, -s, s)};
           },
       .fn = [](const std::vector<Tensor>& in) { return ops::bmm(in[0], in[1]); }},
      "bmm [3, 37, 65] @ [3, 65, 29]");
}

TEST(LinalgGpu, EmptyProducts) {
  COLOSSAL_REQUIRE_GPU();
  const Device gpu = core::cuda_device(0);
  for (DType dtype : {DType::f32, DType::bf16}) {
    Tensor c =
        ops::matmul(core::ones({2, 0}, TensorOptions(dtype, gpu)), core::ones({0, 3}, TensorOptions(dtype, gpu)));
    EXPECT_EQ(c.shape(), (Shape{2, 3}));
    testing::expect_values(c.to(core::kCpu), {0, 0, 0, 0, 0, 0});
    Tensor none =
        ops::matmul(core::ones({0, 5}, TensorOptions(dtype, gpu)), core::ones({5, 3}, TensorOptions(dtype, gpu)));
    EXPECT_EQ(none.shape(), (Shape{0, 3}));
  }
}

// ---- linear and linear_gelu

/// linear or linear_gelu on x [..., in] with weight [out, in] and (optionally) bias [out].
GemmCase linear_case(const Shape& x_shape, int64_t out_features, bool with_bias, bool gelu) {
  const int64_t in_features = x_shape.back();
  const double s = weight_scale(in_features);
  return {.make_inputs =
              [=](DType d) {
                std::vector<Tensor> in{random_input(x_shape, 21, d),
                                       random_input({out_features, in_features}, 22, d, -s, s)};
                if (with_bias) in.push_back(random_input({out_features}, 23, d, -0.5, 0.5));
                return in;
              },
          .fn =
              [=](const std::vector<Tensor>& in) {
                const Tensor bias = with_bias ? in[2] : Tensor();
                return gelu ? ops::linear_gelu(in[0], in[1], bias) : ops::linear(in[0], in[1], bias);
              },
          .gelu_epilogue = gelu};
}

TEST(LinalgGpu, LinearOddSizes) {
  COLOSSAL_REQUIRE_GPU();
  check_all_precisions(linear_case({3, 37, 129}, 65, true, false), "linear [3, 37, 129] -> 65 with bias");
  check_all_precisions(linear_case({3, 37, 129}, 65, false, false), "linear [3, 37, 129] -> 65");
  check_all_precisions(linear_case({129}, 65, true, false), "linear [129] -> 65 with bias");
  // GPT-2's Conv1D stores its weight [in, out] and hands linear the transposed view.
  const double s = weight_scale(129);
  check_all_precisions({.make_inputs =
                            [=](DType d) {
                              return std::vector<Tensor>{random_input({37, 129}, 24, d),
                                                         random_input({129, 65}, 25, d, -s, s),
                                                         random_input({65}, 26, d, -0.5, 0.5)};
                            },
                        .fn = [](const std::vector<Tensor>& in) { return ops::linear(in[0], in[1].t(), in[2]); }},
                       "linear with a transposed weight (Conv1D)");
}

TEST(LinalgGpu, LinearInConv1dLayoutUsedTwiceSumsItsGradients) {
  // nn::Conv1D's weight [in, out] passed transposed, used on two inputs in one backward: the weight
  // gradient of the second use is added into the first's by its GEMM (Note [Gradient accumulation in
  // the op]), and each use's bias gradient comes out of that GEMM's epilogue (BGRADA, written, then
  // summed) where cuBLASLt has it; against the CPU's plain sums, in every precision. 64 and 48
  // features: GPT-2's multiples of 8; 65 and 37: odd sizes, where the composite may run instead.
  COLOSSAL_REQUIRE_GPU();
  for (const auto& [in_features, out_features] : {std::pair<int64_t, int64_t>{64, 48}, {65, 37}}) {
    const double s = weight_scale(in_features);
    check_all_precisions(
        {.make_inputs =
             [=](DType d) {
               return std::vector<Tensor>{random_input({2, 19, in_features}, 41, d),
                                          random_input({29, in_features}, 42, d),
                                          random_input({in_features, out_features}, 43, d, -s, s),
                                          random_input({out_features}, 44, d, -0.5, 0.5)};
             },
         .fn =
             [](const std::vector<Tensor>& in) {
               const Tensor a = ops::linear(in[0], in[2].t(), in[3]);
               return ops::add(ops::reshape(a, {38, a.size(-1)}),
                               ops::sum(ops::linear(in[1], in[2].t(), in[3]), {0}, true));
             }},
        fmt::format("linear [.., {}] -> {} in Conv1D's layout, used twice", in_features, out_features));
  }
}

TEST(LinalgGpu, LinearAddPartOddSizes) {
  // Note [A row-parallel layer's residual in its GEMM]: one part of the rows made by a GEMM reading
  // the residual as its C and the bias in its epilogue (or, at alignments cuBLASLt refuses, the
  // residual and bias written first and the GEMM adding onto them), the rest by plain GEMMs; every
  // part of 3 over 37 rows (13, 12, 12), whole and in 4 row blocks, with and without the bias, and
  // the backward's gradients, against the CPU in every precision. 64 outputs keep every part's rows
  // 128-byte aligned in bf16, so the fused GEMM runs there.
  COLOSSAL_REQUIRE_GPU();
  const double s = weight_scale(129);
  for (const int64_t out_features : {65, 64}) {
    for (int64_t part = 0; part < 3; ++part) {
      for (const int64_t blocks : {1, 4}) {
        for (const bool with_bias : {true, false}) {
          check_all_precisions(
              {.make_inputs =
                   [=](DType d) {
                     std::vector<Tensor> in{random_input({37, 129}, 27, d),
                                            random_input({out_features, 129}, 28, d, -s, s),
                                            random_input({37, out_features}, 30, d)};
                     if (with_bias) in.push_back(random_input({out_features}, 29, d, -0.5, 0.5));
                     return in;
                   },
               .fn =
                   [=](const std::vector<Tensor>& in) {
                     return ops::linear_add_part(in[0], in[1], with_bias ? in[3] : Tensor(), in[2], part, 3, blocks);
                   }},
              fmt::format("linear_add_part [37, 129] -> {}, part {} of 3, {} blocks, {}", out_features, part, blocks,
                          with_bias ? "bias" : "no bias"));
        }
      }
    }
  }
}

TEST(LinalgGpu, LinearGeluOddSizes) {
  COLOSSAL_REQUIRE_GPU();
  // 65 outputs: the kept pre-activation's rows are padded to 72 for cuBLASLt.
  check_all_precisions(linear_case({3, 37, 129}, 65, true, true), "linear_gelu [3, 37, 129] -> 65 with bias");
  check_all_precisions(linear_case({37, 129}, 64, false, true), "linear_gelu [37, 129] -> 64");
  check_all_precisions(linear_case({129}, 65, true, true), "linear_gelu [129] -> 65 with bias");
}

/// gelu_mlp on x [..., in] with GPT-2's layout: weights stored [in, hidden] and [hidden, out]
/// (passed transposed, as Conv1D does) and both biases.
GemmCase gelu_mlp_case(const Shape& x_shape, int64_t hidden, int64_t out_features) {
  const int64_t in_features = x_shape.back();
  const double s1 = weight_scale(in_features), s2 = weight_scale(hidden);
  return {.make_inputs =
              [=](DType d) {
                return std::vector<Tensor>{
                    random_input(x_shape, 60, d), random_input({in_features, hidden}, 61, d, -s1, s1),
                    random_input({hidden}, 62, d, -0.5, 0.5), random_input({hidden, out_features}, 63, d, -s2, s2),
                    random_input({out_features}, 64, d, -0.5, 0.5)};
              },
          .fn = [](const std::vector<Tensor>& in) { return ops::gelu_mlp(in[0], in[1].t(), in[2], in[3].t(), in[4]); },
          .gelu_epilogue = true};
}

/// Runs the case at one precision and returns how many of its backward passes fused the GELU
/// gradient into the GEMM (ops::fused_gelu_backward_count).
int64_t fused_backward_passes(const GemmCase& test_case, const Precision& precision, const std::string& name) {
  const int64_t before = ops::fused_gelu_backward_count();
  expect_cuda_matches_cpu(test_case, precision, name);
  const int64_t fused = ops::fused_gelu_backward_count() - before;
  std::printf("[ info ] %s (%s): GELU backward %s\n", name.c_str(), precision.name, fused > 0 ? "fused" : "composed");
  return fused;
}

// Tolerances: those of linear_gelu (see the top of the file), and they still hold for the fused
// backward. Its GELU gradient multiplies the f32 product before the one rounding to bf16/f16,
// where the composite rounds the product first and the gradient again: one ulp of difference
// more on a sizeable share of the hidden gradient's entries, which the sums over the rows (the
// first weight's and bias's gradients) turn into a random walk well inside 4 ulps of their rms.
// In TF32 the two chained products (dh = dy W2, then dW1 = x^T dh') carry about 2^-10 relative
// each (bias plus walk), ~3 * 2^-10 in all, inside the 2^-8 allowed.
TEST(LinalgGpu, GeluMlpGpt2Like) {
  COLOSSAL_REQUIRE_GPU();
  // 256 rows, 64 -> 256 -> 64: every size a multiple of 8, as GPT-2's (768 -> 3072 -> 768).
  const GemmCase mlp = gelu_mlp_case({4, 64, 64}, 256, 64);
  for (const Precision& p : kPrecisions) {
    const int64_t fused = fused_backward_passes(mlp, p, "gelu_mlp [4, 64, 64] -> 256 -> 64");
    if (p.dtype == DType::bf16 || p.dtype == DType::f16) {
      EXPECT_EQ(fused, 1) << p.name << ": cuBLASLt refused CUBLASLT_EPILOGUE_DGELU at aligned sizes";
    }
    if (p.dtype == DType::f64) {
      EXPECT_EQ(fused, 0) << "f64 must take the composite (the reference dtype)";
    }
  }
}

TEST(LinalgGpu, GeluMlpOddSizes) {
  COLOSSAL_REQUIRE_GPU();
  // 65 hidden features: the pre-activation is kept with rows padded to 72, and the hidden gradient
  // [37, 65] has an odd leading dimension; cuBLASLt may or may not have kernels for it, and either
  // path must give the CPU's values. f64 always composes.
  const GemmCase mlp = gelu_mlp_case({37, 33}, 65, 29);
  for (const Precision& p : kPrecisions) {
    const int64_t fused = fused_backward_passes(mlp, p, "gelu_mlp [37, 33] -> 65 -> 29");
    if (p.dtype == DType::f64) {
      EXPECT_EQ(fused, 0) << "f64 must take the composite";
    }
  }
  // A single row through an unbatched x: the fused bias gradient sums one row.
  check_all_precisions(gelu_mlp_case({64}, 128, 32), "gelu_mlp [64] -> 128 -> 32");
}

TEST(LinalgGpu, Gpt2Sizes) {
  COLOSSAL_REQUIRE_GPU();
  // GPT-2 small at batch 2 x 64 tokens: attention qkv, MLP up (fused GELU) and down, attention
  // output projection, and the tied lm_head (50304 outputs, no bias) on 8 tokens.
  check_all_precisions(linear_case({2, 64, 768}, 2304, true, false), "gpt2 qkv linear 768 -> 2304");
  check_all_precisions(linear_case({2, 64, 768}, 3072, true, true), "gpt2 fc linear_gelu 768 -> 3072");
  check_all_precisions(linear_case({2, 64, 3072}, 768, true, false), "gpt2 proj linear 3072 -> 768");
  check_all_precisions(linear_case({2, 64, 768}, 768, true, false), "gpt2 attention out linear 768 -> 768");
  check_all_precisions(linear_case({8, 768}, 50304, false, false), "gpt2 lm_head linear 768 -> 50304");
  // Attention scores and values at GPT-2's head size.
  const double s64 = weight_scale(64), s128 = weight_scale(128);
  check_all_precisions(
      {.make_inputs =
           [=](DType d) {
             return std::vector<Tensor>{random_input({2, 12, 128, 64}, 27, d),
                                        random_input({2, 12, 128, 64}, 28, d, -s64, s64)};
           },
       .fn = [](const std::vector<Tensor>& in) { return ops::matmul(in[0], in[1].transpose(-1, -2)); }},
      "gpt2 q @ k^T");
  check_all_precisions({.make_inputs =
                            [=](DType d) {
                              return std::vector<Tensor>{random_input({2, 12, 128, 128}, 29, d),
                                                         random_input({2, 12, 128, 64}, 30, d, -s128, s128)};
                            },
                        .fn = [](const std::vector<Tensor>& in) { return ops::matmul(in[0], in[1]); }},
                       "gpt2 attention @ v");
}

// ---- the fused epilogues themselves

/// Calls the fused GEMM stub directly and compares with the composite on the CPU. At GPT-2's sizes
/// (all multiples of 8) cuBLASLt must take the bf16/f16 epilogues: the fast path is the point.
void check_fused(DType dtype, int64_t rows, int64_t in_features, int64_t out_features, bool must_fuse) {
  const std::string what = fmt::format("fused {} {}x{}x{}", core::dtype_name(dtype), rows, in_features, out_features);
  SCOPED_TRACE(what);
  const Device gpu = core::cuda_device(0);
  const Precision precision{dtype, Float32MatmulPrecision::high, core::dtype_name(dtype).data()};
  const GemmTolerance tol = tolerance_for(precision, true);
  const double s = weight_scale(in_features);
  Tensor x = random_input({rows, in_features}, 31, dtype, -1, 1, false);
  Tensor w = random_input({out_features, in_features}, 32, dtype, -s, s, false);
  Tensor b = random_input({out_features}, 33, dtype, -0.5, 0.5, false);
  Tensor xg = x.to(gpu), wg = w.to(gpu), bg = b.to(gpu);
  const Tensor pre_cpu = ops::linear(x, w, b);

  // bias
  Tensor out = core::empty({rows, out_features}, TensorOptions(dtype, gpu));
  const bool bias_fused = ops::fused_gemm_stub(gpu, out, xg, wg.t(), ops::GemmEpilogue{.bias = bg});
  if (bias_fused) expect_gemm_close(out, pre_cpu, tol, what + " bias");
  // an addend (cuBLASLt's C apart from D), with and without the bias; the addend is left as it was
  const Tensor addend = random_input({rows, out_features}, 36, dtype, -1, 1, false);
  const Tensor addend_g = addend.to(gpu), addend_before = addend_g.clone();
  const bool addend_bias_fused =
      ops::fused_gemm_stub(gpu, out, xg, wg.t(), ops::GemmEpilogue{.bias = bg, .addend = addend_g});
  if (addend_bias_fused) expect_gemm_close(out, ops::add(pre_cpu, addend), tol, what + " bias + addend");
  const bool addend_fused = ops::fused_gemm_stub(gpu, out, xg, wg.t(), ops::GemmEpilogue{.addend = addend_g});
  if (addend_fused) expect_gemm_close(out, ops::add(ops::matmul(x, w.t()), addend), tol, what + " addend");
  EXPECT_EQ(addend_g.to(core::kCpu).to_vector<double>(), addend_before.to(core::kCpu).to_vector<double>())
      << what << ": the addend was written";
  // bias + GELU, keeping the pre-activation
  Tensor pre;
  const bool gelu_fused = ops::fused_gemm_stub(
      gpu, out, xg, wg.t(), ops::GemmEpilogue{.bias = bg, .gelu_tanh = true, .pre_activation = &pre});
  if (gelu_fused) {
    expect_gemm_close(out, ops::gelu(pre_cpu, ops::GeluApproximation::tanh), tol, what + " bias + gelu");
    ASSERT_TRUE(pre.defined());
    EXPECT_EQ(pre.shape(), (Shape{rows, out_features}));
    expect_gemm_close(pre, pre_cpu, tol, what + " pre-activation");
  }
  // weight gradient with the bias gradient: grad^T [out, rows] @ x [rows, in], row sums of grad^T.
  Tensor grad = random_input({rows, out_features}, 34, dtype, -1, 1, false);
  Tensor grad_weight = core::empty({out_features, in_features}, TensorOptions(dtype, gpu));
  Tensor grad_bias = core::empty({out_features}, TensorOptions(dtype, gpu));
  const bool bgrad_fused =
      ops::fused_gemm_stub(gpu, grad_weight, grad.to(gpu).t(), xg, ops::GemmEpilogue{.bias_grad = grad_bias});
  if (bgrad_fused) {
    expect_gemm_close(grad_weight, ops::matmul(grad.t(), x), tol, what + " weight gradient");
    expect_gemm_close(grad_bias, ops::sum(grad, {0}), tol, what + " bias gradient");
  }
  // The same two gradients in the [in, out] layout (nn::Conv1D's): x^T [in, rows] @ grad [rows, out]
  // with grad's column sums, written and then added onto (accumulate: beta = 1).
  Tensor grad_weight_t = core::empty({in_features, out_features}, TensorOptions(dtype, gpu));
  Tensor grad_bias_b = core::empty({out_features}, TensorOptions(dtype, gpu));
  const Tensor gradg = grad.to(gpu);
  const bool bgrad_b_fused =
      ops::fused_gemm_stub(gpu, grad_weight_t, xg.t(), gradg, ops::GemmEpilogue{.bias_grad_of_b = grad_bias_b});
  bool bgrad_b_accumulated = false;
  if (bgrad_b_fused) {
    const Tensor expected_t = ops::matmul(x.t(), grad);
    expect_gemm_close(grad_weight_t, expected_t, tol, what + " weight gradient [in, out]");
    expect_gemm_close(grad_bias_b, ops::sum(grad, {0}), tol, what + " bias gradient of b");
    grad_bias_b.zero_();
    bgrad_b_accumulated = ops::fused_gemm_stub(gpu, grad_weight_t, xg.t(), gradg,
                                               ops::GemmEpilogue{.bias_grad_of_b = grad_bias_b, .accumulate = true});
    if (bgrad_b_accumulated) {
      expect_gemm_close(grad_weight_t, ops::add(expected_t, expected_t), tol,
                        what + " weight gradient [in, out] added");
      expect_gemm_close(grad_bias_b, ops::sum(grad, {0}), tol, what + " bias gradient of b (written, not added)");
    }
  }
  // The gradient of the pre-activation through a next layer whose weight is w^T [in, out]:
  // (dy [rows, in] @ w^T) * gelu'(pre), with and without its column sums (the bias gradient), as
  // gelu_mlp's backward asks for it. The reference differentiates GELU on the CPU at the GPU's own
  // pre-activation, so that only the epilogue is compared.
  bool dgelu_fused = false, dgelu_bgrad_fused = false;
  if (gelu_fused) {
    const Tensor dy = random_input({rows, in_features}, 35, dtype, -1, 1, false);
    Tensor pre_leaf = pre.to(core::kCpu);
    pre_leaf.set_requires_grad(true);
    autograd::backward(ops::gelu(pre_leaf, ops::GeluApproximation::tanh), ops::matmul(dy, w.t()));
    const Tensor grad_pre_cpu = pre_leaf.grad();
    Tensor grad_pre = core::empty({rows, out_features}, TensorOptions(dtype, gpu));
    Tensor grad_pre_bias = core::empty({out_features}, TensorOptions(dtype, gpu));
    const Tensor dyg = dy.to(gpu);
    dgelu_bgrad_fused = ops::fused_gemm_stub(
        gpu, grad_pre, dyg, wg.t(), ops::GemmEpilogue{.gelu_grad_pre_activation = pre, .bias_grad = grad_pre_bias});
    if (dgelu_bgrad_fused) {
      expect_gemm_close(grad_pre, grad_pre_cpu, tol, what + " GELU gradient (with bias gradient)");
      expect_gemm_close(grad_pre_bias, ops::sum(grad_pre_cpu, {0}), tol, what + " GELU bias gradient");
    }
    dgelu_fused = ops::fused_gemm_stub(gpu, grad_pre, dyg, wg.t(), ops::GemmEpilogue{.gelu_grad_pre_activation = pre});
    if (dgelu_fused) expect_gemm_close(grad_pre, grad_pre_cpu, tol, what + " GELU gradient");
  }
  std::printf(
      "[ info ] %s: bias %s, bias+addend %s, addend %s, bias+gelu %s, bias gradient %s, bias gradient of b %s "
      "(accumulating %s), gelu gradient %s, gelu+bias gradient %s\n",
      what.c_str(), bias_fused ? "fused" : "composed", addend_bias_fused ? "fused" : "composed",
      addend_fused ? "fused" : "composed", gelu_fused ? "fused" : "composed", bgrad_fused ? "fused" : "composed",
      bgrad_b_fused ? "fused" : "composed", bgrad_b_accumulated ? "fused" : "composed",
      dgelu_fused ? "fused" : "composed", dgelu_bgrad_fused ? "fused" : "composed");
  if (must_fuse) {
    EXPECT_TRUE(bias_fused) << what << ": cuBLASLt refused CUBLASLT_EPILOGUE_BIAS";
    EXPECT_TRUE(addend_bias_fused) << what << ": cuBLASLt refused CUBLASLT_EPILOGUE_BIAS with C apart from D";
    EXPECT_TRUE(addend_fused) << what << ": cuBLASLt refused C apart from D";
    EXPECT_TRUE(gelu_fused) << what << ": cuBLASLt refused CUBLASLT_EPILOGUE_GELU_AUX_BIAS";
    EXPECT_TRUE(bgrad_fused) << what << ": cuBLASLt refused CUBLASLT_EPILOGUE_BGRADB";
    EXPECT_TRUE(bgrad_b_fused) << what << ": cuBLASLt refused CUBLASLT_EPILOGUE_BGRADA";
    EXPECT_TRUE(bgrad_b_accumulated) << what << ": cuBLASLt refused CUBLASLT_EPILOGUE_BGRADA with beta = 1";
    EXPECT_TRUE(dgelu_fused) << what << ": cuBLASLt refused CUBLASLT_EPILOGUE_DGELU";
    EXPECT_TRUE(dgelu_bgrad_fused) << what << ": cuBLASLt refused CUBLASLT_EPILOGUE_DGELU_BGRAD";
  }
}

TEST(LinalgGpu, FusedEpilogues) {
  COLOSSAL_REQUIRE_GPU();
  for (DType dtype : {DType::bf16, DType::f16, DType::f32}) {
    check_fused(dtype, 128, 768, 3072, dtype != DType::f32);  // f32 training is not the fast path
    check_fused(dtype, 37, 129, 65, false);  // odd sizes may or may not have fused kernels; either is right
  }
  // 4.8 GFLOP per product, above the autotuning threshold (1e9): every epilogue is timed on the call's
  // own buffers first (bias gradient and pre-activation written while timing), then run for real.
  check_fused(DType::bf16, 1024, 768, 3072, true);
  check_fused(DType::f64, 37, 129, 65, false);
}

TEST(LinalgGpu, FusedGeluGradientDeclinesOtherLayouts) {
  COLOSSAL_REQUIRE_GPU();
  // The backward epilogue reads the pre-activation in the layout the forward's epilogue writes (row
  // stride a multiple of 8). Given another, or f64, the kernel must decline and write nothing, so
  // that gelu_mlp composes; sentinels in the outputs show that nothing was written.
  const Device gpu = core::cuda_device(0);
  const int64_t rows = 64, k = 64, hidden = 64;
  for (DType dtype : {DType::bf16, DType::f32, DType::f64}) {
    SCOPED_TRACE(core::dtype_name(dtype));
    const Tensor dy = random_input({rows, k}, 70, dtype, -1, 1, false).to(gpu);
    const Tensor w = random_input({k, hidden}, 71, dtype, -0.2, 0.2, false).to(gpu);
    // Row stride 68: a multiple of 4 but not of 8.
    const Tensor padded = random_input({rows, 68}, 72, dtype, -2, 2, false).to(gpu);
    const Tensor aligned = random_input({rows, hidden}, 73, dtype, -2, 2, false).to(gpu);
    for (const Tensor& pre : {padded.narrow(1, 0, hidden), aligned}) {
      if (dtype != DType::f64 && pre.is_same(aligned)) continue;  // a layout cuBLASLt may take
      Tensor grad_pre = core::full({rows, hidden}, 7.0, TensorOptions(dtype, gpu));
      Tensor grad_bias = core::full({hidden}, 7.0, TensorOptions(dtype, gpu));
      EXPECT_FALSE(ops::fused_gemm_stub(gpu, grad_pre, dy, w,
                                        ops::GemmEpilogue{.gelu_grad_pre_activation = pre, .bias_grad = grad_bias}))
          << "pre-activation strides " << fmt::format("{}", pre.strides());
      const auto untouched = [](const Tensor& t) {
        const std::vector<double> values = t.to(core::kCpu).to_vector<double>();
        return std::all_of(values.begin(), values.end(), [](double v) { return v == 7.0; });
      };
      EXPECT_TRUE(untouched(grad_pre)) << "wrote the output";
      EXPECT_TRUE(untouched(grad_bias)) << "wrote the bias gradient";
    }
  }
}

// ---- modes, streams and bad input

using testing::EnvGuard;

TEST(LinalgGpu, AutotuningIsCorrectAndCached) {
  COLOSSAL_REQUIRE_GPU();
  // See Note [GEMM autotuning] in ops/cuda/linalg_kernels.cpp. 2 M N K = 3.6 GFLOP, above the 1e9
  // threshold, and a shape no other test uses, so that its first call here is the first in the process.
  const Device gpu = core::cuda_device(0);
  const int64_t m = 1024, k = 2304, n = 768;
  const double s = weight_scale(k);
  const GemmTolerance tol = tolerance_for(kPrecisions[2], false);  // bf16
  const Tensor a = random_input({m, k}, 50, DType::bf16, -1, 1, false);
  const Tensor b = random_input({k, n}, 51, DType::bf16, -s, s, false);
  const Tensor expected = ops::matmul(a, b);
  const Tensor ag = a.to(gpu), bg = b.to(gpu);

  // The problems of this test are tuned here, not read from an earlier process's tuning file.
  const EnvGuard no_file("COLOSSAL_GEMM_CACHE", "off");
  Tensor heuristic;  // the heuristic's first pick, as with autotuning off
  {
    EnvGuard off("COLOSSAL_GEMM_AUTOTUNE", "0");
    const int64_t before = ops::gemm_autotune_count();
    heuristic = ops::matmul(ag, bg);
    EXPECT_EQ(ops::gemm_autotune_count(), before) << "COLOSSAL_GEMM_AUTOTUNE=0 still autotuned";
  }
  EnvGuard on("COLOSSAL_GEMM_AUTOTUNE", "1");
  const int64_t before = ops::gemm_autotune_count();
  const Tensor tuned = ops::matmul(ag, bg);  // the unsettled pick is tuned now that tuning is on
  EXPECT_EQ(ops::gemm_autotune_count(), before + 1) << "the first call with autotuning on did not tune";
  const Tensor again = ops::matmul(ag, bg);
  EXPECT_EQ(ops::gemm_autotune_count(), before + 1) << "the second call tuned again instead of using the cache";
  expect_gemm_close(heuristic, expected, tol, "heuristic pick");
  expect_gemm_close(tuned, expected, tol, "autotuned pick");
  expect_gemm_close(again, expected, tol, "cached autotuned pick");
  // One algorithm and no atomics (see SameBitsTwice): the cached call repeats the tuned one exactly.
  testing::expect_close(again.to(core::kCpu), tuned.to(core::kCpu), 0, 0, "autotuned twice");

  // An accumulating call (beta = 1) is timed into scratch: the output is accumulated exactly once.
  const int64_t n2 = 640;  // another shape, so another problem to tune
  const Tensor b2 = random_input({k, n2}, 52, DType::bf16, -s, s, false);
  const Tensor c = random_input({m, n2}, 53, DType::bf16, -1, 1, false);
  Tensor accumulated_cpu = c.clone();
  ops::batched_gemm_stub(core::kCpu, accumulated_cpu, a, b2, 1.0);
  Tensor accumulated = c.to(gpu);
  ops::batched_gemm_stub(gpu, accumulated, ag, b2.to(gpu), 1.0);
  EXPECT_EQ(ops::gemm_autotune_count(), before + 2) << "the accumulating call was not tuned";
  expect_gemm_close(accumulated, accumulated_cpu, tol, "autotuned accumulation (beta = 1)");
}

TEST(LinalgGpu, TunedChoicesComeBackFromTheTuningFile) {
  COLOSSAL_REQUIRE_GPU();
  // See Note [GEMM tuning file] in ops/gemm_tuning_file.cpp. A shape no other test uses.
  const Device gpu = core::cuda_device(0);
  const int64_t m = 1536, k = 1280, n = 896;
  const GemmTolerance tol = tolerance_for(kPrecisions[2], false);  // bf16
  const Tensor a = random_input({m, k}, 60, DType::bf16, -1, 1, false);
  const Tensor b = random_input({k, n}, 61, DType::bf16, -weight_scale(k), weight_scale(k), false);
  const Tensor expected = ops::matmul(a, b);
  const Tensor ag = a.to(gpu), bg = b.to(gpu);
  const std::filesystem::path dir =
      std::filesystem::temp_directory_path() / ("linalg_gpu_tuning_file_" + std::to_string(::getpid()));
  std::filesystem::remove_all(dir);
  const EnvGuard autotune("COLOSSAL_GEMM_AUTOTUNE", "1");
  const EnvGuard cache("COLOSSAL_GEMM_CACHE", dir.c_str());
  ops::forget_gemm_algos();

  const int64_t tuned_before = ops::gemm_autotune_count(), filed_before = ops::gemm_tuning_file_count();
  const Tensor tuned = ops::matmul(ag, bg);
  EXPECT_EQ(ops::gemm_autotune_count(), tuned_before + 1) << "the first call did not tune";
  EXPECT_EQ(ops::gemm_tuning_file_count(), filed_before);
  size_t files = 0, lines = 0;
  for (const auto& entry : std::filesystem::directory_iterator(dir)) {
    ++files;
    std::ifstream in(entry.path());
    for (std::string line; std::getline(in, line);) ++lines;
  }
  EXPECT_EQ(files, 1u);
  EXPECT_EQ(lines, 1u) << "one line for the one problem tuned";

  // As a new process would: nothing in memory, the file read.
  ops::forget_gemm_algos();
  const Tensor filed = ops::matmul(ag, bg);
  EXPECT_EQ(ops::gemm_autotune_count(), tuned_before + 1) << "tuned again although the file holds the problem";
  EXPECT_EQ(ops::gemm_tuning_file_count(), filed_before + 1) << "the file's choice was not used";
  expect_gemm_close(filed, expected, tol, "the file's choice");
  // The same algorithm (one kernel, no atomics: see SameBitsTwice) gives the same bits.
  testing::expect_close(filed.to(core::kCpu), tuned.to(core::kCpu), 0, 0, "tuned, then read from the file");

  // With the file off, a forgotten problem is tuned again.
  {
    const EnvGuard off("COLOSSAL_GEMM_CACHE", "off");
    ops::forget_gemm_algos();
    const Tensor again = ops::matmul(ag, bg);
    EXPECT_EQ(ops::gemm_autotune_count(), tuned_before + 2);
    expect_gemm_close(again, expected, tol, "tuned again with the file off");
  }
  ops::forget_gemm_algos();
  std::filesystem::remove_all(dir);
}

TEST(LinalgGpu, Float32PrecisionSetting) {
  COLOSSAL_REQUIRE_GPU();
  const Device gpu = core::cuda_device(0);
  Tensor a = random_input({256, 256}, 40, DType::f32, -1, 1, false).to(gpu);
  Tensor b = random_input({256, 256}, 41, DType::f32, -1, 1, false).to(gpu);
  Tensor full, tf32;
  {
    PrecisionGuard guard(Float32MatmulPrecision::highest);
    full = ops::matmul(a, b).to(core::kCpu);
  }
  {
    PrecisionGuard guard(Float32MatmulPrecision::high);
    tf32 = ops::matmul(a, b).to(core::kCpu);
  }
  // TF32 rounds inputs to 10-bit mantissas: sums of 256 products of size ~1/3 move by ~1e-3, far
  // above f32 rounding (1e-6). A difference shows the tensor cores really ran in TF32.
  double worst = 0;
  const auto x = full.to_vector<double>(), y = tf32.to_vector<double>();
  for (size_t i = 0; i < x.size(); ++i) worst = std::max(worst, std::abs(x[i] - y[i]));
  EXPECT_GT(worst, 1e-5);
  EXPECT_LT(worst, 0.1);
}

TEST(LinalgGpu, SameBitsTwice) {
  COLOSSAL_REQUIRE_GPU();
  // No split-K reduction with atomics (see the reduction-scheme mask): the same call gives the same bits.
  const Device gpu = core::cuda_device(0);
  Tensor a = random_input({512, 3072}, 42, DType::bf16, -1, 1, false).to(gpu);
  Tensor b = random_input({3072, 64}, 43, DType::bf16, -1, 1, false).to(gpu);
  testing::expect_close(ops::matmul(a, b).to(core::kCpu), ops::matmul(a, b).to(core::kCpu), 0, 0, "repeat");
}

TEST(LinalgGpu, SecondStream) {
  COLOSSAL_REQUIRE_GPU();
  // Each stream gets its own cuBLASLt workspace; a GEMM queued on another stream is still correct.
  const Device gpu = core::cuda_device(0);
  Tensor a = random_input({64, 96}, 44, DType::bf16, -1, 1, false);
  Tensor b = random_input({96, 48}, 45, DType::bf16, -weight_scale(96), weight_scale(96), false);
  const Tensor expected = ops::matmul(a, b);
  const core::Stream stream = core::cuda::create_stream(gpu);
  {
    core::cuda::StreamGuard guard(stream);
    Tensor c = ops::matmul(a.to(gpu), b.to(gpu));
    core::cuda::synchronize(stream);
    expect_gemm_close(c, expected, tolerance_for(kPrecisions[2], false), "second stream");
  }
  core::cuda::destroy_stream(stream);
}

TEST(LinalgGpu, BadInputIsAClearError) {
  COLOSSAL_REQUIRE_GPU();
  const Device gpu = core::cuda_device(0);
  Tensor cpu_a = core::ones({2, 3}), cpu_w = core::ones({4, 3});
  Tensor gpu_a = core::ones({2, 3}, TensorOptions(DType::f32, gpu)),
         gpu_w = core::ones({4, 3}, TensorOptions(DType::f32, gpu));
  Tensor gpu_b = core::ones({3, 4}, TensorOptions(DType::f32, gpu));
  EXPECT_ERROR_CONTAINS(ops::matmul(cpu_a, gpu_b), "a [2, 3] is on cpu but b [3, 4] is on cuda:0");
  EXPECT_ERROR_CONTAINS(ops::bmm(core::ones({1, 2, 3}, TensorOptions(DType::f32, gpu)), core::ones({1, 3, 4})),
                        "a [1, 2, 3] is on cuda:0 but b [1, 3, 4] is on cpu");
  EXPECT_ERROR_CONTAINS(ops::linear(gpu_a, gpu_w, core::ones({4})), "input [2, 3] is on cuda:0 but bias [4] is on cpu");
  EXPECT_ERROR_CONTAINS(ops::linear_gelu(cpu_a, gpu_w), "input [2, 3] is on cpu but weight [4, 3] is on cuda:0");
  // The kernel checks too, for callers that reach the stub directly.
  Tensor out = core::empty({2, 4}, TensorOptions(DType::f32, gpu));
  EXPECT_ERROR_CONTAINS(ops::batched_gemm_stub(gpu, out, cpu_a, gpu_b, 0.0),
                        "a [2, 3] is on cpu but the output [2, 4] is on cuda:0");
  // Two GPUs: the same checks, naming both devices (and the operands' shapes, as every message above).
  if (core::cuda::device_count() > 1) {
    Tensor other = core::ones({3, 4}, TensorOptions(DType::f32, core::cuda_device(1)));
    EXPECT_ERROR_CONTAINS(ops::matmul(gpu_a, other), "matmul: a [2, 3] is on cuda:0 but b [3, 4] is on cuda:1");
    EXPECT_ERROR_CONTAINS(ops::batched_gemm_stub(gpu, out, gpu_a, other, 0.0),
                          "b [3, 4] is on cuda:1 but the output [2, 4] is on cuda:0");
  }
}

}  // namespace
}  // namespace colossal
