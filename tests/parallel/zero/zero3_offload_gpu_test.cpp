// ZeRO-3 with the optimizer offloaded on one GPU: the mixed-precision masters are made in host memory
// (Note [Masters on the host] in amp/mixed_precision_optimizer.cpp), so building the Engine never holds
// the model's f32 copy on the GPU beside its 16-bit one and ZeRO's chunks; and training equals ZeRO-3
// without offload on the same GPU (the same kernels forward and backward; the host's AdamW against the
// device's, both in f32).
#include <gtest/gtest.h>

#include <cmath>
#include <memory>
#include <vector>

#include "colossal/core/allocator.h"
#include "colossal/core/random.h"
#include "colossal/engine/engine.h"
#include "colossal/nn/activation.h"
#include "colossal/nn/linear.h"
#include "colossal/ops/nn_functional.h"
#include "colossal/optim/adam.h"
#include "colossal/parallel/zero/low_level_zero.h"  // ZeroOptions
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

std::unique_ptr<engine::Engine> zero3_engine(const std::shared_ptr<nn::Sequential>& model, bool offload) {
  optim::AdamOptions o = optim::adamw_defaults();
  o.lr = 1e-3;
  auto optimizer = std::make_shared<optim::AdamW>(model->parameters(), o);
  engine::EngineOptions options;
  options.amp = amp::AmpOptions::for_mode(amp::AmpMode::bf16);
  options.zero = ZeroOptions{.stage = 3, .offload_optimizer = offload, .chunk_bytes = int64_t{4} << 20};
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

}  // namespace
}  // namespace colossal::parallel::zero
