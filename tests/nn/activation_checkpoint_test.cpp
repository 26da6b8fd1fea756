// Activation checkpointing in the models (checkpoint_activations on GPT-2's and ViT's blocks and
// ResNet's residual blocks): two optimizer steps, the first accumulating two micro-batches, give
// the same losses, gradients, parameters and buffers as without it, bit for bit, with dropout and
// drop path drawing masks; in f64, f32, bf16 and f16; the recompute rewinds the generators and
// leaves them where the forward left them; no checkpointing in evaluation or without grad; and the
// activation memory kept from forward to backward, measured by the CPU allocator, shrinks.
//
// Why bit-equal: the recompute runs the same kernels on the same inputs in the same order with the
// same random draws, and each block input's gradient is the sum of the same two contributions (the
// residual path and the normalisation path), which floating-point addition gives alike in either
// order. A difference of one ulp would therefore be a real fault (a mask drawn differently, a
// buffer updated twice), not rounding.
#include <gtest/gtest.h>

#include <fmt/format.h>

#include <cmath>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "colossal/autograd/checkpoint.h"
#include "colossal/autograd/grad_mode.h"
#include "colossal/core/allocator.h"
#include "colossal/nn/models/gpt2.h"
#include "colossal/nn/models/resnet.h"
#include "colossal/nn/models/vit.h"
#include "colossal/ops.h"
#include "colossal/optim/adam.h"
#include "colossal/optim/sgd.h"

namespace colossal {
namespace {

using nn::models::GPT2;
using nn::models::GPT2Config;
using nn::models::ResNet;
using nn::models::ResNetConfig;
using nn::models::VisionTransformer;
using nn::models::ViTConfig;

/// What a short training run leaves: each micro-batch's loss, each step's gradients (after
/// accumulation) and the final state (parameters and buffers).
struct Trace {
  std::vector<double> losses;
  std::vector<std::map<std::string, Tensor>> grads;
  std::map<std::string, Tensor> state;
};

/// `micro_batches[s]` micro-batches in step s, each loss(step, micro) / micro_batches[s] backward,
/// then one AdamW update (SGD with momentum for f16 parameters, where AdamW's eps of 1e-8 is zero).
Trace train(nn::Module& model, const std::function<Tensor(int, int)>& loss, const std::vector<int>& micro_batches) {
  model.train();
  std::unique_ptr<optim::Optimizer> optimizer;
  if (model.parameters().front().dtype() == DType::f16) {
    optimizer = std::make_unique<optim::Sgd>(model.parameters(), optim::SgdOptions{.lr = 1e-2, .momentum = 0.9});
  } else {
    optimizer = std::make_unique<optim::AdamW>(model.parameters(), optim::AdamOptions{.lr = 1e-2, .weight_decay = 0.1});
  }
  Trace trace;
  for (size_t step = 0; step < micro_batches.size(); ++step) {
    optimizer->zero_grad();
    for (int micro = 0; micro < micro_batches[step]; ++micro) {
      Tensor l = loss(static_cast<int>(step), micro);
      trace.losses.push_back(l.item<double>());
      autograd::backward(l / static_cast<double>(micro_batches[step]));
    }
    std::map<std::string, Tensor> grads;
    for (const auto& [name, param] : model.named_parameters()) {
      grads[name] = param.grad().defined() ? param.grad().clone() : Tensor();
    }
    trace.grads.push_back(std::move(grads));
    optimizer->step();
  }
  for (const auto& [name, tensor] : model.state_dict()) trace.state[name] = tensor.clone();
  return trace;
}

/// Every element the same value (to_vector<double> is exact for every floating dtype).
void expect_identical(const Tensor& actual, const Tensor& expected, const std::string& what) {
  ASSERT_EQ(actual.defined(), expected.defined()) << what;
  if (!actual.defined()) return;
  ASSERT_EQ(actual.shape(), expected.shape()) << what;
  ASSERT_EQ(actual.dtype(), expected.dtype()) << what;
  const std::vector<double> a = actual.to_vector<double>(), e = expected.to_vector<double>();
  size_t differ = 0, first = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    if (a[i] != e[i] && differ++ == 0) first = i;
  }
  EXPECT_EQ(differ, 0u) << what << ": " << differ << " of " << a.size() << " elements differ, first at " << first
                        << " (" << a[first] << " vs " << e[first] << ")";
}

void expect_same_trace(const Trace& with, const Trace& without) {
  ASSERT_EQ(with.losses.size(), without.losses.size());
  for (size_t i = 0; i < with.losses.size(); ++i) EXPECT_EQ(with.losses[i], without.losses[i]) << "loss " << i;
  ASSERT_EQ(with.grads.size(), without.grads.size());
  for (size_t s = 0; s < with.grads.size(); ++s) {
    for (const auto& [name, grad] : without.grads[s]) {
      ASSERT_TRUE(with.grads[s].contains(name)) << name;
      expect_identical(with.grads[s].at(name), grad, fmt::format("step {} gradient of {}", s, name));
    }
  }
  for (const auto& [name, tensor] : without.state) {
    ASSERT_TRUE(with.state.contains(name)) << name;
    expect_identical(with.state.at(name), tensor, "final " + name);
  }
}

/// The largest difference between two traces' gradients: a run whose masks differ must show one,
/// so that the equality above could have failed.
double largest_gradient_difference(const Trace& a, const Trace& b) {
  double largest = 0.0;
  for (size_t s = 0; s < a.grads.size(); ++s) {
    for (const auto& [name, grad] : a.grads[s]) {
      const std::vector<double> x = grad.to_vector<double>(), y = b.grads[s].at(name).to_vector<double>();
      for (size_t i = 0; i < x.size(); ++i) largest = std::max(largest, std::abs(x[i] - y[i]));
    }
  }
  return largest;
}

// ---- GPT-2

GPT2Config gpt2_config(bool checkpoint) {
  GPT2Config config;
  config.vocab_size = 61;
  config.n_positions = 16;
  config.n_embd = 24;
  config.n_layer = 3;
  config.n_head = 4;
  config.dropout = 0.2;  // high enough that every block draws many dropped elements
  config.checkpoint_activations = checkpoint;
  return config;
}

Tensor random_ids(int64_t batch, int64_t tokens, int64_t vocab, uint64_t seed) {
  core::Generator gen(seed);
  return core::randint(0, vocab, {batch, tokens}, DType::i64, &gen);
}

/// GPT-2 in `dtype`, its dropout drawing from its own generator seeded `dropout_seed`.
Trace train_gpt2(bool checkpoint, DType dtype, uint64_t dropout_seed = 77) {
  core::Generator init(5), dropout(dropout_seed);
  GPT2 model(gpt2_config(checkpoint), &init, &dropout);
  model.to(dtype);
  EXPECT_EQ(model.h()->at<nn::models::GPT2Block>(0)->checkpoint_activations(), checkpoint);
  auto loss = [&](int step, int micro) {
    const uint64_t seed = 100 + 10 * static_cast<uint64_t>(step) + static_cast<uint64_t>(micro);
    const Tensor ids = random_ids(2, 12, 61, seed), targets = random_ids(2, 12, 61, seed + 1000);
    return nn::models::lm_cross_entropy(model.forward(ids).to(DType::f64), targets);
  };
  Trace trace = train(model, loss, {2, 1});
  trace.state["dropout generator offset"] = core::full({}, static_cast<double>(dropout.state().offset), DType::f64);
  return trace;
}

TEST(ActivationCheckpoint, GPT2WithDropoutEqualsTheRunWithoutIt) {
  for (DType dtype : {DType::f64, DType::f32}) {
    SCOPED_TRACE(fmt::format("{}", dtype));
    const Trace without = train_gpt2(false, dtype), with = train_gpt2(true, dtype);
    expect_same_trace(with, without);
    // The dropout masks matter at this size: other masks give other gradients.
    EXPECT_GT(largest_gradient_difference(train_gpt2(false, dtype, 78), without), 1e-4);
  }
}

TEST(ActivationCheckpoint, GPT2InHalfPrecisionEqualsTheRunWithoutIt) {
  // The bf16 and naive-fp16 modes train the model in its half dtype; the recompute runs the same
  // half-precision kernels, so the half-precision gradients are identical too.
  for (DType dtype : {DType::bf16, DType::f16}) {
    SCOPED_TRACE(fmt::format("{}", dtype));
    const Trace without = train_gpt2(false, dtype);
    for (double loss : without.losses) EXPECT_TRUE(std::isfinite(loss)) << loss;
    expect_same_trace(train_gpt2(true, dtype), without);
  }
}

TEST(ActivationCheckpoint, GPT2BlocksRecordOneCheckpointNodeOnlyWhileTrainingWithGrad) {
  core::Generator init(5), dropout(77);
  GPT2 model(gpt2_config(true), &init, &dropout);
  model.to(DType::f64);
  const auto block = model.h()->at<nn::models::GPT2Block>(1);
  Tensor x = core::randn({2, 5, 24}, DType::f64, &init);
  x.set_requires_grad(true);
  model.train();
  EXPECT_EQ(block->forward(x).grad_fn()->name(), "Checkpoint");
  {
    autograd::NoGradGuard no_grad;  // nothing to keep for backward: the plain forward
    EXPECT_FALSE(block->forward(x).requires_grad());
  }
  model.eval();  // evaluation: not checkpointed (as Hugging Face's), and no dropout
  const Tensor eval_out = block->forward(x);
  EXPECT_NE(eval_out.grad_fn()->name(), "Checkpoint");
  model.set_checkpoint_activations(false);
  EXPECT_FALSE(model.config().checkpoint_activations);
  expect_identical(block->forward(x), eval_out, "evaluation output without checkpointing");
  model.train();
  EXPECT_NE(block->forward(x).grad_fn()->name(), "Checkpoint");
}

TEST(ActivationCheckpoint, GPT2ForwardUnderNoGradIsTheSameWithOrWithout) {
  // Evaluation under no_grad with the switch on computes what it computes with it off.
  core::Generator init_a(5), init_b(5), drop_a(9), drop_b(9);
  GPT2 on(gpt2_config(true), &init_a, &drop_a), off(gpt2_config(false), &init_b, &drop_b);
  const Tensor ids = random_ids(2, 10, 61, 3);
  autograd::NoGradGuard no_grad;
  for (bool training : {true, false}) {
    on.train(training);
    off.train(training);
    expect_identical(on.forward(ids), off.forward(ids), training ? "training-mode logits" : "evaluation logits");
  }
}

// ---- ViT

ViTConfig vit_config(bool checkpoint) {
  ViTConfig config;
  config.img_size = 8;
  config.patch_size = 4;
  config.in_chans = 3;
  config.num_classes = 5;
  config.embed_dim = 16;
  config.depth = 3;
  config.num_heads = 2;
  config.drop_rate = 0.1;
  config.pos_drop_rate = 0.1;
  config.proj_drop_rate = 0.2;
  config.attn_drop_rate = 0.2;
  config.drop_path_rate = 0.4;  // blocks 1 and 2 drop whole samples' branches at 0.2 and 0.4
  config.checkpoint_activations = checkpoint;
  return config;
}

/// ViT with its dropout on the default generator (dropout_generator = nullptr), seeded here.
Trace train_vit(bool checkpoint, uint64_t dropout_seed = 31) {
  core::Generator init(6);
  VisionTransformer model(vit_config(checkpoint), &init);
  model.to(DType::f64);
  core::manual_seed(dropout_seed);
  auto loss = [&](int step, int micro) {
    core::Generator data(200 + 10 * static_cast<uint64_t>(step) + static_cast<uint64_t>(micro));
    const Tensor images = core::randn({4, 3, 8, 8}, DType::f64, &data);
    const Tensor labels = core::randint(0, 5, {4}, DType::i64, &data);
    return ops::cross_entropy(model.forward(images), labels);
  };
  Trace trace = train(model, loss, {2, 1});
  trace.state["default generator offset"] =
      core::full({}, static_cast<double>(core::default_generator().state().offset), DType::f64);
  return trace;
}

TEST(ActivationCheckpoint, ViTWithDropoutAndDropPathEqualsTheRunWithoutIt) {
  const Trace without = train_vit(false), with = train_vit(true);
  expect_same_trace(with, without);
  EXPECT_GT(largest_gradient_difference(train_vit(false, 32), without), 1e-4);
}

TEST(ActivationCheckpoint, ViTSwitchReachesEveryBlock) {
  VisionTransformer model(vit_config(false));
  model.set_checkpoint_activations(true);
  EXPECT_TRUE(model.config().checkpoint_activations);
  for (size_t i = 0; i < model.blocks()->size(); ++i) {
    EXPECT_TRUE(model.blocks()->at<nn::TransformerBlock>(i)->checkpoint_activations()) << i;
  }
}

// ---- ResNet

ResNetConfig resnet_config(bool checkpoint) {
  ResNetConfig config = ResNetConfig::resnet18(3);
  config.layers = {1, 2, 1, 1};
  config.width = 4;
  config.cifar_stem = true;
  config.checkpoint_activations = checkpoint;
  return config;
}

Trace train_resnet(const ResNetConfig& config) {
  core::Generator init(7);
  ResNet model(config, &init);
  model.to(DType::f64);
  auto loss = [&](int step, int micro) {
    core::Generator data(300 + 10 * static_cast<uint64_t>(step) + static_cast<uint64_t>(micro));
    const Tensor images = core::randn({4, 3, 8, 8}, DType::f64, &data);
    const Tensor labels = core::randint(0, 3, {4}, DType::i64, &data);
    return ops::cross_entropy(model.forward(images), labels);
  };
  Trace trace = train(model, loss, {2, 1});
  // The running statistics steer evaluation: its logits must agree too.
  model.eval();
  core::Generator data(999);
  trace.state["evaluation logits"] = model.forward(core::randn({2, 3, 8, 8}, DType::f64, &data)).detach();
  return trace;
}

TEST(ActivationCheckpoint, ResNetEqualsTheRunWithoutItRunningStatisticsIncluded) {
  // The state compared includes every BatchNorm's running_mean, running_var and
  // num_batches_tracked: the recompute must not update them a second time.
  for (auto block : {nn::models::ResNetBlockKind::basic, nn::models::ResNetBlockKind::bottleneck}) {
    SCOPED_TRACE(block == nn::models::ResNetBlockKind::basic ? "basic" : "bottleneck");
    ResNetConfig without = resnet_config(false), with = resnet_config(true);
    without.block = with.block = block;
    const Trace plain = train_resnet(without), checkpointed = train_resnet(with);
    expect_same_trace(checkpointed, plain);
    EXPECT_EQ(checkpointed.state.at("layer1.0.bn1.num_batches_tracked").item<double>(), 3.0);
  }
}

TEST(ActivationCheckpoint, BatchNormLeavesRunningStatisticsAloneWhileRecomputing) {
  // Directly: a checkpointed segment holding a BatchNorm updates its statistics once per forward.
  nn::BatchNorm2d bn(3);
  bn.to(DType::f64);
  core::Generator gen(4);
  Tensor x = core::randn({4, 3, 2, 2}, DType::f64, &gen);
  x.set_requires_grad(true);
  Tensor out = autograd::checkpoint([&bn](const Tensor& in) { return bn.forward(in); }, x);
  const Tensor mean_after_forward = bn.buffer("running_mean").clone();
  EXPECT_FALSE(autograd::is_recomputing());
  autograd::backward(ops::sum(out * out));
  expect_identical(bn.buffer("running_mean"), mean_after_forward, "running_mean after the recompute");
  EXPECT_EQ(bn.buffer("num_batches_tracked").item<double>(), 1.0);
  EXPECT_TRUE(x.grad().defined());
}

// ---- memory

/// Bytes the CPU allocator holds after a training forward, beyond what it held before: what the
/// graph keeps for backward (plus the logits), and the peak over forward and backward.
struct ActivationBytes {
  int64_t kept_after_forward = 0;
  int64_t peak = 0;
};

ActivationBytes measure_gpt2(bool checkpoint) {
  GPT2Config config = gpt2_config(checkpoint);
  config.n_layer = 6;
  config.n_embd = 64;
  config.n_positions = 64;
  core::Generator init(5), dropout(77);
  GPT2 model(config, &init, &dropout);
  model.train();
  const Tensor ids = random_ids(4, 64, 61, 1), targets = random_ids(4, 64, 61, 2);
  const Device cpu{};
  const int64_t before = core::memory_stats(cpu).allocated_bytes;
  core::reset_peak_memory(cpu);
  ActivationBytes bytes;
  {
    Tensor loss = nn::models::lm_cross_entropy(model.forward(ids), targets);
    bytes.kept_after_forward = core::memory_stats(cpu).allocated_bytes - before;
    autograd::backward(loss);
  }
  bytes.peak = core::memory_stats(cpu).peak_allocated_bytes - before;
  return bytes;
}

TEST(ActivationCheckpoint, GPT2KeepsLessActivationMemoryFromForwardToBackward) {
  const ActivationBytes without = measure_gpt2(false), with = measure_gpt2(true);
  // Reported for docs/design.md and the issue: f32, 6 blocks, B4 T64 C64, vocabulary 61.
  std::printf(
      "GPT-2 6 x 64 wide, B4 T64, f32: kept after forward %.1f KiB without, %.1f KiB with checkpointing; peak "
      "over the step %.1f KiB without, %.1f KiB with\n",
      without.kept_after_forward / 1024.0, with.kept_after_forward / 1024.0, without.peak / 1024.0, with.peak / 1024.0);
  // With checkpointing a block keeps its input [B, T, C] (64 KiB here) and its output, the next
  // block's input; without, it keeps its layer norms' outputs and statistics, q, k, v, the
  // attention probabilities and their dropout mask, the MLP's 4C-wide hidden activation and the
  // dropout masks: over ten times as much. Outside the blocks (embeddings, logits, the loss) both
  // keep the same. A factor 3 on the total leaves room for those.
  EXPECT_LT(with.kept_after_forward * 3, without.kept_after_forward);
  EXPECT_LT(with.peak, without.peak);
}

}  // namespace
}  // namespace colossal
