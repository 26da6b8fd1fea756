// Layout-independent checkpoints of a tensor-parallel model: the conversions between what a rank of
// the tensor-parallel group holds (its shard of each split parameter, of the optimizer's moments and
// of the fp32 master weights) and the serial model's whole tensors under its names, which is what a
// checkpoint stores whatever the layout that wrote it. save_checkpoint gathers, load_checkpoint
// takes each rank's shard. Under ZeRO the optimizer's state and the fp32 masters are also split over
// the data group (parallel/zero/low_level_zero.h), gathered and cut the same way. See Note [Checkpoints of a sharded
// model] in checkpoint_sharding.cpp. Under a pipeline each stage holds some of the serial model's
// tensors under its own names and its optimizer counts its own parameters: the stages' tensors are
// renamed to the serial ones and sent to the pipeline's first stage, and each stage takes its own
// back on load (Note [Checkpoints of a pipeline]).
#pragma once

#include <map>
#include <string>
#include <vector>

#include "colossal/comm/process_group.h"
#include "colossal/engine/engine.h"
#include "colossal/nn/state_dict.h"
#include "colossal/optim/optimizer.h"  // optim::StateDict
#include "colossal/parallel/tp/shard_spec.h"
#include "colossal/parallel/zero/zero_handler.h"

namespace colossal::engine {

class CheckpointSharding {
 public:
  /// The shard specs of `engine`'s model over its context's tensor-parallel group (nothing to do
  /// where that group has one rank).
  explicit CheckpointSharding(Engine& engine);

  /// Whether any tensor is split (the tensor group has more than one rank).
  bool active() const { return group_ != nullptr; }
  /// Whether the engine holds one stage of a pipeline (EngineOptions::serial_names with a pipeline
  /// group of more than one rank).
  bool pipelined() const { return pipeline_ != nullptr; }
  /// The serial model's trainable parameter names (the serial optimizer's), under a pipeline; empty
  /// otherwise.
  std::vector<std::string> serial_parameter_names() const;

  /// The serial tensors from this rank's: every split tensor gathered over the group (every rank
  /// of the group calls these together, with the same keys in the same order), replicated ones as
  /// they are. `model` holds state_dict() names, `optimizer` the optimizer's state_dict() keys,
  /// `amp` the mixed-precision optimizer's. Under a pipeline every stage calls them together, and
  /// the whole serial state is on the first stage's ranks of tensor rank 0 (the writer's) only.
  nn::StateDict gather_model(const nn::StateDict& model) const;
  /// Loads a checkpoint's model tensors (this rank's, from shard_model) into the engine's model:
  /// under ZeRO-3 each rank keeps its shard of the parameters (ZeroHandler::load_model_state).
  void load_model(Engine& engine, const nn::StateDict& model) const;
  optim::StateDict gather_optimizer(const optim::StateDict& optimizer) const;
  optim::StateDict gather_amp(const optim::StateDict& amp) const;

  /// This rank's shards of the serial tensors a checkpoint holds (no communication); under a
  /// pipeline the stage's tensors among them, under the stage's names and optimizer indices.
  nn::StateDict shard_model(const nn::StateDict& model) const;
  optim::StateDict shard_optimizer(const optim::StateDict& optimizer) const;
  optim::StateDict shard_amp(const optim::StateDict& amp) const;

 private:
  /// The spec of the model's parameter or buffer `name` (replicated when it names none).
  parallel::tp::ShardSpec model_spec(const std::string& name) const;
  /// The spec of the optimizer's state key "state.<i>.<buffer>": its parameter's for a buffer of the
  /// parameter's rank (the moments), replicated for anything else (step counts, hyper-parameters).
  parallel::tp::ShardSpec optimizer_spec(const std::string& key, const Tensor& tensor) const;
  /// The spec of the mixed-precision key "master.<name>": the parameter's; replicated otherwise.
  parallel::tp::ShardSpec amp_spec(const std::string& key) const;
  Tensor gather(const Tensor& local, const parallel::tp::ShardSpec& spec) const;
  /// Every stage's `local` (serial names) on the pipeline's first stage, the first holder's tensor
  /// where two stages hold one (the tied wte); the other stages get `local` back. `what` names the
  /// exchange for errors.
  std::vector<std::pair<std::string, Tensor>> gather_stages(std::vector<std::pair<std::string, Tensor>> local,
                                                            const char* what) const;
  /// The serial optimizer's index of the stage optimizer's parameter `index`.
  size_t serial_index(size_t index) const;
  /// The serial optimizer's group of the stage optimizer's group `g`.
  size_t serial_group(size_t g) const;
  /// This rank's part of the checkpoint's tensor `key`; throws naming it when it does not split.
  Tensor shard(const std::string& key, const Tensor& serial, const parallel::tp::ShardSpec& spec) const;

  std::shared_ptr<comm::ProcessGroup> group_;
  /// The engine's ZeRO handler, whose ranks each hold a shard of the optimizer and masters; null
  /// without ZeRO.
  const parallel::zero::ZeroHandler* zero_ = nullptr;
  std::map<std::string, parallel::tp::ShardSpec> specs_;
  /// The model's name of the optimizer's i-th parameter (across groups, as its state_dict counts).
  std::vector<std::string> optimizer_names_;

  // Under a pipeline (null group without one):
  std::shared_ptr<comm::ProcessGroup> pipeline_;
  std::shared_ptr<const SerialNames> serial_;
  /// Whether this rank's pipeline group is the writer's (tensor rank 0): the others gather nothing.
  bool pipeline_gathers_ = false;
  /// The serial model's names -> this stage's (a stage may hold one tensor under two names).
  std::map<std::string, std::vector<std::string>> stage_names_;
  /// The serial optimizer's index of each serial parameter name, and its group.
  std::map<std::string, std::pair<size_t, size_t>> serial_index_;
  /// The stage optimizer's group sizes, and each group's serial group.
  std::vector<size_t> group_sizes_, serial_groups_;
};

}  // namespace colossal::engine
