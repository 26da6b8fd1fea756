// Adam and AdamW's mixed-precision step (Note [Fused mixed-precision step] in
// amp/mixed_precision_optimizer.cpp) on the CPU reference path: f32 parameters stepped from bf16 /
// f16 gradients, with the fp16 unscale and clipping's factor handed over and the updated parameters
// written through into 16-bit copies, give bit for bit what the three passes give (copy the
// gradients into f32, unscale in place, step, copy the parameters out), over several steps, odd
// sizes, a parameter left without a gradient, with and without weight decay and AMSGrad. Then the
// hand-overs' misuse: the errors name the parameter, and the optimizers without the support refuse.
#include <gtest/gtest.h>

#include <memory>
#include <string>
#include <vector>

#include "colossal/core/random.h"      // Generator, normal_
#include "colossal/core/view.h"        // cast_raw
#include "colossal/optim/adam.h"       // Adam, AdamW
#include "colossal/optim/clip_grad.h"  // sum_of_squares
#include "colossal/optim/sgd.h"        // Sgd
#include "gradcheck.h"                 // EXPECT_ERROR_CONTAINS

namespace colossal::optim {
namespace {

struct MixedCase {
  std::string name;
  DType dtype;     // of the gradients and the copies
  bool decoupled;  // AdamW, else Adam
  double weight_decay;
  bool amsgrad;
  double unscale;  // 1: none; else the fp16 loss scale's inverse
  double clip;     // 1: none; else clipping's factor
};

std::vector<MixedCase> mixed_cases() {
  return {
      {"bf16 AdamW", DType::bf16, true, 0.1, false, 1.0, 1.0},
      {"bf16 AdamW clipped", DType::bf16, true, 0.1, false, 1.0, 0.37},
      {"bf16 Adam amsgrad no decay", DType::bf16, false, 0.0, true, 1.0, 1.0},
      {"bf16 Adam L2 clipped", DType::bf16, false, 0.05, false, 1.0, 0.61},
      {"f16 AdamW unscaled", DType::f16, true, 0.1, false, 1.0 / 1024, 1.0},
      {"f16 AdamW unscaled clipped amsgrad", DType::f16, true, 0.1, true, 1.0 / 4096, 0.43},
      {"f16 Adam unscaled by a non-power of two", DType::f16, false, 0.0, false, 1.0 / 3000, 1.0},
  };
}

/// Masters and copies of odd sizes (vectors of four, a tail and single elements).
const std::vector<Shape> kShapes{{3, 5}, {7}, {1}, {2, 33}};

std::unique_ptr<Optimizer> make_adam(const MixedCase& c, std::vector<Tensor> params) {
  const AdamOptions options{.lr = 1e-2, .weight_decay = c.weight_decay, .amsgrad = c.amsgrad};
  if (c.decoupled) return std::make_unique<AdamW>(std::move(params), options);
  return std::make_unique<Adam>(std::move(params), options);
}

Tensor random_tensor(const Shape& shape, double scale, uint64_t seed) {
  core::Generator generator(seed);
  Tensor t = core::empty(shape);
  core::normal_(t, 0.0, scale, &generator);
  return t;
}

/// The bits of a tensor (f32, bf16 and f16 are exact as f64).
std::vector<double> bits(const Tensor& t) {
  return t.to_vector<double>();
}

TEST(AdamMixedPrecision, SixteenBitGradientsUnscaleClipAndWriteThroughEqualThreePasses) {
  for (const MixedCase& c : mixed_cases()) {
    SCOPED_TRACE(c.name);
    std::vector<Tensor> masters_three, masters_fused, copies_three, copies_fused;
    for (size_t k = 0; k < kShapes.size(); ++k) {
      const Tensor master = random_tensor(kShapes[k], 1.0, 10 + k);
      masters_three.push_back(master.clone());
      masters_fused.push_back(master.clone());
      copies_three.push_back(core::cast_raw(master, c.dtype));
      copies_fused.push_back(core::cast_raw(master, c.dtype));
    }
    for (Tensor& t : masters_three) t.set_requires_grad(true);
    for (Tensor& t : masters_fused) t.set_requires_grad(true);
    std::unique_ptr<Optimizer> three = make_adam(c, masters_three);
    std::unique_ptr<Optimizer> fused = make_adam(c, masters_fused);
    ASSERT_TRUE(fused->supports_mixed_precision_step());

    for (int step = 1; step <= 4; ++step) {
      // What a scaled backward leaves: 16-bit gradients of size ~1 / unscale; parameter 2 gets none
      // in step 2 (it is then neither stepped nor written).
      std::vector<Tensor> grads16;
      for (size_t k = 0; k < kShapes.size(); ++k) {
        const bool has_grad = !(k == 2 && step == 2);
        grads16.push_back(has_grad ? core::cast_raw(random_tensor(kShapes[k], 0.5 / c.unscale, 100 * step + k), c.dtype)
                                   : Tensor());
      }
      // Three passes: the 16-bit gradients into f32, unscaled in place, the step, the copy out.
      std::vector<Tensor> grads32;
      for (size_t k = 0; k < kShapes.size(); ++k) {
        masters_three[k].set_grad(grads16[k].defined() ? core::cast_raw(grads16[k], DType::f32) : Tensor());
        if (grads16[k].defined()) grads32.push_back(masters_three[k].grad());
      }
      if (c.unscale != 1.0) sum_of_squares(grads32, c.unscale);
      if (c.clip != 1.0) three->scale_gradients_in_next_step(core::scalar_tensor(c.clip, DType::f64));
      three->step();
      multi_tensor_copy(copies_three, masters_three);

      // Fused: the 16-bit gradients as they are, the hand-overs, one step.
      for (size_t k = 0; k < kShapes.size(); ++k) masters_fused[k].set_grad(grads16[k]);
      if (c.unscale != 1.0) fused->unscale_gradients_in_next_step(c.unscale);
      if (c.clip != 1.0) fused->scale_gradients_in_next_step(core::scalar_tensor(c.clip, DType::f64));
      fused->write_through_in_next_step(masters_fused, copies_fused);
      fused->step();

      for (size_t k = 0; k < kShapes.size(); ++k) {
        const std::string what = "step " + std::to_string(step) + ", parameter " + std::to_string(k);
        EXPECT_EQ(bits(masters_fused[k]), bits(masters_three[k])) << what << ": master";
        EXPECT_EQ(bits(copies_fused[k]), bits(copies_three[k])) << what << ": copy";
        EXPECT_EQ(copies_fused[k].dtype(), c.dtype) << what;
        const ParamState& s3 = three->state(0, k);
        const ParamState& sf = fused->state(0, k);
        EXPECT_EQ(sf.step, s3.step) << what;
        for (const auto& [name, buffer] : s3.buffers) {
          EXPECT_EQ(bits(sf.buffers.at(name)), bits(buffer)) << what << ": " << name;
        }
      }
    }
  }
}

TEST(AdamMixedPrecision, HandOversLastOneStep) {
  Tensor master = core::from_vector<float>({1.0f, -2.0f, 0.5f}, {3});
  master.set_requires_grad(true);
  Tensor copy = core::cast_raw(master, DType::bf16);
  AdamW adamw({master}, {.lr = 0.1});
  master.set_grad(core::from_vector<float>({0.5f, -0.25f, 1.0f}, {3}).to(DType::bf16));
  adamw.unscale_gradients_in_next_step(0.5);
  adamw.write_through_in_next_step({master}, {copy});
  adamw.step();
  EXPECT_EQ(bits(copy), bits(core::cast_raw(master, DType::bf16)));
  const std::vector<double> written = bits(copy);
  // The next step has no hand-over: the master moves, the copy stays as it was.
  const std::vector<double> before = bits(master);
  adamw.step();
  EXPECT_EQ(bits(copy), written);
  EXPECT_NE(bits(master), before);
}

TEST(AdamMixedPrecision, MisusedHandOversNameTheParameter) {
  Tensor weight = core::zeros({2, 3});
  Tensor bias = core::zeros({3});
  weight.set_requires_grad(true);
  bias.set_requires_grad(true);
  ParamGroup group;
  group.params = {weight, bias};
  group.names = {"fc.weight", "fc.bias"};
  AdamW adamw({group});
  EXPECT_ERROR_CONTAINS(
      adamw.write_through_in_next_step({weight, bias},
                                       {core::zeros({3, 2}, DType::bf16), core::zeros({3}, DType::bf16)}),
      "AdamW: write_through_in_next_step: param group 0: parameter 'fc.weight' has shape [2, 3] but its copy has "
      "shape [3, 2]");
  EXPECT_ERROR_CONTAINS(adamw.write_through_in_next_step({bias}, {core::zeros({3}, DType::i32)}),
                        "parameter 'fc.bias': its copy is i32; a copy must be f32, bf16 or f16");
  EXPECT_ERROR_CONTAINS(adamw.write_through_in_next_step({core::zeros({3})}, {core::zeros({3}, DType::bf16)}),
                        "tensor 0 of the list (shape [3]) is not a parameter of this optimizer");
  EXPECT_ERROR_CONTAINS(adamw.write_through_in_next_step({weight, bias}, {core::zeros({2, 3}, DType::bf16)}),
                        "1 copies for 2 parameters");
  EXPECT_ERROR_CONTAINS(adamw.unscale_gradients_in_next_step(0.0), "expects a finite factor > 0, got 0");
  weight.set_grad(core::full({2, 3}, 0.5, DType::f64));
  EXPECT_ERROR_CONTAINS(adamw.step(),
                        "AdamW: param group 0: parameter 'fc.weight' is f32 but its gradient is f64; an f32 "
                        "parameter's gradient must be f32, bf16 or f16");
}

TEST(AdamMixedPrecision, OptimizersWithoutTheSupportRefuseTheHandOvers) {
  Tensor p = core::zeros({3});
  p.set_requires_grad(true);
  Sgd sgd({p}, {.lr = 0.1});
  EXPECT_FALSE(sgd.supports_mixed_precision_step());
  EXPECT_ERROR_CONTAINS(sgd.write_through_in_next_step({p}, {core::zeros({3}, DType::bf16)}),
                        "SGD: write_through_in_next_step: this optimizer does not write its parameters through");
  EXPECT_ERROR_CONTAINS(sgd.unscale_gradients_in_next_step(0.5),
                        "SGD: unscale_gradients_in_next_step: this optimizer does not unscale inside its update");
}

}  // namespace
}  // namespace colossal::optim
