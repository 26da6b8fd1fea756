// ZeRO stage 3 (parallel/zero/zero3.h) through the layout-equivalence harness, at 2 and 4 MPI ranks:
// every data rank keeps 1/Nd of each chunk of parameters, gathers a unit's chunks before its forward
// and its backward, reduce-scatters the gradients into its shard and steps only that, and yet the
// losses, the update's gradients (the shards gathered whole) and the updated parameters (gathered
// whole) equal the serial run on the global batch at every step, with accumulation, clipping, AdamW,
// bf16 and fp16, under each placement ("cuda", "cpu", and "auto" with a budget that makes it evict).
// Chunks of 256 bytes split the tiny models' units into several chunks and parameters between ranks.
// Tolerances: f32 as tests/support/layout_harness.cpp (1e-5: the reduction's order differs from the
// serial sum only by rounding); bf16 and fp16 as the stage 1 and 2 tests (zero_equivalence_mpi_test).
#include <gtest/gtest.h>

#include <cstdio>

#include "../../comm/mpi_test_main.h"
#include "colossal/optim/adam.h"
#include "layout_harness.h"

namespace colossal::testing {
namespace {

using parallel::zero::Placement;

std::shared_ptr<comm::ProcessGroup> world_group() {
  return std::shared_ptr<comm::ProcessGroup>(&comm::testing::world(), [](comm::ProcessGroup*) {});
}

Layout zero3_layout(Placement placement) {
  Layout layout{.data = comm::testing::world().size(), .zero = 3};
  layout.zero_placement = placement;
  // "auto": room for a few 256-byte chunks' shards, so that after each step most are evicted.
  if (placement == Placement::auto_) layout.zero_device_budget_bytes = 512;
  return layout;
}

void expect_case(const HarnessCase& c, const Layout& layout) {
  const HarnessReport report = expect_layout_matches_serial(c, layout, world_group());
  EXPECT_GT(report.compared_tensors, 0);
  if (comm::testing::world().rank() == 0) {
    std::printf("%s %s: max relative difference loss %.2e, gradient %.2e (%s), parameter %.2e (%s)\n", c.name.c_str(),
                layout.name().c_str(), report.loss, report.grad, report.worst_grad.c_str(), report.param,
                report.worst_param.c_str());
  }
}

HarnessCase mlp_adamw_case() {
  HarnessCase c = mlp_case();
  c.make_optimizer = [](nn::Module& model) -> std::shared_ptr<optim::Optimizer> {
    optim::AdamOptions o = optim::adamw_defaults();
    o.lr = 1e-2;
    // Two param groups in another order than the model's: the shards follow the optimizer's order.
    return std::make_shared<optim::AdamW>(optim::make_param_groups(model.named_parameters(), 0.05), o);
  };
  c.accumulation = 3;
  c.clip = 0.05;  // below the gradients' norm: every update is clipped, by the norm over all shards
  return c;
}

HarnessCase gpt2_accumulation_clipping_case() {
  // GPT-2 ties wte to the head: the root unit holds it, gathered for the embedding and the head.
  HarnessCase c = gpt2_case();
  c.accumulation = 2;
  c.clip = 0.1;
  return c;
}

class Zero3Placements : public ::testing::TestWithParam<Placement> {};

TEST_P(Zero3Placements, MlpAdamWAccumulationClipping) {
  expect_case(mlp_adamw_case(), zero3_layout(GetParam()));
}

TEST_P(Zero3Placements, Gpt2AccumulationClipping) {
  expect_case(gpt2_accumulation_clipping_case(), zero3_layout(GetParam()));
}

INSTANTIATE_TEST_SUITE_P(ZeroEquivalence, Zero3Placements,
                         ::testing::Values(Placement::cuda, Placement::cpu, Placement::auto_),
                         [](const ::testing::TestParamInfo<Placement>& info) {
                           return info.param == Placement::cuda  ? std::string("cuda")
                                  : info.param == Placement::cpu ? std::string("cpu")
                                                                 : std::string("auto");
                         });

TEST(ZeroEquivalence, Stage3Gpt2OneChunkPerUnit) {
  // Chunks larger than any unit: one all-gather and one reduce-scatter per unit and pass.
  Layout layout = zero3_layout(Placement::cuda);
  layout.zero_chunk_bytes = 1 << 20;
  expect_case(gpt2_accumulation_clipping_case(), layout);
}

TEST(ZeroEquivalence, Stage3VitAccumulationClipping) {
  HarnessCase c = vit_case();
  c.accumulation = 2;
  c.clip = 0.1;
  c.tolerance = kClippedVitTolerance;
  expect_case(c, zero3_layout(Placement::cpu));
}

TEST(ZeroEquivalence, Stage3Gpt2Bf16Accumulation) {
  // bf16 chunks, f32 masters of the shard written back into it: the stage 2 test's tolerance.
  HarnessCase c = gpt2_case();
  c.precision = Precision::bf16;
  c.accumulation = 2;
  c.tolerance = 3e-2;
  expect_case(c, zero3_layout(Placement::auto_));
}

TEST(ZeroEquivalence, Stage3MlpFp16SkipsTheSameSteps) {
  // Naive fp16 with a first scale of 2^32 that overflows (see Stage2MlpFp16 in
  // zero_equivalence_mpi_test.cpp for the scale and the tolerance): every rank skips that step.
  HarnessCase c = mlp_adamw_case();
  c.precision = Precision::fp16;
  amp::GradScalerOptions scaler = amp::GradScalerOptions::naive_defaults();
  scaler.initial_scale = 4294967296.0;
  scaler.backoff_factor = 1.0 / 65536.0;
  scaler.hysteresis = 1;
  c.scaler = scaler;
  c.steps = 4;
  c.tolerance = 3e-2;
  const HarnessReport report = expect_layout_matches_serial(c, zero3_layout(Placement::cpu), world_group());
  EXPECT_GT(report.skipped_steps, 0);
  EXPECT_LT(report.skipped_steps, c.steps);
}

}  // namespace
}  // namespace colossal::testing

int main(int argc, char** argv) {
  return colossal::comm::testing::run_mpi_tests(argc, argv);
}
