// StepTiming on a GPU (label gpu): an Engine asked to time every step records the phases of each
// optimizer step, and their averages are positive and add up to no more than the step.
#include <gtest/gtest.h>

#include <memory>

#include "colossal/core/cuda_device.h"
#include "colossal/core/random.h"
#include "colossal/engine/engine.h"
#include "colossal/nn/activation.h"
#include "colossal/nn/linear.h"
#include "colossal/nn/module.h"
#include "colossal/ops/nn_functional.h"
#include "colossal/optim/sgd.h"

namespace colossal::engine {
namespace {

TEST(StepTimingGpu, PhasesOfEveryStepAddUpWithinTheStep) {
  if (!core::cuda::is_available()) GTEST_SKIP() << "needs a GPU";
  const Device gpu(core::DeviceType::cuda, 0);
  core::Generator init(3);
  auto model = std::make_shared<nn::Sequential>(std::initializer_list<std::shared_ptr<nn::Module>>{
      std::make_shared<nn::Linear>(64, 256, true, &init), std::make_shared<nn::GELU>(),
      std::make_shared<nn::Linear>(256, 10, true, &init)});
  model->to(gpu);
  auto sgd = std::make_shared<optim::Sgd>(model->parameters(), optim::SgdOptions{.lr = 0.1});
  EngineOptions options;
  options.step_timing_interval = 1;
  options.gradient_accumulation = 2;
  Engine engine(model, sgd, [](const Tensor& out, const Tensor& y) { return ops::cross_entropy(out, y); }, options);
  ASSERT_NE(engine.step_timing(), nullptr);
  core::Generator data(5);
  for (int i = 0; i < 8; ++i) {  // 4 optimizer steps of 2 micro-steps
    Tensor x = core::randn({32, 64}, {}, &data).to(gpu);
    Tensor y = core::randint(0, 10, {32}, DType::i64, &data).to(gpu);
    engine.step(x, y);
  }
  const StepTiming::Summary s = engine.step_timing()->summary();
  EXPECT_EQ(s.samples, 4);
  EXPECT_GT(s.forward_backward_ms, 0.0);
  EXPECT_GE(s.exposed_reduction_ms, 0.0);  // no gradient handler: nothing to wait for
  EXPECT_GT(s.update_ms, 0.0);
  EXPECT_GT(s.step_ms, 0.0);
  EXPECT_LE(s.forward_backward_ms + s.exposed_reduction_ms + s.update_ms, s.step_ms * 1.001 + 0.01);
}

}  // namespace
}  // namespace colossal::engine
