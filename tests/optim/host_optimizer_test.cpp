// The host optimizer step (optim/host_optimizer.h) against the optimizers' own step() on random data:
// Adam (L2 decay, AMSGrad), AdamW (decoupled decay), LAMB (bias correction on and off, a clipped and
// an unclipped trust ratio, a group without it), each with clipping's gradient scale
// (scale_gradients_in_next_step), over tensors that cross the host step's chunk and block sizes and an
// empty one; 16-bit gradients and outputs; results independent of the thread count; bad input.
//
// Tolerance: both compute in f32 the same operations in the same order; the host step may contract
// a * b + c into one FMA (one rounding instead of two) and sums LAMB's norms in f64 where the
// reference sums in f32, so each step differs by a few f32 roundings (2^-24 relative each) of the
// quantities involved. Over 4 steps that is below 1e-6 relative to the tensor's largest element
// (~8 ulps), while a wrong formula (a missing bias correction, the decay in the wrong place, the
// scale not applied, a trust ratio of the wrong tensor) moves the results by 1e-3 or more.
#include <gtest/gtest.h>
#include <omp.h>

#include <algorithm>
#include <cmath>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include <fmt/format.h>

#include "colossal/core/random.h"
#include "colossal/ops/elementwise.h"  // mul
#include "colossal/optim/adam.h"
#include "colossal/optim/host_optimizer.h"
#include "colossal/optim/lamb.h"
#include "colossal/optim/sgd.h"
#include "gradcheck.h"  // EXPECT_ERROR_CONTAINS

namespace colossal::optim {
namespace {

constexpr double kTolerance = 1e-6;
// Across the chunk (16384) and block (512) edges, with a tail; a small one; an empty one.
const std::vector<Shape> kShapes = {{3, 11000}, {7}, {0}, {513}};

std::vector<Tensor> random_params(uint64_t seed) {
  core::Generator gen(seed);
  std::vector<Tensor> params;
  for (const Shape& shape : kShapes) params.push_back(core::randn(shape, {}, &gen));
  return params;
}

std::vector<Tensor> clones(const std::vector<Tensor>& tensors) {
  std::vector<Tensor> out;
  for (const Tensor& t : tensors) out.push_back(t.clone());
  return out;
}

/// Largest |got - want| over the largest |want| (0 for empty tensors).
double relative_difference(const Tensor& got, const Tensor& want) {
  const std::vector<double> a = got.to(DType::f64).contiguous().to_vector<double>();
  const std::vector<double> b = want.to(DType::f64).contiguous().to_vector<double>();
  double diff = 0, scale = 0;
  for (size_t i = 0; i < b.size(); ++i) {
    diff = std::max(diff, std::abs(a[i] - b[i]));
    scale = std::max(scale, std::abs(b[i]));
  }
  return scale == 0 ? diff : diff / scale;
}

using MakeOptimizer = std::function<std::unique_ptr<Optimizer>(std::vector<Tensor> params)>;

/// Steps two optimizers built by `make` from equal parameters with equal random gradients for
/// `steps` updates, the first through step(), the second through host_step with gradients in
/// `grad_dtype` (the reference gets the same values in f32), both scaled by `scale` when it is not
/// 1; then compares parameters and every state buffer.
void expect_host_matches(const MakeOptimizer& make, DType grad_dtype = DType::f32, double scale = 1.0, int steps = 4) {
  const std::vector<Tensor> start = random_params(7);
  std::vector<Tensor> reference_params = clones(start), host_params = clones(start);
  std::unique_ptr<Optimizer> reference = make(reference_params);
  std::unique_ptr<Optimizer> host = make(host_params);
  core::Generator gen(99);
  for (int step = 0; step < steps; ++step) {
    std::vector<HostStepItem> items;
    size_t k = 0;
    for (size_t g = 0; g < host->param_groups().size(); ++g) {
      for (size_t i = 0; i < host->param_groups()[g].params.size(); ++i, ++k) {
        // Gradients of a few sizes, some near zero, in the 16-bit dtype when asked.
        const Tensor grad = ops::mul(core::randn(kShapes[k], {}, &gen), 0.5 + static_cast<double>(step)).to(grad_dtype);
        // A copy: LAMB's step scales its gradients in place.
        reference->param_groups()[g].params[i].set_grad(grad.to(DType::f32).clone());
        items.push_back(HostStepItem{g, i, grad, Tensor()});
      }
    }
    if (scale != 1.0) reference->scale_gradients_in_next_step(core::scalar_tensor(scale, {DType::f64}));
    reference->step();
    host_step(*host, items, scale);
  }
  for (size_t g = 0; g < host->param_groups().size(); ++g) {
    for (size_t i = 0; i < host->param_groups()[g].params.size(); ++i) {
      const std::string where = fmt::format("{} group {} param {}", host->name(), g, i);
      EXPECT_LE(relative_difference(host->param_groups()[g].params[i], reference->param_groups()[g].params[i]),
                kTolerance)
          << where;
      const ParamState* want = reference->find_state(g, i);
      const ParamState* got = host->find_state(g, i);
      ASSERT_NE(want, nullptr) << where;
      ASSERT_NE(got, nullptr) << where;
      EXPECT_EQ(got->step, want->step) << where;
      ASSERT_EQ(got->buffers.size(), want->buffers.size()) << where;
      for (const auto& [name, buffer] : want->buffers) {
        ASSERT_TRUE(got->buffers.contains(name)) << where << " " << name;
        EXPECT_EQ(got->buffers.at(name).shape(), buffer.shape()) << where << " " << name;
        EXPECT_LE(relative_difference(got->buffers.at(name), buffer), kTolerance) << where << " " << name;
      }
    }
  }
  // The update moved the parameters (a test of nothing would pass the comparison too).
  EXPECT_GT(relative_difference(host->param_groups()[0].params[0], start[0]), 1e-3);
}

MakeOptimizer adamw(double weight_decay) {
  return [weight_decay](std::vector<Tensor> params) -> std::unique_ptr<Optimizer> {
    AdamOptions o = adamw_defaults();
    o.lr = 1e-2;
    o.weight_decay = weight_decay;
    return std::make_unique<AdamW>(std::move(params), o);
  };
}

TEST(HostOptimizer, AdamWMatchesStep) {
  expect_host_matches(adamw(0.1));
}

TEST(HostOptimizer, AdamWWithoutDecay) {
  expect_host_matches(adamw(0.0));
}

TEST(HostOptimizer, AdamWClippingScale) {
  // Clipping's factor, applied by the reference inside its update (MultiTensorLists::grad_scale).
  expect_host_matches(adamw(0.1), DType::f32, 0.37);
}

TEST(HostOptimizer, AdamL2DecayAmsgradClipping) {
  expect_host_matches(
      [](std::vector<Tensor> params) -> std::unique_ptr<Optimizer> {
        return std::make_unique<Adam>(std::move(params),
                                      AdamOptions{.lr = 3e-3, .weight_decay = 0.05, .amsgrad = true});
      },
      DType::f32, 0.5);
}

TEST(HostOptimizer, AdamWTwoGroupsWithTheirOwnOptions) {
  // Decay on the first two tensors only, another lr on the rest: each item reads its group's options.
  expect_host_matches([](std::vector<Tensor> params) -> std::unique_ptr<Optimizer> {
    std::vector<ParamGroup> groups(2);
    groups[0].params = {params[0], params[1]};
    groups[0].options = {{"weight_decay", 0.2}};
    groups[1].params = {params[2], params[3]};
    groups[1].options = {{"weight_decay", 0.0}, {"lr", 5e-3}};
    return std::make_unique<AdamW>(std::move(groups));
  });
}

MakeOptimizer lamb(LambOptions o) {
  return [o](std::vector<Tensor> params) -> std::unique_ptr<Optimizer> {
    return std::make_unique<Lamb>(std::move(params), o);
  };
}

TEST(HostOptimizer, LambMatchesStep) {
  expect_host_matches(lamb(LambOptions{.lr = 1e-2, .weight_decay = 0.01}));
}

TEST(HostOptimizer, LambClippingScaleNoBiasCorrectionTrustClip) {
  expect_host_matches(lamb(LambOptions{.lr = 1e-2, .weight_decay = 0.01, .bias_correction = false, .trust_clip = 1.0}),
                      DType::f32, 0.25);
}

TEST(HostOptimizer, LambWithoutTrustRatio) {
  expect_host_matches(lamb(LambOptions{.lr = 1e-2, .weight_decay = 0.1, .use_trust_ratio = false}));
}

TEST(HostOptimizer, Bf16AndF16Gradients) {
  // A 16-bit gradient is read as its f32 value; the reference gets that value in f32.
  expect_host_matches(adamw(0.1), DType::bf16, 0.5);
  expect_host_matches(adamw(0.1), DType::f16);
  expect_host_matches(lamb(LambOptions{.lr = 1e-2, .weight_decay = 0.01}), DType::bf16);
}

TEST(HostOptimizer, WritesTheUpdatedParameterInTheModelsDtype) {
  for (DType dtype : {DType::f32, DType::bf16, DType::f16}) {
    for (const MakeOptimizer& make : {adamw(0.1), lamb(LambOptions{.lr = 1e-2})}) {
      std::vector<Tensor> params = random_params(3);
      std::unique_ptr<Optimizer> optimizer = make(params);
      core::Generator gen(5);
      std::vector<HostStepItem> items;
      std::vector<Tensor> outs;
      for (size_t i = 0; i < params.size(); ++i) {
        outs.push_back(core::full(params[i].shape(), 123.0, {dtype}));
        items.push_back(HostStepItem{0, i, core::randn(params[i].shape(), {}, &gen), outs.back()});
      }
      host_step(*optimizer, items);
      // Rounded to nearest even from the updated f32 parameter, exactly as Tensor::to rounds.
      for (size_t i = 0; i < params.size(); ++i) {
        EXPECT_EQ(relative_difference(outs[i], optimizer->param_groups()[0].params[i].to(dtype)), 0.0)
            << fmt::format("{} {} tensor {}", optimizer->name(), dtype, i);
      }
    }
  }
}

TEST(HostOptimizer, SameBitsWithAnyThreadCount) {
  // The chunks are fixed and LAMB's sums are added in chunk order: one thread and two give the same bits.
  const int threads = omp_get_max_threads();
  for (const MakeOptimizer& make : {adamw(0.1), lamb(LambOptions{.lr = 1e-2, .weight_decay = 0.01})}) {
    std::vector<std::vector<Tensor>> results;
    for (int n : {1, 2}) {
      omp_set_num_threads(n);
      std::vector<Tensor> params = random_params(11);
      std::unique_ptr<Optimizer> optimizer = make(params);
      core::Generator gen(13);
      std::vector<HostStepItem> items;
      for (size_t i = 0; i < params.size(); ++i) {
        items.push_back(HostStepItem{0, i, core::randn(params[i].shape(), {}, &gen), Tensor()});
      }
      host_step(*optimizer, items, 0.9);
      results.push_back(params);
    }
    for (size_t i = 0; i < results[0].size(); ++i) {
      EXPECT_EQ(relative_difference(results[1][i], results[0][i]), 0.0) << make(random_params(1))->name() << " " << i;
    }
  }
  omp_set_num_threads(threads);
}

TEST(HostOptimizer, StepsOnlyTheItemsGiven) {
  std::vector<Tensor> params = random_params(17);
  const std::vector<Tensor> start = clones(params);
  std::unique_ptr<Optimizer> optimizer = adamw(0.1)(params);
  host_step(*optimizer, {HostStepItem{0, 3, core::ones(params[3].shape()), Tensor()}});
  EXPECT_EQ(relative_difference(params[0], start[0]), 0.0);
  EXPECT_EQ(optimizer->find_state(0, 0), nullptr);
  EXPECT_GT(relative_difference(params[3], start[3]), 1e-3);
  EXPECT_EQ(optimizer->find_state(0, 3)->step, 1);
}

TEST(HostOptimizer, RejectsWhatItCannotStep) {
  std::vector<Tensor> params = random_params(19);
  Sgd sgd(params, SgdOptions{.lr = 0.1});
  EXPECT_ERROR_CONTAINS(host_step(sgd, {HostStepItem{0, 0, core::ones(params[0].shape()), Tensor()}}),
                        "runs Adam, AdamW and LAMB; optimizer SGD");
  std::unique_ptr<Optimizer> optimizer = adamw(0.1)(params);
  EXPECT_ERROR_CONTAINS(host_step(*optimizer, {HostStepItem{0, 0, core::ones({5}), Tensor()}}),
                        "the gradient of parameter #0 must be a contiguous f32, bf16 or f16 CPU tensor of 33000");
  EXPECT_ERROR_CONTAINS(host_step(*optimizer, {HostStepItem{0, 1, core::ones({7}, {DType::f64}), Tensor()}}),
                        "the gradient of parameter #1 must be");
  EXPECT_ERROR_CONTAINS(host_step(*optimizer, {HostStepItem{0, 1, core::ones({7}), core::ones({6})}}),
                        "the output of parameter #1");
  EXPECT_ERROR_CONTAINS(host_step(*optimizer, {HostStepItem{1, 0, core::ones({7}), Tensor()}}),
                        "no parameter 0 in param group 1");
  EXPECT_ERROR_CONTAINS(host_step(*optimizer, {HostStepItem{0, 1, core::ones({7}), Tensor()},
                                               HostStepItem{0, 1, core::ones({7}), Tensor()}}),
                        "parameter #1 is named twice");
  EXPECT_FALSE(host_step_supports(sgd));
  EXPECT_TRUE(host_step_supports(*optimizer));
}

}  // namespace
}  // namespace colossal::optim
