// The comparison behind fused_step_test and fused_step_gpu_test (Note [Fused mixed-precision
// step]): one model, data and run of steps through an optimizer that fuses the mixed-precision step
// and through the same optimizer told not to (ThreePass), on the CPU or a GPU; every model
// parameter, master, moment, norm and loss scale must be the same bits after every step.
#pragma once

#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "amp_test_util.h"  // MlpSizes, make_mlp, random_batch
#include "colossal/amp/mixed_precision_optimizer.h"
#include "colossal/core/device.h"      // Device, kCpu
#include "colossal/ops/elementwise.h"  // sub, mul
#include "colossal/ops/reduction.h"    // mean
#include "colossal/optim/adam.h"       // Adam, AdamW
#include "colossal/optim/clip_grad.h"  // total_grad_norm, kInfNorm

namespace colossal::amp::testing {

/// AdamW (or Adam) that says it cannot fuse: MixedPrecisionOptimizer takes the three passes with it.
template <class Base>
class ThreePass : public Base {
 public:
  using Base::Base;
  bool supports_mixed_precision_step() const override { return false; }
};

/// Linear(5, 19) - GELU - Linear(19, 3) (odd sizes: vectors of four and tails), built on the CPU on
/// every device, so the GPU runs start from the CPU runs' values.
inline constexpr MlpSizes kFusedStepMlp{.in = 5, .hidden = 19, .out = 3};

/// One forward and scaled backward of batch `step` on `device` (no optimizer step).
inline void forward_backward(MixedPrecisionOptimizer& amp, int step, core::Device device = core::kCpu) {
  const Tensor x = random_batch(8, kFusedStepMlp.in, 100 + step).to(device);
  const Tensor y = random_batch(8, kFusedStepMlp.out, 200 + step).to(device);
  const Tensor diff = ops::sub(amp.cast_output(amp.model().forward(amp.cast_input(x))), y);
  amp.backward(ops::mean(ops::mul(diff, diff)));
}

inline std::vector<double> bits(const Tensor& t) {
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

// The cases the CPU and the GPU test both run, for `mode` bf16 or naive (named "bf16 ..." or "fp16 ...").

inline std::string case_name(AmpMode mode, const std::string& what) {
  return (mode == AmpMode::bf16 ? "bf16 " : "fp16 ") + what;
}

inline FusedCase unclipped_case(AmpMode mode) {
  return {.name = case_name(mode, "AdamW"), .mode = mode};
}

inline FusedCase clipped_case(AmpMode mode) {
  return {.name = case_name(mode, "AdamW clipped"), .mode = mode, .max_norm = 0.05};
}

inline FusedCase inf_norm_clipped_case(AmpMode mode) {
  return {
      .name = case_name(mode, "AdamW clipped, inf-norm"), .mode = mode, .max_norm = 0.01, .norm_type = optim::kInfNorm};
}

inline FusedCase recomputed_norm_clipped_case(AmpMode mode) {
  return {.name = case_name(mode, "AdamW clipped by a recomputed norm"),
          .mode = mode,
          .max_norm = 0.05,
          .recomputing_norm_hook = true};
}

/// fp16 under a scale that is no power of two (1000, growing threefold), unclipped.
inline FusedCase non_power_of_two_scale_case() {
  return {.name = "fp16 AdamW, a scale that is no power of two, unclipped",
          .mode = AmpMode::naive,
          .initial_scale = 1000,
          .growth_factor = 3};
}

struct AmpRun {
  std::shared_ptr<nn::Sequential> model;
  std::shared_ptr<optim::Optimizer> optimizer;
  std::unique_ptr<MixedPrecisionOptimizer> amp;
};

/// The model of seed 7 on `device` with AdamW or Adam as `s` says (ThreePass unless `fused`) in
/// `s`'s mode, scaler and norm.
inline AmpRun make_run(const FusedCase& s, bool fused, core::Device device = core::kCpu) {
  AmpRun run;
  run.model = make_mlp(7, kFusedStepMlp);
  run.model->to(device);
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

/// An overflowing backward: an infinity in the first parameter's fp16 gradient (element 0 on the
/// CPU; on a GPU, where the host cannot write an element, its first row).
inline void poison_first_grad(AmpRun& run) {
  Tensor grad = run.amp->model_params().front().grad();
  if (grad.device().is_cpu()) {
    grad.data<core::Half>()[0] = core::Half(INFINITY);
  } else {
    grad.narrow(0, 0, 1).fill_(INFINITY);
  }
}

/// Steps both runs `steps` times on `device` (step 3 of an fp16 run overflows) and EXPECTs the same
/// bits everywhere after every step; returns whether the fused run's masters held 16-bit gradients
/// after its last clean step (the fused path was taken).
inline bool expect_fused_equals_three_pass(const FusedCase& s, core::Device device = core::kCpu, int steps = 5) {
  AmpRun three = make_run(s, false, device);
  AmpRun fused = make_run(s, true, device);
  bool took_fused_path = false;
  for (int step = 0; step < steps; ++step) {
    const std::string when = s.name + ", step " + std::to_string(step);
    forward_backward(*three.amp, step, device);
    forward_backward(*fused.amp, step, device);
    if (s.mode == AmpMode::naive && step == 3) {
      // The step is skipped by both.
      poison_first_grad(three);
      poison_first_grad(fused);
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

}  // namespace colossal::amp::testing
