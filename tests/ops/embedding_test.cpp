// embedding: weight gradients by finite differences (repeated indices, a padding row), gathered
// values, the padding row's zero gradient, a parallel backward equal to a serial reference, and
// bad indices named in the error.
#include <gtest/gtest.h>

#include <vector>

#include "colossal/core/view.h"  // cast_raw
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
