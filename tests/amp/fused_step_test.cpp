// MixedPrecisionOptimizer's fused step (Note [Fused mixed-precision step]) against its three-pass
// step on the CPU: the same model and data through AdamW / Adam that fuse and through the same
// optimizers told not to, bf16 and naive fp16, with and without clipping (2-, 1- and inf-norms, the
// default norm and a hook that recomputes it), weight decay groups, AMSGrad, an overflowing fp16
// step, several steps; every model parameter, master, moment, norm and loss scale must be the same
// bits. Then the steps that must keep three passes, and ZeRO's sharded masters, whose write-through
// is fused too.
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
#include "colossal/optim/sgd.h"        // Sgd

namespace colossal::amp {
namespace {

/// AdamW (or Adam) that says it cannot fuse: MixedPrecisionOptimizer takes the three passes with it.
template <class Base>
class ThreePass : public Base {
 public:
  using Base::Base;
  bool supports_mixed_precision_step() const override { return false; }
};

/// Linear(5, 19) - GELU - Linear(19, 3) in f32 (odd sizes: vectors of four and tails), from `seed`.
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
  const Tensor x = random_batch(8, 5, 100 + step);
  const Tensor y = random_batch(8, 3, 200 + step);
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
        grad.data<core::Half>()[0] = core::Half(INFINITY);
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

TEST(FusedMixedPrecisionStep, Bf16EqualsThreePasses) {
  for (const FusedCase& s :
       {FusedCase{.name = "bf16 AdamW", .mode = AmpMode::bf16},
        FusedCase{.name = "bf16 Adam amsgrad", .mode = AmpMode::bf16, .adamw = false, .amsgrad = true},
        FusedCase{.name = "bf16 AdamW clipped", .mode = AmpMode::bf16, .max_norm = 0.05},
        FusedCase{.name = "bf16 AdamW clipped, inf-norm",
        .mode = AmpMode::bf16,
        .max_norm = 0.01,
        .norm_type = optim::kInfNorm},
        FusedCase{.name = "bf16 AdamW clipped by a recomputed norm",
        .mode = AmpMode::bf16,
        .max_norm = 0.05,
        .recomputing_norm_hook = true}}) {
    EXPECT_TRUE(expect_fused_equals_three_pass(s)) << s.name << ": the fused path was not taken";
  }
}

TEST(FusedMixedPrecisionStep, NaiveFp16EqualsThreePasses) {
  for (const FusedCase& s :
       {FusedCase{.name = "fp16 AdamW", .mode = AmpMode::naive},
        FusedCase{.name = "fp16 Adam amsgrad", .mode = AmpMode::naive, .adamw = false, .amsgrad = true},
        FusedCase{.name = "fp16 AdamW clipped", .mode = AmpMode::naive, .max_norm = 0.05},
        FusedCase{.name = "fp16 AdamW clipped, 1-norm", .mode = AmpMode::naive, .max_norm = 0.05, .norm_type = 1.0},
        FusedCase{.name = "fp16 AdamW clipped, inf-norm",
        .mode = AmpMode::naive,
        .max_norm = 0.01,
        .norm_type = optim::kInfNorm},
        FusedCase{.name = "fp16 AdamW clipped by a recomputed norm",
        .mode = AmpMode::naive,
        .max_norm = 0.05,
        .recomputing_norm_hook = true},
        FusedCase{.name = "fp16 AdamW, a scale that is no power of two, unclipped",
        .mode = AmpMode::naive,
        .initial_scale = 1000,
        .growth_factor = 3}}) {
    EXPECT_TRUE(expect_fused_equals_three_pass(s)) << s.name << ": the fused path was not taken";
  }
}

TEST(FusedMixedPrecisionStep, StepsItCannotMatchTakeThreePasses) {
  // A scale that is no power of two, or a 3-norm, would not give the three passes' clipping norm
  // from the scaled gradients: those steps take the three passes (and still agree, trivially).
  for (const FusedCase& s :
       {FusedCase{.name = "fp16 clipped, scale 1000",
       .mode = AmpMode::naive,
       .max_norm = 0.05,
       .initial_scale = 1000,
       .growth_factor = 3},
        FusedCase{.name = "fp16 clipped, 3-norm", .mode = AmpMode::naive, .max_norm = 0.05, .norm_type = 3}}) {
    EXPECT_FALSE(expect_fused_equals_three_pass(s)) << s.name << ": the fused path was taken";
  }
  // bf16 has no scale: its 3-norm is the same either way.
  EXPECT_TRUE(expect_fused_equals_three_pass(
      FusedCase{.name = "bf16 clipped, 3-norm", .mode = AmpMode::bf16, .max_norm = 0.05, .norm_type = 3}));
}

TEST(FusedMixedPrecisionStep, SgdKeepsThreePasses) {
  auto model = make_mlp(3);
  auto sgd = std::make_shared<optim::Sgd>(model->parameters(), optim::SgdOptions{.lr = 0.1});
  MixedPrecisionOptimizer amp(model, sgd, AmpOptions::for_mode(AmpMode::bf16));
  forward_backward(amp, 0);
  ASSERT_TRUE(amp.step().stepped);
  EXPECT_EQ(amp.master_params().front().grad().dtype(), DType::f32) << "the gradients were copied into f32";
  for (size_t k = 0; k < amp.model_params().size(); ++k) {
    EXPECT_EQ(bits(amp.model_params()[k]), bits(core::cast_raw(amp.master_params()[k], DType::bf16)));
  }
}

/// shard_masters as ZeRO calls it, over the elements [numel / 3, numel) of every parameter (an
/// offset that leaves the slice unaligned), with the handler's f32 shard gradient set by hand.
void shard_like_zero(MixedPrecisionOptimizer& amp, std::vector<int64_t>& begins) {
  std::vector<Tensor> shards;
  begins.clear();
  for (const Tensor& master : amp.master_params()) {
    const int64_t begin = master.numel() / 3;
    shards.push_back(master.detach().view({-1}).narrow(0, begin, master.numel() - begin).clone());
    begins.push_back(begin);
  }
  amp.shard_masters(shards, begins);
}

TEST(FusedMixedPrecisionStep, ShardedMastersWriteThroughEqualsThreePasses) {
  for (AmpMode mode : {AmpMode::bf16, AmpMode::naive}) {
    const FusedCase s{.name = mode == AmpMode::bf16 ? "bf16 sharded" : "fp16 sharded", .mode = mode, .max_norm = 0.05};
    AmpRun three = make_run(s, false);
    AmpRun fused = make_run(s, true);
    std::vector<int64_t> begins;
    shard_like_zero(*three.amp, begins);
    shard_like_zero(*fused.amp, begins);
    for (int step = 0; step < 4; ++step) {
      const std::string when = s.name + ", step " + std::to_string(step);
      for (AmpRun* run : {&three, &fused}) {
        forward_backward(*run->amp, step);
        // The handler's reduced shard gradient: the model gradient's slice, in f32.
        for (size_t k = 0; k < run->amp->master_params().size(); ++k) {
          Tensor shard = run->amp->master_params()[k];
          const Tensor grad = run->amp->model_params()[k].grad();
          shard.set_grad(core::cast_raw(grad.view({-1}).narrow(0, begins[k], shard.numel()), DType::f32));
        }
      }
      const AmpStepResult r3 = three.amp->step(s.max_norm);
      const AmpStepResult rf = fused.amp->step(s.max_norm);
      ASSERT_TRUE(r3.stepped && rf.stepped) << when;
      EXPECT_EQ(rf.grad_norm.item<double>(), r3.grad_norm.item<double>()) << when;
      for (size_t k = 0; k < three.amp->master_params().size(); ++k) {
        const std::string name = when + ": " + three.amp->param_names()[k];
        EXPECT_EQ(bits(fused.amp->master_params()[k]), bits(three.amp->master_params()[k])) << name << " shard";
        EXPECT_EQ(bits(fused.amp->model_params()[k]), bits(three.amp->model_params()[k])) << name << " model";
      }
      three.amp->zero_grad();
      fused.amp->zero_grad();
    }
  }
}

TEST(FusedMixedPrecisionStep, ShardedMastersAreWrittenThroughByTheUpdate) {
  // The three passes copy every shard into its slice; the fused update writes the shards it steps,
  // so a slice whose shard got no gradient keeps what it holds (its master's rounding, normally:
  // here a marker that shows which path ran).
  const FusedCase s{.name = "bf16 sharded", .mode = AmpMode::bf16};
  for (const bool fused : {false, true}) {
    AmpRun run = make_run(s, fused);
    std::vector<int64_t> begins;
    shard_like_zero(*run.amp, begins);
    forward_backward(*run.amp, 0);
    for (size_t k = 0; k < run.amp->master_params().size(); ++k) {
      Tensor shard = run.amp->master_params()[k];
      const Tensor grad = run.amp->model_params()[k].grad();
      if (k == 0) continue;  // no gradient for parameter 0's shard
      shard.set_grad(core::cast_raw(grad.view({-1}).narrow(0, begins[k], shard.numel()), DType::f32));
    }
    Tensor slice = run.amp->model_params()[0].detach().view({-1}).narrow(0, begins[0], 1);
    slice.fill_(123.0);
    ASSERT_TRUE(run.amp->step().stepped);
    EXPECT_EQ(slice.item<double>(), fused ? 123.0 : bits(core::cast_raw(run.amp->master_params()[0], DType::bf16))[0])
        << (fused ? "fused" : "three passes");
  }
}

}  // namespace
}  // namespace colossal::amp
