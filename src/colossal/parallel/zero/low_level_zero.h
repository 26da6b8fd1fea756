// LowLevelZero: ZeRO stages 1 and 2 (Rajbhandari et al.; Colossal-AI's LowLevelZeroOptimizer) as the
// Engine's gradient handler. Each rank of the data-parallel group steps only its shard of the
// parameters (parallel/zero/partition.h): the optimizer's states and, under naive fp16 / bf16, the
// fp32 master weights exist for that shard alone (stage 1). Gradients are reduce-scattered in buckets
// during backward, each rank keeping the fp32 gradients of its shard (stage 2 does so at every
// micro-step, so no full gradient outlives its bucket; stage 1 accumulates the full local gradients
// over the window and reduces at its end). After the step each rank's updated parameters are
// all-gathered back into every replica. See Note [ZeRO step] in low_level_zero.cpp.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "colossal/amp/mixed_precision_optimizer.h"
#include "colossal/comm/process_group.h"
#include "colossal/core/tensor.h"
#include "colossal/nn/module.h"
#include "colossal/optim/optimizer.h"
#include "colossal/parallel/gradient_handler.h"
#include "colossal/parallel/zero/host_offload.h"
#include "colossal/parallel/zero/partition.h"
#include "colossal/parallel/zero/units.h"
#include "colossal/parallel/zero/zero_handler.h"  // ZeroHandler, ModelStateBytes

namespace colossal::parallel::zero {

struct ZeroOptions {
  /// 1: optimizer states and fp32 masters sharded; 2: gradients too (config zero.stage).
  int stage = 1;
  /// Gradient bytes per bucket (config zero.reduce_bucket_mb; Colossal-AI's and DDP's 25 MiB).
  int64_t reduce_bucket_bytes = int64_t{25} << 20;
  /// Unset: Granularity::tensor for optimizers whose update takes norms per tensor (LAMB, LARS:
  /// uses_tensor_norms), element otherwise.
  std::optional<Granularity> granularity;
  /// Broadcast parameters, buffers and fp32 masters from the group's rank 0 at construction.
  bool broadcast_parameters = true;
  /// Stages 1 and 2 with the parameters in their buckets: leave the step's parameter all-gathers
  /// running into the next forward, each unit waiting for its own buckets (Note [Gathers under the
  /// forward] in low_level_zero.cpp). The environment variable COLOSSAL_ZERO_GATHER_IN_FORWARD (0 or
  /// 1), when set, overrides it.
  bool gather_in_forward = true;
  /// Stages 1 and 2 on the device: buckets (the last reduced) whose shards the update steps after
  /// the others, which step while these are still being reduced (Note [Update beside the last
  /// reductions] in engine/engine.cpp; DataParallelOptions::late_buckets); 0 steps everything after
  /// every reduction. The environment variable COLOSSAL_ZERO_LATE_BUCKETS, when set, overrides it.
  int late_buckets = 2;
  /// Config zero.offload_optimizer: the shard's fp32 masters and the optimizer's moments live in host
  /// memory and the optimizer steps there (parallel/zero/host_offload.h, Note [Optimizer offload];
  /// stage 3: Note [ZeRO-3 offload] in zero3.cpp); Adam, AdamW and LAMB only (stage 3: no LAMB).
  bool offload_optimizer = false;
  /// With offload_optimizer: step each bucket (stage 3: chunk) on the host as soon as its gradient
  /// is there, while backward goes on. Only right when nothing needs all gradients before the step
  /// (no clipping, no fp16 loss scale): the Engine sets it so.
  bool step_during_backward = false;
  // Stage 3 (parallel/zero/zero3.h; the chunk manager, chunk_manager.h):
  /// Parameter bytes per chunk (config zero.chunk_size_mb): a unit's parameters are packed into
  /// chunks of at most this size (a larger parameter gets one of its own), each gathered whole.
  int64_t chunk_bytes = int64_t{32} << 20;
  /// Where the parameter shards live between uses (config zero.placement_policy).
  Placement placement = Placement::cuda;
  /// "auto": device bytes the resident shards may take. Unset: measured after the first (warm-up)
  /// step as what the device has left beside that step's peak (tests set it to make "auto" evict).
  std::optional<int64_t> device_budget_bytes;
};

/// Whether `optimizer`'s update of a tensor depends on norms over the whole tensor (LAMB's and
/// LARS's trust ratios), so ZeRO must keep its tensors whole on one rank.
bool uses_tensor_norms(const optim::Optimizer& optimizer);

class LowLevelZero final : public ZeroHandler {
 public:
  /// Shards `optimizer` (built over `model`'s parameters, without state yet; under mixed precision
  /// already wrapped by `amp`, which must then be non-null) over `group`: rebinds its param groups to
  /// the shards this rank steps and registers gradient-ready hooks on the model's parameters. Build
  /// it after any dtype or device conversion of the model (the Engine does, after the mixed-precision
  /// wrapper). Every rank of `group` must construct it with the same model and optimizer structure.
  /// Throws naming the parameter when a trainable one is in no optimizer group, the stage when it is
  /// not 1 or 2, and the optimizer when it has state.
  LowLevelZero(nn::Module& model, optim::Optimizer& optimizer, amp::MixedPrecisionOptimizer* amp,
               std::shared_ptr<comm::ProcessGroup> group, ZeroOptions options);
  ~LowLevelZero() override;
  LowLevelZero(const LowLevelZero&) = delete;
  LowLevelZero& operator=(const LowLevelZero&) = delete;

  /// Before each backward. Stage 1: whether it ends the window (its gradients are reduced) or only
  /// accumulates locally. Stage 2 reduces every backward's gradients into the shard either way.
  void set_sync(bool sync) override;
  /// Waits for the window's reductions and puts each shard's reduced fp32 gradient into the .grad
  /// of the tensor the optimizer steps for it (shards()); the model's gradients are dropped.
  void finish() override;
  /// Waits for every bucket's reduction but the last late_buckets', gives every shard its gradient
  /// (the late ones' filled by finish()) and returns the late buckets' shards; or finish() and none
  /// where the step could not read the shard gradient as it lands (see the definition).
  std::vector<Tensor> finish_all_but_late() override;
  /// Drops the open window: its reductions (those in flight completed first, as on every rank) and
  /// the model's local gradients.
  void zero_grad() override;
  /// Launches the buckets backward has not (parameters without a gradient) and returns true: finish()
  /// issues nothing more on group().
  bool issue_all() override;
  /// All-gathers the updated parameters (nothing when the step was skipped): with the parameters in
  /// their buckets, asynchronously, the next forward's units waiting for theirs.
  void after_update(bool stepped) override;
  /// Makes the caller's stream wait for every parameter all-gather still running.
  void wait_for_parameters() override;
  const comm::ProcessGroup& group() const override { return *group_; }
  /// Each rank holds the gradients of its shard only.
  bool replicates_gradients() const override { return false; }
  std::string_view name() const override;

  int stage() const override { return options_.stage; }
  const Partition& partition() const { return *partition_; }
  /// Whether the model's parameters live in one flat buffer per bucket, gathered in place after the
  /// step (Note [Parameters in their buckets] in low_level_zero.cpp).
  bool parameters_in_buckets() const { return !flat_params_.empty(); }
  /// Whether the step's all-gathers run on into the next forward (Note [Gathers under the forward]):
  /// gather_in_forward, and a forward has shown every unit's hooks run.
  bool gathers_under_forward() const { return options_.gather_in_forward && units_checked_ && units_hooked_; }
  /// The tensors the optimizer steps, index-aligned with param_names() (the optimizer's parameters
  /// in group order): 1-D shards of each parameter, empty where this rank owns none of it.
  const std::vector<Tensor>& shards() const override { return shards_; }
  const std::vector<std::string>& param_names() const override { return names_; }

  /// Checkpoints hold the serial optimizer and mixed-precision state (Note [Checkpoints of a
  /// sharded model] in engine/checkpoint_sharding.cpp). gather_* all-gather each shard's tensors
  /// ("state.<i>.<buffer>", "master.<name>") into the whole parameter's (every rank of the group
  /// calls them together, with the same keys); shard_* cut this rank's pieces out of whole ones.
  optim::StateDict gather_optimizer_state(const optim::StateDict& state) const override;
  optim::StateDict shard_optimizer_state(const optim::StateDict& state) const override;
  optim::StateDict gather_amp_state(const optim::StateDict& state) const override;
  optim::StateDict shard_amp_state(const optim::StateDict& state) const override;

  /// After finish(): every parameter's reduced gradient, whole (all-gathered over the group), by
  /// name: for tests and debugging. Collective.
  std::vector<std::pair<std::string, Tensor>> gather_gradients() const override;

  /// This rank's model states now: parameters, optimizer states and masters as held; gradients as a
  /// window holds them at most: stage 1 the full local gradients (model dtype) plus the fp32 shard,
  /// stage 2 the fp32 shard plus one bucket in flight. Device memory only: with offload the masters
  /// and moments are on the host (host_bytes(), pinned_host_bytes()).
  ModelStateBytes model_state_bytes() const override;

  /// Optimizer offload (ZeroOptions::offload_optimizer; ZeroHandler's): after_update copies the
  /// updated parameters to the device and all-gathers them.
  bool offloads_optimizer() const override { return offload_ != nullptr; }
  void step_on_host() override;
  void load_masters_from_model() override;
  int64_t host_bytes() const override;
  int64_t pinned_host_bytes() const override;

 private:
  struct Entry;
  struct BucketState;
  struct InFlight;
  void mark_ready(size_t bucket, size_t slot);
  void launch_ready_in_order();
  void launch(size_t bucket);
  void launch_the_rest();                     // the buckets the current backward has not launched (once it marked one)
  Tensor shard_gradient(size_t entry) const;  // the entry's slice of shard_grad_
  void flush_backward();
  void drain(bool all, size_t end = SIZE_MAX);  // the reductions in flight of buckets before `end`
  std::vector<DType> reduced_dtypes() const;    // each bucket's gradient dtype
  void make_offload();
  bool parameters_own_their_memory() const;
  void bind_flat_parameters();
  void hook_units(std::vector<Unit> units);
  void wait_for_gathers(const std::vector<size_t>& buckets);
  Tensor gather_piece(const Tensor& local, size_t param) const;
  Tensor own_piece(const Tensor& whole, size_t param, const std::string& key) const;

  nn::Module& model_;
  optim::Optimizer& optimizer_;
  amp::MixedPrecisionOptimizer* amp_;
  std::shared_ptr<comm::ProcessGroup> group_;
  ZeroOptions options_;
  std::vector<Entry> entries_;  // the optimizer's parameters, in group order
  std::vector<std::string> names_;
  std::vector<Tensor> shards_;
  std::unique_ptr<Partition> partition_;
  std::vector<size_t> fill_order_;  // partition index -> entry index
  std::vector<size_t> entry_slot_;  // entry index -> partition index
  std::vector<BucketState> buckets_;
  // Where every parameter owns its memory and the step runs on the device: one flat buffer per bucket
  // holding the model's parameters (Note [Parameters in their buckets]).
  std::vector<Tensor> flat_params_;
  std::vector<size_t> gather_order_;  // the order after_update gathers the buckets in
  // Note [Gathers under the forward]: each bucket's all-gather the next forward has not waited for,
  // and the units whose pre-hooks wait (the model's own last).
  struct UnitWait {
    nn::Module* module = nullptr;
    std::vector<size_t> buckets;
    int64_t pre_hook = -1;
    bool ran = false;  // its pre-hook ran in the forward under way
  };
  std::vector<comm::Work> gathers_;
  std::vector<UnitWait> unit_waits_;
  int64_t model_hook_ = -1;
  bool units_checked_ = false;  // a forward through the model's hooks has ended
  bool units_hooked_ = false;   // and every unit's pre-hook ran in it
  std::vector<InFlight> in_flight_;
  size_t next_launch_ = 0;
  bool sync_ = true;
  bool backward_marked_ = false;         // the current backward marked a parameter
  bool window_reduced_ = false;          // the window launched a reduction
  Tensor shard_grad_;                    // partition().shard_numel(): the window's reduced gradients
  int64_t shard_grad_element_size_ = 4;  // its last window's dtype (Note [Shard gradient dtype])
  bool shard_grad_written_ = false;
  bool shard_grad_written_once_ = false;  // made by the window's last backward: reductions go straight in
  Tensor master_shard_;                   // naive / bf16: the f32 masters of this rank's shard, end to end
  std::unique_ptr<HostOffload> offload_;  // offload_optimizer: the masters and the step on the host
  bool discarding_ = false;               // zero_grad drops the window: no gradient to the host
};

}  // namespace colossal::parallel::zero
