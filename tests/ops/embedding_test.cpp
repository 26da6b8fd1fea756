// embedding: weight gradients by finite differences (repeated indices, a padding row), gathered
// values, the padding row's zero gradient, a parallel backward equal to a serial reference, the
// backward adding into the gradient the weight's joins (Note [Gradient accumulation in the op]), and
// bad indices named in the error. CTest runs the accumulation tests a second time with
// COLOSSAL_FUSED_GRAD_ACCUMULATION=0: the engine's sums, the same values.
#include <gtest/gtest.h>

#include <cstdlib>
#include <cstring>
#include <vector>

#include "colossal/autograd/engine.h"  // fused_gradient_accumulations
#include "colossal/core/view.h"        // cast_raw
#include "gradcheck.h"

namespace colossal {
namespace {

using testing::check_gradients;
using testing::expect_close;
using testing::expect_values;
using testing::random_leaf;
using testing::random_tensor;

TEST(GradCheck, embedding) {
  // Rows 1 and 3 are picked several times, so their gradients are sums; row 2 is never picked.
  check_gradients({.make_inputs =
                       [] {
                         return std::vector<Tensor>{random_leaf({5, 3}, 11),
                                                    core::from_vector<int64_t>({1, 3, 1, 0, 4, 1, 3, 3}, {2, 4})};
                       },
                   .fn = [](const std::vector<Tensor>& in) { return ops::embedding(in[1], in[0]); }});
}

TEST(GradCheck, embedding_padding_idx) {
  // The padding row still takes part in the forward, so a finite difference would see it; zeroing
  // the outputs read from it makes the numeric gradient of that row 0 too, and the check then
  // covers every other row with padding_idx set. EmbeddingTest.PaddingRowGetsNoGradient checks that
  // the row gets 0 even when its outputs matter.
  const std::vector<int32_t> picks = {2, 0, 2, 4, 0, 2};
  check_gradients({.make_inputs =
                       [&] {
                         return std::vector<Tensor>{random_leaf({5, 4}, 12), core::from_vector<int32_t>(picks, {3, 2})};
                       },
                   .fn =
                       [&](const std::vector<Tensor>& in) {
                         std::vector<double> keep;
                         for (int32_t p : picks) keep.push_back(p == 0 ? 0.0 : 1.0);
                         const Tensor mask = core::from_vector<double>(keep, {3, 2, 1});
                         return ops::embedding(in[1], in[0], /*padding_idx=*/0) * mask;
                       }});
}

TEST(EmbeddingTest, GathersRows) {
  const Tensor weight = core::from_vector<double>({0.5, 1.5, 2.5, 3.5, 4.5, 5.5, 6.5, 7.5}, {4, 2});
  const Tensor out = ops::embedding(core::from_vector<int32_t>({2, 0, 3, 3}, {2, 2}), weight);
  EXPECT_EQ(out.shape(), (Shape{2, 2, 2}));
  expect_values(out, {4.5, 5.5, 0.5, 1.5, 6.5, 7.5, 6.5, 7.5});
  // A 0-d index gives one row of shape [dim].
  const Tensor single = ops::embedding(core::from_vector<int64_t>({1}, {}), weight);
  EXPECT_EQ(single.shape(), (Shape{2}));
  expect_values(single, {2.5, 3.5});
}

TEST(EmbeddingTest, PutWritesRowsInPlace) {
  Tensor weight = core::from_vector<double>({0.5, 1.5, 2.5, 3.5, 4.5, 5.5, 6.5, 7.5}, {4, 2});
  // Index 2 twice with equal rows; rows 1 and 3 named by nothing keep their values.
  ops::embedding_put_(weight, core::from_vector<int32_t>({2, 0, 2}, {3}),
                      core::from_vector<double>({-1, -2, -3, -4, -1, -2}, {3, 2}));
  expect_values(weight, {-3, -4, 2.5, 3.5, -1, -2, 6.5, 7.5});
  // Put after embedding copies the rows a lookup read: the other table's rows become equal.
  const Tensor source = random_tensor({6, 5}, 21);
  Tensor copy = core::zeros({6, 5}, TensorOptions(DType::f64));
  const Tensor ids = core::from_vector<int64_t>({4, 1, 4, 5, 1, 0}, {2, 3});
  ops::embedding_put_(copy, ids, ops::embedding(ids, source));
  expect_close(ops::embedding(ids, copy), ops::embedding(ids, source), 0, 0, "rows copied by embedding_put_");
  expect_values(ops::embedding(core::from_vector<int64_t>({2, 3}, {2}), copy), std::vector<double>(10, 0.0));
  // A transposed table: rows with a column stride.
  Tensor base = core::zeros({2, 4}, TensorOptions(DType::f32));
  Tensor table = base.t();
  ops::embedding_put_(table, core::from_vector<int64_t>({3}, {1}), core::from_vector<float>({8.f, 9.f}, {1, 2}));
  expect_values(base, {0, 0, 0, 8, 0, 0, 0, 9});
}

TEST(EmbeddingTest, PutRefusesWhatItCannotWrite) {
  Tensor weight = core::zeros({4, 2}, TensorOptions(DType::f32));
  EXPECT_ERROR_CONTAINS(ops::embedding_put_(weight, core::from_vector<int64_t>({1, 4}, {2}), core::ones({2, 2})),
                        "embedding_put_: index 4 at position [1] of indices [2] is out of range for num_embeddings 4");
  EXPECT_ERROR_CONTAINS(ops::embedding_put_(weight, core::from_vector<int64_t>({1}, {1}), core::ones({1, 3})),
                        "embedding_put_: rows must be f32 of shape [1, 2]");
  Tensor leaf = random_leaf({4, 2}, 22);
  EXPECT_ERROR_CONTAINS(ops::embedding_put_(leaf, core::from_vector<int64_t>({1}, {1}), core::ones({1, 2})),
                        "requires a gradient");
}

TEST(EmbeddingTest, StridedWeight) {
  // weight = base^T is [4, 2] with strides [1, 4]: rows are not contiguous in memory.
  const Tensor base = core::from_vector<float>({0.5f, 2.5f, 4.5f, 6.5f, 1.5f, 3.5f, 5.5f, 7.5f}, {2, 4});
  const Tensor out = ops::embedding(core::from_vector<int64_t>({3, 1}, {2}), base.t());
  expect_values(out, {6.5, 7.5, 2.5, 3.5});
}

TEST(EmbeddingTest, PaddingRowGetsNoGradient) {
  Tensor weight = random_leaf({4, 3}, 13);
  const Tensor indices = core::from_vector<int64_t>({1, 3, 1, 1, 0, 3}, {6});
  autograd::backward(ops::sum(ops::embedding(indices, weight, /*padding_idx=*/3)));
  // d sum / d row r = (times r is picked) per element, except the padding row 3.
  expect_values(weight.grad(), {1, 1, 1, 3, 3, 3, 0, 0, 0, 0, 0, 0});
}

TEST(EmbeddingTest, HalfPrecisionBackwardAccumulatesInFloat) {
  // 300 copies of 1 summed in bf16 stall at 256 (bf16 has 8 significant bits), in f32 they reach 300
  // exactly, and 300 is a bf16 value, so an f32 accumulator gives exactly 300.
  Tensor weight = core::cast_raw(random_tensor({2, 2}, 14), DType::bf16);
  weight.set_requires_grad(true);
  const Tensor indices = core::zeros({300}, DType::i64);
  autograd::backward(ops::sum(ops::embedding(indices, weight)));
  expect_values(weight.grad(), {300, 300, 0, 0});
}

TEST(EmbeddingTest, ParallelBackwardMatchesSerialReference) {
  // 20000 rows of dim 4 split into several chunks (kParallelGrain / dim = 8192 rows per chunk),
  // and 60000 picks with many repeats. The kernel sums each row's contributions in ascending
  // position order, as this reference does, so the f32 results agree bit for bit.
  constexpr int64_t kRows = 20000, kDim = 4, kPicks = 60000;
  const Tensor indices = core::randint(0, kRows, {kPicks}, DType::i64, nullptr);
  Tensor weight = core::cast_raw(random_tensor({kRows, kDim}, 15), DType::f32);
  weight.set_requires_grad(true);
  const Tensor upstream = core::cast_raw(random_tensor({kPicks, kDim}, 16), DType::f32);
  autograd::backward(ops::embedding(indices, weight), upstream);

  const std::vector<int64_t> idx = indices.to_vector<int64_t>();
  const std::vector<float> up = upstream.to_vector<float>();
  std::vector<float> expected(kRows * kDim, 0.0f);
  for (int64_t k = 0; k < kPicks; ++k) {
    for (int64_t j = 0; j < kDim; ++j) expected[idx[k] * kDim + j] += up[k * kDim + j];
  }
  const std::vector<float> got = weight.grad().to_vector<float>();
  ASSERT_EQ(got.size(), expected.size());
  int64_t mismatches = 0;
  for (size_t i = 0; i < got.size(); ++i) mismatches += got[i] != expected[i];
  EXPECT_EQ(mismatches, 0);

  // A second backward gives the same bits (tolerance 0: the sum order is fixed).
  Tensor again = core::empty({kRows, kDim}, DType::f32);
  again.copy_(weight);
  again.set_requires_grad(true);
  autograd::backward(ops::embedding(indices, again), upstream);
  expect_close(again.grad(), weight.grad(), 0.0, 0.0, "repeat");
}

// ---- the backward adding into the gradient it joins

/// Whether this process lets ops add into accumulation targets (the engine reads the switch once).
bool fused_accumulation_on() {
  const char* v = std::getenv("COLOSSAL_FUSED_GRAD_ACCUMULATION");
  return v == nullptr || std::strcmp(v, "0") != 0;
}

/// The weight gradient of sum(embedding(indices, w, padding_idx) * upstream), row by row in
/// ascending position order (the kernels' order), as f64 values of a [rows, dim] table.
std::vector<double> reference_gradient(const std::vector<int64_t>& indices, const Tensor& upstream, int64_t rows,
                                       int64_t dim, int64_t padding_idx) {
  const std::vector<double> up = upstream.to(DType::f64).to_vector<double>();
  std::vector<double> grad(static_cast<size_t>(rows * dim), 0.0);
  for (size_t k = 0; k < indices.size(); ++k) {
    if (indices[k] == padding_idx) continue;
    for (int64_t j = 0; j < dim; ++j) grad[indices[k] * dim + j] += up[k * dim + j];
  }
  return grad;
}

std::vector<double> plus(const std::vector<double>& a, const std::vector<double>& b) {
  std::vector<double> sum(a.size());
  for (size_t i = 0; i < a.size(); ++i) sum[i] = a[i] + b[i];
  return sum;
}

// Rows 0..7 of dim 3: row 2 is padding (named, never summed), rows 5 and 7 are named by no index.
constexpr int64_t kRows = 8, kDim = 3, kPadding = 2;
const std::vector<int64_t> kFirst = {1, 3, 1, 2, 0, 1, 6, 3};
const std::vector<int64_t> kSecond = {4, 1, 2, 6, 6};

Tensor lookups(const std::vector<int64_t>& values) {
  return core::from_vector<int64_t>(values, {static_cast<int64_t>(values.size())});
}

TEST(EmbeddingAccumulation, TwoLookupsOfOneWeight) {
  // loss = sum(e(i1) * u1) + sum(e(i2) * u2) on one weight (a tied weight's two uses): the first
  // gradient to arrive waits at the leaf and the second lookup's kernel adds its rows into it. Each
  // row's sum is taken in position order, as the reference does, and f64 addition commutes, so
  // whichever lookup runs first the values agree exactly. A second backward adds both into .grad.
  const Tensor u1 = random_tensor({8, kDim}, 91), u2 = random_tensor({5, kDim}, 92);
  const std::vector<double> once = plus(reference_gradient(kFirst, u1, kRows, kDim, kPadding),
                                        reference_gradient(kSecond, u2, kRows, kDim, kPadding));
  Tensor w = random_leaf({kRows, kDim}, 93);
  auto loss = [&] {
    return ops::add(ops::sum(ops::mul(ops::embedding(lookups(kFirst), w, kPadding), u1)),
                    ops::sum(ops::mul(ops::embedding(lookups(kSecond), w, kPadding), u2)));
  };
  const int64_t before = autograd::fused_gradient_accumulations();
  autograd::backward(loss());
  EXPECT_EQ(autograd::fused_gradient_accumulations() - before, fused_accumulation_on() ? 1 : 0)
      << "the second lookup adds into the first's waiting sum";
  expect_close(w.grad(), core::from_vector<double>(once, {kRows, kDim}), 0.0, 0.0, "first backward");

  const void* grad_data = w.grad().raw_data();
  autograd::backward(loss());
  EXPECT_EQ(autograd::fused_gradient_accumulations() - before, fused_accumulation_on() ? 2 : 0);
  expect_close(w.grad(), core::from_vector<double>(plus(once, once), {kRows, kDim}), 0.0, 0.0, "second backward");
  EXPECT_EQ(w.grad().raw_data(), grad_data) << "the sum stays in the first backward's buffer";
}

TEST(EmbeddingAccumulation, OneLookupJoinsAnEarlierGradient) {
  // An earlier backward leaves a dense .grad (c, in every row); the lookup's kernel adds its rows into
  // it: rows the indices name become c + sum, the padding row and the unnamed rows keep c exactly.
  const Tensor c = random_tensor({kRows, kDim}, 94);
  const Tensor u = random_tensor({8, kDim}, 95);
  Tensor w = random_leaf({kRows, kDim}, 96);
  autograd::backward(ops::sum(ops::mul(w, c)));
  const void* grad_data = w.grad().raw_data();
  const int64_t before = autograd::fused_gradient_accumulations();
  autograd::backward(ops::sum(ops::mul(ops::embedding(lookups(kFirst), w, kPadding), u)));
  EXPECT_EQ(autograd::fused_gradient_accumulations() - before, fused_accumulation_on() ? 1 : 0)
      << "the lookup adds into .grad";
  EXPECT_EQ(w.grad().raw_data(), grad_data) << "added in place, by the kernel or the engine";
  const std::vector<double> expected =
      plus(c.to_vector<double>(), reference_gradient(kFirst, u, kRows, kDim, kPadding));
  expect_close(w.grad(), core::from_vector<double>(expected, {kRows, kDim}), 0.0, 0.0, "joined gradient");
  const std::vector<double> got = w.grad().to_vector<double>(), earlier = c.to_vector<double>();
  for (const int64_t row : {kPadding, int64_t{5}, int64_t{7}}) {
    for (int64_t j = 0; j < kDim; ++j) EXPECT_EQ(got[row * kDim + j], earlier[row * kDim + j]) << "row " << row;
  }
}

TEST(EmbeddingAccumulation, HalfPrecisionAddsInFloatAndRoundsOnce) {
  // Row 0 holds 1 and gets 2^-8 + 2^-16 (each exact in bf16, their f32 sum is not). Added in the
  // kernel's f32 accumulator, 1 + 2^-8 + 2^-16 rounds up to 1 + 2^-7. The engine's separate add first
  // rounds the sum to bf16 (a tie, to even: 2^-8), then 1 + 2^-8 is a tie between 1 and 1 + 2^-7
  // that rounds to even: 1. Rows 1 and 2 are named by no index and keep 1.
  Tensor w = core::cast_raw(random_tensor({3, 2}, 97), DType::bf16);
  w.set_requires_grad(true);
  autograd::backward(ops::sum(w));  // .grad = 1 everywhere
  const Tensor upstream =
      core::cast_raw(core::from_vector<double>({0x1p-8, 0x1p-8, 0x1p-16, 0x1p-16}, {2, 2}), DType::bf16);
  autograd::backward(ops::embedding(core::from_vector<int64_t>({0, 0}, {2}), w), upstream);
  const double row0 = fused_accumulation_on() ? 1.0 + 0x1p-7 : 1.0;
  expect_values(w.grad(), {row0, row0, 1, 1, 1, 1});
}

TEST(EmbeddingTest, BadInputs) {
  const Tensor weight = random_tensor({4, 3}, 17);
  EXPECT_ERROR_CONTAINS(ops::embedding(core::from_vector<int64_t>({0, 1, 5, 2}, {2, 2}), weight),
                        "index 5 at position [1, 0] of indices [2, 2] is out of range for num_embeddings 4");
  EXPECT_ERROR_CONTAINS(ops::embedding(core::from_vector<int32_t>({-1}, {1}), weight), "index -1 at position [0]");
  EXPECT_ERROR_CONTAINS(ops::embedding(core::from_vector<float>({1.0f}, {1}), weight), "must be i32 or i64, got f32");
  EXPECT_ERROR_CONTAINS(ops::embedding(core::from_vector<int64_t>({1}, {1}), random_tensor({4}, 18)),
                        "weight must be [num_embeddings, dim], got shape [4]");
  EXPECT_ERROR_CONTAINS(ops::embedding(core::from_vector<int64_t>({1}, {1}), weight, 4),
                        "padding_idx 4 is out of range for num_embeddings 4");
  EXPECT_ERROR_CONTAINS(ops::embedding(core::from_vector<int64_t>({1}, {1}), core::ones({4, 3}, DType::i64)),
                        "weight must be floating");
}

}  // namespace
}  // namespace colossal
