// The three model families on the GPU: forward and backward in bf16 (and f32) from the same weights
// and inputs as the CPU in f32, the losses equal within the bf16 tolerance and every parameter's
// gradient finite and non-zero on the GPU.
//
// Tolerance: bf16 keeps 8 significant bits (relative rounding 2^-9 per value). Through a few layers
// of GEMMs, layer norms and softmaxes the logits drift by a few of those roundings each, and the
// loss, a mean over many rows, averages much of that out: 2e-2 relative on the loss leaves margin
// over the ~5e-3 seen for such depths, and is still far below a wrong formula's error (O(1)). f32 on
// the GPU differs from the CPU only by summation order and TF32 GEMMs (10-bit inputs): 5e-3.
#include <gtest/gtest.h>

#include <cmath>
#include <functional>
#include <memory>

#include "colossal/nn/models/gpt2.h"
#include "colossal/nn/models/resnet.h"
#include "colossal/nn/models/vit.h"
#include "gpu_compare.h"
#include "model_test_util.h"

namespace colossal {
namespace {

/// Builds the same model twice (same seed), runs `loss_of` on the CPU in f32 and on the GPU in
/// `dtype`, and compares the losses; then checks every GPU gradient.
void check_model_on_gpu(const char* name, const std::function<std::shared_ptr<nn::Module>()>& build,
                        const std::function<Tensor(nn::Module&, Device, DType)>& loss_of, DType dtype, double rtol) {
  SCOPED_TRACE(fmt::format("{} in {}", name, dtype));
  auto cpu_model = build();
  const Tensor cpu_loss = loss_of(*cpu_model, core::kCpu, DType::f32);
  auto gpu_model = build();
  gpu_model->to(core::cuda_device(0));
  gpu_model->to(dtype);
  const Tensor gpu_loss = loss_of(*gpu_model, core::cuda_device(0), dtype);
  autograd::backward(gpu_loss);
  const double expected = cpu_loss.to(DType::f64).item<double>();
  const double actual = gpu_loss.to(core::kCpu).to(DType::f64).item<double>();
  EXPECT_TRUE(std::isfinite(actual));
  EXPECT_NEAR(actual, expected, rtol * std::abs(expected)) << name;
  testing::expect_finite_nonzero_grads(*gpu_model);
}

Tensor ids_tensor(int64_t batch, int64_t tokens, int64_t vocab, uint64_t seed) {
  core::Generator g(seed);
  return core::randint(0, vocab, {batch, tokens}, TensorOptions(DType::i64), &g);
}

TEST(ModelsGpu, Gpt2ForwardBackward) {
  COLOSSAL_REQUIRE_GPU();
  nn::models::GPT2Config config;
  config.vocab_size = 1000;
  config.n_positions = 64;
  config.n_embd = 128;
  config.n_layer = 2;
  config.n_head = 4;
  config.dropout = 0.0;
  config.vocab_multiple = 64;
  const Tensor ids = ids_tensor(4, 64, config.vocab_size, 1), targets = ids_tensor(4, 64, config.vocab_size, 2);
  auto build = [&] {
    core::Generator g(7);
    return std::static_pointer_cast<nn::Module>(std::make_shared<nn::models::GPT2>(config, &g));
  };
  auto loss = [&](nn::Module& m, Device device, DType) {
    return nn::models::lm_cross_entropy(m.forward(ids.to(device)), targets.to(device));
  };
  check_model_on_gpu("gpt2", build, loss, DType::f32, 5e-3);
  check_model_on_gpu("gpt2", build, loss, DType::bf16, 2e-2);
}

TEST(ModelsGpu, VitForwardBackward) {
  COLOSSAL_REQUIRE_GPU();
  nn::models::ViTConfig config = nn::models::ViTConfig::vit_tiny_patch4_32(10);
  config.depth = 2;
  core::Generator data(3);
  const Tensor images = core::randn({8, 3, 32, 32}, DType::f32, &data);
  const Tensor labels = core::randint(0, 10, {8}, TensorOptions(DType::i64), &data);
  auto build = [&] {
    core::Generator g(8);
    return std::static_pointer_cast<nn::Module>(std::make_shared<nn::models::VisionTransformer>(config, &g));
  };
  auto loss = [&](nn::Module& m, Device device, DType dtype) {
    return ops::cross_entropy(m.forward(images.to(device).to(dtype)), labels.to(device));
  };
  check_model_on_gpu("vit", build, loss, DType::f32, 5e-3);
  check_model_on_gpu("vit", build, loss, DType::bf16, 2e-2);
}

TEST(ModelsGpu, ResNetForwardBackward) {
  COLOSSAL_REQUIRE_GPU();
  nn::models::ResNetConfig config = nn::models::ResNetConfig::resnet18(10);
  config.cifar_stem = true;
  core::Generator data(4);
  const Tensor images = core::randn({8, 3, 32, 32}, DType::f32, &data);
  const Tensor labels = core::randint(0, 10, {8}, TensorOptions(DType::i64), &data);
  auto build = [&] {
    core::Generator g(9);
    return std::static_pointer_cast<nn::Module>(std::make_shared<nn::models::ResNet>(config, &g));
  };
  auto loss = [&](nn::Module& m, Device device, DType dtype) {
    return ops::cross_entropy(m.forward(images.to(device).to(dtype)), labels.to(device));
  };
  check_model_on_gpu("resnet18", build, loss, DType::f32, 5e-3);
  check_model_on_gpu("resnet18", build, loss, DType::bf16, 2e-2);
  // channels_last: cuDNN's NHWC convolutions and the nhwc batch norm on the GPU against the CPU
  // (whose nhwc ops are the nchw kernels between transposes), from the same weights.
  config.channels_last = true;
  check_model_on_gpu("resnet18 channels_last", build, loss, DType::f32, 5e-3);
  check_model_on_gpu("resnet18 channels_last", build, loss, DType::bf16, 2e-2);
}

}  // namespace
}  // namespace colossal
