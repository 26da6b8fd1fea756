// The DataLoader's GPU path: batches collated into pinned memory, copied on a side stream and handed
// out only after the consumer's current stream waits for the copy. The data must equal the CPU
// loader's batch for batch, kernels the consumer queues must see it, on the default stream or one
// of the consumer's own, and an error must still arrive at its batch despite the copy-ahead.
#include <gtest/gtest.h>

#include "colossal/core/cuda_device.h"
#include "colossal/data/data.h"
#include "colossal/ops.h"

namespace colossal::data {
namespace {

/// Sample i: input [256] f32 with element j = i * 1000 + j, target i; throws for `bad_index`.
class RampDataset : public Dataset {
 public:
  explicit RampDataset(int64_t n, int64_t bad_index = -1) : n_(n), bad_index_(bad_index) {}
  int64_t size() const override { return n_; }
  Example get(int64_t index) const override {
    COLOSSAL_CHECK(index != bad_index_, "sample {} is broken on purpose", index);
    std::vector<float> v(256);
    for (size_t j = 0; j < v.size(); ++j) v[j] = static_cast<float>(index * 1000 + static_cast<int64_t>(j));
    return {core::from_vector<float>(v, {256}), label_tensor(index)};
  }

 private:
  int64_t n_, bad_index_;
};

class DevicePrefetch : public ::testing::Test {
 protected:
  void SetUp() override {
    if (!core::cuda::is_available()) GTEST_SKIP() << "no GPU";
  }
};

void expect_same_batches(DataLoader& gpu, DataLoader& cpu) {
  int64_t batches = 0;
  while (true) {
    std::optional<Batch> g = gpu.next();
    std::optional<Batch> c = cpu.next();
    ASSERT_EQ(g.has_value(), c.has_value());
    if (!g) break;
    ASSERT_EQ(g->input.device(), core::cuda_device(0));
    ASSERT_EQ(g->target.device(), core::cuda_device(0));
    EXPECT_EQ(g->sample_indices, c->sample_indices);
    // A kernel queued on the consumer's stream right away must see the copied data.
    const Tensor doubled = ops::mul(g->input, 2.0);
    EXPECT_EQ(doubled.to(core::kCpu).to_vector<float>(), ops::mul(c->input, 2.0).to_vector<float>());
    EXPECT_EQ(g->target.to(core::kCpu).to_vector<int64_t>(), c->target.to_vector<int64_t>());
    ++batches;
  }
  EXPECT_EQ(batches, cpu.size());
}

TEST_F(DevicePrefetch, DeliversTheCpuLoadersBatchesOnTheGpu) {
  auto ds = std::make_shared<RampDataset>(203);
  for (int64_t workers : {0, 3}) {
    DataLoader gpu(
        ds, {.batch_size = 16, .shuffle = true, .seed = 3, .num_workers = workers, .device = core::cuda_device(0)});
    DataLoader cpu(ds, {.batch_size = 16, .shuffle = true, .seed = 3});
    for (int64_t epoch = 0; epoch < 3; ++epoch) {
      gpu.set_epoch(epoch);
      cpu.set_epoch(epoch);
      expect_same_batches(gpu, cpu);
    }
  }
}

TEST_F(DevicePrefetch, WaitsOnTheConsumersOwnStream) {
  auto ds = std::make_shared<RampDataset>(64);
  const core::Stream mine = core::cuda::create_stream(core::cuda_device(0));
  {
    core::cuda::StreamGuard guard(mine);
    DataLoader gpu(ds, {.batch_size = 8, .num_workers = 2, .device = core::cuda_device(0)});
    DataLoader cpu(ds, {.batch_size = 8});
    expect_same_batches(gpu, cpu);
  }
  core::cuda::synchronize(mine);
  core::cuda::destroy_stream(mine);
}

TEST_F(DevicePrefetch, PinnedBatchesAndErrorsAtTheirBatch) {
  auto ds = std::make_shared<RampDataset>(40, /*bad_index=*/20);
  DataLoader pinned(ds, {.batch_size = 8, .pin_memory = true});
  ASSERT_TRUE(core::cuda::is_pinned(pinned.next()->input));
  DataLoader gpu(ds, {.batch_size = 8, .num_workers = 2, .device = core::cuda_device(0)});
  EXPECT_EQ(gpu.next()->sample_indices.front(), 0);
  EXPECT_EQ(gpu.next()->sample_indices.front(), 8);  // batch 2 (samples 16..23) fails while this is in flight
  try {
    gpu.next();
    ADD_FAILURE() << "expected the error of sample 20";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("sample 20"), std::string::npos) << e.what();
  }
  EXPECT_FALSE(gpu.next().has_value());
}

}  // namespace
}  // namespace colossal::data
