// The batch stages' CUDA kernels against their CPU kernels on random inputs, and a DataLoader that
// runs a stage on the GPU after its copy against the same loader on the CPU.
// ImageBatchStage: the kernel is built with -fmad=false and sums in the CPU kernel's order, and its
// operations (u8 / 255, products and sums of floats, (v - mean) / std, the mixup blend) are single
// IEEE-rounded float operations on both sides, so the outputs must be equal bit for bit.
// SyntheticPixelStage: u8 pixels are integer bit slices (equal); f32 pixels go through the
// libraries' float log, cos and sin (CUDA's: 1, 2 and 2 ulp at most; glibc's under 1), so a normal
// r cos(a) differs by a few ulp of its magnitude: tolerance 8 ulp of |value| (8 * 2^-23 relative)
// plus 1e-6 absolute for values near 0, where cos's ulp error is relative to the cosine, not to r.
#include <gtest/gtest.h>

#include <cmath>

#include "batch_stage_cases.h"
#include "colossal/core/cuda_device.h"
#include "colossal/core/view.h"  // to_device_raw
#include "colossal/data/data.h"

namespace colossal::data {
namespace {

class BatchStageGpu : public ::testing::Test {
 protected:
  void SetUp() override {
    if (!core::cuda::is_available()) GTEST_SKIP() << "no GPU";
  }
};

/// Runs `stage` on a copy of `batch` on the GPU and returns the output back on the CPU.
Tensor run_on_gpu(const BatchStage& stage, const Batch& batch) {
  const Device gpu = core::cuda_device(0);
  Batch on_gpu = batch;
  on_gpu.input = core::to_device_raw(batch.input, gpu);
  const Tensor out = core::empty(stage.output_shape(batch.input.shape()), TensorOptions(stage.output_dtype(), gpu));
  stage.run(on_gpu, out);
  return out.to(core::kCpu);
}

TEST_F(BatchStageGpu, ImageStageEqualsTheCpuKernelBitForBit) {
  for (const testing::StageCase& c : testing::image_stage_cases()) {
    SCOPED_TRACE(c.what);
    const ImageBatchStage stage(c.options);
    Batch batch{.input = testing::random_images(c.input, c.dtype, 41), .target = core::zeros({c.input[0]}, DType::i64)};
    core::Generator generator(5);
    stage.prepare(batch, generator, host_empty);
    const Tensor gpu = run_on_gpu(stage, batch);
    run_batch_stage_on_host(stage, batch, host_empty);
    ASSERT_EQ(gpu.shape(), batch.input.shape());
    EXPECT_EQ(gpu.to_vector<float>(), batch.input.to_vector<float>());
  }
}

void expect_close_normals(const Tensor& got, const Tensor& want) {
  const std::vector<float> g = got.to_vector<float>(), w = want.to_vector<float>();
  ASSERT_EQ(g.size(), w.size());
  int64_t bad = 0;
  for (size_t i = 0; i < g.size(); ++i) {
    const float tolerance = 8.0f * std::ldexp(1.0f, -23) * std::abs(w[i]) + 1e-6f;
    if (!(std::abs(g[i] - w[i]) <= tolerance) && bad++ < 5) {
      ADD_FAILURE() << "pixel " << i << ": GPU " << g[i] << ", CPU " << w[i];
    }
  }
  EXPECT_EQ(bad, 0);
}

TEST_F(BatchStageGpu, SyntheticPixelsMatchTheCpu) {
  for (DType dtype : {DType::f32, DType::u8}) {
    SCOPED_TRACE(fmt::format("{}", dtype));
    // 3 x 31 x 29 pixels: the last Philox block of each image is partial.
    SyntheticImageOptions o{.size = 7, .image_shape = {3, 31, 29}, .num_classes = 5, .seed = 12, .dtype = dtype};
    o.pixel_keys = true;
    const SyntheticImageDataset keys(o);
    std::vector<Example> examples;
    for (int64_t i = 0; i < keys.size(); ++i) examples.push_back(keys.get(i));
    Batch batch = stack_collate(examples, host_empty);
    const SyntheticPixelStage stage(o.image_shape, dtype);
    const Tensor gpu = run_on_gpu(stage, batch);
    run_batch_stage_on_host(stage, batch, host_empty);
    if (dtype == DType::u8) {
      EXPECT_EQ(gpu.to_vector<uint8_t>(), batch.input.to_vector<uint8_t>());
    } else {
      expect_close_normals(gpu, batch.input);
    }
  }
}

TEST_F(BatchStageGpu, LoaderRunsTheStageAfterItsCopy) {
  auto base = std::make_shared<SyntheticImageDataset>(
      SyntheticImageOptions{.size = 45, .image_shape = {3, 12, 12}, .num_classes = 10, .seed = 2, .dtype = DType::u8});
  auto augmented =
      std::make_shared<TransformDataset>(base,
                                         std::make_shared<Compose>(std::vector<std::shared_ptr<const Transform>>{
                                             std::make_shared<RandomCrop>(12, 2), std::make_shared<AutoAugment>()}),
                                         9);
  const auto stage = std::make_shared<ImageBatchStage>(ImageBatchStageOptions{
      .height = 40, .width = 40, .mean = {0.5}, .std = {0.25}, .mixup = MixupOptions{.alpha = 0.2, .num_classes = 10}});
  for (int64_t workers : {0, 3}) {
    SCOPED_TRACE(fmt::format("{} workers", workers));
    DataLoader gpu(augmented, {.batch_size = 8,
                               .shuffle = true,
                               .seed = 4,
                               .num_workers = workers,
                               .device = core::cuda_device(0),
                               .batch_stage = stage});
    DataLoader cpu(augmented, {.batch_size = 8, .shuffle = true, .seed = 4, .batch_stage = stage});
    for (int64_t epoch : {0, 1}) {
      const int64_t batches = testing::compare_passes(gpu, cpu, epoch, [](const Batch& g, const Batch& c) {
        ASSERT_EQ(g.input.device(), core::cuda_device(0));
        EXPECT_EQ(g.input.to(core::kCpu).to_vector<float>(), c.input.to_vector<float>());
        EXPECT_EQ(g.target.to(core::kCpu).to_vector<float>(), c.target.to_vector<float>());
      });
      EXPECT_EQ(batches, 6);  // ceil(45 / 8)
    }
  }
  // Synthetic pixel keys through the loader: the GPU batches are the eager dataset's images.
  SyntheticImageOptions o{.size = 20, .image_shape = {3, 16, 16}, .num_classes = 10, .seed = 6};
  auto eager = std::make_shared<SyntheticImageDataset>(o);
  o.pixel_keys = true;
  DataLoader keyed(std::make_shared<SyntheticImageDataset>(o),
                   {.batch_size = 6,
                    .num_workers = 2,
                    .device = core::cuda_device(0),
                    .batch_stage = std::make_shared<SyntheticPixelStage>(o.image_shape, DType::f32)});
  DataLoader plain(eager, {.batch_size = 6});
  for (int64_t b = 0; b < 4; ++b) {
    std::optional<Batch> g = keyed.next(), c = plain.next();
    ASSERT_TRUE(g && c);
    expect_close_normals(g->input.to(core::kCpu), c->input);
    EXPECT_EQ(g->target.to(core::kCpu).to_vector<int64_t>(), c->target.to_vector<int64_t>());
  }
}

}  // namespace
}  // namespace colossal::data
