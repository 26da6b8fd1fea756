// Checkpoints of a sharded model: see checkpoint_sharding.h.
#include "colossal/engine/checkpoint_sharding.h"

#include <charconv>
#include <string_view>
#include <unordered_map>

#include "colossal/amp/mixed_precision_optimizer.h"
#include "colossal/core/error.h"

namespace colossal::engine {

// Note [Checkpoints of a sharded model]
// A checkpoint holds the serial model's tensors whatever layout wrote it, so that any layout can
// read it (tp=2 -> tp=1, tp=4, dp x tp) and `colossal export` needs to know nothing of layouts. The
// tensor-parallel layers declare how each parameter lives on the group (parallel/tp/shard_spec.h);
// what else a rank keeps per parameter is split the same way:
//  - the optimizer's state "state.<i>.<buffer>": the optimizer counts its parameters across groups
//    in order, and the parallel model has the serial model's parameters, names and order (only the
//    shapes differ), so index i names the same parameter at every layout; its moments (every buffer
//    of the parameter's rank: exp_avg, exp_avg_sq, momentum_buffer) take the parameter's spec, its
//    step count and the hyper-parameters are replicated;
//  - under mixed precision the fp32 master weights "master.<name>" take the parameter's spec.
// Saving gathers each split tensor over the tensor group (every rank of the group takes part; the
// world's rank 0 writes); loading reads the whole file on every rank and keeps each its shard
// (shard_of), so the file is exactly the one a serial run writes after the same steps.
// ZeRO (parallel/zero/) keeps whole parameters on every rank but splits the optimizer's buffers and
// the masters over the data group: its own gather_* / shard_* turn its 1-D shards into the serial
// tensors and back, keyed the same way, so a checkpoint written under ZeRO at dp=2 resumes at dp=1
// without it, and the reverse.

namespace {

using parallel::tp::ShardSpec;

/// (i, buffer) from an optimizer state key "state.<i>.<buffer>".
bool parse_state_key(std::string_view key, size_t& index, std::string_view& buffer) {
  constexpr std::string_view kState = "state.";
  if (!key.starts_with(kState)) return false;
  key.remove_prefix(kState.size());
  const size_t dot = key.find('.');
  if (dot == std::string_view::npos) return false;
  auto [end, ec] = std::from_chars(key.data(), key.data() + dot, index);
  if (ec != std::errc() || end != key.data() + dot) return false;
  buffer = key.substr(dot + 1);
  return true;
}

}  // namespace

CheckpointSharding::CheckpointSharding(Engine& engine) : zero_(engine.zero()) {
  const parallel::ParallelContext& context = engine.context();
  if (!context.has_group(parallel::GroupKind::kTensor) || context.size(parallel::GroupKind::kTensor) == 1) return;
  group_ = context.group(parallel::GroupKind::kTensor);
  specs_ = parallel::tp::collect_shard_specs(engine.model());

  std::unordered_map<const core::TensorImpl*, std::string> names;
  for (const auto& [name, parameter] : engine.model().named_parameters()) names.emplace(parameter.impl(), name);
  if (amp::MixedPrecisionOptimizer* amp = engine.amp()) {
    // The optimizer steps the fp32 masters, index-aligned with the model's parameters.
    for (size_t k = 0; k < amp->master_params().size(); ++k) {
      auto it = names.find(amp->model_params()[k].impl());
      if (it != names.end()) names.emplace(amp->master_params()[k].impl(), it->second);
    }
  }
  for (const optim::ParamGroup& param_group : engine.optimizer().param_groups()) {
    for (const Tensor& parameter : param_group.params) {
      auto it = names.find(parameter.impl());
      COLOSSAL_CHECK(it != names.end(),
                     "checkpoint: the optimizer updates a tensor of shape {} that is none of the model's parameters; "
                     "a tensor-parallel checkpoint needs each optimizer state named by its parameter",
                     parameter.shape());
      optimizer_names_.push_back(it->second);
    }
  }
}

ShardSpec CheckpointSharding::model_spec(const std::string& name) const {
  auto it = specs_.find(name);
  return it == specs_.end() ? ShardSpec::replicate() : it->second;
}

ShardSpec CheckpointSharding::optimizer_spec(const std::string& key, const Tensor& tensor) const {
  size_t index = 0;
  std::string_view buffer;
  if (!parse_state_key(key, index, buffer) || buffer == "step" || index >= optimizer_names_.size()) {
    return ShardSpec::replicate();
  }
  const ShardSpec spec = model_spec(optimizer_names_[index]);
  if (spec.replicated() || tensor.dim() <= spec.dim) return ShardSpec::replicate();
  return spec;
}

ShardSpec CheckpointSharding::amp_spec(const std::string& key) const {
  constexpr std::string_view kMaster = "master.";
  if (!key.starts_with(kMaster)) return ShardSpec::replicate();
  return model_spec(key.substr(kMaster.size()));
}

Tensor CheckpointSharding::gather(const Tensor& local, const ShardSpec& spec) const {
  return spec.replicated() ? local : parallel::tp::gather_shard(local, spec, *group_);
}

Tensor CheckpointSharding::shard(const std::string& key, const Tensor& serial, const ShardSpec& spec) const {
  if (spec.replicated()) return serial;
  try {
    return parallel::tp::shard_of(serial, spec, group_->rank(), group_->size());
  } catch (const Error& e) {
    COLOSSAL_FAIL(
        "tensor \"{}\" of shape {} cannot be split over the {} tensor-parallel ranks as this model splits it "
        "(was the checkpoint written for another model config?): {}",
        key, serial.shape(), group_->size(), e.what());
  }
}

nn::StateDict CheckpointSharding::gather_model(const nn::StateDict& model) const {
  if (!active()) return model;
  nn::StateDict out;
  for (const auto& [name, tensor] : model) out.insert(name, gather(tensor, model_spec(name)));
  return out;
}

optim::StateDict CheckpointSharding::gather_optimizer(const optim::StateDict& optimizer) const {
  if (zero_ != nullptr) return zero_->gather_optimizer_state(optimizer);  // ZeRO has no tensor group
  if (!active()) return optimizer;
  optim::StateDict out;
  for (const auto& [key, tensor] : optimizer) out.emplace(key, gather(tensor, optimizer_spec(key, tensor)));
  return out;
}

optim::StateDict CheckpointSharding::gather_amp(const optim::StateDict& amp) const {
  if (zero_ != nullptr) return zero_->gather_amp_state(amp);
  if (!active()) return amp;
  optim::StateDict out;
  for (const auto& [key, tensor] : amp) out.emplace(key, gather(tensor, amp_spec(key)));
  return out;
}

nn::StateDict CheckpointSharding::shard_model(const nn::StateDict& model) const {
  if (!active()) return model;
  nn::StateDict out;
  for (const auto& [name, tensor] : model) out.insert(name, shard("model." + name, tensor, model_spec(name)));
  return out;
}

optim::StateDict CheckpointSharding::shard_optimizer(const optim::StateDict& optimizer) const {
  if (zero_ != nullptr) return zero_->shard_optimizer_state(optimizer);
  if (!active()) return optimizer;
  optim::StateDict out;
  for (const auto& [key, tensor] : optimizer) {
    out.emplace(key, shard("optimizer." + key, tensor, optimizer_spec(key, tensor)));
  }
  return out;
}

optim::StateDict CheckpointSharding::shard_amp(const optim::StateDict& amp) const {
  if (zero_ != nullptr) return zero_->shard_amp_state(amp);
  if (!active()) return amp;
  optim::StateDict out;
  for (const auto& [key, tensor] : amp) out.emplace(key, shard("amp." + key, tensor, amp_spec(key)));
  return out;
}

}  // namespace colossal::engine
