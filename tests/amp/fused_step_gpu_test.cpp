// MixedPrecisionOptimizer's fused step on a GPU against its three-pass step there (Note [Fused
// mixed-precision step]): tests/amp/fused_step_test.cpp's comparisons (fused_step_harness.h) with
// the model, the batches and every step on CUDA, where the update is multi_tensor_mixed_kernel and
// the overflow check and clipping norm the multi-tensor sums of squares, which must add the 16-bit
// gradients in their f32 copies' order (Note [Sums of squares in one order]): every parameter,
// master, moment, norm and loss scale the same bits.
#include <gtest/gtest.h>

#include "colossal/amp/mixed_precision_optimizer.h"
#include "colossal/core/device.h"  // cuda_device
#include "fused_step_harness.h"    // FusedCase, the shared cases, expect_fused_equals_three_pass
#include "gpu_compare.h"           // COLOSSAL_REQUIRE_GPU

namespace colossal::amp {
namespace {

using testing::clipped_case;
using testing::expect_fused_equals_three_pass;
using testing::FusedCase;
using testing::inf_norm_clipped_case;
using testing::non_power_of_two_scale_case;
using testing::recomputed_norm_clipped_case;
using testing::unclipped_case;

TEST(FusedMixedPrecisionStepGpu, Bf16AndNaiveFp16EqualThreePasses) {
  COLOSSAL_REQUIRE_GPU();
  for (const FusedCase& s :
       {unclipped_case(AmpMode::bf16), clipped_case(AmpMode::bf16),
        FusedCase{.name = "bf16 Adam amsgrad clipped by a recomputed norm",
        .mode = AmpMode::bf16,
        .adamw = false,
        .amsgrad = true,
        .max_norm = 0.05,
        .recomputing_norm_hook = true},
        unclipped_case(AmpMode::naive), clipped_case(AmpMode::naive), inf_norm_clipped_case(AmpMode::naive),
        recomputed_norm_clipped_case(AmpMode::naive), non_power_of_two_scale_case()}) {
    EXPECT_TRUE(expect_fused_equals_three_pass(s, core::cuda_device(0))) << s.name << ": the fused path was not taken";
  }
}

}  // namespace
}  // namespace colossal::amp
