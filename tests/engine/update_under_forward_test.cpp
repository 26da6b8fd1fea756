// Note [Update under the next forward] (engine/engine.cpp) on the CPU: there the update runs at once,
// but part by part with the parts waited for in the units' pre-hooks, so the bookkeeping (the parts,
// the hooks, the check that every unit's hooks run, the held gradients) runs as on a GPU; the numbers
// must be those of the update at the step's end, bit for bit. update_under_forward_gpu_test.cpp runs
// the same cases where the update really overlaps the forward.
#include <gtest/gtest.h>

#include "update_under_forward_cases.h"

namespace colossal::engine::testing {
namespace {

TEST(UpdateUnderForward, Gpt2Bf16WithClippingTrainsAsTheUpdateAtTheStep) {
  const CaseRun on = expect_same_as_at_the_step(core::kCpu, CaseOptions{});
  // The model's own parameters and the three blocks; every update but the last is waited for part by
  // part by the next forward's pre-hooks.
  EXPECT_EQ(on.num_parts, 4u);
  EXPECT_EQ(on.parts_waited, 3 * 4);
}

TEST(UpdateUnderForward, F32AccumulationAndEvaluationBetweenSteps) {
  CaseOptions c;
  c.bf16 = false;
  c.accumulation = 2;
  c.evaluate_between = true;
  const CaseRun on = expect_same_as_at_the_step(core::kCpu, c);
  // The evaluation's forward waits for each update part by part; the training forward after it has
  // nothing left to wait for.
  EXPECT_EQ(on.parts_waited, 4 * 4);
  EXPECT_EQ(on.evaluations.size(), 4u);
}

TEST(UpdateUnderForward, WithoutClippingOrMixedPrecision) {
  CaseOptions c;
  c.model = CaseModel::stack;
  c.bf16 = false;
  c.clip = false;
  const CaseRun on = expect_same_as_at_the_step(core::kCpu, c);
  EXPECT_EQ(on.num_parts, 4u);  // the three layers, and the model's own (the head)
  EXPECT_EQ(on.parts_waited, 3 * 4);
}

TEST(UpdateUnderForward, AModelThatSkipsItsUnitsHooksUpdatesAtTheStep) {
  // The first forward shows that the layers' pre-hooks do not run: every update ends with its step.
  CaseOptions c;
  c.model = CaseModel::direct_stack;
  const CaseRun direct = expect_same_as_at_the_step(core::kCpu, c);
  EXPECT_EQ(direct.parts_waited, 0);
  c.model = CaseModel::stack;
  EXPECT_EQ(direct.losses, run_case(core::kCpu, false, c).losses) << "the same layers called through operator()";
}

TEST(UpdateUnderForward, OffUnlessAskedFor) {
  EXPECT_EQ(run_case(core::kCpu, std::nullopt, CaseOptions{}, 1).parts_waited, -1);
}

}  // namespace
}  // namespace colossal::engine::testing
