// DataLoader: batching and drop_last, the same bytes whatever the worker count, shuffling per
// epoch, errors delivered at the batch they belong to, the bound on prefetching, restarts, the
// pinned-memory pool, and the CPU-only build's clear refusal of pin_memory and devices.
#include <gtest/gtest.h>
#include <omp.h>

#include <atomic>
#include <chrono>
#include <cstring>
#include <set>
#include <thread>

#include "colossal/core/cuda_device.h"
#include "colossal/core/view.h"  // contiguous_raw
#include "colossal/data/data.h"
#include "colossal/ops.h"
#include "data_test_util.h"

namespace colossal::data {
namespace {

namespace fs = std::filesystem;
using testing::expect_error;

/// Sample i: input [2] = {i, 10 i} (f32), target i; throws for `bad_index`; records the largest
/// index requested.
class IndexDataset : public Dataset {
 public:
  explicit IndexDataset(int64_t n, int64_t bad_index = -1) : n_(n), bad_index_(bad_index) {}
  int64_t size() const override { return n_; }
  Example get(int64_t index) const override {
    check_index(index, n_, "IndexDataset");
    int64_t seen = max_index_.load();
    while (index > seen && !max_index_.compare_exchange_weak(seen, index)) {
    }
    COLOSSAL_CHECK(index != bad_index_, "sample {} is broken on purpose", index);
    return {core::from_vector<float>({static_cast<float>(index), 10.0f * static_cast<float>(index)}, {2}),
            label_tensor(index)};
  }
  int64_t max_index() const { return max_index_.load(); }

 private:
  int64_t n_, bad_index_;
  mutable std::atomic<int64_t> max_index_{-1};
};

std::vector<int64_t> targets_of(const Batch& b) {
  return b.target.to_vector<int64_t>();
}

/// Every batch of one pass, as (input bytes, target bytes, sample indices).
struct PassRecord {
  std::vector<std::vector<uint8_t>> inputs, targets;
  std::vector<std::vector<int64_t>> indices;
  bool operator==(const PassRecord&) const = default;
};

std::vector<uint8_t> raw_bytes(const Tensor& t) {
  std::vector<uint8_t> out(t.nbytes());
  if (!out.empty()) std::memcpy(out.data(), core::contiguous_raw(t).raw_data(), out.size());
  return out;
}

PassRecord record_pass(DataLoader& loader) {
  PassRecord r;
  for (Batch& b : loader) {
    r.inputs.push_back(raw_bytes(b.input));
    r.targets.push_back(raw_bytes(b.target));
    r.indices.push_back(b.sample_indices);
  }
  return r;
}

TEST(DataLoader, BatchesInSamplerOrderWithAndWithoutDropLast) {
  auto ds = std::make_shared<IndexDataset>(10);
  DataLoader loader(ds, {.batch_size = 4});
  EXPECT_EQ(loader.size(), 3);
  std::vector<std::vector<int64_t>> seen;
  int64_t expected_index = 0;
  for (Batch& b : loader) {
    EXPECT_EQ(b.index, expected_index++);
    EXPECT_EQ(b.input.shape()[1], 2);
    EXPECT_EQ(b.input.dtype(), DType::f32);
    seen.push_back(targets_of(b));
    EXPECT_EQ(targets_of(b), b.sample_indices);
  }
  EXPECT_EQ(seen, (std::vector<std::vector<int64_t>>{{0, 1, 2, 3}, {4, 5, 6, 7}, {8, 9}}));
  DataLoader dropping(ds, {.batch_size = 4, .drop_last = true});
  EXPECT_EQ(dropping.size(), 2);
  int batches = 0;
  for (Batch& b : dropping) {
    EXPECT_EQ(b.input.size(0), 4);
    ++batches;
  }
  EXPECT_EQ(batches, 2);
  // After a pass, next() keeps answering nullopt until the next start.
  EXPECT_FALSE(dropping.next().has_value());
  dropping.start();
  EXPECT_TRUE(dropping.next().has_value());
}

/// CIFAR-like augmentation (AutoAugment, ToTensor, crop, flip) and mixup: every random draw there
/// is.
DataLoaderOptions augmented_options(int64_t workers, int64_t prefetch) {
  return {.batch_size = 5,
          .shuffle = true,
          .seed = 1234,
          .num_workers = workers,
          .prefetch_factor = prefetch,
          .batch_transform = std::make_shared<Mixup>(MixupOptions{.alpha = 0.2, .num_classes = 10})};
}

std::shared_ptr<Dataset> augmented_dataset() {
  auto base = std::make_shared<SyntheticImageDataset>(
      SyntheticImageOptions{.size = 37, .image_shape = {3, 12, 12}, .num_classes = 10, .seed = 5, .dtype = DType::u8});
  auto pipeline = std::make_shared<Compose>(std::vector<std::shared_ptr<const Transform>>{
      std::make_shared<AutoAugment>(), std::make_shared<ToTensor>(), std::make_shared<RandomCrop>(12, 2),
      std::make_shared<RandomHorizontalFlip>(),
      std::make_shared<Normalize>(std::vector<double>{0.49, 0.48, 0.45}, std::vector<double>{0.25, 0.24, 0.26})});
  return std::make_shared<TransformDataset>(base, pipeline, 99);
}

TEST(DataLoader, SameBytesWithZeroOneOrFourWorkers) {
  auto ds = augmented_dataset();
  DataLoader inline_loader(ds, augmented_options(0, 1));
  const PassRecord reference = record_pass(inline_loader);
  ASSERT_EQ(reference.inputs.size(), 8u);  // ceil(37 / 5)
  for (auto [workers, prefetch] : {std::pair{1, 1}, std::pair{4, 2}, std::pair{4, 1}, std::pair{3, 5}}) {
    DataLoader loader(ds, augmented_options(workers, prefetch));
    EXPECT_TRUE(record_pass(loader) == reference) << workers << " workers, prefetch " << prefetch;
    EXPECT_TRUE(record_pass(loader) == reference) << "second pass, " << workers << " workers";
  }
  // The targets are mixup's soft targets.
  inline_loader.start();
  Batch b = *inline_loader.next();
  EXPECT_EQ(b.target.shape(), (Shape{5, 10}));
}

// A resumed run starts its epoch at the batch after its checkpoint: the batches from there on are
// byte for byte those of a full pass, with any number of workers; a start past the end is refused.
TEST(DataLoader, StartingMidEpochHandsOutTheRestOfTheFullPass) {
  auto ds = augmented_dataset();
  DataLoader full(ds, augmented_options(0, 1));
  full.set_epoch(3);
  const PassRecord reference = record_pass(full);
  ASSERT_EQ(reference.inputs.size(), 8u);
  for (int64_t workers : {0, 3}) {
    DataLoader loader(ds, augmented_options(workers, 2));
    loader.set_epoch(3);
    for (int64_t first : {0, 5, 8}) {
      SCOPED_TRACE(::testing::Message() << workers << " workers, first batch " << first);
      loader.start(first);
      PassRecord rest;
      while (std::optional<Batch> b = loader.next()) {
        rest.inputs.push_back(raw_bytes(b->input));
        rest.targets.push_back(raw_bytes(b->target));
        rest.indices.push_back(b->sample_indices);
        EXPECT_EQ(b->index, first + static_cast<int64_t>(rest.indices.size()) - 1);
      }
      PassRecord expected;
      expected.inputs.assign(reference.inputs.begin() + first, reference.inputs.end());
      expected.targets.assign(reference.targets.begin() + first, reference.targets.end());
      expected.indices.assign(reference.indices.begin() + first, reference.indices.end());
      EXPECT_TRUE(rest == expected);
    }
    try {
      loader.start(9);
      FAIL() << "started past the end";
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find("valid: 0..8"), std::string::npos) << e.what();
    }
  }
}

TEST(DataLoader, ShufflesPerEpochAndRepeatsForTheSameSeedAndEpoch) {
  auto ds = std::make_shared<IndexDataset>(50);
  DataLoader a(ds, {.batch_size = 50, .shuffle = true, .seed = 7, .num_workers = 2});
  DataLoader b(ds, {.batch_size = 50, .shuffle = true, .seed = 7});
  DataLoader c(ds, {.batch_size = 50, .shuffle = true, .seed = 8});
  const std::vector<int64_t> epoch0 = targets_of(*a.next());
  EXPECT_EQ(targets_of(*b.next()), epoch0);
  EXPECT_NE(targets_of(*c.next()), epoch0);
  std::vector<int64_t> sorted = epoch0;
  std::sort(sorted.begin(), sorted.end());
  for (int64_t i = 0; i < 50; ++i) EXPECT_EQ(sorted[static_cast<size_t>(i)], i);
  a.set_epoch(1);
  EXPECT_EQ(a.epoch(), 1);
  const std::vector<int64_t> epoch1 = targets_of(*a.next());
  EXPECT_NE(epoch1, epoch0);
  a.set_epoch(0);
  EXPECT_EQ(targets_of(*a.next()), epoch0);
  // Without set_epoch a new pass repeats the epoch (as torch's samplers do).
  a.start();
  EXPECT_EQ(targets_of(*a.next()), epoch0);
}

TEST(DataLoader, DistributedRanksSeeDisjointShares) {
  auto ds = std::make_shared<IndexDataset>(24);
  std::set<int64_t> all;
  for (int64_t rank = 0; rank < 3; ++rank) {
    auto sampler =
        std::make_shared<DistributedSampler>(24, DistributedSamplerOptions{.rank = rank, .world_size = 3, .seed = 2});
    DataLoader loader(ds, {.batch_size = 4, .num_workers = 2}, sampler);
    EXPECT_EQ(loader.size(), 2);
    for (Batch& b : loader) {
      for (int64_t t : targets_of(b)) EXPECT_TRUE(all.insert(t).second) << "index " << t << " seen twice";
    }
  }
  EXPECT_EQ(all.size(), 24u);
}

TEST(DataLoader, ASampleErrorArrivesAtItsBatchNamingBatchAndSample) {
  for (int64_t workers : {0, 3}) {
    auto ds = std::make_shared<IndexDataset>(12, /*bad_index=*/7);
    DataLoader loader(ds, {.batch_size = 3, .num_workers = workers});
    auto first = loader.next();
    ASSERT_TRUE(first.has_value());
    EXPECT_EQ(targets_of(*first), (std::vector<int64_t>{0, 1, 2}));
    EXPECT_EQ(targets_of(*loader.next()), (std::vector<int64_t>{3, 4, 5}));
    expect_error([&] { loader.next(); }, {"loading sample 7 for batch 2 of epoch 0", "broken on purpose"});
    EXPECT_FALSE(loader.next().has_value()) << "the pass ends at the error";
    loader.start();  // a new pass starts cleanly
    EXPECT_EQ(targets_of(*loader.next()), (std::vector<int64_t>{0, 1, 2}));
  }
}

TEST(DataLoader, CollationErrorsNameTheExample) {
  class Ragged : public Dataset {
   public:
    int64_t size() const override { return 4; }
    Example get(int64_t index) const override { return {core::zeros({index < 2 ? 3 : 4}), label_tensor(index)}; }
  };
  DataLoader loader(std::make_shared<Ragged>(), {.batch_size = 4});
  expect_error([&] { loader.next(); }, {"collating batch 0", "example 2 is f32 [4], example 0 is f32 [3]"});
}

TEST(DataLoader, WorkersRunOpenMpSingleThreadedAndLeaveTheCallerAlone) {
  // Note [Workers run single-threaded]: inside a worker, loops split over OpenMP run on that worker
  // alone (a team of every core per worker oversubscribed the host); the caller's setting stays.
  class ThreadCount : public Dataset {
   public:
    int64_t size() const override { return 8; }
    Example get(int64_t) const override {
      return {core::full({1}, static_cast<double>(omp_get_max_threads()), DType::f32), label_tensor(0)};
    }
  };
  omp_set_num_threads(2);
  DataLoader loader(std::make_shared<ThreadCount>(), {.batch_size = 2, .num_workers = 2});
  for (const Batch& batch : loader) {
    for (double threads : batch.input.to_vector<double>()) EXPECT_EQ(threads, 1.0);
  }
  EXPECT_EQ(omp_get_max_threads(), 2) << "the caller's thread count is its own";
  DataLoader inline_loader(std::make_shared<ThreadCount>(), {.batch_size = 2, .num_workers = 0});
  for (const Batch& batch : inline_loader) {
    for (double threads : batch.input.to_vector<double>()) EXPECT_EQ(threads, 2.0) << "no workers: the caller's";
  }
}

TEST(DataLoader, WorkersRunAtMostNumWorkersTimesPrefetchBatchesAhead) {
  auto ds = std::make_shared<IndexDataset>(100);
  DataLoader loader(ds, {.batch_size = 1, .num_workers = 2, .prefetch_factor = 2});
  ASSERT_TRUE(loader.next().has_value());
  std::this_thread::sleep_for(std::chrono::milliseconds(100));
  // Batch 0 consumed; batches 1..4 may be claimed (capacity 4), batch 5 not.
  EXPECT_LE(ds->max_index(), 4);
  EXPECT_GE(ds->max_index(), 1);
  int64_t count = 1;
  while (loader.next()) ++count;
  EXPECT_EQ(count, 100);
}

TEST(DataLoader, StopsMidPassOnRestartAndDestruction) {
  auto ds = std::make_shared<IndexDataset>(40);
  {
    DataLoader loader(ds, {.batch_size = 2, .num_workers = 3});
    loader.next();
    loader.next();
    loader.start();
    EXPECT_EQ(targets_of(*loader.next()), (std::vector<int64_t>{0, 1}));
    loader.next();
  }  // destroyed with workers mid-pass: joins them
  SUCCEED();
}

TEST(DataLoader, TokenFilesBatchIntoTokenMatrices) {
  const std::string file =
      (fs::path(::testing::TempDir()) / fmt::format("colossal_tokens_{}.bin", ::getpid())).string();
  std::vector<uint8_t> bytes;
  for (int i = 0; i < 200; ++i) bytes.push_back(static_cast<uint8_t>(i)), bytes.push_back(0);
  testing::write_bytes(file, bytes);
  auto tokens = std::make_shared<TokenFileDataset>(file, TokenFileOptions{.sequence_length = 8, .seed = 1});
  DataLoader loader(tokens, {.batch_size = 4, .num_workers = 2});
  Batch b = *loader.next();
  EXPECT_EQ(b.input.shape(), (Shape{4, 8}));
  EXPECT_EQ(b.target.shape(), (Shape{4, 8}));
  const std::vector<int64_t> in = b.input.to_vector<int64_t>(), out = b.target.to_vector<int64_t>();
  for (size_t i = 0; i + 1 < 8; ++i) EXPECT_EQ(in[i + 1], out[i]);
  fs::remove(file);
}

TEST(DataLoader, RejectsBadOptionsAndPinnedMemoryWithoutCuda) {
  auto ds = std::make_shared<IndexDataset>(4);
  expect_error([&] { DataLoader(ds, {.batch_size = 0}); }, {"batch_size must be at least 1, got 0"});
  expect_error([&] { DataLoader(ds, {.num_workers = -1}); }, {"num_workers"});
  expect_error([&] { DataLoader(ds, {.prefetch_factor = 0}); }, {"prefetch_factor"});
  expect_error([&] { DataLoader(ds, {.device = core::kCpu}); }, {"must be a CUDA device"});
  if (core::cuda::is_available()) GTEST_SKIP() << "a GPU is visible: pinned memory works here";
  expect_error([&] { DataLoader(ds, {.pin_memory = true}); }, {"pin_memory needs CUDA", "pin_memory = false"});
  expect_error([&] { DataLoader(ds, {.device = core::cuda_device(0)}); }, {"device is cuda:0", "no GPU is visible"});
}

TEST(PinnedMemoryPool, RecyclesBlocksOnceTheirTensorsAreGone) {
  auto pool = PinnedMemoryPool::create(host_empty);
  void* first_ptr = nullptr;
  {
    Tensor a = pool->empty({4, 8}, DType::f32);
    first_ptr = a.raw_data();
    Tensor view = a.select(0, 1);  // a view keeps the block alive
    a = Tensor();
    EXPECT_EQ(pool->blocks_cached(), 0);
  }
  EXPECT_EQ(pool->blocks_cached(), 1);
  Tensor b = pool->empty({8, 4}, DType::f32);  // same byte size: the same block
  EXPECT_EQ(b.raw_data(), first_ptr);
  EXPECT_EQ(b.shape(), (Shape{8, 4}));
  Tensor c = pool->empty({3}, DType::i64);  // a different size: a new block
  EXPECT_EQ(pool->blocks_allocated(), 2);
  std::weak_ptr<PinnedMemoryPool> weak = pool;
  pool.reset();  // tensors may outlive the pool
  EXPECT_TRUE(weak.expired());
  b.fill_(1.0);
  EXPECT_EQ(b.to_vector<float>()[31], 1.0f);
}

TEST(PinnedMemoryPool, AByteSizePast64BitsIsAnError) {
  // 2^61 f64 elements: the byte count wrapped to 0 and a 0-byte block backed the tensor.
  auto pool = PinnedMemoryPool::create(host_empty);
  expect_error([&] { pool->empty({int64_t{1} << 61}, DType::f64); },
               {"PinnedMemoryPool::empty: shape [2305843009213693952] of f64", "more bytes than fit in 64 bits"});
  EXPECT_EQ(pool->blocks_allocated(), 0);
}

}  // namespace
}  // namespace colossal::data
