// MixedPrecisionOptimizer's fused step on a GPU against its three-pass step there (Note [Fused
// mixed-precision step]): tests/amp/fused_step_test.cpp's comparisons with the model, the batches
// and every step on CUDA, where the update is multi_tensor_mixed_kernel and the overflow check and
// clipping norm the multi-tensor sums of squares, which must add the 16-bit gradients in their f32
// copies' order (Note [Sums of squares in one order]): every parameter, master, moment, norm and
// loss scale the same bits.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "colossal/amp/mixed_precision_optimizer.h"
#include "colossal/core/random.h"  // Generator, normal_
#include "colossal/core/view.h"    // cast_raw
#include "colossal/nn/activation.h"
#include "colossal/nn/linear.h"
#include "colossal/ops/elementwise.h"  // sub, mul
#include "colossal/ops/reduction.h"    // mean
#include "colossal/optim/adam.h"       // Adam, AdamW
#include "colossal/optim/clip_grad.h"  // total_grad_norm, kInfNorm
#include "gpu_compare.h"               // COLOSSAL_REQUIRE_GPU

namespace colossal::amp {
namespace {

/// AdamW (or Adam) that says it cannot fuse: MixedPrecisionOptimizer takes the three passes with it.
template <class Base>
class ThreePass : public Base {
 public:
  using Base::Base;
  bool supports_mixed_precision_step() const override { return false; }
};

/// Linear(5, 19) - GELU - Linear(19, 3) in f32 (odd sizes: vectors of four and tails), from `seed`,
/// built on the CPU (the same initial values as fused_step_test's).
std::shared_ptr<nn::Sequential> make_mlp(uint64_t seed) {
  core::Generator generator(seed);
  auto model = std::make_shared<nn::Sequential>();
  model->push_back(std::make_shared<nn::Linear>(5, 19, true, &generator));
  model->push_back(std::make_shared<nn::GELU>());
  model->push_back(std::make_shared<nn::Linear>(19, 3, true, &generator));
  return model;
}

Tensor random_batch(int64_t rows, int64_t cols, uint64_t seed) {
  core::Generator generator(seed);
  Tensor t = core::empty({rows, cols});
  core::normal_(t, 0.0, 1.0, &generator);
  return t;
}

/// One forward and scaled backward of batch `step` (no optimizer step).
void forward_backward(MixedPrecisionOptimizer& amp, int step) {
  const Tensor x = random_batch(8, 5, 100 + step).to(core::cuda_device(0));
  const Tensor y = random_batch(8, 3, 200 + step).to(core::cuda_device(0));
  const Tensor diff = ops::sub(amp.cast_output(amp.model().forward(amp.cast_input(x))), y);
  amp.backward(ops::mean(ops::mul(diff, diff)));
}

std::vector<double> bits(const Tensor& t) {
  return t.to_vector<double>();  // f32, bf16 and f16 are exact as f64
}

struct FusedCase {
  std::string name;
  AmpMode mode;
  bool adamw = true;
  bool amsgrad = false;
  std::optional<double> max_norm;
  double norm_type = 2.0;
  /// Replaces the default norm with one that ignores the overflow check's sum (as
  /// GradientStatistics does on a tensor rank that skips replicated parameters).
  bool recomputing_norm_hook = false;
  double initial_scale = 1024;
  double growth_factor = 2.0;
};

struct AmpRun {
  std::shared_ptr<nn::Sequential> model;
  std::shared_ptr<optim::Optimizer> optimizer;
  std::unique_ptr<MixedPrecisionOptimizer> amp;
};

AmpRun make_run(const FusedCase& s, bool fused) {
  AmpRun run;
  run.model = make_mlp(7);
  run.model->to(core::cuda_device(0));
  const auto groups = optim::make_param_groups(run.model->named_parameters(), 0.1);  // a no-decay group too
  const optim::AdamOptions options{.lr = 1e-2, .weight_decay = 0.1, .amsgrad = s.amsgrad};
  if (s.adamw) {
    run.optimizer = fused ? std::make_shared<optim::AdamW>(groups, options)
                          : std::make_shared<ThreePass<optim::AdamW>>(groups, options);
  } else {
    run.optimizer = fused ? std::make_shared<optim::Adam>(groups, options)
                          : std::make_shared<ThreePass<optim::Adam>>(groups, options);
  }
  AmpOptions amp_options = AmpOptions::for_mode(s.mode);
  amp_options.scaler.initial_scale = s.initial_scale;
  amp_options.scaler.growth_factor = s.growth_factor;
  amp_options.scaler.growth_interval = 2;  // the scale moves during the run
  run.amp = std::make_unique<MixedPrecisionOptimizer>(run.model, run.optimizer, amp_options);
  if (s.recomputing_norm_hook) {
    run.amp->set_grad_norm([](const std::vector<Tensor>& params, double norm_type, const Tensor&) {
      return optim::total_grad_norm(params, norm_type);
    });
  }
  return run;
}

/// Steps both runs `steps` times (step 3 of an fp16 run overflows) and EXPECTs the same bits
/// everywhere after every step; returns whether the fused run's masters held 16-bit gradients
/// after its last clean step (the fused path was taken).
bool expect_fused_equals_three_pass(const FusedCase& s, int steps = 5) {
  AmpRun three = make_run(s, false);
  AmpRun fused = make_run(s, true);
  bool took_fused_path = false;
  for (int step = 0; step < steps; ++step) {
    const std::string when = s.name + ", step " + std::to_string(step);
    forward_backward(*three.amp, step);
    forward_backward(*fused.amp, step);
    if (s.mode == AmpMode::naive && step == 3) {
      // An overflowing backward: the step is skipped by both.
      for (AmpRun* run : {&three, &fused}) {
        Tensor grad = run->amp->model_params().front().grad();
        grad.narrow(0, 0, 1).fill_(INFINITY);
      }
    }
    const AmpStepResult r3 = three.amp->step(s.max_norm, s.norm_type);
    const AmpStepResult rf = fused.amp->step(s.max_norm, s.norm_type);
    EXPECT_EQ(rf.stepped, r3.stepped) << when;
    EXPECT_EQ(rf.loss_scale, r3.loss_scale) << when;
    EXPECT_EQ(rf.grad_norm.defined(), r3.grad_norm.defined()) << when;
    if (r3.grad_norm.defined() && rf.grad_norm.defined()) {
      EXPECT_EQ(rf.grad_norm.item<double>(), r3.grad_norm.item<double>()) << when << ": the gradient norm";
    }
    if (rf.stepped) {
      const Tensor grad = fused.amp->master_params().front().grad();
      took_fused_path = grad.defined() && grad.dtype() != DType::f32;
    }
    for (size_t k = 0; k < three.amp->master_params().size(); ++k) {
      const std::string name = when + ": " + three.amp->param_names()[k];
      EXPECT_EQ(bits(fused.amp->master_params()[k]), bits(three.amp->master_params()[k])) << name << " master";
      EXPECT_EQ(bits(fused.amp->model_params()[k]), bits(three.amp->model_params()[k])) << name << " model";
    }
    const optim::StateDict state3 = three.optimizer->state_dict();
    const optim::StateDict statef = fused.optimizer->state_dict();
    EXPECT_EQ(statef.size(), state3.size()) << when;
    for (const auto& [key, value] : state3) {
      const auto it = statef.find(key);
      EXPECT_TRUE(it != statef.end()) << when << ": optimizer state " << key << " is missing";
      if (it != statef.end()) {
        EXPECT_EQ(bits(it->second), bits(value)) << when << ": optimizer state " << key;
      }
    }
    three.amp->zero_grad();
    fused.amp->zero_grad();
  }
  EXPECT_EQ(fused.amp->loss_scale(), three.amp->loss_scale()) << s.name;
  return took_fused_path;
}

TEST(FusedMixedPrecisionStepGpu, Bf16AndNaiveFp16EqualThreePasses) {
  COLOSSAL_REQUIRE_GPU();
  for (const FusedCase& s : {FusedCase{.name = "bf16 AdamW", .mode = AmpMode::bf16},
                             FusedCase{.name = "bf16 AdamW clipped", .mode = AmpMode::bf16, .max_norm = 0.05},
                             FusedCase{.name = "bf16 Adam amsgrad clipped by a recomputed norm",
                             .mode = AmpMode::bf16,
                             .adamw = false,
                             .amsgrad = true,
                             .max_norm = 0.05,
                             .recomputing_norm_hook = true},
                             FusedCase{.name = "fp16 AdamW", .mode = AmpMode::naive},
                             FusedCase{.name = "fp16 AdamW clipped", .mode = AmpMode::naive, .max_norm = 0.05},
                             FusedCase{.name = "fp16 AdamW clipped, inf-norm",
                             .mode = AmpMode::naive,
                             .max_norm = 0.01,
                             .norm_type = optim::kInfNorm},
                             FusedCase{.name = "fp16 AdamW clipped by a recomputed norm",
                             .mode = AmpMode::naive,
                             .max_norm = 0.05,
                             .recomputing_norm_hook = true},
                             FusedCase{.name = "fp16 AdamW, scale 1000, unclipped",
                             .mode = AmpMode::naive,
                             .initial_scale = 1000,
                             .growth_factor = 3}}) {
    EXPECT_TRUE(expect_fused_equals_three_pass(s)) << s.name << ": the fused path was not taken";
  }
}

}  // namespace
}  // namespace colossal::amp
