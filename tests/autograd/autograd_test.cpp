// The autograd engine: accumulation, retain_graph, no-grad, custom Functions, hooks, retain_grad
// and activation checkpointing.
#include <gtest/gtest.h>

#include "gradcheck.h"

namespace colossal {
namespace {

using testing::expect_close;
using testing::expect_values;
using testing::random_leaf;
using testing::random_tensor;

TEST(Autograd, GradientsAccumulateAcrossBackwards) {
  Tensor x = core::from_vector<double>({1, 2, 3}, {3}, TensorOptions(DType::f64).with_requires_grad(true));
  autograd::backward(ops::sum(x * x));  // d/dx sum x^2 = 2x
  expect_values(x.grad(), {2, 4, 6});
  autograd::backward(ops::sum(x * 3.0));
  expect_values(x.grad(), {5, 7, 9});
}

TEST(Autograd, DiamondGraphSumsBothPaths) {
  Tensor x = core::from_vector<double>({2}, {1}, TensorOptions(DType::f64).with_requires_grad(true));
  Tensor a = ops::exp(x);
  Tensor y = a * a + a;  // d/dx = 2 e^{2x} + e^x
  autograd::backward(ops::sum(y));
  expect_values(x.grad(), {2 * std::exp(4.0) + std::exp(2.0)}, 1e-12);
}

TEST(Autograd, SecondBackwardNeedsRetainGraph) {
  Tensor x = random_leaf({4}, 1);
  Tensor loss = ops::sum(ops::exp(x));
  autograd::backward(loss, Tensor(), {.retain_graph = true});
  Tensor first = x.grad().clone();
  autograd::backward(loss);  // the graph was retained
  expect_close(x.grad(), first * 2.0, 1e-15, 0);
  EXPECT_ERROR_CONTAINS(autograd::backward(loss), "retain_graph=true");
}

TEST(Autograd, NoGradGuardRecordsNothing) {
  Tensor x = random_leaf({3}, 2);
  Tensor y;
  {
    autograd::NoGradGuard no_grad;
    y = x * 2.0;
  }
  EXPECT_FALSE(y.requires_grad());
  EXPECT_TRUE(y.is_leaf());
  EXPECT_ERROR_CONTAINS(autograd::backward(ops::sum(y)), "does not require grad");
  EXPECT_TRUE((x * 2.0).requires_grad());
}

TEST(Autograd, NonScalarRootNeedsGradient) {
  Tensor x = random_leaf({3}, 3);
  Tensor y = x * 2.0;
  EXPECT_ERROR_CONTAINS(autograd::backward(y), "pass grad_roots");
  autograd::backward(y, core::from_vector<double>({1, 10, 100}, {3}));
  expect_values(x.grad(), {2, 20, 200});
}

TEST(Autograd, DetachStopsGradients) {
  Tensor x = random_leaf({3}, 4);
  Tensor y = x * x.detach();  // only one factor is differentiated: dy/dx = x
  autograd::backward(ops::sum(y));
  expect_close(x.grad(), x.detach(), 0, 0);
}

/// y = x^3 written by hand, with its derivative 3x^2.
class Cube final : public autograd::Function {
 public:
  std::string name() const override { return "Cube"; }
  std::vector<Tensor> forward(autograd::FunctionContext& ctx, const std::vector<Tensor>& in) override {
    ctx.save_for_backward({in[0]});
    return {in[0] * in[0] * in[0]};
  }
  std::vector<Tensor> backward(autograd::FunctionContext& ctx, const std::vector<Tensor>& grads) override {
    const Tensor& x = ctx.saved[0];
    return {grads[0] * x * x * 3.0};
  }
};

TEST(GradCheck, custom_function) {
  testing::check_gradients(
      {.make_inputs = [] { return std::vector<Tensor>{random_leaf({5}, 5)}; },
       .fn = [](const std::vector<Tensor>& in) { return autograd::apply(std::make_shared<Cube>(), {in[0]})[0]; }});
}

TEST(Autograd, CustomFunctionForwardDoesNotRecord) {
  Tensor x = random_leaf({2}, 6);
  Tensor y = autograd::apply(std::make_shared<Cube>(), {x})[0];
  ASSERT_TRUE(y.grad_fn() != nullptr);
  EXPECT_EQ(y.grad_fn()->name(), "Cube");
  EXPECT_EQ(y.grad_fn()->next_edges().size(), 1u);  // only the Function node, not mul's inside it
}

TEST(Autograd, TensorHookReplacesGradient) {
  Tensor x = random_leaf({3}, 7);
  Tensor mid = x * 2.0;
  autograd::register_hook(mid, [](const Tensor& g) { return g * 10.0; });
  autograd::backward(ops::sum(mid));
  expect_values(x.grad(), {20, 20, 20});

  Tensor leaf = random_leaf({2}, 8);
  autograd::register_hook(leaf, [](const Tensor& g) { return g * -1.0; });
  autograd::backward(ops::sum(leaf * 3.0));
  expect_values(leaf.grad(), {-3, -3});
}

TEST(Autograd, GradReadyHookRunsAfterAccumulation) {
  Tensor w = random_leaf({2}, 9);
  std::vector<double> seen;
  autograd::register_grad_ready_hook(w, [&](Tensor& p) { seen.push_back(p.grad().to_vector<double>()[0]); });
  autograd::backward(ops::sum(w * 3.0));
  autograd::backward(ops::sum(w * 3.0));
  ASSERT_EQ(seen.size(), 2u);  // once per backward, with .grad already updated
  EXPECT_EQ(seen[0], 3.0);
  EXPECT_EQ(seen[1], 6.0);
}

TEST(Autograd, RetainGradKeepsNonLeafGradient) {
  Tensor x = random_leaf({3}, 10);
  Tensor mid = x * 2.0;
  autograd::retain_grad(mid);
  autograd::backward(ops::sum(mid * mid));
  expect_close(mid.grad(), mid.detach() * 2.0, 1e-15, 0);
}

TEST(Autograd, SetRequiresGradOnlyOnFloatingLeaves) {
  Tensor i = core::zeros({2}, DType::i64);
  EXPECT_ERROR_CONTAINS(i.set_requires_grad(true), "only floating tensors");
  Tensor x = random_leaf({2}, 11);
  Tensor y = x * 2.0;
  EXPECT_ERROR_CONTAINS(y.set_requires_grad(true), "only leaf tensors");
}

TEST(Autograd, SmallGradientsOfRepeatedBackwardsAreAddedTogether) {
  // Note [Small gradients added together]: a bias and a scale, used twice in a graph and summed over
  // three backwards, get the sums of separate backwards; from the second backward on their additions
  // into .grad are batched, except for the leaf with a grad-ready hook, which sees each sum.
  Tensor b = random_leaf({5}, 1), s = random_leaf({5}, 2);
  Tensor h = random_leaf({5}, 3);
  int ready = 0;
  autograd::register_grad_ready_hook(h, [&](Tensor& leaf) {
    ++ready;
    EXPECT_TRUE(leaf.grad().defined());
  });
  std::vector<Tensor> inputs;
  for (int i = 0; i < 3; ++i) inputs.push_back(random_tensor({4, 5}, 10 + i));
  auto loss = [&](const Tensor& x, const Tensor& bias, const Tensor& scale, const Tensor& hooked) {
    const Tensor y = ops::add(ops::mul(x, scale), bias);
    return ops::sum(ops::mul(ops::add(ops::mul(y, y), ops::mul(y, bias)), hooked));
  };
  // The reference: each backward on fresh leaves, summed.
  std::vector<double> want_b(5, 0.0), want_s(5, 0.0), want_h(5, 0.0);
  for (const Tensor& x : inputs) {
    Tensor b1 = b.detach().clone(), s1 = s.detach().clone(), h1 = h.detach().clone();
    for (Tensor* t : {&b1, &s1, &h1}) t->set_requires_grad(true);
    autograd::backward(loss(x, b1, s1, h1));
    for (int j = 0; j < 5; ++j) {
      want_b[j] += b1.grad().to_vector<double>()[j];
      want_s[j] += s1.grad().to_vector<double>()[j];
      want_h[j] += h1.grad().to_vector<double>()[j];
    }
  }
  const int64_t before = autograd::batched_gradient_accumulations();
  for (const Tensor& x : inputs) autograd::backward(loss(x, b, s, h));
  EXPECT_EQ(autograd::batched_gradient_accumulations() - before, 4) << "b and s in the second and third backwards";
  EXPECT_EQ(ready, 3);
  for (int j = 0; j < 5; ++j) {
    EXPECT_NEAR(b.grad().to_vector<double>()[j], want_b[j], 1e-12);
    EXPECT_NEAR(s.grad().to_vector<double>()[j], want_s[j], 1e-12);
    EXPECT_NEAR(h.grad().to_vector<double>()[j], want_h[j], 1e-12);
  }
}

TEST(Checkpoint, GradientsEqualPlainBackward) {
  Tensor w = random_leaf({4, 4}, 12);
  auto segment = [&w](const std::vector<Tensor>& in) {
    return std::vector<Tensor>{ops::tanh(ops::sum(in[0].unsqueeze(2) * w, {1})) * in[0]};
  };
  Tensor x1 = random_leaf({3, 4}, 13);
  autograd::backward(ops::sum(segment({x1})[0]));
  Tensor gx = x1.grad(), gw = w.grad().clone();
  w.set_grad(Tensor());

  Tensor x2 = random_leaf({3, 4}, 13);
  Tensor out = autograd::checkpoint(segment, {x2})[0];
  EXPECT_EQ(out.grad_fn()->name(), "Checkpoint");
  autograd::backward(ops::sum(out));
  expect_close(x2.grad(), gx, 1e-15, 0, "input gradient");
  expect_close(w.grad(), gw, 1e-15, 0, "parameter gradient inside the segment");
}

TEST(Checkpoint, RecomputeReplaysRandomNumbers) {
  // The segment multiplies by fresh random numbers: the recompute must draw the same ones, so the
  // gradient equals the mask used in forward.
  core::manual_seed(1234);
  Tensor x = random_leaf({64}, 14);
  Tensor mask_seen;
  auto segment = [&mask_seen](const std::vector<Tensor>& in) {
    Tensor mask = core::rand({64}, DType::f64);
    mask_seen = mask;
    return std::vector<Tensor>{in[0] * mask};
  };
  Tensor out = autograd::checkpoint(segment, {x})[0];
  Tensor forward_mask = mask_seen;
  core::rand({1}, DType::f64);  // the stream moves on after the segment
  const core::GeneratorState before_backward = core::default_generator().state();
  autograd::backward(ops::sum(out));
  expect_close(x.grad(), forward_mask, 0, 0, "gradient = forward mask");
  // The recompute rewound the stream and then restored it: later draws are unaffected.
  EXPECT_EQ(core::default_generator().state(), before_backward);
}

}  // namespace
}  // namespace colossal
