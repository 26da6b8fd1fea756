// matmul, bmm, linear, linear_gelu and gelu_mlp: gradient checks for every operand-rank case, values
// derived by hand, transposed and strided operands, f32/f64 and half-precision agreement, gelu_mlp
// against its composition, and bad input.
#include <gtest/gtest.h>

#include <cmath>
#include <numeric>

#include "colossal/ops/linalg_kernels.h"  // fused_gelu_backward_count
#include "gradcheck.h"

namespace colossal {
namespace {

using testing::check_gradients;
using testing::expect_close;
using testing::expect_values;
using testing::random_leaf;
using testing::random_tensor;

/// Gradient check of matmul for operands of the given shapes.
void check_matmul(const Shape& a_shape, const Shape& b_shape) {
  SCOPED_TRACE(fmt::format("a {} @ b {}", a_shape, b_shape));
  check_gradients({.make_inputs =
                       [=] {
                         return std::vector<Tensor>{random_leaf(a_shape, 1), random_leaf(b_shape, 2)};
                       },
                   .fn = [](const std::vector<Tensor>& in) { return ops::matmul(in[0], in[1]); }});
}

TEST(GradCheck, matmul) {
  check_matmul({3, 4}, {4, 5});
}
TEST(GradCheck, matmul_batched_broadcast) {
  check_matmul({2, 1, 3, 4}, {3, 4, 2});  // batch [2, 1] against [3]
  check_matmul({3, 4}, {2, 4, 5});        // a 2-D a broadcast over b's batch
  check_matmul({2, 3, 4}, {4, 5});        // a's batch folded into its rows
}
TEST(GradCheck, matmul_vector) {
  check_matmul({4}, {4});        // dot product
  check_matmul({3, 4}, {4});     // matrix-vector
  check_matmul({4}, {4, 5});     // vector-matrix
  check_matmul({4}, {2, 4, 5});  // vector against a batch
  check_matmul({2, 3, 4}, {4});  // batch against a vector
}
TEST(GradCheck, matmul_transposed_operands) {
  // Transposed views go to BLAS as transpose flags; the gradients must land in the right layout.
  check_gradients({.make_inputs =
                       [] {
                         return std::vector<Tensor>{random_leaf({4, 3}, 3), random_leaf({5, 4}, 4)};
                       },
                   .fn = [](const std::vector<Tensor>& in) { return ops::matmul(in[0].t(), in[1].t()); }});
}
TEST(GradCheck, bmm) {
  check_gradients({.make_inputs =
                       [] {
                         return std::vector<Tensor>{random_leaf({2, 3, 4}, 5), random_leaf({2, 4, 2}, 6)};
                       },
                   .fn = [](const std::vector<Tensor>& in) { return ops::bmm(in[0], in[1]); }});
}
TEST(GradCheck, linear) {
  check_gradients(
      {.make_inputs =
           [] {
             return std::vector<Tensor>{random_leaf({2, 3, 4}, 7), random_leaf({5, 4}, 8), random_leaf({5}, 9)};
           },
       .fn = [](const std::vector<Tensor>& in) { return ops::linear(in[0], in[1], in[2]); }});
}
TEST(GradCheck, linear_without_bias) {
  check_gradients({.make_inputs =
                       [] {
                         return std::vector<Tensor>{random_leaf({4}, 10), random_leaf({3, 4}, 11)};
                       },
                   .fn = [](const std::vector<Tensor>& in) { return ops::linear(in[0], in[1]); }});
}

TEST(GradCheck, linear_gelu) {
  // Pre-activations of [-1, 1) inputs over 4 features stay within [-5, 5], where tanh-GELU is smooth
  // and eps = 1e-6 central differences are accurate to ~1e-10.
  check_gradients(
      {.make_inputs =
           [] {
             return std::vector<Tensor>{random_leaf({2, 3, 4}, 12), random_leaf({5, 4}, 13), random_leaf({5}, 14)};
           },
       .fn = [](const std::vector<Tensor>& in) { return ops::linear_gelu(in[0], in[1], in[2]); }});
  check_gradients({.make_inputs =
                       [] {
                         return std::vector<Tensor>{random_leaf({4}, 15), random_leaf({3, 4}, 16)};
                       },
                   .fn = [](const std::vector<Tensor>& in) { return ops::linear_gelu(in[0], in[1]); }});
}

TEST(GradCheck, gelu_mlp) {
  // Pre-activations of [-1, 1) inputs over 4 features stay within [-5, 5] (see linear_gelu above).
  check_gradients(
      {.make_inputs =
           [] {
             return std::vector<Tensor>{random_leaf({2, 3, 4}, 17), random_leaf({6, 4}, 18), random_leaf({6}, 19),
                                        random_leaf({5, 6}, 20), random_leaf({5}, 21)};
           },
       .fn = [](const std::vector<Tensor>& in) { return ops::gelu_mlp(in[0], in[1], in[2], in[3], in[4]); }});
  // GPT-2's layout: weights stored [in, out] and passed transposed; no biases.
  check_gradients(
      {.make_inputs =
           [] {
             return std::vector<Tensor>{random_leaf({3, 4}, 22), random_leaf({4, 6}, 23), random_leaf({6, 5}, 24)};
           },
       .fn =
           [](const std::vector<Tensor>& in) {
             return ops::gelu_mlp(in[0], in[1].t(), Tensor(), in[2].t(), Tensor());
           }});
}

/// The inputs of gelu_mlp in `dtype`, weights [in, out] as GPT-2's Conv1D holds them (passed
/// transposed), with requires_grad set on those whose mask bit is set.
std::vector<Tensor> mlp_inputs(DType dtype, const std::vector<bool>& requires_grad) {
  std::vector<Tensor> in{random_tensor({2, 3, 8}, 90, -1, 1, dtype), random_tensor({8, 12}, 91, -0.6, 0.6, dtype),
                         random_tensor({12}, 92, -0.5, 0.5, dtype), random_tensor({12, 8}, 93, -0.5, 0.5, dtype),
                         random_tensor({8}, 94, -0.5, 0.5, dtype)};
  for (size_t i = 0; i < in.size(); ++i) in[i].set_requires_grad(requires_grad[i]);
  return in;
}

TEST(GeluMlp, EqualsLinearGeluThenLinear) {
  // On the CPU gelu_mlp runs the kernels of linear_gelu and linear in their order, forward and
  // backward, so everything is bit-for-bit equal (tolerance 0), whichever inputs need a gradient.
  const std::vector<std::vector<bool>> masks = {{true, true, true, true, true},
                                                {true, false, false, false, false},
                                                {false, true, true, false, false},
                                                {false, false, false, true, true},
                                                {false, false, true, true, false}};
  for (DType dtype : {DType::f32, DType::bf16, DType::f64}) {
    for (const std::vector<bool>& mask : masks) {
      const std::string what = fmt::format("{} mask {}{}{}{}{}", core::dtype_name(dtype), int{mask[0]}, int{mask[1]},
                                           int{mask[2]}, int{mask[3]}, int{mask[4]});
      SCOPED_TRACE(what);
      std::vector<Tensor> fused = mlp_inputs(dtype, mask), composed = mlp_inputs(dtype, mask);
      Tensor y = ops::gelu_mlp(fused[0], fused[1].t(), fused[2], fused[3].t(), fused[4]);
      Tensor reference =
          ops::linear(ops::linear_gelu(composed[0], composed[1].t(), composed[2]), composed[3].t(), composed[4]);
      ASSERT_EQ(y.shape(), (Shape{2, 3, 8}));
      expect_close(y, reference, 0, 0, what + " forward");
      const Tensor upstream = random_tensor(y.shape(), 95, -1, 1, dtype);
      autograd::backward(y, upstream);
      autograd::backward(reference, upstream);
      for (size_t i = 0; i < fused.size(); ++i) {
        ASSERT_EQ(fused[i].grad().defined(), mask[i]) << what << " input " << i;
        if (mask[i]) expect_close(fused[i].grad(), composed[i].grad(), 0, 0, what + fmt::format(" gradient {}", i));
      }
    }
  }
  EXPECT_EQ(ops::fused_gelu_backward_count(), 0) << "the CPU has no fused GELU backward";
}

TEST(GeluMlp, NoGradientNoGraph) {
  Tensor x = random_tensor({4, 8}, 96, -1, 1, DType::f32);
  Tensor w1 = random_tensor({12, 8}, 97, -1, 1, DType::f32), w2 = random_tensor({8, 12}, 98, -1, 1, DType::f32);
  Tensor y = ops::gelu_mlp(x, w1, Tensor(), w2, Tensor());
  EXPECT_FALSE(y.requires_grad());
  expect_close(y, ops::linear(ops::linear_gelu(x, w1), w2), 0, 0, "gelu_mlp without biases");
}

TEST(Linear, GeluMatchesLinearThenGelu) {
  // On the CPU linear_gelu is linear followed by tanh-GELU, the same kernels in the same order.
  Tensor x = random_tensor({2, 3, 8}, 63, -1, 1, DType::f32);
  Tensor w = random_tensor({5, 8}, 64, -1, 1, DType::f32);
  Tensor b = random_tensor({5}, 65, -1, 1, DType::f32);
  Tensor y = ops::linear_gelu(x, w, b);
  EXPECT_EQ(y.shape(), (Shape{2, 3, 5}));
  expect_close(y, ops::gelu(ops::linear(x, w, b), ops::GeluApproximation::tanh), 0, 0, "linear_gelu");
  expect_close(ops::linear_gelu(x, w), ops::gelu(ops::linear(x, w), ops::GeluApproximation::tanh), 0, 0,
               "linear_gelu without bias");
}

TEST(Matmul, KnownValues) {
  // [[1, 2, 3], [4, 5, 6]] @ [[7, 8], [9, 10], [11, 12]], by hand:
  // row 0: 1*7 + 2*9 + 3*11 = 58, 1*8 + 2*10 + 3*12 = 64; row 1: 139, 154.
  Tensor a = core::from_vector<float>({1, 2, 3, 4, 5, 6}, {2, 3});
  Tensor b = core::from_vector<float>({7, 8, 9, 10, 11, 12}, {3, 2});
  Tensor c = ops::matmul(a, b);
  EXPECT_EQ(c.shape(), (Shape{2, 2}));
  expect_values(c, {58, 64, 139, 154});
  // Dot product: 1*7 + 2*8 + 3*9 = 50, a 0-d result.
  Tensor dot = ops::matmul(core::from_vector<double>({1, 2, 3}, {3}), core::from_vector<double>({7, 8, 9}, {3}));
  EXPECT_EQ(dot.dim(), 0);
  EXPECT_EQ(dot.item<double>(), 50.0);
  // Matrix-vector: [[1, 2, 3], [4, 5, 6]] @ [1, 0, -1] = [1 - 3, 4 - 6] = [-2, -2].
  Tensor mv = ops::matmul(a, core::from_vector<float>({1, 0, -1}, {3}));
  EXPECT_EQ(mv.shape(), (Shape{2}));
  expect_values(mv, {-2, -2});
}

TEST(Matmul, KnownGradients) {
  // C = A B with dC = ones: dA = ones @ B^T (row sums of B, repeated), dB = A^T @ ones (column
  // sums of A, repeated). B's rows sum to 15, 19, 23; A's columns sum to 5, 7, 9.
  Tensor a = core::from_vector<double>({1, 2, 3, 4, 5, 6}, {2, 3});
  Tensor b = core::from_vector<double>({7, 8, 9, 10, 11, 12}, {3, 2});
  a.set_requires_grad(true);
  b.set_requires_grad(true);
  autograd::backward(ops::sum(ops::matmul(a, b)));
  expect_values(a.grad(), {15, 19, 23, 15, 19, 23});
  expect_values(b.grad(), {5, 5, 7, 7, 9, 9});
}

TEST(Matmul, BroadcastBatchShapes) {
  // [2, 1, 3, 4] @ [5, 4, 6] -> [2, 5, 3, 6]; every batch entry equals its 2-D product.
  Tensor a = random_tensor({2, 1, 3, 4}, 20);
  Tensor b = random_tensor({5, 4, 6}, 21);
  Tensor c = ops::matmul(a, b);
  ASSERT_EQ(c.shape(), (Shape{2, 5, 3, 6}));
  for (int64_t i = 0; i < 2; ++i) {
    for (int64_t j = 0; j < 5; ++j) {
      // f64 GEMM of length-4 dot products: rounding is a few ulp of O(1) values (1e-16); 1e-12 is margin.
      expect_close(c.select(0, i).select(0, j), ops::matmul(a.select(0, i).select(0, 0), b.select(0, j)), 1e-12, 0,
                   fmt::format("batch ({}, {})", i, j));
    }
  }
}

TEST(Matmul, StridedOperandsMatchContiguous) {
  // A transposed view (transpose flag), a column slice (leading dimension > columns) and a step
  // along the last dimension (packed) all give the product of their contiguous copies.
  Tensor base = random_tensor({6, 8}, 30);
  Tensor b = random_tensor({4, 3}, 31);
  const std::vector<Tensor> lhs = {base.t().slice(0, 0, 5).slice(1, 0, 4),  // transposed
                                   base.slice(1, 2, 6),                     // ld = 8 > 4 columns
                                   base.slice(1, 0, 8, 2)};                 // column stride 2
  for (const Tensor& a : lhs) {
    // f64, length-4 dot products of O(1) values: 1e-12 is far above rounding (1e-16).
    expect_close(ops::matmul(a, b), ops::matmul(a.contiguous(), b), 1e-12, 0, fmt::format("a {}", a.strides()));
  }
}

TEST(Matmul, F32AgreesWithF64) {
  Tensor a = random_tensor({2, 7, 33}, 40);
  Tensor b = random_tensor({33, 9}, 41);
  Tensor reference = ops::matmul(a, b);
  // f32 dot products of 33 terms in [-1, 1): error ~ sqrt(33) * 6e-8 * |terms|, below 1e-5.
  expect_close(ops::matmul(a.to(DType::f32), b.to(DType::f32)), reference, 1e-5, 1e-5, "f32");
}

TEST(Matmul, HalfPrecisionWithinTolerance) {
  Tensor a = random_tensor({3, 16}, 50);
  Tensor b = random_tensor({16, 5}, 51);
  for (DType dtype : {DType::f16, DType::bf16}) {
    // The inputs are rounded to the half type (relative 2^-11 for f16, 2^-8 for bf16), the GEMM runs
    // in f32 and the result is rounded again. Compare against the f64 product of the rounded inputs:
    // the only error left is the final rounding, |c| * 2^-8 <= 16 * 0.004 for bf16, so 0.07 (f16: 0.01).
    Tensor ah = a.to(dtype), bh = b.to(dtype);
    Tensor c = ops::matmul(ah, bh);
    EXPECT_EQ(c.dtype(), dtype);
    const double tolerance = dtype == DType::bf16 ? 0.07 : 0.01;
    expect_close(c, ops::matmul(ah.to(DType::f64), bh.to(DType::f64)), tolerance, 0,
                 std::string(core::dtype_name(dtype)));
  }
}

TEST(Linear, KnownValuesAndShape) {
  // x [1, 2] times W [[1, 0], [0, 1], [1, 1]] transposed plus b [0.5, -0.5, 0]:
  // [1 + 0.5, 2 - 0.5, 3 + 0] = [1.5, 1.5, 3].
  Tensor x = core::from_vector<float>({1, 2}, {1, 1, 2});
  Tensor w = core::from_vector<float>({1, 0, 0, 1, 1, 1}, {3, 2});
  Tensor b = core::from_vector<float>({0.5f, -0.5f, 0}, {3});
  Tensor y = ops::linear(x, w, b);
  EXPECT_EQ(y.shape(), (Shape{1, 1, 3}));
  expect_values(y, {1.5, 1.5, 3});
}

TEST(Linear, MatchesMatmulInHalfPrecision) {
  Tensor x = random_tensor({4, 8}, 60, -1, 1, DType::bf16);
  Tensor w = random_tensor({3, 8}, 61, -1, 1, DType::bf16);
  Tensor b = random_tensor({3}, 62, -1, 1, DType::bf16);
  Tensor y = ops::linear(x, w, b);
  Tensor reference = ops::add(ops::matmul(x.to(DType::f64), w.to(DType::f64).t()), b.to(DType::f64));
  // One bf16 rounding of values |y| <= 9: 9 * 2^-8 = 0.035; 0.05 leaves margin.
  expect_close(y, reference, 0.05, 0, "bf16 linear");
}

TEST(LinearAddPart, OnePartIsLinearPlusTheResidualWithItsGradients) {
  // With one part the op is x W^T + b + r, a true function of all four: central differences in f64.
  check_gradients(
      {.make_inputs =
           [] {
             return std::vector<Tensor>{random_leaf({2, 3, 5}, 301), random_leaf({4, 5}, 302), random_leaf({4}, 303),
                                        random_leaf({2, 3, 4}, 304)};
           },
       .fn = [](const std::vector<Tensor>& in) { return ops::linear_add_part(in[0], in[1], in[2], in[3], 0, 1); }});
  const Tensor x = random_tensor({2, 3, 5}, 311), w = random_tensor({4, 5}, 312), b = random_tensor({4}, 313),
               r = random_tensor({2, 3, 4}, 314);
  expect_close(ops::linear_add_part(x, w, b, r, 0, 1), ops::add(ops::linear(x, w, b), r), 1e-12, 0);
}

TEST(LinearAddPart, ThePartsSumToTheLayerWithTheResidualOnceAndGiveItTheWholeGradient) {
  // Three ranks of a row-parallel layer: rank p holds W_p (its input features) and adds b + r to its
  // third of the 7 rows; the sum of the three outputs is r + b + sum_p x_p W_p^T, and each rank's
  // backward gives b and r the whole output gradient (they are replicated), x_p and W_p linear's.
  const Tensor r = random_tensor({7, 4}, 320), b = random_tensor({4}, 321), upstream = random_tensor({7, 4}, 322);
  Tensor total = core::zeros({7, 4}, TensorOptions(DType::f64, core::kCpu));
  Tensor expected = ops::add(r, b);
  for (int64_t part = 0; part < 3; ++part) {
    SCOPED_TRACE(part);
    const Tensor x = random_leaf({7, 2}, 330 + static_cast<uint64_t>(part));
    const Tensor w = random_leaf({4, 2}, 340 + static_cast<uint64_t>(part));
    Tensor bias = b.detach(), residual = r.detach();
    bias.set_requires_grad(true);
    residual.set_requires_grad(true);
    const Tensor y = ops::linear_add_part(x, w, bias, residual, part, 3);
    total = ops::add(total, y.detach());
    expected = ops::add(expected, ops::linear(x.detach(), w.detach()));
    autograd::backward(y, upstream);
    expect_close(residual.grad(), upstream, 0, 0, "residual gradient");
    expect_close(bias.grad(), ops::sum(upstream, {0}), 1e-12, 0, "bias gradient");
    expect_close(x.grad(), ops::matmul(upstream, w.detach()), 1e-12, 0, "input gradient");
    expect_close(w.grad(), ops::matmul(upstream.t(), x.detach()), 1e-12, 0, "weight gradient");
  }
  expect_close(total, expected, 1e-12, 0, "the parts' sum");
}

TEST(LinearAddPart, RowBlocksGiveTheSameValuesBlockByBlock) {
  // With blocks, the GEMMs run over blocks of rows that cut across the part's rows; each finished
  // block is handed over in order, a view of the output's rows, and the values are those of one block.
  const Tensor x = random_tensor({2, 7, 5}, 360), w = random_tensor({4, 5}, 361), b = random_tensor({4}, 362),
               r = random_tensor({2, 7, 4}, 363);
  for (int64_t part = 0; part < 3; ++part) {
    const Tensor whole = ops::linear_add_part(x, w, b, r, part, 3);
    for (int64_t blocks : {2, 5, 14, 30}) {
      SCOPED_TRACE(fmt::format("part {}, {} blocks", part, blocks));
      std::vector<int64_t> sizes;
      const Tensor y = ops::linear_add_part(x, w, b, r, part, 3, blocks, [&](const Tensor& block) {
        EXPECT_EQ(block.dim(), 2);
        EXPECT_EQ(block.size(1), 4);
        sizes.push_back(block.size(0));
      });
      expect_close(y, whole, 0, 0, "blocked against whole");
      EXPECT_EQ(static_cast<int64_t>(sizes.size()), std::min<int64_t>(blocks, 14));
      EXPECT_EQ(std::accumulate(sizes.begin(), sizes.end(), int64_t{0}), 14);
    }
  }
  EXPECT_ERROR_CONTAINS(ops::linear_add_part(x, w, b, r, 0, 3, 0), "blocks must be >= 1, got 0");
}

TEST(LinearAddPart, BadOperandsAreClearErrors) {
  const Tensor x = random_tensor({2, 3, 5}, 350), w = random_tensor({4, 5}, 351), b = random_tensor({4}, 352);
  EXPECT_ERROR_CONTAINS(ops::linear_add_part(x, w, b, random_tensor({2, 3, 5}, 353), 0, 2),
                        "the residual must have the output's shape [2, 3, 4]");
  EXPECT_ERROR_CONTAINS(ops::linear_add_part(x, w, b, random_tensor({2, 3, 4}, 354), 2, 2), "part 2 of 2");
}

TEST(Bmm, MatchesPerBatchMatmul) {
  Tensor a = random_tensor({3, 2, 5}, 70);
  Tensor b = random_tensor({3, 5, 4}, 71);
  Tensor c = ops::bmm(a, b);
  ASSERT_EQ(c.shape(), (Shape{3, 2, 4}));
  for (int64_t i = 0; i < 3; ++i) {
    // f64 length-5 dot products: rounding ~1e-16, 1e-12 is margin.
    expect_close(c.select(0, i), ops::matmul(a.select(0, i), b.select(0, i)), 1e-12, 0);
  }
}

TEST(Bmm, ManyBatchesReuseBuffers) {
  // 64 products of 16 x 16 matrices; bf16 goes through conversion buffers reused batch after
  // batch. Each must equal its own 2-D product.
  for (DType dtype : {DType::f32, DType::bf16}) {
    Tensor a = random_tensor({64, 16, 16}, 80, -1, 1, dtype);
    Tensor b = random_tensor({64, 16, 16}, 81, -1, 1, dtype);
    Tensor c = ops::bmm(a, b);
    for (int64_t i = 0; i < 64; i += 9) {
      // The same inputs through the same f32 GEMM on one matrix: identical up to BLAS blocking, so
      // f32 rounding of 16-term sums (1e-6) bounds the difference; bf16 outputs may then round to
      // neighbouring values, one ulp of |c| <= 16 at 2^-8: 0.07.
      expect_close(c.select(0, i), ops::matmul(a.select(0, i), b.select(0, i)), dtype == DType::f32 ? 1e-5 : 0.07, 0,
                   fmt::format("{} batch {}", core::dtype_name(dtype), i));
    }
  }
}

TEST(Matmul, EmptyInnerDimensionGivesZeros) {
  Tensor c = ops::matmul(core::ones({2, 0}), core::ones({0, 3}));
  EXPECT_EQ(c.shape(), (Shape{2, 3}));
  expect_values(c, {0, 0, 0, 0, 0, 0});
}

TEST(Matmul, BadInput) {
  EXPECT_ERROR_CONTAINS(ops::matmul(core::ones({2, 3}), core::ones({4, 5})), "[2, 3]");
  EXPECT_ERROR_CONTAINS(ops::matmul(core::ones({2, 3}), core::ones({4, 5})), "[4, 5]");
  EXPECT_ERROR_CONTAINS(ops::matmul(core::ones({2, 3}, DType::i64), core::ones({3, 2}, DType::i64)), "i64");
  EXPECT_ERROR_CONTAINS(ops::matmul(core::ones({2, 3}), core::ones({3, 2}, DType::f64)), "f64");
  EXPECT_ERROR_CONTAINS(ops::matmul(core::ones({2, 3, 4}), core::ones({3, 4, 5})), "[2]");  // batches [2] vs [3]
  EXPECT_ERROR_CONTAINS(ops::matmul(core::scalar_tensor(1.0), core::ones({2})), "at least one dimension");
  EXPECT_ERROR_CONTAINS(ops::bmm(core::ones({2, 3, 4}), core::ones({3, 4, 5})), "batch sizes differ");
  EXPECT_ERROR_CONTAINS(ops::bmm(core::ones({3, 4}), core::ones({4, 5})), "3-D");
  EXPECT_ERROR_CONTAINS(ops::linear(core::ones({2, 3}), core::ones({4, 5})), "[4, 5]");
  EXPECT_ERROR_CONTAINS(ops::linear(core::ones({2, 5}), core::ones({4, 5}), core::ones({3})), "bias");
  EXPECT_ERROR_CONTAINS(ops::linear(core::ones({2, 5}, DType::i32), core::ones({4, 5}, DType::i32)), "i32");
  EXPECT_ERROR_CONTAINS(ops::linear_gelu(core::ones({2, 3}), core::ones({4, 5})), "linear_gelu");
  EXPECT_ERROR_CONTAINS(ops::linear_gelu(core::ones({2, 5}), core::ones({4, 5}), core::ones({3})), "bias");
  const Tensor x = core::ones({2, 5}), w1 = core::ones({4, 5}), b1 = core::ones({4});
  EXPECT_ERROR_CONTAINS(ops::gelu_mlp(x, core::ones({4, 6}), b1, core::ones({3, 4}), Tensor()), "[4, 6]");
  EXPECT_ERROR_CONTAINS(ops::gelu_mlp(x, w1, b1, core::ones({3, 5}), Tensor()),
                        "proj_weight must be [out_features, 4]");
  EXPECT_ERROR_CONTAINS(ops::gelu_mlp(x, w1, b1, core::ones({3, 4}), core::ones({4})), "proj_bias must be [3]");
  EXPECT_ERROR_CONTAINS(ops::gelu_mlp(x, w1, b1, core::ones({3, 4}, DType::f64), Tensor()), "f64");
}

}  // namespace
}  // namespace colossal
