// Samplers and the random draws under them: permutations are permutations and depend only on
// (seed, epoch); DistributedSampler splits, pads and truncates exactly as torch's does.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <numeric>
#include <set>

#include "colossal/data/random.h"
#include "colossal/data/sampler.h"
#include "data_test_util.h"

namespace colossal::data {
namespace {

using testing::expect_error;

std::vector<int64_t> iota(int64_t n) {
  std::vector<int64_t> v(static_cast<size_t>(n));
  std::iota(v.begin(), v.end(), 0);
  return v;
}

bool is_permutation_of_range(std::vector<int64_t> v) {
  std::sort(v.begin(), v.end());
  return v == iota(static_cast<int64_t>(v.size()));
}

TEST(Rng, DrawsStayInRangeAndReplayFromTheSameState) {
  core::Generator g(5);
  Rng rng(g);
  std::vector<int64_t> counts(6, 0);
  for (int i = 0; i < 6000; ++i) {
    const double u = rng.uniform();
    ASSERT_GE(u, 0.0);
    ASSERT_LT(u, 1.0);
    const int64_t k = rng.integer(-2, 4);
    ASSERT_GE(k, -2);
    ASSERT_LT(k, 4);
    ++counts[static_cast<size_t>(k + 2)];
  }
  // 1000 expected per value; the binomial standard deviation is sqrt(6000 * 1/6 * 5/6) = 29, so
  // 150 is over 5 sigma.
  for (int64_t c : counts) EXPECT_NEAR(static_cast<double>(c), 1000.0, 150.0);
  core::Generator a(9), b(9);
  Rng ra(a), rb(b);
  EXPECT_EQ(ra.uniform(), rb.uniform());
  EXPECT_EQ(ra.integer(0, 1000000), rb.integer(0, 1000000));
  EXPECT_EQ(a.state(), b.state());
  expect_error([&] { ra.integer(3, 3); }, {"empty range [3, 3)"});
}

TEST(Rng, GammaAndBetaHaveTheirMoments) {
  core::Generator g(11);
  Rng rng(g);
  const int n = 20000;
  for (double shape : {0.2, 1.0, 3.5}) {
    double sum = 0;
    for (int i = 0; i < n; ++i) sum += rng.gamma(shape);
    // Gamma(k) has mean k and variance k: the sample mean's standard error is sqrt(k / n); 5 of them.
    EXPECT_NEAR(sum / n, shape, 5 * std::sqrt(shape / n)) << "shape " << shape;
  }
  const double alpha = 0.2;
  double sum = 0, sum_sq = 0;
  for (int i = 0; i < n; ++i) {
    const double x = rng.beta(alpha, alpha);
    ASSERT_GE(x, 0.0);
    ASSERT_LE(x, 1.0);
    sum += x, sum_sq += x * x;
  }
  // Beta(a, a): mean 1/2, variance 1 / (4 (2a + 1)) = 0.1786; the mean's standard error is
  // sqrt(0.1786 / n) = 0.003, so 0.015 is 5 sigma; the variance estimate is good to about 0.01.
  const double mean = sum / n, var = sum_sq / n - mean * mean;
  EXPECT_NEAR(mean, 0.5, 0.015);
  EXPECT_NEAR(var, 1.0 / (4 * (2 * alpha + 1)), 0.01);
}

TEST(Rng, DerivedGeneratorsDifferByStreamEpochAndIndex) {
  std::set<uint64_t> seeds;
  for (auto stream : {RandomStream::shuffle, RandomStream::sample_transform, RandomStream::batch_transform}) {
    for (int64_t epoch = 0; epoch < 3; ++epoch) {
      for (int64_t index = 0; index < 50; ++index) seeds.insert(derive_generator(1, stream, epoch, index).seed());
    }
  }
  EXPECT_EQ(seeds.size(), 3u * 3 * 50);
  EXPECT_EQ(derive_generator(1, RandomStream::shuffle, 2, 3).seed(),
            derive_generator(1, RandomStream::shuffle, 2, 3).seed());
  EXPECT_NE(derive_generator(1, RandomStream::shuffle, 2, 3).seed(),
            derive_generator(2, RandomStream::shuffle, 2, 3).seed());
}

TEST(Samplers, SequentialAndRandom) {
  SequentialSampler seq(5);
  EXPECT_EQ(seq.indices(), iota(5));
  RandomSampler a(1000, 42), b(1000, 42), c(1000, 43);
  const std::vector<int64_t> e0 = a.indices();
  EXPECT_TRUE(is_permutation_of_range(e0));
  EXPECT_NE(e0, iota(1000));
  EXPECT_EQ(e0, b.indices());
  EXPECT_NE(e0, c.indices());
  a.set_epoch(1);
  const std::vector<int64_t> e1 = a.indices();
  EXPECT_TRUE(is_permutation_of_range(e1));
  EXPECT_NE(e0, e1);
  a.set_epoch(0);
  EXPECT_EQ(a.indices(), e0);
  EXPECT_TRUE(RandomSampler(0, 1).indices().empty());
}

TEST(Samplers, DistributedMatchesTorchWithoutShuffle) {
  // torch.utils.data.DistributedSampler(range(10), num_replicas=3, shuffle=False): the list is padded
  // to 12 with its own start (0, 1), then rank r takes positions r, r + 3, ...
  const std::vector<std::vector<int64_t>> padded = {{0, 3, 6, 9}, {1, 4, 7, 0}, {2, 5, 8, 1}};
  const std::vector<std::vector<int64_t>> dropped = {{0, 3, 6}, {1, 4, 7}, {2, 5, 8}};
  for (int64_t rank = 0; rank < 3; ++rank) {
    DistributedSampler pad(10, {.rank = rank, .world_size = 3, .shuffle = false});
    EXPECT_EQ(pad.size(), 4);
    EXPECT_EQ(pad.total_size(), 12);
    EXPECT_EQ(pad.indices(), padded[static_cast<size_t>(rank)]);
    DistributedSampler drop(10, {.rank = rank, .world_size = 3, .shuffle = false, .drop_last = true});
    EXPECT_EQ(drop.size(), 3);
    EXPECT_EQ(drop.indices(), dropped[static_cast<size_t>(rank)]);
  }
  // Padding longer than the list cycles it: 2 samples over 5 ranks.
  std::vector<int64_t> all;
  for (int64_t rank = 0; rank < 5; ++rank) {
    const auto idx = DistributedSampler(2, {.rank = rank, .world_size = 5, .shuffle = false}).indices();
    ASSERT_EQ(idx.size(), 1u);
    all.push_back(idx[0]);
  }
  EXPECT_EQ(all, (std::vector<int64_t>{0, 1, 0, 1, 0}));
}

TEST(Samplers, DistributedRanksPartitionOneSharedPermutation) {
  const int64_t n = 103, world = 4;
  for (int64_t epoch = 0; epoch < 2; ++epoch) {
    std::vector<int64_t> seen;
    std::vector<std::vector<int64_t>> per_rank;
    for (int64_t rank = 0; rank < world; ++rank) {
      DistributedSampler s(n, {.rank = rank, .world_size = world, .shuffle = true, .seed = 9});
      s.set_epoch(epoch);
      per_rank.push_back(s.indices());
      EXPECT_EQ(per_rank.back().size(), 26u);  // ceil(103 / 4)
      seen.insert(seen.end(), per_rank.back().begin(), per_rank.back().end());
    }
    // Every index appears; the 1 padding sample repeats the permutation's first element.
    std::set<int64_t> distinct(seen.begin(), seen.end());
    EXPECT_EQ(distinct.size(), static_cast<size_t>(n));
    const std::vector<int64_t> perm = shuffled_indices(n, 9, epoch);
    for (int64_t rank = 0; rank < world; ++rank)
      for (size_t i = 0; i < per_rank[static_cast<size_t>(rank)].size(); ++i) {
        const size_t position = i * static_cast<size_t>(world) + static_cast<size_t>(rank);
        EXPECT_EQ(per_rank[static_cast<size_t>(rank)][i], perm[position % static_cast<size_t>(n)]);
      }
  }
  // drop_last: 103 -> 25 per rank, no index twice.
  std::set<int64_t> distinct;
  for (int64_t rank = 0; rank < world; ++rank) {
    const auto idx = DistributedSampler(n, {.rank = rank, .world_size = world, .seed = 9, .drop_last = true}).indices();
    EXPECT_EQ(idx.size(), 25u);
    distinct.insert(idx.begin(), idx.end());
  }
  EXPECT_EQ(distinct.size(), 100u);
  // With one replica it is the RandomSampler's order.
  DistributedSampler single(50, {.rank = 0, .world_size = 1, .seed = 4});
  single.set_epoch(3);
  RandomSampler random(50, 4);
  random.set_epoch(3);
  EXPECT_EQ(single.indices(), random.indices());
}

TEST(Samplers, DistributedRejectsBadRanks) {
  expect_error([] { DistributedSampler(10, {.rank = 3, .world_size = 3}); }, {"rank 3 is outside [0, 3)"});
  expect_error([] { DistributedSampler(10, {.rank = 0, .world_size = 0}); }, {"world_size must be at least 1"});
  expect_error([] { DistributedSampler(10, {.rank = -1, .world_size = 2}); }, {"rank -1"});
}

}  // namespace
}  // namespace colossal::data
