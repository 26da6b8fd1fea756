// Gradient accumulation in the op (Note [Gradient accumulation in the op] in autograd/engine.cpp):
// a linear layer's weight gradient added by its GEMM into the .grad it joins (several backwards) or
// into the sum waiting at the leaf (several uses in one graph), for nn::Linear's layout and
// nn::Conv1D's transposed one, and gelu_mlp's two weights; equal to the gradients summed apart, the
// grad-ready hooks run once per backward, and left alone where a gradient hook must see the
// gradient. Layer norm's input gradient added into a residual's waiting sum (not a leaf's).
#include <gtest/gtest.h>

#include "colossal/autograd/engine.h"
#include "colossal/autograd/function.h"
#include "colossal/nn/linear.h"
#include "colossal/ops/elementwise.h"
#include "colossal/ops/linalg.h"
#include "colossal/ops/nn_functional.h"
#include "colossal/ops/reduction.h"
#include "gradcheck.h"

namespace colossal {
namespace {

using testing::expect_close;
using testing::random_tensor;

/// A fresh leaf holding `values`' numbers.
Tensor leaf_like(const Tensor& values) {
  Tensor t = values.clone();
  t.set_requires_grad(true);
  return t;
}

/// The gradient of sum(fn(x) * w) for each leaf, each backward on fresh leaves: the reference sum.
Tensor sum_of_separate(const std::vector<Tensor>& inputs, const Tensor& weight_values,
                       const std::function<Tensor(const Tensor&, const Tensor&)>& fn, const Tensor& contract) {
  Tensor total;
  for (const Tensor& x : inputs) {
    Tensor w = leaf_like(weight_values);
    autograd::backward(ops::sum(ops::mul(fn(x, w), contract)));
    total = total.defined() ? ops::add(total, w.grad()) : w.grad().clone();
  }
  return total;
}

TEST(GradAccumulationInOp, LinearWeightOverSeveralBackwards) {
  const Tensor values = random_tensor({5, 4}, 1);
  const Tensor contract = random_tensor({3, 5}, 2);
  const std::vector<Tensor> inputs{random_tensor({3, 4}, 3), random_tensor({3, 4}, 4), random_tensor({3, 4}, 5)};
  auto fn = [](const Tensor& x, const Tensor& w) { return ops::linear(x, w); };
  const Tensor expected = sum_of_separate(inputs, values, fn, contract);

  Tensor w = leaf_like(values);
  int ready = 0;
  autograd::register_grad_ready_hook(w, [&](Tensor&) { ++ready; });
  const int64_t before = autograd::fused_gradient_accumulations();
  const void* grad_data = nullptr;
  for (const Tensor& x : inputs) {
    autograd::backward(ops::sum(ops::mul(fn(x, w), contract)));
    if (grad_data == nullptr) grad_data = w.grad().raw_data();
    EXPECT_EQ(w.grad().raw_data(), grad_data) << "the sum stays in the first backward's buffer";
  }
  EXPECT_EQ(autograd::fused_gradient_accumulations() - before, 2) << "the second and third backwards add in the GEMM";
  EXPECT_EQ(ready, 3) << "the grad-ready hooks run once per backward";
  expect_close(w.grad(), expected, 1e-12, 1e-12, "weight gradient");
}

TEST(GradAccumulationInOp, LinearWithBiasKeepsTheBiasGradient) {
  const Tensor w_values = random_tensor({6, 4}, 11), b_values = random_tensor({6}, 12);
  const Tensor contract = random_tensor({2, 3, 6}, 13);
  const std::vector<Tensor> inputs{random_tensor({2, 3, 4}, 14), random_tensor({2, 3, 4}, 15)};
  Tensor w = leaf_like(w_values), b = leaf_like(b_values);
  Tensor expected_w, expected_b;
  for (const Tensor& x : inputs) {
    Tensor w1 = leaf_like(w_values), b1 = leaf_like(b_values);
    autograd::backward(ops::sum(ops::mul(ops::linear(x, w1, b1), contract)));
    expected_w = expected_w.defined() ? ops::add(expected_w, w1.grad()) : w1.grad().clone();
    expected_b = expected_b.defined() ? ops::add(expected_b, b1.grad()) : b1.grad().clone();
  }
  const int64_t before = autograd::fused_gradient_accumulations();
  for (const Tensor& x : inputs) autograd::backward(ops::sum(ops::mul(ops::linear(x, w, b), contract)));
  EXPECT_EQ(autograd::fused_gradient_accumulations() - before, 1);
  expect_close(w.grad(), expected_w, 1e-12, 1e-12, "weight gradient");
  expect_close(b.grad(), expected_b, 1e-12, 1e-12, "bias gradient");
}

TEST(GradAccumulationInOp, Conv1DWeightThroughItsTranspose) {
  nn::Conv1D layer(4, 6);
  layer.to(DType::f64);
  const Tensor weight_values = layer.weight().detach().clone();
  const Tensor bias_values = layer.bias().detach().clone();
  const Tensor contract = random_tensor({3, 6}, 21);
  const std::vector<Tensor> inputs{random_tensor({3, 4}, 22), random_tensor({3, 4}, 23), random_tensor({3, 4}, 24)};
  auto fn = [&](const Tensor& x, const Tensor& w) { return ops::linear(x, w.t(), bias_values); };
  const Tensor expected = sum_of_separate(inputs, weight_values, fn, contract);

  const int64_t before = autograd::fused_gradient_accumulations();
  for (const Tensor& x : inputs) autograd::backward(ops::sum(ops::mul(layer(x), contract)));
  EXPECT_EQ(autograd::fused_gradient_accumulations() - before, 2);
  expect_close(layer.weight().grad(), expected, 1e-12, 1e-12, "Conv1D weight gradient");
}

TEST(GradAccumulationInOp, GeluMlpBothWeights) {
  const Tensor fc_values = random_tensor({8, 4}, 31), fc_bias = random_tensor({8}, 32);
  const Tensor proj_values = random_tensor({4, 8}, 33), proj_bias = random_tensor({4}, 34);
  const Tensor contract = random_tensor({3, 4}, 35);
  const std::vector<Tensor> inputs{random_tensor({3, 4}, 36), random_tensor({3, 4}, 37)};
  Tensor fc = leaf_like(fc_values), proj = leaf_like(proj_values);
  Tensor expected_fc, expected_proj;
  for (const Tensor& x : inputs) {
    Tensor fc1 = leaf_like(fc_values), proj1 = leaf_like(proj_values);
    autograd::backward(ops::sum(ops::mul(ops::gelu_mlp(x, fc1, fc_bias, proj1, proj_bias), contract)));
    expected_fc = expected_fc.defined() ? ops::add(expected_fc, fc1.grad()) : fc1.grad().clone();
    expected_proj = expected_proj.defined() ? ops::add(expected_proj, proj1.grad()) : proj1.grad().clone();
  }
  const int64_t before = autograd::fused_gradient_accumulations();
  for (const Tensor& x : inputs) {
    autograd::backward(ops::sum(ops::mul(ops::gelu_mlp(x, fc, fc_bias, proj, proj_bias), contract)));
  }
  EXPECT_EQ(autograd::fused_gradient_accumulations() - before, 2) << "both weights in the second backward";
  expect_close(fc.grad(), expected_fc, 1e-12, 1e-12, "fc weight gradient");
  expect_close(proj.grad(), expected_proj, 1e-12, 1e-12, "proj weight gradient");
}

TEST(GradAccumulationInOp, SeveralUsesInOneGraphAddIntoTheWaitingSum) {
  // One weight used by two linear ops (a layer run on its batch in two chunks): the first gradient to
  // arrive waits at the leaf, the second is added into it by its GEMM.
  const Tensor values = random_tensor({5, 4}, 41);
  const Tensor x1 = random_tensor({3, 4}, 42), x2 = random_tensor({2, 4}, 43);
  const Tensor c1 = random_tensor({3, 5}, 44), c2 = random_tensor({2, 5}, 45);
  Tensor expected;
  {
    Tensor a = leaf_like(values), b = leaf_like(values);
    autograd::backward(
        ops::add(ops::sum(ops::mul(ops::linear(x1, a), c1)), ops::sum(ops::mul(ops::linear(x2, b), c2))));
    expected = ops::add(a.grad(), b.grad());
  }
  Tensor w = leaf_like(values);
  int ready = 0;
  autograd::register_grad_ready_hook(w, [&](Tensor&) { ++ready; });
  const int64_t before = autograd::fused_gradient_accumulations();
  autograd::backward(ops::add(ops::sum(ops::mul(ops::linear(x1, w), c1)), ops::sum(ops::mul(ops::linear(x2, w), c2))));
  EXPECT_EQ(autograd::fused_gradient_accumulations() - before, 1);
  EXPECT_EQ(ready, 1);
  expect_close(w.grad(), expected, 1e-12, 1e-12, "weight gradient, first backward");
  // A second backward: both uses' gradients join the .grad of the first.
  autograd::backward(ops::add(ops::sum(ops::mul(ops::linear(x1, w), c1)), ops::sum(ops::mul(ops::linear(x2, w), c2))));
  EXPECT_EQ(ready, 2);
  expect_close(w.grad(), ops::mul(expected, 2.0), 1e-12, 1e-12, "weight gradient, second backward");
}

TEST(GradAccumulationInOp, AGradientHookStillSeesTheGradientAlone) {
  const Tensor values = random_tensor({5, 4}, 51);
  const Tensor contract = random_tensor({3, 5}, 52);
  const Tensor x = random_tensor({3, 4}, 53);
  Tensor w = leaf_like(values);
  std::vector<Tensor> seen;
  autograd::register_hook(w, [&](const Tensor& g) {
    seen.push_back(g.clone());
    return Tensor();
  });
  const int64_t before = autograd::fused_gradient_accumulations();
  autograd::backward(ops::sum(ops::mul(ops::linear(x, w), contract)));
  autograd::backward(ops::sum(ops::mul(ops::linear(x, w), contract)));
  EXPECT_EQ(autograd::fused_gradient_accumulations(), before) << "a hooked leaf takes the plain path";
  ASSERT_EQ(seen.size(), 2u);
  expect_close(seen[1], seen[0], 0.0, 0.0, "the hook's second gradient");
  expect_close(w.grad(), ops::mul(seen[0], 2.0), 1e-12, 1e-12, "the sum");
}

TEST(GradAccumulationInOp, NoTargetBeforeTheFirstGradient) {
  // The first backward has no .grad to add into: the gradient is written, not added.
  Tensor w = leaf_like(random_tensor({5, 4}, 61));
  const int64_t before = autograd::fused_gradient_accumulations();
  autograd::backward(ops::sum(ops::linear(random_tensor({3, 4}, 62), w)));
  EXPECT_EQ(autograd::fused_gradient_accumulations(), before);
  EXPECT_TRUE(w.grad().defined());
}

TEST(GradAccumulationInOp, LayerNormAddsIntoTheResidualsWaitingSum) {
  // A residual block, h + layer_norm(h) * c (h computed, not a leaf): the add delivers h's first
  // gradient, then layer norm's backward adds its input gradient into that waiting sum (case (c)).
  // The reference runs layer norm on a copy of h, whose node nothing else feeds, so its gradient is
  // summed by the engine as before. Both with and without the affine parameters, in f64 and f32.
  for (const DType dtype : {DType::f64, DType::f32}) {
    for (const bool affine : {true, false}) {
      SCOPED_TRACE(fmt::format("{} affine {}", dtype, affine));
      const Tensor a_values = random_tensor({6, 8}, 71).to(dtype);
      const Tensor c = random_tensor({6, 8}, 72).to(dtype);
      const Tensor w_values = ops::add(random_tensor({8}, 73), 1.0).to(dtype);
      const Tensor b_values = random_tensor({8}, 74).to(dtype);
      auto run = [&](bool through_copy, int64_t* fused) {
        Tensor a = leaf_like(a_values), w = leaf_like(w_values), b = leaf_like(b_values);
        const Tensor h = ops::mul(a, 1.5);
        const Tensor normed =
            ops::layer_norm(through_copy ? ops::mul(h, 1.0) : h, {8}, affine ? w : Tensor(), affine ? b : Tensor());
        const int64_t before = autograd::fused_gradient_accumulations();
        autograd::backward(ops::sum(ops::mul(ops::add(h, ops::mul(normed, c)), c)));
        *fused = autograd::fused_gradient_accumulations() - before;
        return std::vector<Tensor>{a.grad(), affine ? w.grad() : Tensor(), affine ? b.grad() : Tensor()};
      };
      int64_t fused = 0, fused_reference = 0;
      const std::vector<Tensor> got = run(false, &fused);
      const std::vector<Tensor> expected = run(true, &fused_reference);
      EXPECT_EQ(fused, 1) << "layer norm's input gradient added into the residual's sum";
      EXPECT_EQ(fused_reference, 0) << "nothing waits at the copy";
      const double tol = dtype == DType::f64 ? 1e-12 : 1e-6;
      expect_close(got[0], expected[0], tol, tol, "the input's gradient");
      if (affine) {
        expect_close(got[1], expected[1], tol, tol, "weight gradient");
        expect_close(got[2], expected[2], tol, tol, "bias gradient");
      }
    }
  }
}

TEST(GradAccumulationInOp, NoWaitingSumWhenTheGradientIsShared) {
  // h + layer_norm(h): the add hands the same gradient to both, so the sum waiting at h is also layer
  // norm's incoming gradient, and must not be written into.
  const Tensor a_values = random_tensor({4, 8}, 81);
  const Tensor c = random_tensor({4, 8}, 82);
  auto run = [&](bool through_copy) {
    Tensor a = leaf_like(a_values);
    const Tensor h = ops::mul(a, 2.0);
    autograd::backward(ops::sum(ops::mul(ops::add(h, ops::layer_norm(through_copy ? ops::mul(h, 1.0) : h, {8})), c)));
    return a.grad();
  };
  const int64_t before = autograd::fused_gradient_accumulations();
  const Tensor got = run(false);
  EXPECT_EQ(autograd::fused_gradient_accumulations(), before);
  expect_close(got, run(true), 1e-12, 1e-12, "the input's gradient");
}

}  // namespace
}  // namespace colossal
