// parallel::zero::Partition: how ZeRO cuts parameters into buckets and each bucket into equal chunks,
// one per rank (element granularity: parameters split to the element; tensor: whole parameters).
#include "colossal/parallel/zero/partition.h"

#include <gtest/gtest.h>

#include <vector>

#include "colossal/core/error.h"

namespace colossal::parallel::zero {
namespace {

std::vector<ParamSize> f32_sizes(const std::vector<int64_t>& numels) {
  std::vector<ParamSize> sizes;
  for (int64_t n : numels) sizes.push_back(ParamSize{n, 4, 0});
  return sizes;
}

/// Every element of every parameter belongs to exactly one piece, each piece lies within its rank's
/// chunk, no two pieces of a rank overlap, and the parameter fills [start, start + numel) of the
/// bucket's flat buffer (each piece at its rank's chunk).
void expect_exact_cover(const Partition& partition, const std::vector<ParamSize>& sizes) {
  for (const Bucket& bucket : partition.buckets()) {
    std::vector<std::vector<int>> used(static_cast<size_t>(partition.size()),
                                       std::vector<int>(static_cast<size_t>(bucket.chunk), 0));
    ASSERT_EQ(bucket.starts.size(), bucket.params.size());
    for (size_t i = 0; i < bucket.params.size(); ++i) {
      std::vector<int> covered(static_cast<size_t>(sizes[bucket.params[i]].numel), 0);
      for (const Piece& piece : bucket.pieces[i]) {
        ASSERT_GT(piece.numel, 0);
        ASSERT_LE(piece.offset + piece.numel, bucket.chunk);
        EXPECT_EQ(piece.rank * bucket.chunk + piece.offset, bucket.starts[i] + piece.begin)
            << "parameter " << bucket.params[i];
        for (int64_t e = 0; e < piece.numel; ++e) {
          ++covered[static_cast<size_t>(piece.begin + e)];
          ++used[static_cast<size_t>(piece.rank)][static_cast<size_t>(piece.offset + e)];
        }
      }
      for (int c : covered) EXPECT_EQ(c, 1) << "parameter " << bucket.params[i];
    }
    for (const auto& rank : used) {
      for (int u : rank) EXPECT_LE(u, 1);
    }
  }
}

TEST(ZeroPartition, ElementGranularityBalancesAndPadsTheTail) {
  const auto sizes = f32_sizes({5, 7, 1});
  const Partition partition(sizes, 1 << 20, 4, Granularity::element);
  ASSERT_EQ(partition.buckets().size(), 1u);
  EXPECT_EQ(partition.buckets()[0].chunk, 4);  // 13 elements over 4 ranks: 4, 4, 4 and 1 + 3 padding
  EXPECT_EQ(partition.owned_numel(), (std::vector<int64_t>{4, 4, 4, 1}));
  expect_exact_cover(partition, sizes);
  // The second parameter (elements 5..11 of the bucket) is split over ranks 1 and 2.
  EXPECT_EQ(partition.piece(1, 1).begin, 0);
  EXPECT_EQ(partition.piece(1, 1).numel, 3);
  EXPECT_EQ(partition.piece(1, 1).offset, 1);
  EXPECT_EQ(partition.piece(1, 2).begin, 3);
  EXPECT_EQ(partition.piece(1, 2).numel, 4);
  EXPECT_EQ(partition.piece(1, 0).numel, 0);  // rank 0 owns none of it
  EXPECT_EQ(partition.max_piece(1), 4);
  EXPECT_EQ(partition.shard_numel(), 4);
}

TEST(ZeroPartition, BucketsFollowTheByteCapAndTheDtype) {
  std::vector<ParamSize> sizes = f32_sizes({3, 1, 8, 2, 2});
  sizes[4].dtype = 1;                                             // another dtype starts a bucket
  const Partition partition(sizes, 16, 2, Granularity::element);  // 16 bytes: 4 f32 elements
  ASSERT_EQ(partition.buckets().size(), 4u);
  EXPECT_EQ(partition.buckets()[0].params, (std::vector<size_t>{0, 1}));
  EXPECT_EQ(partition.buckets()[1].params, (std::vector<size_t>{2}));  // larger than the cap: alone
  EXPECT_EQ(partition.buckets()[2].params, (std::vector<size_t>{3}));
  EXPECT_EQ(partition.buckets()[3].params, (std::vector<size_t>{4}));
  EXPECT_EQ(partition.bucket_of(2), 1u);
  EXPECT_EQ(partition.shard_offset(1), 2);
  EXPECT_EQ(partition.shard_numel(), 2 + 4 + 1 + 1);
  expect_exact_cover(partition, sizes);
}

TEST(ZeroPartition, AnotherGroupStartsABucket) {
  // LowLevelZero keeps the model's own parameters apart from its blocks' (Note [Gathers under the
  // forward] in low_level_zero.cpp): a group change starts a bucket as a dtype change does.
  std::vector<ParamSize> sizes = f32_sizes({1, 1, 1, 1});
  sizes[0].group = 1;  // GPT-2's ln_f, first in backward
  sizes[3].group = 1;  // its wpe, last
  const Partition partition(sizes, 1024, 2, Granularity::element);
  ASSERT_EQ(partition.buckets().size(), 3u);
  EXPECT_EQ(partition.buckets()[0].params, (std::vector<size_t>{0}));
  EXPECT_EQ(partition.buckets()[1].params, (std::vector<size_t>{1, 2}));
  EXPECT_EQ(partition.buckets()[2].params, (std::vector<size_t>{3}));
  expect_exact_cover(partition, sizes);
}

TEST(ZeroPartition, TensorGranularityKeepsParametersWhole) {
  const auto sizes = f32_sizes({10, 1, 1, 8});
  const Partition partition(sizes, 1 << 20, 2, Granularity::tensor);
  ASSERT_EQ(partition.buckets().size(), 1u);
  // 10 to rank 0; then rank 1 has the least load for the 1, the 1 and the 8.
  EXPECT_EQ(partition.piece(0, 0).numel, 10);
  EXPECT_EQ(partition.piece(1, 1).numel, 1);
  EXPECT_EQ(partition.piece(2, 1).numel, 1);
  EXPECT_EQ(partition.piece(3, 1).numel, 8);
  EXPECT_EQ(partition.piece(3, 1).offset, 2);
  EXPECT_EQ(partition.buckets()[0].chunk, 10);
  EXPECT_EQ(partition.owned_numel(), (std::vector<int64_t>{10, 10}));
  for (size_t p = 0; p < sizes.size(); ++p) EXPECT_EQ(partition.max_piece(p), sizes[p].numel);
  expect_exact_cover(partition, sizes);
}

TEST(ZeroPartition, MoreRanksThanElements) {
  const auto sizes = f32_sizes({2, 0});
  const Partition partition(sizes, 1 << 20, 4, Granularity::element);
  EXPECT_EQ(partition.buckets()[0].chunk, 1);
  EXPECT_EQ(partition.owned_numel(), (std::vector<int64_t>{1, 1, 0, 0}));
  EXPECT_EQ(partition.piece(1, 3).numel, 0);
  expect_exact_cover(partition, sizes);
}

TEST(ZeroPartition, RejectsBadArguments) {
  EXPECT_THROW(Partition(f32_sizes({1}), 0, 2, Granularity::element), Error);
  EXPECT_THROW(Partition(f32_sizes({1}), 16, 0, Granularity::element), Error);
}

}  // namespace
}  // namespace colossal::parallel::zero
