// Pipeline partitions (parallel/pp/partition.h): Colossal-AI's uniform split with its remainders on
// the last stages, model chunks placed for the interleaved schedule, the balanced split against a
// brute force over every cut, explicit sizes, and the errors each refuses with.
#include "colossal/parallel/pp/partition.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <limits>
#include <random>
#include <vector>

#include "gradcheck.h"  // EXPECT_ERROR_CONTAINS

namespace colossal::parallel::pp {
namespace {

using Parts = StageParts;

TEST(PartitionUniform, EvenSplitsAndTheRemainderOnTheLastStages) {
  EXPECT_EQ(partition_uniform(24, 4), (Parts{{{0, 6}}, {{6, 12}}, {{12, 18}}, {{18, 24}}}));
  // 10 over 4: two pieces each and one more for the last two stages (Colossal-AI's partition_uniform).
  EXPECT_EQ(partition_uniform(10, 4), (Parts{{{0, 2}}, {{2, 4}}, {{4, 7}}, {{7, 10}}}));
  EXPECT_EQ(partition_uniform(3, 1), (Parts{{{0, 3}}}));
}

TEST(PartitionUniform, ChunksAreInterleavedAcrossStages) {
  // 12 pieces, 2 stages x 2 chunks: parts in order [0,3) [3,6) [6,9) [9,12); stage s holds parts s, s + 2.
  EXPECT_EQ(partition_uniform(12, 2, 2), (Parts{{{0, 3}, {6, 9}}, {{3, 6}, {9, 12}}}));
  EXPECT_EQ(describe(partition_uniform(12, 2, 2)), "stage 0: [0, 3) [6, 9); stage 1: [3, 6) [9, 12)");
}

TEST(PartitionUniform, RefusesWhatCannotSplit) {
  EXPECT_ERROR_CONTAINS(partition_uniform(10, 2, 3), "10 pieces do not split into 3 equal model chunks");
  EXPECT_ERROR_CONTAINS(partition_uniform(3, 4), "3 pieces per model chunk leave some of the 4 pipeline stages");
  EXPECT_ERROR_CONTAINS(partition_uniform(8, 0), "the number of pipeline stages must be >= 1, got 0");
}

/// The lightest heaviest part over every cut of `w` into k non-empty contiguous parts.
double brute_force_bound(const std::vector<double>& w, int k) {
  const int n = static_cast<int>(w.size());
  double best = std::numeric_limits<double>::infinity();
  // Choose k - 1 cut points among n - 1 gaps (a bitmask over the gaps).
  for (unsigned mask = 0; mask < (1u << (n - 1)); ++mask) {
    if (__builtin_popcount(mask) != k - 1) continue;
    double part = 0, heaviest = 0;
    for (int i = 0; i < n; ++i) {
      part += w[static_cast<size_t>(i)];
      if (i == n - 1 || ((mask >> i) & 1u)) {
        heaviest = std::max(heaviest, part);
        part = 0;
      }
    }
    best = std::min(best, heaviest);
  }
  return best;
}

TEST(PartitionBalanced, MatchesTheBruteForceBound) {
  std::mt19937 rng(7);
  for (int trial = 0; trial < 200; ++trial) {
    const int n = 2 + static_cast<int>(rng() % 9);
    const int stages = 1 + static_cast<int>(rng() % 3), chunks = 1 + static_cast<int>(rng() % 2);
    if (n < stages * chunks) continue;
    std::vector<double> w(static_cast<size_t>(n));
    for (double& x : w) x = static_cast<double>(rng() % 10);  // integers: sums are exact
    const Parts parts = partition_balanced(w, stages, chunks);
    // Back into part order, contiguous and covering every piece.
    std::vector<PieceRange> in_order;
    for (int j = 0; j < stages * chunks; ++j)
      in_order.push_back(parts[static_cast<size_t>(j % stages)][static_cast<size_t>(j / stages)]);
    double heaviest = 0;
    int64_t at = 0;
    for (const PieceRange& r : in_order) {
      ASSERT_EQ(r.begin, at) << describe(parts);
      ASSERT_GT(r.size(), 0) << describe(parts);
      double sum = 0;
      for (int64_t i = r.begin; i < r.end; ++i) sum += w[static_cast<size_t>(i)];
      heaviest = std::max(heaviest, sum);
      at = r.end;
    }
    EXPECT_EQ(at, n);
    EXPECT_EQ(heaviest, brute_force_bound(w, stages * chunks)) << describe(parts);
  }
  EXPECT_EQ(partition_balanced({1, 1, 1, 1, 10, 1, 1, 1}, 2), (Parts{{{0, 4}}, {{4, 8}}}));
  // Equal weights that divide evenly split as the uniform partition does; with a remainder, the parts
  // still differ by at most one piece (cut closest to an even share, ties to the longer part).
  EXPECT_EQ(partition_balanced(std::vector<double>(8, 1.0), 4), partition_uniform(8, 4));
  EXPECT_EQ(partition_balanced(std::vector<double>(10, 1.0), 4), (Parts{{{0, 3}}, {{3, 5}}, {{5, 8}}, {{8, 10}}}));
}

TEST(PartitionBalanced, GptLikePiecesPutTheEmbeddingsAlone) {
  // embed (wte + wpe: 39.4M), 12 blocks of 7.1M, head (ln_f, tied lm_head: 1.5K) over 4 stages.
  std::vector<double> w{39.4e6};
  for (int i = 0; i < 12; ++i) w.push_back(7.1e6);
  w.push_back(1.5e3);
  const Parts parts = partition_balanced(w, 4);
  EXPECT_EQ(parts[0][0], (PieceRange{0, 1})) << describe(parts);
  EXPECT_EQ(parts[3][0].end, 14) << describe(parts);
}

TEST(PartitionBalanced, RefusesTooFewPiecesAndBadWeights) {
  EXPECT_ERROR_CONTAINS(partition_balanced({1, 2, 3}, 2, 2), "3 pieces cannot fill 4 parts (2 stages x 2 chunks)");
  EXPECT_ERROR_CONTAINS(partition_balanced({1, -2, 3}, 2), "piece 1 has weight -2");
}

TEST(PartitionExplicit, SizesInPartOrder) {
  EXPECT_EQ(partition_explicit({3, 5}, 8, 2), (Parts{{{0, 3}}, {{3, 8}}}));
  EXPECT_EQ(partition_explicit({1, 2, 3, 4}, 10, 2, 2), (Parts{{{0, 1}, {3, 6}}, {{1, 3}, {6, 10}}}));
  EXPECT_ERROR_CONTAINS(partition_explicit({3, 5, 1}, 9, 2), "3 sizes given, but 2 stages x 1 chunks need 2");
  EXPECT_ERROR_CONTAINS(partition_explicit({3, 0}, 3, 2), "part 1 has 0 pieces");
  EXPECT_ERROR_CONTAINS(partition_explicit({3, 4}, 8, 2), "add up to 7, but the model has 8 pieces");
}

}  // namespace
}  // namespace colossal::parallel::pp
