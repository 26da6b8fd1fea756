// CUDA embedding against the CPU kernels, f32/bf16/f16: the gathered rows and the weight gradient
// for repeated indices, a padding row, one index repeated thousands of times (a run split into many
// chunks), i32 and i64 indices, a transposed weight (element gather), odd widths; the gradient's
// run-to-run determinism; the backward adding into the gradient it joins (the accumulating kernel,
// f64 too, and through autograd); bad indices raising the CPU's message; indices on the wrong device.
// Tolerances: tests/support/gpu_compare.h.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <vector>

#include "colossal/autograd/engine.h"   // fused_gradient_accumulations
#include "colossal/core/view.h"         // cast_raw
#include "colossal/ops/loss_kernels.h"  // embedding_backward_stub
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

// ---- the backward adding into the gradient it joins (Note [Gradient accumulation in the op])

/// Indices into 64 rows: row 3 at 100 positions (4 chunks, summed through partial rows), row 5 at 33
/// (2 chunks), rows 10..49 once each (a chunk written directly), row 8 twice, row 7 (the padding
/// row where one is set) 4 times; rows 0-2, 4, 6, 9 and 50-63 are named by none. The 179 positions
/// are interleaved by k -> 37k mod 179 (179 is prime), so a run's positions are not adjacent.
constexpr int64_t kAccRows = 64, kAccPadding = 7;
std::vector<int64_t> accumulation_index_values() {
  std::vector<int64_t> runs;
  runs.insert(runs.end(), 100, 3);
  runs.insert(runs.end(), 33, 5);
  for (int64_t r = 10; r < 50; ++r) runs.push_back(r);
  runs.insert(runs.end(), 2, 8);
  runs.insert(runs.end(), 4, kAccPadding);
  const int64_t n = static_cast<int64_t>(runs.size());
  std::vector<int64_t> values(runs.size());
  for (int64_t k = 0; k < n; ++k) values[static_cast<size_t>(k * 37 % n)] = runs[static_cast<size_t>(k)];
  return values;
}

/// Rows `rows` of a [rows, dim] table as f64 values (exact for every floating dtype).
std::vector<double> rows_of(const Tensor& table, const std::vector<int64_t>& rows) {
  const Tensor t = core::cast_raw(table.to(core::kCpu), DType::f64);
  const std::vector<double> all = t.to_vector<double>();
  const int64_t dim = t.size(1);
  std::vector<double> out;
  for (const int64_t r : rows) out.insert(out.end(), all.begin() + r * dim, all.begin() + (r + 1) * dim);
  return out;
}

TEST(EmbeddingGpu, AccumulatingBackwardMatchesCpu) {
  COLOSSAL_REQUIRE_GPU();
  // The kernels called directly on a table that already holds a gradient: rows the indices name
  // become old + sum on both devices, the others keep their bits. The 100- and 33-term rows sum in
  // chunks on the GPU and in one sequence on the CPU (2x the base tolerance); the rows of one chunk
  // add in the same order on both.
  const Device gpu = core::cuda_device(0);
  const std::vector<int64_t> values = accumulation_index_values();
  const int64_t n = static_cast<int64_t>(values.size());
  const Tensor indices = core::from_vector<int64_t>(values, {n});
  const std::vector<int64_t> unnamed = {0, 1, 2, 4, 6, 9, 50, 57, 63};
  for (const DType dtype : {DType::f32, DType::f64, DType::bf16, DType::f16}) {
    for (const int64_t dim : {37, 256}) {  // odd: element loads; 256: 16-byte vectors in every dtype
      for (const int64_t padding_idx : {int64_t{-1}, kAccPadding}) {
        SCOPED_TRACE(fmt::format("accumulating embedding backward [{}, {}] ({}), padding_idx {}", kAccRows, dim, dtype,
                                 padding_idx));
        const Tensor old = random_input({kAccRows, dim}, 61, dtype, -1, 1, false);
        const Tensor grad_out = random_input({n, dim}, 62, dtype, -1, 1, false);
        const Tensor grad_out_gpu = grad_out.to(gpu), indices_gpu = indices.to(gpu);
        Tensor cpu = old.clone();
        ops::embedding_backward_stub(core::kCpu, cpu, grad_out, indices, padding_idx, true);
        auto on_gpu = [&](bool accumulate) {
          Tensor table = old.to(gpu);
          ops::embedding_backward_stub(gpu, table, grad_out_gpu, indices_gpu, padding_idx, accumulate);
          return table;
        };
        const Tensor got = on_gpu(true);
        const testing::Tolerance tol = testing::tolerance_for(dtype);
        expect_close(got.to(core::kCpu), cpu, 2 * tol.atol, 2 * tol.rtol, "accumulated gradient");

        std::vector<int64_t> kept = unnamed;
        if (padding_idx >= 0) kept.push_back(padding_idx);
        EXPECT_EQ(rows_of(got, kept), rows_of(old, kept)) << "rows no index adds to keep their bits";
        expect_close(on_gpu(true).to(core::kCpu), got.to(core::kCpu), 0.0, 0.0, "accumulated gradient, second run");

        // The plain form over the same filled table still writes every row (today's kernel).
        const Tensor plain = on_gpu(false);
        Tensor plain_cpu = old.clone();
        ops::embedding_backward_stub(core::kCpu, plain_cpu, grad_out, indices, padding_idx, false);
        expect_close(plain.to(core::kCpu), plain_cpu, 2 * tol.atol, 2 * tol.rtol, "plain gradient");
        if (dtype == DType::f32 || dtype == DType::f64) {
          // Sums in the tensor's own dtype round the same way added in the kernel or by the engine.
          expect_close(got.to(core::kCpu), ops::add(old, plain.to(core::kCpu)), 0.0, 0.0, "old + plain gradient");
        }
      }
    }
  }
}

/// Whether this process lets ops add into accumulation targets (the engine reads the switch once).
bool fused_accumulation_on() {
  const char* v = std::getenv("COLOSSAL_FUSED_GRAD_ACCUMULATION");
  return v == nullptr || std::strcmp(v, "0") != 0;
}

TEST(EmbeddingGpu, BackwardJoinsAnEarlierGradient) {
  COLOSSAL_REQUIRE_GPU();
  // Through autograd on each device: an earlier backward leaves a dense .grad; one lookup adds into
  // it (the leaf's .grad), then two lookups of the weight in one graph (the second adds into the
  // first's waiting sum, which joins .grad). The GPU's .grad against the CPU's after each.
  const std::vector<int64_t> values = accumulation_index_values();
  const int64_t n = static_cast<int64_t>(values.size());
  const Tensor indices = core::from_vector<int64_t>(values, {n});
  const Tensor second_indices = core::from_vector<int64_t>({3, 60, 3, 7, 12}, {5});
  for (const DType dtype : {DType::f32, DType::f64, DType::bf16, DType::f16}) {
    for (const int64_t dim : {37, 256}) {
      SCOPED_TRACE(fmt::format("embedding into an earlier gradient [{}, {}] ({})", kAccRows, dim, dtype));
      const Tensor weight_values = random_input({kAccRows, dim}, 63, dtype, -1, 1, false);
      const Tensor c = random_input({kAccRows, dim}, 64, dtype, -1, 1, false);
      const Tensor u = random_input({n, dim}, 65, dtype, -1, 1, false);
      const Tensor u2 = random_input({5, dim}, 66, dtype, -1, 1, false);
      const testing::Tolerance tol = testing::tolerance_for(dtype);
      std::vector<Tensor> grads[2];  // the CPU's and the GPU's .grad after each step
      const int64_t before = autograd::fused_gradient_accumulations();
      for (const Device device : {core::kCpu, core::cuda_device(0)}) {
        Tensor w = weight_values.to(device).detach();  // a leaf of its own
        w.set_requires_grad(true);
        const Tensor idx = indices.to(device), idx2 = second_indices.to(device);
        autograd::backward(ops::sum(ops::mul(w, c.to(device))));
        autograd::backward(ops::sum(ops::mul(ops::embedding(idx, w, kAccPadding), u.to(device))));
        grads[device.is_cuda() ? 1 : 0].push_back(w.grad().to(core::kCpu).clone());
        autograd::backward(ops::add(ops::sum(ops::mul(ops::embedding(idx, w, kAccPadding), u.to(device))),
                                    ops::sum(ops::mul(ops::embedding(idx2, w, kAccPadding), u2.to(device)))));
        grads[device.is_cuda() ? 1 : 0].push_back(w.grad().to(core::kCpu).clone());
      }
      EXPECT_EQ(autograd::fused_gradient_accumulations() - before, fused_accumulation_on() ? 4 : 0)
          << "one lookup per backward and device";
      // 2x, as in AccumulatingBackwardMatchesCpu: the long rows sum in another order on the GPU.
      expect_close(grads[1][0], grads[0][0], 2 * tol.atol, 2 * tol.rtol, "one lookup");
      // 4x: by now each row is the sum of three backwards, each rounded to the dtype on its own.
      expect_close(grads[1][1], grads[0][1], 4 * tol.atol, 4 * tol.rtol, "two more lookups");
    }
  }
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

TEST(EmbeddingGpu, PutMatchesCpu) {
  COLOSSAL_REQUIRE_GPU();
  const Device gpu = core::cuda_device(0);
  // Widths that take 16-byte vectors (64) and ones that do not (7), a transposed table, repeats.
  for (DType dtype : {DType::f32, DType::bf16, DType::f16, DType::f64}) {
    for (const auto& [rows, dim, transposed] : {std::tuple{50, 64, false}, {50, 7, false}, {40, 16, true}}) {
      SCOPED_TRACE(fmt::format("embedding_put_ [{}, {}] ({}){}", rows, dim, dtype, transposed ? ", transposed" : ""));
      const Tensor indices = repeated_indices({3, 37}, rows, rows);
      const Tensor source = random_input({rows, dim}, 61, dtype, -1, 1, false);
      const Tensor values = ops::embedding(indices, source);  // equal rows where an index repeats
      const Tensor start = random_input(transposed ? Shape{dim, rows} : Shape{rows, dim}, 62, dtype, -1, 1, false);
      Tensor cpu = start.clone();
      Tensor on_gpu = start.to(gpu);
      ops::embedding_put_(transposed ? cpu.t() : cpu, indices, values);
      ops::embedding_put_(transposed ? on_gpu.t() : on_gpu, indices.to(gpu), values.to(gpu));
      expect_close(on_gpu.to(core::kCpu), cpu, 0, 0, "embedding_put_ on the GPU");
    }
  }
  Tensor weight = core::zeros({5, 3}, TensorOptions(DType::f32, gpu));
  EXPECT_ERROR_CONTAINS(
      {
        ops::embedding_put_(weight, core::from_vector<int64_t>({0, 6}, {2}).to(gpu),
                            core::ones({2, 3}, TensorOptions(DType::f32, gpu)));
        core::cuda::synchronize(gpu);
      },
      "embedding_put_: index 6 at position [1] of indices [2] is out of range for num_embeddings 5 (valid: 0..4)");
}

TEST(EmbeddingGpu, IndicesOnAnotherDevice) {
  COLOSSAL_REQUIRE_GPU();
  Tensor weight = core::ones({5, 3}, TensorOptions(DType::f32, core::cuda_device(0)));
  EXPECT_ERROR_CONTAINS(ops::embedding(core::from_vector<int64_t>({1}, {1}), weight),
                        "embedding: indices are on cpu but weight is on cuda:0");
}

}  // namespace
}  // namespace colossal
