// The vocabulary-parallel embedding (parallel/tp/embedding_1d.h) under MPI, the whole world as the
// tensor-parallel group (2 and 4 ranks): the lookup equals the serial nn::Embedding's on every rank,
// each shard's gradient equals its rows of the serial gradient (repeated ids accumulate), and a
// vocabulary that does not split is padded with zero rows that no id reaches and gather_shard drops.
//
// Tolerance: f64, 1e-12 relative (the sum over ranks adds zeros to the one rank's row).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <memory>
#include <vector>

#include "../../comm/mpi_test_main.h"
#include "colossal/autograd/engine.h"
#include "colossal/nn/embedding.h"
#include "colossal/ops/elementwise.h"
#include "colossal/ops/reduction.h"
#include "colossal/parallel/tp/embedding_1d.h"
#include "gradcheck.h"  // EXPECT_ERROR_CONTAINS
#include "tp_test_util.h"

namespace colossal::parallel::tp {
namespace {

using comm::testing::world;
using testing::relative_error;
using testing::tp_group;
using testing::weighted_sum;

TEST(VocabParallelEmbedding, LookupAndGradientsEqualTheSerialTable) {
  const int64_t vocab = 6 * world().size(), dim = 5;
  core::Generator g(9);
  nn::Embedding serial(vocab, dim, std::nullopt, &g);
  serial.to(DType::f64);
  // Ids from every rank's rows, some repeated, as [2, 7].
  std::vector<int64_t> v;
  for (int64_t i = 0; i < 14; ++i) v.push_back((i * 5 + 1) % vocab);
  v[3] = v[9];
  const Tensor ids = core::from_vector<int64_t>(v, {2, 7});
  Tensor ys = serial.forward(ids);
  autograd::backward(weighted_sum(ys));

  auto parallel = VocabParallelEmbedding::from(serial, tp_group());
  EXPECT_EQ(parallel->weight().shape(), (Shape{6, dim}));
  Tensor yp = parallel->forward(ids);
  autograd::backward(weighted_sum(yp));
  EXPECT_LE(relative_error(yp, ys), 1e-12);
  EXPECT_LE(relative_error(parallel->weight().grad(), serial.weight().grad().narrow(0, parallel->first_row(), 6)),
            1e-12);
}

TEST(VocabParallelEmbedding, AVocabularyThatDoesNotSplitIsPaddedWithRowsNoIdReaches) {
  // 3 tp + 1 rows padded to 4 tp: each rank holds 4, the last rank tp - 1 of them zero padding.
  const int64_t vocab = world().size() * 3 + 1, dim = 4, rows = 4;
  core::Generator g(11);
  nn::Embedding serial(vocab, dim, std::nullopt, &g);
  serial.to(DType::f64);
  std::vector<int64_t> v;
  for (int64_t i = 0; i < 12; ++i) v.push_back((i * 7 + 2) % vocab);
  v[0] = vocab - 1;  // the last real row
  const Tensor ids = core::from_vector<int64_t>(v, {2, 6});
  Tensor ys = serial.forward(ids);
  autograd::backward(weighted_sum(ys));

  auto parallel = VocabParallelEmbedding::from(serial, tp_group());
  EXPECT_EQ(parallel->num_embeddings(), vocab);
  EXPECT_EQ(parallel->weight().shape(), (Shape{rows, dim}));
  EXPECT_EQ(parallel->padding(), rows * world().size() - vocab);
  Tensor yp = parallel->forward(ids);
  autograd::backward(weighted_sum(yp));
  EXPECT_LE(relative_error(yp, ys), 1e-12);
  // The padding rows stay zero and get no gradient; gathered by the spec, the table is the serial one.
  const int64_t real = std::clamp<int64_t>(vocab - parallel->first_row(), 0, rows);
  EXPECT_LE(
      relative_error(parallel->weight().narrow(0, 0, real), serial.weight().narrow(0, parallel->first_row(), real)),
      1e-12);
  EXPECT_LE(relative_error(parallel->weight().grad().narrow(0, 0, real),
                           serial.weight().grad().narrow(0, parallel->first_row(), real)),
            1e-12);
  if (real < rows) {
    EXPECT_EQ(ops::sum(ops::abs(parallel->weight().narrow(0, real, rows - real))).item<double>(), 0.0);
    EXPECT_EQ(ops::sum(ops::abs(parallel->weight().grad().narrow(0, real, rows - real))).item<double>(), 0.0);
  }
  const Tensor gathered = gather_shard(parallel->weight(), parallel->shard_specs().at("weight"), *tp_group());
  EXPECT_EQ(gathered.shape(), serial.weight().shape());
  EXPECT_LE(relative_error(gathered, serial.weight()), 0.0);
}

}  // namespace
}  // namespace colossal::parallel::tp

int main(int argc, char** argv) {
  return colossal::comm::testing::run_mpi_tests(argc, argv);
}
