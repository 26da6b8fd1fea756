// CUDA embedding against the CPU kernels, f32/bf16/f16: the gathered rows and the weight gradient
// for repeated indices, a padding row, one index repeated thousands of times (a run split into many
// chunks), i32 and i64 indices, a transposed weight (element gather), odd widths; the gradient's
// run-to-run determinism; bad indices raising the CPU's message; indices on the wrong device.
// Tolerances: tests/support/gpu_compare.h.
#include <gtest/gtest.h>

#include <algorithm>
#include <vector>

#include "gpu_compare.h"

namespace colossal {
namespace {

using testing::expect_close;
using testing::expect_cuda_matches_cpu;
using testing::random_input;

constexpr DType kDtypes[] = {DType::f32, DType::bf16, DType::f16};

/// n indices in [0, num_embeddings) with many repeats: index k is (k * k * 31 + 7) % modulus.
Tensor repeated_indices(const Shape& shape, int64_t num_embeddings, int64_t modulus, DType dtype = DType::i64) {
  const int64_t n = core::shape_numel(shape);
  std::vector<int64_t> values(static_cast<size_t>(n));
  for (int64_t k = 0; k < n; ++k) values[static_cast<size_t>(k)] = (k * k * 31 + 7) % std::min(modulus, num_embeddings);
  Tensor t = core::from_vector<int64_t>(values, shape);
  return dtype == DType::i64 ? t : t.to(dtype);
}

void check(const Tensor& indices, int64_t num_embeddings, int64_t dim, int64_t padding_idx, double scale = 1.0,
           bool transposed_weight = false) {
  for (DType dtype : kDtypes) {
    SCOPED_TRACE(fmt::format("embedding {} indices {} into [{}, {}], padding_idx {}{} ({})", indices.dtype(),
                             indices.shape(), num_embeddings, dim, padding_idx, transposed_weight ? ", transposed" : "",
                             dtype));
    expect_cuda_matches_cpu(
        {.make_inputs =
             [=](DType d) {
               const Shape shape = transposed_weight ? Shape{dim, num_embeddings} : Shape{num_embeddings, dim};
               return std::vector<Tensor>{indices, random_input(shape, 51, d, -1, 1)};
             },
         .fn =
             [=](const std::vector<Tensor>& in) {
               return ops::embedding(in[0], transposed_weight ? in[1].t() : in[1], padding_idx);
             },
         .tolerance_scale = scale},
        dtype, "embedding");
  }
}

TEST(EmbeddingGpu, RepeatedIndicesAndPadding) {
  COLOSSAL_REQUIRE_GPU();
  // Up to ~10 repeats of each of 50 rows: each row's gradient is a sum of a few terms.
  check(repeated_indices({8, 64}, 100, 50), 100, 768, -1);
  check(repeated_indices({8, 64}, 100, 50), 100, 768, 7);
  check(repeated_indices({500}, 60, 60, DType::i32), 60, 37, 3);  // odd width: element loads
  check(repeated_indices({3, 5, 7}, 20, 20), 20, 129, 0);
}

TEST(EmbeddingGpu, FrequentIndex) {
  COLOSSAL_REQUIRE_GPU();
  // Index 3 at 5000 positions (157 chunks summed through partial rows, then in order); index 5 at
  // 33 (two chunks); the rest single. The CPU adds the 5000 terms in one sequence and the GPU in
  // chunks of 32: both orders round differently in f32, 4x the base tolerance as for long sums.
  std::vector<int64_t> values;
  for (int64_t k = 0; k < 6000; ++k) values.push_back(k % 6 == 5 ? (k / 6) % 40 + 10 : 3);
  for (int64_t k = 0; k < 33; ++k) values.push_back(5);
  const Tensor indices = core::from_vector<int64_t>(values, {static_cast<int64_t>(values.size())});
  check(indices, 64, 256, -1, 4.0);
  check(indices, 64, 256, 3, 4.0);  // the frequent index is the padding row: no gradient at all
}

TEST(EmbeddingGpu, TransposedWeight) {
  COLOSSAL_REQUIRE_GPU();
  check(repeated_indices({40}, 30, 30), 30, 16, -1, 1.0, true);
}

TEST(EmbeddingGpu, GradientIsDeterministic) {
  COLOSSAL_REQUIRE_GPU();
  const Device gpu = core::cuda_device(0);
  const Tensor indices = repeated_indices({20000}, 1000, 97).to(gpu);
  Tensor upstream = random_input({20000, 64}, 52, DType::f32, -1, 1, false).to(gpu);
  auto gradient = [&] {
    Tensor weight = random_input({1000, 64}, 53, DType::f32, -1, 1, false).to(gpu).set_requires_grad(true);
    autograd::backward(ops::embedding(indices, weight), upstream);
    return weight.grad().to(core::kCpu);
  };
  const Tensor first = gradient();
  expect_close(gradient(), first, 0, 0, "embedding gradient, second run");
}

TEST(EmbeddingGpu, BadIndices) {
  COLOSSAL_REQUIRE_GPU();
  const Device gpu = core::cuda_device(0);
  Tensor weight = random_input({5, 3}, 54, DType::f32, -1, 1, false).to(gpu);
  // The CPU's message, naming the first bad position as a multi-index.
  // Deferred (Note [Deferred device checks]): thrown at the next host synchronisation or read.
  EXPECT_ERROR_CONTAINS(
      {
        ops::embedding(core::from_vector<int64_t>({0, 1, 7, 9}, {2, 2}).to(gpu), weight);
        core::cuda::synchronize(gpu);
      },
      "embedding: index 7 at position [1, 0] of indices [2, 2] is out of range for num_embeddings 5 (valid: 0..4)");
  EXPECT_ERROR_CONTAINS(
      {
        const Tensor rows = ops::embedding(core::from_vector<int32_t>({2, -1}, {2}).to(gpu), weight);
        rows.to(core::kCpu);
      },
      "index -1 at position [1]");
  // Checked even when the rows are empty.
  Tensor empty_rows = core::empty({5, 0}, TensorOptions(DType::f32, gpu));
  EXPECT_ERROR_CONTAINS(
      {
        ops::embedding(core::from_vector<int64_t>({5}, {1}).to(gpu), empty_rows);
        core::cuda::synchronize(gpu);
      },
      "index 5 at position [0]");
  // A valid call afterwards still works.
  EXPECT_EQ(ops::embedding(core::from_vector<int64_t>({4}, {1}).to(gpu), weight).shape(), (Shape{1, 3}));
}

TEST(EmbeddingGpu, IndicesOnAnotherDevice) {
  COLOSSAL_REQUIRE_GPU();
  Tensor weight = core::ones({5, 3}, TensorOptions(DType::f32, core::cuda_device(0)));
  EXPECT_ERROR_CONTAINS(ops::embedding(core::from_vector<int64_t>({1}, {1}), weight),
                        "embedding: indices are on cpu but weight is on cuda:0");
}

}  // namespace
}  // namespace colossal
