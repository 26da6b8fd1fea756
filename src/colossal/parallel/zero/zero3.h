// Zero3: ZeRO stage 3 (Rajbhandari et al.; Colossal-AI's Gemini, FSDP) as the Engine's gradient
// handler. Parameters, gradients, fp32 masters and optimizer states are all sharded over the
// data-parallel group: each rank keeps 1/Nd of every chunk of parameters (parallel/zero/
// chunk_manager.h), a unit's chunks are all-gathered before its forward and again before its
// backward, freed after each, the next unit's prefetched meanwhile; gradients are reduce-scattered
// into the shard as each unit's backward completes; the optimizer steps the shard and nothing is
// gathered after the step. With zero.offload_optimizer the masters and moments live on the host and
// the step runs there, writing the shards where they live. See Note [ZeRO-3 units], Note [ZeRO-3
// step] and Note [ZeRO-3 offload] in zero3.cpp.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "colossal/amp/mixed_precision_optimizer.h"
#include "colossal/comm/process_group.h"
#include "colossal/core/tensor.h"
#include "colossal/nn/module.h"
#include "colossal/optim/optimizer.h"
#include "colossal/parallel/zero/chunk_manager.h"
#include "colossal/parallel/zero/host_offload.h"
#include "colossal/parallel/zero/low_level_zero.h"  // ZeroOptions
#include "colossal/parallel/zero/zero_handler.h"

namespace colossal::parallel::zero {

class Zero3 final : public ZeroHandler {
 public:
  /// Shards `model`'s parameters, `optimizer` (built over them, without state; under mixed precision
  /// already wrapped by `amp`) and its masters over `group`, and hooks the model's units: the model
  /// itself and every module held in a Sequential or ModuleList (GPT-2's and ViT's blocks, an MLP's
  /// layers), which the model must call through Module::operator() (Note [Forward hooks]). Build it
  /// after any dtype or device conversion; from then on the model's parameters hold memory only
  /// while a unit computes (read them through gather_model_state). Throws naming the parameter when
  /// one is frozen or in no optimizer group, and the optimizer when it takes whole-tensor norms
  /// (LAMB, LARS: use stage 1 or 2) or has state.
  Zero3(nn::Module& model, optim::Optimizer& optimizer, amp::MixedPrecisionOptimizer* amp,
        std::shared_ptr<comm::ProcessGroup> group, ZeroOptions options);
  ~Zero3() override;
  Zero3(const Zero3&) = delete;
  Zero3& operator=(const Zero3&) = delete;

  /// Before each backward: the last backward's units that got no gradient send zeros now.
  void set_sync(bool sync) override;
  /// Sends what is left, waits for the reductions, frees every gathered chunk, fetches the shards to
  /// the device and gives each tensor the optimizer steps its slice of the f32 shard gradient. With
  /// optimizer offload the shards stay where they are and the slices are of the host gradient.
  void finish() override;
  void zero_grad() override;
  /// With offload, copies the host step's updated parameters into the shards on the device (those on
  /// the host were written by the step); then places the shards for the next step (the chunk
  /// manager's policy). Nothing is gathered.
  void after_update(bool stepped) override;
  const comm::ProcessGroup& group() const override { return *group_; }
  bool replicates_gradients() const override { return false; }
  std::string_view name() const override;

  int stage() const override { return 3; }
  const std::vector<Tensor>& shards() const override { return shards_; }
  const std::vector<std::string>& param_names() const override { return names_; }
  optim::StateDict gather_optimizer_state(const optim::StateDict& state) const override;
  optim::StateDict shard_optimizer_state(const optim::StateDict& state) const override;
  optim::StateDict gather_amp_state(const optim::StateDict& state) const override;
  optim::StateDict shard_amp_state(const optim::StateDict& state) const override;
  nn::StateDict gather_model_state(const nn::StateDict& state) const override;
  void load_model_state(nn::Module& model, const nn::StateDict& state) override;
  std::vector<std::pair<std::string, Tensor>> gather_gradients() const override;
  /// Parameters: this rank's shards (1/Nd of the model, with each chunk's padding); gradients: the
  /// f32 shard gradient plus the largest chunk's reduction in flight; masters and optimizer states
  /// of the shard.
  /// With optimizer offload, device memory only: the parameter shards on the device, the f32 shard
  /// gradient and the chunk in flight (masters and moments are on the host: host_bytes()).
  ModelStateBytes model_state_bytes() const override;

  /// Optimizer offload (ZeroOptions::offload_optimizer, Note [ZeRO-3 offload] in zero3.cpp).
  bool offloads_optimizer() const override { return offload_ != nullptr; }
  void step_on_host() override;
  void load_masters_from_model() override;
  /// The chunk manager's host buffers (the shards on the host, the spare buffers of those on the
  /// device: pinned on a GPU machine), plus with offload the offload's host memory (masters, gradient
  /// shard, moments). Each buffer counts once: a device shard's offloaded update is staged in its
  /// spare buffer, which is the chunk manager's.
  int64_t host_bytes() const override;
  int64_t pinned_host_bytes() const override;

  const ChunkManager& chunks() const { return *chunks_; }
  /// The optimizer offload (null without zero.offload_optimizer).
  const HostOffload* offload() const { return offload_.get(); }
  /// The hooked units' module names ("" for the model, "h.0", ...), in registration order.
  const std::vector<std::string>& unit_names() const { return unit_names_; }

 private:
  struct Unit;
  struct InFlight;
  class BackwardHook;
  void forward_begin(size_t unit);
  Tensor forward_end(size_t unit, const Tensor& output);
  void backward_begin(size_t unit);
  void mark_ready(size_t unit, size_t param);
  void reduce_unit(size_t unit);
  void flush_backward();
  void drain(bool all);
  std::vector<DType> reduced_dtypes() const;  // each chunk's dtype
  void prefetch_after(const std::vector<size_t>& order, size_t unit);
  Tensor gather_whole(const Tensor& local, size_t param) const;
  Tensor own_piece(const Tensor& whole, size_t param, const std::string& key) const;
  void make_offload();
  HostOffload::Output offload_output(size_t chunk);
  int64_t chunk_host_bytes() const;

  nn::Module& model_;
  optim::Optimizer& optimizer_;
  amp::MixedPrecisionOptimizer* amp_;
  std::shared_ptr<comm::ProcessGroup> group_;
  ZeroOptions options_;
  std::vector<Tensor> params_;  // the model's parameters, in the optimizer's order
  std::vector<std::string> names_;
  std::vector<Tensor> shards_;  // what the optimizer steps, index-aligned
  std::unique_ptr<ChunkManager> chunks_;
  std::vector<Unit> units_;
  std::vector<std::string> unit_names_;
  std::vector<int64_t> grad_offset_;  // per chunk: where its shard starts in shard_grad_
  int64_t shard_grad_numel_ = 0;
  Tensor shard_grad_;                    // the window's reduced gradients of every chunk's shard
  int64_t shard_grad_element_size_ = 4;  // its last window's dtype (Note [Shard gradient dtype])
  std::vector<InFlight> in_flight_;
  Tensor master_shard_;  // naive / bf16: the f32 masters of every chunk's shard
  // The units' order in the first forward and backward, for prefetching the next one.
  std::vector<size_t> forward_order_, backward_order_;
  bool orders_recorded_ = false;
  bool backward_marked_ = false;
  bool window_reduced_ = false;
  std::unique_ptr<HostOffload> offload_;  // offload_optimizer: the masters and the step on the host
  bool sync_ = true;                      // the current backward ends the window
  bool discarding_ = false;               // zero_grad drops the window: no gradient to the host
};

}  // namespace colossal::parallel::zero
