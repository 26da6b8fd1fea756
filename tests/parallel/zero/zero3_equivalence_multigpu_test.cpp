// ZeRO stage 3 over NCCL through the layout-equivalence harness: one process per GPU (started by
// `colossal run --nproc_per_node N --backend processes`, label multigpu, run by tools/gpu-check where 2+
// GPUs exist). Each rank runs the serial model on the global batch and the ZeRO-3 model on its share,
// both on its GPU: chunks all-gathered on NCCL's stream (prefetched one unit ahead), host shards
// copied to the device on the chunk manager's stream ("cpu", "auto" with a budget that evicts), the
// reduce-scatter into f32 shard gradients, the fused optimizer over the chunks' pieces and the bf16
// masters written back into the shards. Tolerances as tests/parallel/layout_equivalence_multigpu_test.cpp:
// f32 with TF32 off 1e-5; bf16 3e-2 (as the MPI case).
#include <gtest/gtest.h>

#include <cstdio>
#include <memory>

#include "colossal/ops/linalg.h"
#include "colossal/optim/adam.h"
#include "layout_harness.h"
#include "multigpu_main.h"

namespace colossal::testing {
namespace {

using parallel::zero::Placement;

std::shared_ptr<comm::ProcessGroup> world() {
  return std::shared_ptr<comm::ProcessGroup>(&comm::testing::world(), [](comm::ProcessGroup*) {});
}

/// `tensor` > 1: ZeRO-3 over the data group of a dp x tp layout (world / tensor data ranks).
void run_case(const HarnessCase& c, Placement placement, ops::Float32MatmulPrecision precision, int tensor = 1) {
  const ops::Float32MatmulPrecision before = ops::float32_matmul_precision();
  ops::set_float32_matmul_precision(precision);
  Layout layout{.data = world()->size() / tensor, .tensor = tensor, .zero = 3};
  layout.zero_placement = placement;
  if (placement == Placement::auto_) layout.zero_device_budget_bytes = 512;
  const HarnessReport report = expect_layout_matches_serial(c, layout, world());
  ops::set_float32_matmul_precision(before);
  EXPECT_GT(report.compared_tensors, 0);
  if (world()->rank() == 0) {
    std::printf("%s %s: max relative difference loss %.2e, gradient %.2e (%s), parameter %.2e (%s)\n", c.name.c_str(),
                layout.name().c_str(), report.loss, report.grad, report.worst_grad.c_str(), report.param,
                report.worst_param.c_str());
  }
}

TEST(Zero3EquivalenceNccl, F32WithoutTf32EveryPlacement) {
  HarnessCase mlp = mlp_case();
  mlp.make_optimizer = [](nn::Module& model) -> std::shared_ptr<optim::Optimizer> {
    optim::AdamOptions o = optim::adamw_defaults();
    o.lr = 1e-2;
    return std::make_shared<optim::AdamW>(optim::make_param_groups(model.named_parameters(), 0.05), o);
  };
  for (Placement placement : {Placement::cuda, Placement::cpu, Placement::auto_}) {
    for (HarnessCase c : {mlp, gpt2_case()}) {
      c.accumulation = 2;
      c.clip = 0.1;
      run_case(c, placement, ops::Float32MatmulPrecision::highest);
    }
  }
}

// Each tensor rank's shards of GPT-2 (heads, MLP, vocabulary) in ZeRO-3's chunks over its data group
// (a group of one at 2 GPUs, tp2; dp2 x tp2 at 4): the tensor group's all-reduces and ZeRO-3's gathers
// and reduce-scatters on their own communicators.
TEST(Zero3EquivalenceNccl, TensorParallelF32WithoutTf32) {
  if (world()->size() % 2 != 0) GTEST_SKIP() << "needs an even number of GPUs";
  for (Placement placement : {Placement::cuda, Placement::cpu}) {
    HarnessCase c = gpt2_tp_case();
    c.accumulation = 2;
    c.clip = 0.1;
    run_case(c, placement, ops::Float32MatmulPrecision::highest, /*tensor=*/2);
  }
}

TEST(Zero3EquivalenceNccl, Bf16) {
  for (Placement placement : {Placement::cuda, Placement::cpu}) {
    HarnessCase c = gpt2_case();
    c.precision = Precision::bf16;
    c.accumulation = 2;
    c.tolerance = 3e-2;
    run_case(c, placement, ops::Float32MatmulPrecision::high);
  }
}

}  // namespace
}  // namespace colossal::testing

int main(int argc, char** argv) {
  return colossal::comm::testing::run_multigpu_tests(argc, argv);
}
