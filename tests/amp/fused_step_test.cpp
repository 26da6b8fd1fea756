// MixedPrecisionOptimizer's fused step (Note [Fused mixed-precision step]) against its three-pass
// step on the CPU: the same model and data through AdamW / Adam that fuse and through the same
// optimizers told not to, bf16 and naive fp16, with and without clipping (2-, 1- and inf-norms, the
// default norm and a hook that recomputes it), weight decay groups, AMSGrad, an overflowing fp16
// step, several steps; every model parameter, master, moment, norm and loss scale must be the same
// bits. Then the steps that must keep three passes, and ZeRO's sharded masters, whose write-through
// is fused too.
#include <gtest/gtest.h>

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "colossal/amp/mixed_precision_optimizer.h"
#include "colossal/core/view.h"        // cast_raw
#include "colossal/optim/clip_grad.h"  // kInfNorm
#include "colossal/optim/sgd.h"        // Sgd
#include "fused_step_harness.h"        // FusedCase, the shared cases, make_run, expect_fused_equals_three_pass

namespace colossal::amp {
namespace {

using testing::AmpRun;
using testing::bits;
using testing::clipped_case;
using testing::expect_fused_equals_three_pass;
using testing::forward_backward;
using testing::FusedCase;
using testing::inf_norm_clipped_case;
using testing::kFusedStepMlp;
using testing::make_mlp;
using testing::make_run;
using testing::non_power_of_two_scale_case;
using testing::recomputed_norm_clipped_case;
using testing::unclipped_case;

TEST(FusedMixedPrecisionStep, Bf16EqualsThreePasses) {
  for (const FusedCase& s :
       {unclipped_case(AmpMode::bf16),
        FusedCase{.name = "bf16 Adam amsgrad", .mode = AmpMode::bf16, .adamw = false, .amsgrad = true},
        clipped_case(AmpMode::bf16), inf_norm_clipped_case(AmpMode::bf16),
        recomputed_norm_clipped_case(AmpMode::bf16)}) {
    EXPECT_TRUE(expect_fused_equals_three_pass(s)) << s.name << ": the fused path was not taken";
  }
}

TEST(FusedMixedPrecisionStep, NaiveFp16EqualsThreePasses) {
  for (const FusedCase& s :
       {unclipped_case(AmpMode::naive),
        FusedCase{.name = "fp16 Adam amsgrad", .mode = AmpMode::naive, .adamw = false, .amsgrad = true},
        clipped_case(AmpMode::naive),
        FusedCase{.name = "fp16 AdamW clipped, 1-norm", .mode = AmpMode::naive, .max_norm = 0.05, .norm_type = 1.0},
        inf_norm_clipped_case(AmpMode::naive), recomputed_norm_clipped_case(AmpMode::naive),
        non_power_of_two_scale_case()}) {
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
  auto model = make_mlp(3, kFusedStepMlp);
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
