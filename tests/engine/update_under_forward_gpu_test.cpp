// Note [Update under the next forward] (engine/engine.cpp) on a GPU, where the update runs on a stream
// of its own beside the next forward: the numbers must be those of the update at the step's end, bit
// for bit, and the parameters read through Engine::model() right after a step must be the updated ones.
#include <gtest/gtest.h>

#include "colossal/core/cuda_device.h"
#include "update_under_forward_cases.h"

namespace colossal::engine::testing {
namespace {

const Device kGpu = core::cuda_device(0);

class UpdateUnderForwardGpu : public ::testing::Test {
 protected:
  void SetUp() override {
    if (!core::cuda::is_available()) GTEST_SKIP() << "no GPU";
  }
};

TEST_F(UpdateUnderForwardGpu, Gpt2Bf16WithClippingTrainsAsTheUpdateAtTheStep) {
  const CaseRun on = expect_same_as_at_the_step(kGpu, CaseOptions{}, 6);
  EXPECT_EQ(on.parts_waited, 5 * 4);
  // Unset is off (not yet measured faster).
  EXPECT_EQ(run_case(kGpu, std::nullopt, CaseOptions{}, 2).parts_waited, -1);
}

TEST_F(UpdateUnderForwardGpu, F32AccumulationAndEvaluationBetweenSteps) {
  CaseOptions c;
  c.bf16 = false;
  c.accumulation = 2;
  c.evaluate_between = true;
  expect_same_as_at_the_step(kGpu, c, 6);
}

TEST_F(UpdateUnderForwardGpu, AModelThatSkipsItsUnitsHooksUpdatesAtTheStep) {
  CaseOptions c;
  c.model = CaseModel::direct_stack;
  EXPECT_EQ(expect_same_as_at_the_step(kGpu, c).parts_waited, 0);
}

}  // namespace
}  // namespace colossal::engine::testing
