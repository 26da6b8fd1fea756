// The layout-equivalence harness's data-parallel cases under MPI (2 and 4 ranks): the MLP, a ViT
// and a GPT-2, each trained serially on the global batch and data-parallel on each rank's share,
// equal at every step in loss, gradients and updated parameters — plain, with gradient accumulation,
// with clipping, with both, and in bf16 with fp32 masters. Tolerances: tests/support/layout_harness.cpp
// (f32) and below (bf16).
#include <gtest/gtest.h>

#include <optional>

#include "../comm/mpi_test_main.h"
#include "colossal/optim/adam.h"
#include "layout_harness.h"

namespace colossal::testing {
namespace {

std::shared_ptr<comm::ProcessGroup> world_group() {
  return std::shared_ptr<comm::ProcessGroup>(&comm::testing::world(), [](comm::ProcessGroup*) {});
}

Layout all_data() {
  return Layout{.data = comm::testing::world().size()};
}

void expect_case(HarnessCase c) {
  const HarnessReport report = expect_layout_matches_serial(c, all_data(), world_group());
  EXPECT_GT(report.compared_tensors, 0);
  if (comm::testing::world().rank() == 0) {
    std::printf("%s dp%d: max relative difference loss %.2e, gradient %.2e (%s), parameter %.2e (%s)\n", c.name.c_str(),
                comm::testing::world().size(), report.loss, report.grad, report.worst_grad.c_str(), report.param,
                report.worst_param.c_str());
  }
}

TEST(LayoutEquivalence, DataParallelMlp) {
  expect_case(mlp_case());
}

TEST(LayoutEquivalence, DataParallelMlpWithAdamW) {
  HarnessCase c = mlp_case();
  c.make_optimizer = [](nn::Module& model) -> std::shared_ptr<optim::Optimizer> {
    optim::AdamOptions o = optim::adamw_defaults();
    o.lr = 1e-2;
    o.weight_decay = 0.01;
    return std::make_shared<optim::AdamW>(model.parameters(), o);
  };
  expect_case(c);
}

TEST(LayoutEquivalence, DataParallelMlpWithAccumulationAndClipping) {
  HarnessCase c = mlp_case();
  c.accumulation = 3;
  c.clip = 0.05;  // below the gradients' norm: every update is clipped
  expect_case(c);
}

TEST(LayoutEquivalence, DataParallelVit) {
  expect_case(vit_case());
}

TEST(LayoutEquivalence, DataParallelVitWithAccumulationAndClipping) {
  HarnessCase c = vit_case();
  c.accumulation = 2;
  c.clip = 0.1;
  c.tolerance = kClippedVitTolerance;
  expect_case(c);
}

TEST(LayoutEquivalence, DataParallelGpt2) {
  expect_case(gpt2_case());
}

TEST(LayoutEquivalence, DataParallelGpt2WithAccumulationAndClipping) {
  HarnessCase c = gpt2_case();
  c.accumulation = 2;
  c.clip = 0.1;
  expect_case(c);
}

TEST(LayoutEquivalence, DataParallelGpt2Bf16) {
  // bf16 model with fp32 masters on both sides. Each stored bf16 gradient carries a relative rounding
  // of up to 2^-9; the data-parallel run rounds every rank's partial sum and each step of the bf16
  // all-reduce (one or two more roundings at 2 or 4 ranks), and where partial sums cancel (a layer
  // norm's bias gradient adds terms of both signs) the error relative to the total grows by their
  // ratio: measured 1.0e-2 on gradients and 6.4e-3 on parameters at 4 ranks (f32: 6e-7). 3e-2 keeps
  // three times that and still catches a missing or doubled average (relative error >= 0.5).
  HarnessCase c = gpt2_case();
  c.precision = Precision::bf16;
  c.tolerance = 3e-2;
  expect_case(c);
}

// Tensor parallelism (1D, Megatron-style GPT-2: heads, MLP, vocab-parallel embedding and loss) over
// the whole world, and data x tensor at 4 ranks. With clipping below the gradients' norm, the norm
// must sum the shards and count the replicated parameters (layer norms, wpe, row-parallel biases)
// once: counted once per rank, the clip factor and every update would differ.
void expect_tensor_parallel(Layout layout, int64_t accumulation, std::optional<double> clip = std::nullopt,
                            bool sequence_parallel = false, std::optional<int64_t> global_batch = std::nullopt,
                            bool fused_residual = false, int64_t row_blocks = 1) {
  HarnessCase c = gpt2_tp_case(sequence_parallel, fused_residual, row_blocks);
  if (global_batch) c.global_batch = *global_batch;
  c.accumulation = accumulation;
  c.clip = clip;
  const HarnessReport report = expect_layout_matches_serial(c, layout, world_group());
  EXPECT_GT(report.compared_tensors, 0);
  if (comm::testing::world().rank() == 0) {
    std::printf("%s %s: max relative difference loss %.2e, gradient %.2e (%s), parameter %.2e (%s)\n", c.name.c_str(),
                layout.name().c_str(), report.loss, report.grad, report.worst_grad.c_str(), report.param,
                report.worst_param.c_str());
  }
}

TEST(LayoutEquivalence, TensorParallelGpt2) {
  expect_tensor_parallel(Layout{.tensor = comm::testing::world().size()}, 1);
}

TEST(LayoutEquivalence, TensorParallelGpt2WithAccumulation) {
  expect_tensor_parallel(Layout{.tensor = comm::testing::world().size()}, 2);
}

TEST(LayoutEquivalence, TensorParallelGpt2WithClipping) {
  expect_tensor_parallel(Layout{.tensor = comm::testing::world().size()}, 2, /*clip=*/0.1);
}

TEST(LayoutEquivalence, TensorParallelGpt2WithTheResidualInTheRowLayersGemm) {
  // Note [A row-parallel layer's residual in its GEMM]: each rank adds the residual and c_proj's
  // bias to its share of the rows inside its GEMM; with accumulation and a clip below the norm.
  expect_tensor_parallel(Layout{.tensor = comm::testing::world().size()}, 2, /*clip=*/0.1,
                         /*sequence_parallel=*/false, std::nullopt, /*fused_residual=*/true);
}

TEST(LayoutEquivalence, TensorParallelGpt2WithTheResidualInTheRowLayersGemmInRowBlocks) {
  // The same with each row layer's GEMMs over 3 blocks of rows (parallel.tensor.row_blocks), each
  // block all-reduced while the next one's GEMMs run: the blocks and the ranks' shares cut the rows
  // differently (16 tokens a sequence, a batch of 4 a rank).
  expect_tensor_parallel(Layout{.tensor = comm::testing::world().size()}, 2, /*clip=*/0.1,
                         /*sequence_parallel=*/false, std::nullopt, /*fused_residual=*/true, /*row_blocks=*/3);
}

TEST(LayoutEquivalence, DataTimesTensorParallelGpt2) {
  if (comm::testing::world().size() != 4) GTEST_SKIP() << "dp2 x tp2 needs 4 ranks";
  expect_tensor_parallel(Layout{.data = 2, .tensor = 2}, 2, /*clip=*/0.1);
}

// ViT under 1D tensor parallelism (heads and MLP split, patch embedding, tokens, norms and head
// replicated), at tp = world and dp2 x tp2, with accumulation and a clip below the gradients' norm.
void expect_tensor_parallel_vit(Layout layout, int64_t accumulation, std::optional<double> clip = std::nullopt,
                                bool sequence_parallel = false, int64_t global_batch = 8) {
  HarnessCase c = vit_tp_case(sequence_parallel);
  c.global_batch = global_batch;
  c.accumulation = accumulation;
  c.clip = clip;
  if (clip) c.tolerance = kClippedVitTolerance;
  const HarnessReport report = expect_layout_matches_serial(c, layout, world_group());
  EXPECT_GT(report.compared_tensors, 0);
  if (comm::testing::world().rank() == 0) {
    std::printf("%s %s: max relative difference loss %.2e, gradient %.2e (%s), parameter %.2e (%s)\n", c.name.c_str(),
                layout.name().c_str(), report.loss, report.grad, report.worst_grad.c_str(), report.param,
                report.worst_param.c_str());
  }
}

TEST(LayoutEquivalence, TensorParallelVit) {
  expect_tensor_parallel_vit(Layout{.tensor = comm::testing::world().size()}, 1);
}

TEST(LayoutEquivalence, TensorParallelVitWithAccumulationAndClipping) {
  expect_tensor_parallel_vit(Layout{.tensor = comm::testing::world().size()}, 2, /*clip=*/0.1);
}

TEST(LayoutEquivalence, DataTimesTensorParallelVit) {
  if (comm::testing::world().size() != 4) GTEST_SKIP() << "dp2 x tp2 needs 4 ranks";
  expect_tensor_parallel_vit(Layout{.data = 2, .tensor = 2}, 2, /*clip=*/0.1);
}

// ViT with sequence parallelism (tp = world): the layer norms, residuals and drop path on each rank's
// share of the batch between the regions, the final norm's output gathered for the replicated head.
// The norms' and the row layers' biases' gradients, each rank's from its own tokens, summed over the
// group; clipping counts them once.
TEST(LayoutEquivalence, TensorParallelVitWithSequenceParallelism) {
  expect_tensor_parallel_vit(Layout{.tensor = comm::testing::world().size()}, 1, std::nullopt,
                             /*sequence_parallel=*/true);
}

TEST(LayoutEquivalence, TensorParallelVitWithSequenceParallelismAccumulationAndClipping) {
  expect_tensor_parallel_vit(Layout{.tensor = comm::testing::world().size()}, 2, /*clip=*/0.1,
                             /*sequence_parallel=*/true);
}

TEST(LayoutEquivalence, TensorParallelVitWithSequenceParallelismOnAPaddedBatch) {
  // Neither a batch of 3 nor the 5 tokens split over 2 or 4 ranks: the batch is padded with zero rows
  // for the blocks and the padding dropped before the head.
  expect_tensor_parallel_vit(Layout{.tensor = comm::testing::world().size()}, 1, /*clip=*/0.1,
                             /*sequence_parallel=*/true, /*global_batch=*/3);
}

TEST(LayoutEquivalence, DataTimesTensorParallelVitWithSequenceParallelism) {
  if (comm::testing::world().size() != 4) GTEST_SKIP() << "dp2 x tp2 needs 4 ranks";
  expect_tensor_parallel_vit(Layout{.data = 2, .tensor = 2}, 2, /*clip=*/0.1, /*sequence_parallel=*/true);
}

// GPT-2 split by per-parameter sharding specs (parallel.tensor.specs, the tutorial's way) rather than
// the built-in policy: any consistent assignment equals serial. Each at tp = world with accumulation
// and clipping below the gradients' norm (the norm counts replicated parameters once, split ones
// summed: here wte and wpe may be split along the embedding dimension, c_proj biases split or not).
using config::TensorSpecRule;
using config::TensorSplit;

/// `c` with accumulation and a clip below the gradients' norm, against serial under `layout`.
void expect_split_by_specs(HarnessCase c, Layout layout) {
  c.accumulation = 2;
  c.clip = 0.1;
  const HarnessReport report = expect_layout_matches_serial(c, layout, world_group());
  EXPECT_GT(report.compared_tensors, 0);
  if (comm::testing::world().rank() == 0) {
    std::printf("%s %s: max relative difference loss %.2e, gradient %.2e (%s), parameter %.2e (%s)\n", c.name.c_str(),
                layout.name().c_str(), report.loss, report.grad, report.worst_grad.c_str(), report.param,
                report.worst_param.c_str());
  }
}

void expect_specs(const std::string& name, std::vector<TensorSpecRule> rules, Layout layout) {
  expect_split_by_specs(gpt2_tp_specs_case(name, std::move(rules)), layout);
}

/// The tutorial's table: ShardSpec([-1]) (column) on c_attn, attn.c_proj, mlp.c_fc, wte and wpe,
/// ShardSpec([0]) (row) on mlp.c_proj's weight.
std::vector<TensorSpecRule> tutorial_table() {
  return {{"h.*.mlp.c_fc.*", TensorSplit::kColumn},    {"h.*.mlp.c_proj.weight", TensorSplit::kRow},
          {"wte.weight", TensorSplit::kColumn},        {"wpe.weight", TensorSplit::kColumn},
          {"h.*.attn.c_attn.*", TensorSplit::kColumn}, {"h.*.attn.c_proj.*", TensorSplit::kColumn}};
}

TEST(LayoutEquivalence, TensorParallelGpt2SpecsOfTheTutorial) {
  expect_specs("the tutorial's table", tutorial_table(), Layout{.tensor = comm::testing::world().size()});
}

TEST(LayoutEquivalence, DataTimesTensorParallelGpt2SpecsOfTheTutorial) {
  if (comm::testing::world().size() != 4) GTEST_SKIP() << "dp2 x tp2 needs 4 ranks";
  expect_specs("the tutorial's table", tutorial_table(), Layout{.data = 2, .tensor = 2});
}

TEST(LayoutEquivalence, TensorParallelGpt2SpecsMlpOnly) {
  expect_specs("MLP only", {{"h.*.mlp.c_fc.*", TensorSplit::kColumn}, {"h.*.mlp.c_proj.weight", TensorSplit::kRow}},
               Layout{.tensor = comm::testing::world().size()});
}

TEST(LayoutEquivalence, TensorParallelGpt2SpecsAttentionOnly) {
  expect_specs("attention only",
               {{"h.*.attn.c_attn.*", TensorSplit::kColumn}, {"h.*.attn.c_proj.weight", TensorSplit::kRow}},
               Layout{.tensor = comm::testing::world().size()});
}

TEST(LayoutEquivalence, TensorParallelGpt2SpecsOfTheBuiltInPolicy) {
  // Megatron's layout written as rules (a regular expression among them); the row layers' biases
  // named "row" too, as a glob over a layer gives them.
  expect_specs("the built-in policy as rules",
               {{"re:h\\.[0-9]+\\.(attn\\.c_attn|mlp\\.c_fc)\\..*", TensorSplit::kColumn},
                {"h.*.c_proj.*", TensorSplit::kRow},
                {"wte.weight", TensorSplit::kVocab}},
               Layout{.tensor = comm::testing::world().size()});
}

TEST(LayoutEquivalence, TensorParallelGpt2SpecsMixed) {
  // Block 0: heads split and gathered before a replicated c_proj, a replicated c_fc before a
  // column-split c_proj; block 1 the tutorial's; wte whole, wpe split.
  expect_specs("mixed",
               {{"h.0.attn.c_attn.*", TensorSplit::kColumn},
                {"h.0.mlp.c_proj.*", TensorSplit::kColumn},
                {"h.1.mlp.c_fc.*", TensorSplit::kColumn},
                {"h.1.mlp.c_proj.weight", TensorSplit::kRow},
                {"h.1.attn.*", TensorSplit::kColumn},
                {"wpe.weight", TensorSplit::kColumn}},
               Layout{.tensor = comm::testing::world().size()});
}

// The ViT split by per-parameter sharding specs against timm's names: the MLP only, attention only,
// the built-in policy written as rules, and a mix that gathers split activations before whole or
// column-split layers; at tp = world and dp2 x tp2, with accumulation and a clip below the gradients'
// norm (kClippedVitTolerance, as the built-in policy's clipped runs).
void expect_vit_specs(const std::string& name, std::vector<TensorSpecRule> rules, Layout layout) {
  HarnessCase c = vit_tp_specs_case(name, std::move(rules));
  c.tolerance = kClippedVitTolerance;
  expect_split_by_specs(std::move(c), layout);
}

TEST(LayoutEquivalence, TensorParallelVitSpecsMlpOnly) {
  expect_vit_specs("MLP only",
                   {{"blocks.*.mlp.fc1.*", TensorSplit::kColumn}, {"blocks.*.mlp.fc2.weight", TensorSplit::kRow}},
                   Layout{.tensor = comm::testing::world().size()});
}

TEST(LayoutEquivalence, TensorParallelVitSpecsAttentionOnly) {
  expect_vit_specs("attention only",
                   {{"blocks.*.attn.qkv.*", TensorSplit::kColumn}, {"blocks.*.attn.proj.weight", TensorSplit::kRow}},
                   Layout{.tensor = comm::testing::world().size()});
}

TEST(LayoutEquivalence, TensorParallelVitSpecsOfTheBuiltInPolicy) {
  expect_vit_specs("the built-in policy as rules",
                   {{"re:blocks\\.[0-9]+\\.(attn\\.qkv|mlp\\.fc1)\\..*", TensorSplit::kColumn},
                    {"blocks.*.attn.proj.*", TensorSplit::kRow},
                    {"blocks.*.mlp.fc2.*", TensorSplit::kRow}},
                   Layout{.tensor = comm::testing::world().size()});
}

/// Block 0: heads split and gathered before a column-split proj, a replicated fc1 before a
/// column-split fc2; block 1: heads split and gathered before a replicated proj, the MLP column then row.
std::vector<TensorSpecRule> vit_mixed_specs() {
  return {{"blocks.0.attn.*", TensorSplit::kColumn},
          {"blocks.0.mlp.fc2.*", TensorSplit::kColumn},
          {"blocks.1.attn.qkv.*", TensorSplit::kColumn},
          {"blocks.1.mlp.fc1.*", TensorSplit::kColumn},
          {"blocks.1.mlp.fc2.weight", TensorSplit::kRow}};
}

TEST(LayoutEquivalence, TensorParallelVitSpecsMixed) {
  expect_vit_specs("mixed", vit_mixed_specs(), Layout{.tensor = comm::testing::world().size()});
}

TEST(LayoutEquivalence, DataTimesTensorParallelVitSpecsMixed) {
  if (comm::testing::world().size() != 4) GTEST_SKIP() << "dp2 x tp2 needs 4 ranks";
  expect_vit_specs("mixed", vit_mixed_specs(), Layout{.data = 2, .tensor = 2});
}

// Sequence parallelism (tp = 2 at 2 ranks, tp = 4 at 4): layer norms, residual adds and dropout on
// shards of the tokens (the batch's where it divides, else the sequence's), all-gather before and reduce-scatter after
// each tensor-parallel region. The layer norms' and row-parallel biases' gradients, each rank's from its own tokens,
// must be summed over the group: left as they are, their updates differ from serial by a factor of about tp and the
// parameters part across ranks. Clipping checks they are then counted once in the norm.
TEST(LayoutEquivalence, TensorParallelGpt2WithSequenceParallelism) {
  expect_tensor_parallel(Layout{.tensor = comm::testing::world().size()}, 1, std::nullopt,
                         /*sequence_parallel=*/true);
}

TEST(LayoutEquivalence, TensorParallelGpt2WithSequenceParallelismAlongTheSequence) {
  // A batch of 3 does not split over 2 or 4 ranks, so the tokens are split along T (Note [Token
  // shards] in parallel/tp/gpt2_1d.cpp); the cases above, with batches that divide, split the batch.
  expect_tensor_parallel(Layout{.tensor = comm::testing::world().size()}, 1, /*clip=*/0.1,
                         /*sequence_parallel=*/true, /*global_batch=*/3);
}

TEST(LayoutEquivalence, TensorParallelGpt2WithSequenceParallelismAccumulationAndClipping) {
  expect_tensor_parallel(Layout{.tensor = comm::testing::world().size()}, 2, /*clip=*/0.1,
                         /*sequence_parallel=*/true);
}

TEST(LayoutEquivalence, DataTimesTensorParallelGpt2WithSequenceParallelism) {
  if (comm::testing::world().size() != 4) GTEST_SKIP() << "dp2 x tp2 needs 4 ranks";
  expect_tensor_parallel(Layout{.data = 2, .tensor = 2}, 2, /*clip=*/0.1, /*sequence_parallel=*/true);
}

}  // namespace
}  // namespace colossal::testing

int main(int argc, char** argv) {
  return colossal::comm::testing::run_mpi_tests(argc, argv);
}
