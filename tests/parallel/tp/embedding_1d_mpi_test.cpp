// The vocabulary-parallel embedding (parallel/tp/embedding_1d.h) under MPI, the whole world as the
// tensor-parallel group (2 and 4 ranks): the lookup equals the serial nn::Embedding's on every rank,
// each shard's gradient equals its rows of the serial gradient (repeated ids accumulate), and a
// vocabulary that does not split is named.
//
// Tolerance: f64, 1e-12 relative (the sum over ranks adds zeros to the one rank's row).
#include <gtest/gtest.h>

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

TEST(VocabParallelEmbedding, AVocabularyThatDoesNotSplitIsNamed) {
  nn::Embedding serial(world().size() * 3 + 1, 4);
  EXPECT_ERROR_CONTAINS(VocabParallelEmbedding::from(serial, tp_group()),
                        "the vocabulary's " + std::to_string(world().size() * 3 + 1) + " rows do not split");
}

}  // namespace
}  // namespace colossal::parallel::tp

int main(int argc, char** argv) {
  return colossal::comm::testing::run_mpi_tests(argc, argv);
}
