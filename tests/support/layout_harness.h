// The layout-equivalence harness (the OneFlow habit): one training problem run twice on every rank,
// serially (the whole global batch through the serial model) and under a parallel layout (each rank
// its share, through the Engine with a ParallelContext), comparing at every optimizer step the
// loss, the gradients the update uses (after the gradient handler) and the updated parameters.
// Every parallel mode adds its layouts here: today data parallelism (dp, with accumulation,
// clipping and mixed precision); tensor, pipeline and ZeRO layouts extend Layout and the gathering
// of their shards back to serial names.
//
// Ranks: MPI ranks on the CPU (the mpi-labelled tests), NCCL ranks on GPUs where the world group is
// NCCL. The serial run happens on the same device as the layout run.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "colossal/amp/grad_scaler.h"  // GradScalerOptions
#include "colossal/comm/process_group.h"
#include "colossal/config/train_config.h"  // TensorSpecRule
#include "colossal/core/random.h"
#include "colossal/core/tensor.h"
#include "colossal/engine/engine.h"
#include "colossal/nn/module.h"
#include "colossal/optim/optimizer.h"
#include "colossal/parallel/parallel_context.h"
#include "colossal/parallel/zero/partition.h"     // Granularity
#include "colossal/parallel/zero/zero_handler.h"  // Placement

namespace colossal::testing {

enum class Precision {
  f32,   ///< everything in f32
  bf16,  ///< bf16 model, f32 master weights (amp bf16)
  fp16,  ///< f16 model, f32 masters, dynamic loss scale (amp naive)
};

struct Layout {
  int data = 1;    ///< data-parallel ranks (the world must hold data * pipeline * tensor)
  int tensor = 1;  ///< tensor-parallel ranks (1D); needs HarnessCase::parallelize
  /// ZeRO stage over the data ranks (parallel/zero/low_level_zero.h, zero3.h): 0 off, 1, 2 or 3.
  int zero = 0;
  /// ZeRO's bucket size: small, so that the tiny models fill several buckets and split parameters
  /// between ranks.
  int64_t zero_bucket_bytes = 512;
  /// ZeRO's granularity; unset: the optimizer's default (parallel::zero::uses_tensor_norms).
  std::optional<parallel::zero::Granularity> zero_granularity;
  /// Stages 1 and 2: the optimizer on the host (zero.offload_optimizer; Adam, AdamW or LAMB).
  bool zero_offload = false;
  /// Stage 3: chunk bytes (small, so that a unit spans several chunks and parameters split between
  /// ranks), the shards' placement and "auto"'s device budget (small, so that it evicts).
  int64_t zero_chunk_bytes = 256;
  parallel::zero::Placement zero_placement = parallel::zero::Placement::cuda;
  std::optional<int64_t> zero_device_budget_bytes;
  // pipeline joins with its issue.
  std::string name() const;  ///< "dp2", "tp2", "dp2_tp2", "dp2_zero1", "dp2_zero3_cpu"
};

struct HarnessCase {
  std::string name;
  /// The serial model, on the CPU in f32, initialised from `init`. Equal seeds must give equal
  /// models (every rank builds its own). Models with dropout must have it off: the serial run draws
  /// one mask for the global batch, a rank one for its share.
  std::function<std::shared_ptr<nn::Module>(core::Generator& init)> build_model;
  /// Rows [begin, end) of the global batch of micro-step `micro` of update `step`: (input, target)
  /// on the CPU. Must depend only on its arguments.
  std::function<std::pair<Tensor, Tensor>(int64_t step, int64_t micro, int64_t begin, int64_t end)> rows;
  engine::Criterion criterion;
  /// For tensor-parallel layouts: the parallel model made from the serial one (on its device) for
  /// this rank of the context's tensor group, and its criterion. Its parameters keep the serial
  /// names, and the harness compares each, gathered by its shard spec (parallel/tp/shard_spec.h),
  /// with the serial one.
  std::function<std::shared_ptr<nn::Module>(nn::Module& serial, const parallel::ParallelContext& context)> parallelize;
  std::function<engine::Criterion(const parallel::ParallelContext& context)> parallel_criterion;
  /// The optimizer over the model's parameters (after the model moved to its device); default SGD
  /// with momentum 0.9, lr 0.05 (see layout_harness.cpp for why not AdamW by default).
  std::function<std::shared_ptr<optim::Optimizer>(nn::Module& model)> make_optimizer;
  int64_t global_batch = 8;  ///< rows of one micro-step over all data-parallel ranks
  int64_t steps = 3;         ///< optimizer updates
  int64_t accumulation = 1;  ///< micro-steps per update
  std::optional<double> clip;
  Precision precision = Precision::f32;
  /// fp16: the loss scaler's options (unset: the naive mode's defaults). A scale that makes the first
  /// step overflow checks that every rank skips the same steps as the serial run.
  std::optional<amp::GradScalerOptions> scaler;
  /// Largest relative difference (by norm, per tensor; per value for losses) allowed between the
  /// serial and the layout run. The default suits f32 (see layout_harness.cpp).
  double tolerance = 1e-5;
};

/// The tolerance of vit_case() (and vit_tp_case()) trained with accumulation and clipping. ViT's
/// biases take their gradients from sums over few tokens that mostly cancel, so the rounding of the
/// serial and the parallel sums (another order) grows over the clipped steps: up to 3e-6 at step 1
/// and 1.05e-5 (tp2, blocks.0.norm1.bias) to 1.07e-5 (dp4, norm.bias) at step 2 on a machine without
/// AVX-512 (OpenBLAS's AVX2 kernels; earlier machines kept them under 1e-5). A wrong scaling is off
/// by 10% or more; 3e-5 still tells them apart.
inline constexpr double kClippedVitTolerance = 3e-5;

/// The largest relative differences seen, and where.
struct HarnessReport {
  double loss = 0, grad = 0, param = 0;
  std::string worst_grad, worst_param;  ///< "step 2 h.0.attn.c_attn.weight"
  int64_t compared_tensors = 0;
  int64_t skipped_steps = 0;  ///< updates the layout run skipped for inf/NaN gradients (fp16)
};

/// Runs `c` serially and under `layout` over `world` (every rank of it calls this together) and
/// adds a GoogleTest failure for each step whose loss, gradients or parameters differ by more than
/// c.tolerance, naming the layout, the step and the tensor. Returns the largest differences.
HarnessReport expect_layout_matches_serial(const HarnessCase& c, const Layout& layout,
                                           const std::shared_ptr<comm::ProcessGroup>& world);

/// Cases the data-parallel tests (and later layouts) share: a GELU MLP, a two-block ViT on 8x8
/// images, a two-block GPT-2 on 16-token windows; dropout off, deterministic rows.
HarnessCase mlp_case();
HarnessCase vit_case();
/// vit_case with four heads (splits over 2 and 4 ranks), parallelized by parallel::tp::ParallelViT;
/// its logits are whole on every rank, so the serial criterion stays. With sequence_parallel,
/// Megatron's sequence parallelism (the batch's share of the 5 tokens' sequences on each rank).
HarnessCase vit_tp_case(bool sequence_parallel = false);
/// vit_tp_case's model split as the per-parameter sharding specs `rules` say (parallel.tensor.specs,
/// resolved by parallel::tp::resolve_vit_specs); the logits stay whole, the serial criterion applies.
HarnessCase vit_tp_specs_case(std::string name, std::vector<config::TensorSpecRule> rules);
HarnessCase gpt2_case();
/// gpt2_case with four heads (splits over 2 and 4 ranks), parallelized by parallel::tp::ParallelGPT2
/// with the vocab-parallel cross-entropy; with sequence_parallel, Megatron's sequence parallelism
/// (the 16-token windows split over 2 and 4 ranks too).
/// fused_residual: the residual and c_proj's bias in the row layers' GEMMs; row_blocks: each row
/// layer's GEMM over that many blocks of rows, each all-reduced under the next (parallel.tensor.row_blocks).
HarnessCase gpt2_tp_case(bool sequence_parallel = false, bool fused_residual = false, int64_t row_blocks = 1);
/// gpt2_tp_case's model split as the per-parameter sharding specs `rules` say (parallel.tensor.specs,
/// resolved by parallel::tp::resolve_gpt2_specs), with the loss the split model computes.
HarnessCase gpt2_tp_specs_case(std::string name, std::vector<config::TensorSpecRule> rules);

}  // namespace colossal::testing
