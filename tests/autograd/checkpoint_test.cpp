// autograd::checkpoint beyond the basics of autograd_test.cpp: the generators a segment names are
// rewound for the recompute and restored after it (also when the recompute throws), the default
// generator always; microbatches whose forwards all run before their backwards (a pipeline's
// order) each recompute with their own draws; is_recomputing() holds exactly during a recompute,
// also nested; a segment whose only grad-requiring tensors are parameters inside it still gives
// them gradients; with grad mode off nothing is recorded.
#include <gtest/gtest.h>

#include <stdexcept>
#include <vector>

#include "colossal/autograd/checkpoint.h"
#include "colossal/autograd/engine.h"
#include "colossal/autograd/grad_mode.h"
#include "colossal/core/random.h"
#include "colossal/ops.h"
#include "gradcheck.h"  // expect_close

namespace colossal {
namespace {

using testing::expect_close;

Tensor leaf(const Shape& shape, uint64_t seed) {
  core::Generator gen(seed);
  Tensor t = core::randn(shape, DType::f64, &gen);
  t.set_requires_grad(true);
  return t;
}

/// in * mask with the mask drawn from `gen`; `mask_seen` keeps the last one drawn.
autograd::Segment masked(core::Generator* gen, Tensor& mask_seen) {
  return [gen, &mask_seen](const std::vector<Tensor>& in) {
    Tensor mask = core::rand(in[0].shape(), DType::f64, gen);
    mask_seen = mask;
    return std::vector<Tensor>{in[0] * mask};
  };
}

TEST(CheckpointGenerators, NamedGeneratorsAreRewoundAndRestored) {
  core::Generator a(11), b(12);
  Tensor x = leaf({32}, 1), mask_a, mask_b;
  auto segment = [&](const std::vector<Tensor>& in) {
    const Tensor first = masked(&a, mask_a)(in)[0];
    return masked(&b, mask_b)({first});
  };
  Tensor out = autograd::checkpoint(segment, {x}, {.generators = {&a, nullptr, &b, &a}})[0];
  const Tensor forward_a = mask_a, forward_b = mask_b;
  core::rand({3}, DType::f64, &a);  // the streams move on before backward
  const core::GeneratorState a_before = a.state(), b_before = b.state();
  autograd::backward(ops::sum(out));
  expect_close(x.grad(), forward_a * forward_b, 0, 0, "gradient = the forward's two masks");
  EXPECT_EQ(a.state(), a_before);
  EXPECT_EQ(b.state(), b_before);
}

TEST(CheckpointGenerators, AGeneratorLeftUnnamedIsNotRewound) {
  // The reason every block names its dropout generators: one left out draws a fresh mask in the
  // recompute, and the gradient no longer matches the forward.
  core::Generator a(11);
  Tensor x = leaf({64}, 2), mask;
  Tensor out = autograd::checkpoint(masked(&a, mask), {x})[0];
  const Tensor forward_mask = mask;
  autograd::backward(ops::sum(out));
  const std::vector<double> got = x.grad().to_vector<double>(), want = forward_mask.to_vector<double>();
  EXPECT_NE(got, want);
}

TEST(CheckpointGenerators, PipelineOrderEachMicrobatchRecomputesItsOwnDraws) {
  // Forwards of three microbatches, then their backwards in reverse: each recompute rewinds to its
  // own forward's state, not to the latest.
  core::Generator gen(21);
  std::vector<Tensor> inputs, outputs, masks;
  // The segments write the mask they draw into these slots, in forward and again in the recompute:
  // sized once, so the references stay valid until backward.
  std::vector<Tensor> slots(3);
  for (int m = 0; m < 3; ++m) {
    Tensor& mask = slots[static_cast<size_t>(m)];
    inputs.push_back(leaf({16}, 30 + static_cast<uint64_t>(m)));
    outputs.push_back(autograd::checkpoint(masked(&gen, mask), {inputs.back()}, {.generators = {&gen}})[0]);
    masks.push_back(mask);
  }
  const core::GeneratorState after_forwards = gen.state();
  for (int m = 2; m >= 0; --m) {
    autograd::backward(ops::sum(outputs[static_cast<size_t>(m)]));
    expect_close(inputs[static_cast<size_t>(m)].grad(), masks[static_cast<size_t>(m)], 0, 0, "microbatch mask");
  }
  EXPECT_EQ(gen.state(), after_forwards);
}

TEST(CheckpointGenerators, DefaultGeneratorIsAlwaysRewound) {
  core::manual_seed(5);
  Tensor x = leaf({16}, 3), mask;
  Tensor out = autograd::checkpoint(masked(nullptr, mask), {x}, {.generators = {}})[0];
  const Tensor forward_mask = mask;
  autograd::backward(ops::sum(out));
  expect_close(x.grad(), forward_mask, 0, 0, "gradient = forward mask");
}

TEST(CheckpointRecompute, IsRecomputingHoldsOnlyDuringTheRecomputeAlsoNested) {
  std::vector<bool> seen;
  auto inner = [&seen](const std::vector<Tensor>& in) {
    seen.push_back(autograd::is_recomputing());
    return std::vector<Tensor>{ops::tanh(in[0])};
  };
  auto outer = [&](const std::vector<Tensor>& in) {
    seen.push_back(autograd::is_recomputing());
    return autograd::checkpoint(inner, {in[0] * 2.0});
  };
  Tensor x = leaf({4}, 4);
  Tensor out = autograd::checkpoint(outer, {x})[0];
  EXPECT_EQ(seen, (std::vector<bool>{false, false}));  // the forward: outer, then inner
  EXPECT_FALSE(autograd::is_recomputing());
  autograd::backward(ops::sum(out));
  // Backward: outer's recompute runs outer and inner's first pass (both repeats), then inner's
  // recompute inside outer's backward.
  EXPECT_EQ(seen, (std::vector<bool>{false, false, true, true, true}));
  EXPECT_FALSE(autograd::is_recomputing());
  // d/dx tanh(2x) = 2 (1 - tanh(2x)^2).
  const Tensor t = ops::tanh(x.detach() * 2.0);
  expect_close(x.grad(), (1.0 - t * t) * 2.0, 1e-15, 0, "nested checkpoint gradient");
}

TEST(CheckpointRecompute, AThrowingRecomputeRestoresTheGeneratorAndTheFlag) {
  core::Generator gen(8);
  bool fail = false;
  Tensor x = leaf({8}, 5);
  auto segment = [&](const std::vector<Tensor>& in) {
    Tensor mask = core::rand({8}, DType::f64, &gen);
    if (fail) throw std::runtime_error("recompute failed");
    return std::vector<Tensor>{in[0] * mask};
  };
  Tensor out = autograd::checkpoint(segment, {x}, {.generators = {&gen}})[0];
  const core::GeneratorState before = gen.state();
  fail = true;
  EXPECT_THROW(autograd::backward(ops::sum(out)), std::runtime_error);
  EXPECT_EQ(gen.state(), before);
  EXPECT_FALSE(autograd::is_recomputing());
}

TEST(CheckpointRecompute, ParametersInsideGetGradientsWhenNoInputRequiresGrad) {
  Tensor w = leaf({5}, 6);
  core::Generator gen(9);
  const Tensor x = core::randn({5}, DType::f64, &gen);  // data: no grad
  auto segment = [&w](const std::vector<Tensor>& in) { return std::vector<Tensor>{ops::exp(in[0] * w)}; };
  Tensor out = autograd::checkpoint(segment, {x})[0];
  ASSERT_TRUE(out.requires_grad());
  autograd::backward(ops::sum(out));
  expect_close(w.grad(), ops::exp(x * w.detach()) * x, 1e-15, 0, "parameter gradient");
}

TEST(CheckpointRecompute, GradModeOffRecordsNothing) {
  Tensor x = leaf({4}, 7);
  int runs = 0;
  auto segment = [&runs](const std::vector<Tensor>& in) {
    ++runs;
    return std::vector<Tensor>{in[0] * 3.0};
  };
  autograd::NoGradGuard no_grad;
  const Tensor out = autograd::checkpoint(segment, {x})[0];
  EXPECT_FALSE(out.requires_grad());
  EXPECT_EQ(runs, 1);
}

}  // namespace
}  // namespace colossal
