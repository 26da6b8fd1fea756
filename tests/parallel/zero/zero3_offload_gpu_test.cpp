// ZeRO-3 with the optimizer offloaded on one GPU: the mixed-precision masters are made in host memory
// (Note [Masters on the host] in amp/mixed_precision_optimizer.cpp), so building the Engine never holds
// the model's f32 copy on the GPU beside its 16-bit one and ZeRO's chunks; and training equals ZeRO-3
// without offload on the same GPU (the same kernels forward and backward; the host's AdamW against the
// device's, both in f32). And "auto" placement pins no more host memory than "cpu": a device shard's
// update is staged in the chunk manager's pinned buffer of it, giving "cpu"'s parameters bit for bit.
#include <gtest/gtest.h>

#include <cmath>
#include <memory>
#include <optional>
#include <vector>

#include "colossal/core/allocator.h"
#include "colossal/core/cuda_device.h"  // is_pinned
#include "colossal/core/random.h"
#include "colossal/engine/engine.h"
#include "colossal/nn/activation.h"
#include "colossal/nn/linear.h"
#include "colossal/ops/nn_functional.h"
#include "colossal/optim/adam.h"
#include "colossal/parallel/zero/low_level_zero.h"  // ZeroOptions
#include "colossal/parallel/zero/zero3.h"
#include "gpu_compare.h"

namespace colossal::parallel::zero {
namespace {

constexpr int64_t kWidth = 1024, kHidden = 2048;  // 4.2M parameters: 16.8 MB in f32, 8.4 MB in bf16

std::shared_ptr<nn::Sequential> model_on(Device device) {
  core::Generator init(11);
  auto model = std::make_shared<nn::Sequential>(std::initializer_list<std::shared_ptr<nn::Module>>{
      std::make_shared<nn::Linear>(kWidth, kHidden, true, &init), std::make_shared<nn::GELU>(),
      std::make_shared<nn::Linear>(kHidden, kWidth, true, &init)});
  model->to(device);
  return model;
}

std::unique_ptr<engine::Engine> zero3_engine(const std::shared_ptr<nn::Sequential>& model, bool offload,
                                             Placement placement = Placement::cuda,
                                             std::optional<int64_t> device_budget_bytes = std::nullopt) {
  optim::AdamOptions o = optim::adamw_defaults();
  o.lr = 1e-3;
  auto optimizer = std::make_shared<optim::AdamW>(model->parameters(), o);
  engine::EngineOptions options;
  options.amp = amp::AmpOptions::for_mode(amp::AmpMode::bf16);
  options.zero = ZeroOptions{.stage = 3,
                             .offload_optimizer = offload,
                             .chunk_bytes = int64_t{4} << 20,
                             .placement = placement,
                             .device_budget_bytes = device_budget_bytes};
  engine::Criterion criterion = [](const Tensor& out, const Tensor& y) { return ops::cross_entropy(out, y); };
  return std::make_unique<engine::Engine>(model, optimizer, criterion, options);
}

TEST(Zero3OffloadGpu, TheMastersAreMadeOnTheHostAndTrainingEqualsTheDeviceStep) {
  COLOSSAL_REQUIRE_GPU();
  const Device gpu = core::cuda_device(0);
  int64_t psi = 0;
  auto model = model_on(gpu);
  for (const Tensor& p : model->parameters()) psi += p.numel();
  const int64_t f32_model = core::memory_stats(gpu).allocated_bytes;
  ASSERT_GE(f32_model, 4 * psi);
  core::reset_peak_memory(gpu);
  auto offloaded = zero3_engine(model, /*offload=*/true);
  // The f32 model (4 Psi) and its bf16 copy (2 Psi) meet once; ZeRO's chunks (2 Psi) come after the f32
  // copy is gone. Had the masters stayed on the GPU until ZeRO took them, the peak would be 8 Psi.
  const int64_t peak = core::memory_stats(gpu).peak_allocated_bytes;
  EXPECT_LE(peak, f32_model + 3 * psi) << "Psi = " << psi;
  for (const Tensor& master : offloaded->amp()->master_params()) EXPECT_TRUE(master.device().is_cpu());

  auto device_model = model_on(gpu);
  auto on_device = zero3_engine(device_model, /*offload=*/false);
  core::Generator data(5);
  for (int step = 0; step < 3; ++step) {
    std::vector<int64_t> labels;
    for (int64_t i = 0; i < 16; ++i) labels.push_back((i * 37 + step) % kWidth);
    const Tensor x = core::randn({16, kWidth}, {}, &data).to(gpu);
    const Tensor y = core::from_vector<int64_t>(labels, {16}).to(gpu);
    const double a = offloaded->step(x, y).item<double>(), b = on_device->step(x, y).item<double>();
    EXPECT_NEAR(a, b, 1e-3 * std::abs(b)) << "step " << step;
  }
}

// Note [ZeRO-3 offload] in zero3.cpp: under "auto" a device shard's update goes through the chunk
// manager's pinned spare buffer of it, not a staging buffer of the offload's own beside it, so every
// chunk holds one pinned host buffer under every placement. The chunks (bf16): w1 (4 MiB), b1, w2
// (4 MiB), b2; "auto"'s budget of 6 MiB keeps the most recently used that fit (after backward: b1,
// w1, then the small b2) and evicts w2, so both kinds of chunk are there. bf16 without clipping: the
// worker thread steps each chunk during backward. The parameters equal "cpu"'s bit for bit: the same
// host AdamW on the same gradients, and a gather from a host shard carries the bits a gather from a
// device shard does into the same kernels.
TEST(Zero3OffloadGpu, AutoPinsWhatCpuPinsAndUpdatesThroughTheChunksHostBuffersAsCpu) {
  COLOSSAL_REQUIRE_GPU();
  const Device gpu = core::cuda_device(0);
  struct Run {
    Placement placement;
    std::optional<int64_t> budget;
    std::shared_ptr<nn::Sequential> model;
    std::unique_ptr<engine::Engine> engine;
    std::vector<double> losses;
  };
  std::vector<Run> runs;
  for (auto [placement, budget] : std::vector<std::pair<Placement, std::optional<int64_t>>>{
           {Placement::cpu, std::nullopt}, {Placement::auto_, int64_t{6} << 20}, {Placement::cuda, std::nullopt}}) {
    Run run{placement, budget, model_on(gpu), nullptr, {}};
    run.engine = zero3_engine(run.model, /*offload=*/true, placement, budget);
    runs.push_back(std::move(run));
  }
  int64_t psi = 0;
  for (const Tensor& p : runs.front().model->parameters()) psi += p.numel();

  core::Generator data(5);
  for (int step = 0; step < 4; ++step) {
    std::vector<int64_t> labels;
    for (int64_t i = 0; i < 16; ++i) labels.push_back((i * 37 + step) % kWidth);
    const Tensor x = core::randn({16, kWidth}, {}, &data).to(gpu);
    const Tensor y = core::from_vector<int64_t>(labels, {16}).to(gpu);
    for (Run& run : runs) {
      SCOPED_TRACE(::testing::Message() << "placement " << static_cast<int>(run.placement) << ", step " << step);
      run.losses.push_back(run.engine->step(x, y).item<double>());
      const auto& zero = dynamic_cast<const Zero3&>(*run.engine->zero());
      const ChunkManager& chunks = zero.chunks();
      const HostOffload& offload = *zero.offload();
      int device_chunks = 0, host_chunks = 0;
      for (size_t c = 0; c < chunks.num_chunks(); ++c) {
        const Tensor buffer = offload.output_buffer(c);
        ASSERT_TRUE(buffer.defined());
        EXPECT_TRUE(core::cuda::is_pinned(buffer)) << "chunk " << c;
        if (chunks.place(c) == ShardPlace::device) {
          ++device_chunks;
          EXPECT_TRUE(offload.output_copied_to_device(c));
          EXPECT_EQ(buffer.raw_data(), chunks.spare_host_buffer(c).raw_data()) << "chunk " << c;
        } else {
          ++host_chunks;
          EXPECT_FALSE(offload.output_copied_to_device(c));
          EXPECT_EQ(buffer.raw_data(), chunks.shard(c).raw_data()) << "chunk " << c;
        }
      }
      if (run.placement == Placement::auto_) {
        EXPECT_GT(device_chunks, 0);
        EXPECT_GT(host_chunks, 0);
      }
      // One rank: the shards are the whole chunks, unpadded. f32 masters and host gradient (8 Psi,
      // the offload's own, with no staging of its own), and each chunk's one bf16 buffer (2 Psi).
      EXPECT_EQ(offload.pinned_bytes(), 8 * psi);
      EXPECT_EQ(zero.pinned_host_bytes(), 10 * psi);
      EXPECT_EQ(chunks.stats().host_shard_bytes + chunks.stats().spare_host_bytes, 2 * psi);
      EXPECT_EQ(zero.pinned_host_bytes(), dynamic_cast<const Zero3&>(*runs.front().engine->zero()).pinned_host_bytes())
          << "as \"cpu\"";
    }
  }
  const Run& cpu = runs.front();
  const nn::StateDict cpu_state = cpu.engine->zero()->gather_model_state(cpu.model->state_dict());
  for (size_t r = 1; r < runs.size(); ++r) {
    SCOPED_TRACE(::testing::Message() << "placement " << static_cast<int>(runs[r].placement));
    EXPECT_EQ(runs[r].losses, cpu.losses);
    const nn::StateDict state = runs[r].engine->zero()->gather_model_state(runs[r].model->state_dict());
    for (const auto& [name, p] : cpu_state) {
      EXPECT_EQ(state.at(name).to_vector<float>(), p.to_vector<float>()) << name;
    }
  }
}

}  // namespace
}  // namespace colossal::parallel::zero
