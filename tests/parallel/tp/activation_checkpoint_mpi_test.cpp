// Activation checkpointing under 1D tensor parallelism on MPI ranks (the world as the tensor group,
// 2 and 4 ranks): a ParallelGPT2 (also with sequence parallelism) and a ParallelViT built from a
// serial model whose blocks checkpoint, trained with dropout on, give on every rank the same losses
// and the same gradients of its shards as the same tensor-parallel model built without it, bit for
// bit, over two AdamW steps (the first accumulating two micro-batches). That needs both generators
// (the data one, alike on every rank, and the tensor-parallel one, per rank) rewound for the
// recompute, and the block's collectives issued again in backward in the same order on every rank
// (a rank out of step would hang on the collective's timeout, or sum the wrong tensors). Then the
// layout harness at tp = world and, at 4 ranks, dp2 x tp2 with accumulation, clipping and bf16:
// the checkpointed layout equals the (checkpointed) serial model, within the harness's tolerances.
//
// Why bit-equal against the run without it: see tests/nn/activation_checkpoint_test.cpp; the
// collectives add nothing new, since the recompute sums the same partial results in the same order.
#include <gtest/gtest.h>

#include <fmt/format.h>

#include <map>
#include <memory>
#include <string>
#include <vector>

#include "../../comm/mpi_test_main.h"
#include "colossal/autograd/engine.h"
#include "colossal/nn/models/gpt2.h"
#include "colossal/nn/models/vit.h"
#include "colossal/ops/nn_functional.h"  // cross_entropy
#include "colossal/optim/adam.h"
#include "colossal/parallel/tp/gpt2_1d.h"
#include "colossal/parallel/tp/random.h"
#include "colossal/parallel/tp/vit_1d.h"
#include "layout_harness.h"
#include "tp_test_util.h"

namespace colossal::parallel::tp {
namespace {

using comm::testing::world;
using testing::tp_group;

struct Trace {
  std::vector<double> losses;
  std::vector<std::map<std::string, Tensor>> grads;  ///< this rank's shards, per step
  std::map<std::string, Tensor> params;              ///< after the last step
};

/// Two AdamW steps of `model`, the first over two micro-batches: loss(step, micro) each.
Trace train(nn::Module& model, const std::function<Tensor(int, int)>& loss) {
  model.train();
  optim::AdamW optimizer(model.parameters(), {.lr = 1e-2, .weight_decay = 0.1});
  Trace trace;
  const std::vector<int> micro_batches = {2, 1};
  for (size_t step = 0; step < micro_batches.size(); ++step) {
    optimizer.zero_grad();
    for (int micro = 0; micro < micro_batches[step]; ++micro) {
      Tensor l = loss(static_cast<int>(step), micro);
      trace.losses.push_back(l.item<double>());
      autograd::backward(l / static_cast<double>(micro_batches[step]));
    }
    std::map<std::string, Tensor> grads;
    for (const auto& [name, param] : model.named_parameters()) grads[name] = param.grad().clone();
    trace.grads.push_back(std::move(grads));
    optimizer.step();
  }
  for (const auto& [name, param] : model.named_parameters()) trace.params[name] = param.detach().clone();
  return trace;
}

void expect_identical(const Tensor& actual, const Tensor& expected, const std::string& what) {
  ASSERT_EQ(actual.defined(), expected.defined()) << what;
  if (!actual.defined()) return;
  ASSERT_EQ(actual.shape(), expected.shape()) << what;
  const std::vector<double> a = actual.to_vector<double>(), e = expected.to_vector<double>();
  size_t differ = 0;
  for (size_t i = 0; i < a.size(); ++i) differ += a[i] != e[i] ? 1 : 0;
  EXPECT_EQ(differ, 0u) << what << ": " << differ << " of " << a.size() << " elements differ on rank "
                        << world().rank();
}

void expect_same_trace(const Trace& with, const Trace& without) {
  ASSERT_EQ(with.losses.size(), without.losses.size());
  for (size_t i = 0; i < with.losses.size(); ++i) EXPECT_EQ(with.losses[i], without.losses[i]) << "loss " << i;
  for (size_t s = 0; s < without.grads.size(); ++s) {
    for (const auto& [name, grad] : without.grads[s]) {
      ASSERT_TRUE(with.grads[s].contains(name)) << name;
      expect_identical(with.grads[s].at(name), grad, fmt::format("step {} gradient of {}", s, name));
    }
  }
  for (const auto& [name, param] : without.params) expect_identical(with.params.at(name), param, "final " + name);
}

Tensor tokens(int64_t batch, int64_t length, int64_t vocab, uint64_t salt) {
  std::vector<int64_t> v;
  for (int64_t i = 0; i < batch * length; ++i) v.push_back((i * 7 + static_cast<int64_t>(salt) * 5 + 3) % vocab);
  return core::from_vector<int64_t>(v, {batch, length});
}

/// GPT-2 with dropout 0.3 split over the world, its generators seeded as TrainingRun seeds them.
Trace train_gpt2(bool checkpoint, bool sequence_parallel) {
  nn::models::GPT2Config config;
  config.vocab_size = 32;
  config.n_positions = 8;
  config.n_embd = 16;
  config.n_layer = 2;
  config.n_head = 4;  // splits over 2 and 4 ranks
  config.dropout = 0.3;
  config.checkpoint_activations = checkpoint;
  core::Generator init(5);
  nn::models::GPT2 serial(config, &init);
  serial.to(DType::f64);
  core::Generator data(100), tensor(100 + kTensorParallelSeedOffset + static_cast<uint64_t>(world().rank()));
  ParallelGPT2 model(
      serial, tp_group(),
      ParallelGPT2Options{.dropout = {.data = &data, .tensor = &tensor}, .sequence_parallel = sequence_parallel});
  EXPECT_EQ(model.h()->at<ParallelGPT2Block>(0)->checkpoint_activations(), checkpoint);
  Trace trace = train(model, [&](int step, int micro) {
    const uint64_t salt = static_cast<uint64_t>(3 * step + micro);
    const Tensor out = model.forward(tokens(2, 8, 32, salt));
    return model.loss(out, tokens(2, 8, 32, salt + 11));
  });
  // Both streams advanced exactly as without checkpointing.
  trace.params["data generator offset"] = core::full({}, static_cast<double>(data.state().offset), DType::f64);
  trace.params["tensor generator offset"] = core::full({}, static_cast<double>(tensor.state().offset), DType::f64);
  return trace;
}

TEST(TensorParallelActivationCheckpoint, Gpt2EqualsTheRunWithoutIt) {
  expect_same_trace(train_gpt2(true, false), train_gpt2(false, false));
}

TEST(TensorParallelActivationCheckpoint, SequenceParallelGpt2EqualsTheRunWithoutIt) {
  expect_same_trace(train_gpt2(true, true), train_gpt2(false, true));
}

Trace train_vit(bool checkpoint) {
  nn::models::ViTConfig config;
  config.img_size = 8;
  config.patch_size = 4;
  config.in_chans = 1;
  config.num_classes = 3;
  config.embed_dim = 16;
  config.depth = 2;
  config.num_heads = 4;
  config.pos_drop_rate = 0.1;
  config.proj_drop_rate = 0.2;
  config.attn_drop_rate = 0.2;
  config.drop_path_rate = 0.3;
  config.checkpoint_activations = checkpoint;
  core::Generator init(9);
  nn::models::VisionTransformer serial(config, &init);
  serial.to(DType::f64);
  core::Generator data(300), tensor(300 + kTensorParallelSeedOffset + static_cast<uint64_t>(world().rank()));
  ParallelViT model(serial, tp_group(), ParallelViTOptions{.dropout = {.data = &data, .tensor = &tensor}});
  EXPECT_EQ(model.blocks()->at<ParallelViTBlock>(1)->checkpoint_activations(), checkpoint);
  return train(model, [&](int step, int micro) {
    std::vector<double> pixels;
    std::vector<int64_t> labels;
    for (int64_t i = 0; i < 4 * 64; ++i) pixels.push_back(std::sin(0.37 * static_cast<double>(i) + 3 * step + micro));
    for (int64_t i = 0; i < 4; ++i) labels.push_back((i + step + micro) % 3);
    return ops::cross_entropy(model.forward(core::from_vector(pixels, {4, 1, 8, 8}, DType::f64)),
                              core::from_vector(labels, {4}, DType::i64));
  });
}

TEST(TensorParallelActivationCheckpoint, VitEqualsTheRunWithoutIt) {
  expect_same_trace(train_vit(true), train_vit(false));
}

// ---- the layout harness: checkpointed layouts against the serial model

std::shared_ptr<comm::ProcessGroup> world_group() {
  return std::shared_ptr<comm::ProcessGroup>(&world(), [](comm::ProcessGroup*) {});
}

/// `c` with the serial model's blocks checkpointing; the tensor-parallel model made from it
/// inherits the switch block by block.
::colossal::testing::HarnessCase checkpointed(::colossal::testing::HarnessCase c) {
  c.name += " checkpointed";
  auto build = c.build_model;
  c.build_model = [build](core::Generator& init) {
    std::shared_ptr<nn::Module> model = build(init);
    if (auto gpt2 = std::dynamic_pointer_cast<nn::models::GPT2>(model)) gpt2->set_checkpoint_activations(true);
    if (auto vit = std::dynamic_pointer_cast<nn::models::VisionTransformer>(model))
      vit->set_checkpoint_activations(true);
    return model;
  };
  return c;
}

void expect_layout(const ::colossal::testing::HarnessCase& c, const ::colossal::testing::Layout& layout) {
  const auto report = ::colossal::testing::expect_layout_matches_serial(c, layout, world_group());
  EXPECT_GT(report.compared_tensors, 0);
  if (world().rank() == 0) {
    std::printf("%s %s: max relative difference loss %.2e, gradient %.2e (%s), parameter %.2e (%s)\n", c.name.c_str(),
                layout.name().c_str(), report.loss, report.grad, report.worst_grad.c_str(), report.param,
                report.worst_param.c_str());
  }
}

TEST(TensorParallelActivationCheckpoint, LayoutHarnessGpt2AndVitAtTensorParallelWorld) {
  // The harness's f32 tolerance (layout_harness.cpp), with accumulation and a clip below the norm.
  for (bool sequence_parallel : {false, true}) {
    auto c = checkpointed(::colossal::testing::gpt2_tp_case(sequence_parallel));
    c.accumulation = 2;
    c.clip = 0.1;
    expect_layout(c, {.tensor = world().size()});
  }
  auto vit = checkpointed(::colossal::testing::vit_tp_case());
  vit.accumulation = 2;
  expect_layout(vit, {.tensor = world().size()});
}

TEST(TensorParallelActivationCheckpoint, LayoutHarnessDataTimesTensorParallelGpt2Bf16) {
  if (world().size() != 4) GTEST_SKIP() << "dp2 x tp2 needs 4 ranks";
  // Data parallelism's bucket all-reduces launch from grad-ready hooks while the recompute's tensor
  // collectives run inside backward: both must stay paired. bf16 with fp32 masters; 3e-2 is the
  // bf16 tolerance of layout_equivalence_mpi_test.cpp (DataParallelGpt2Bf16), for the same reasons.
  auto c = checkpointed(::colossal::testing::gpt2_tp_case());
  c.accumulation = 2;
  c.clip = 0.1;
  expect_layout(c, {.data = 2, .tensor = 2});
  c.precision = ::colossal::testing::Precision::bf16;
  c.tolerance = 3e-2;
  expect_layout(c, {.data = 2, .tensor = 2});
}

}  // namespace
}  // namespace colossal::parallel::tp

int main(int argc, char** argv) {
  return colossal::comm::testing::run_mpi_tests(argc, argv);
}
