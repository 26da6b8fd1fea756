// Checkpoints of a sharded model: see checkpoint_sharding.h.
#include "colossal/engine/checkpoint_sharding.h"

#include <charconv>
#include <set>
#include <string_view>
#include <unordered_map>

#include <fmt/format.h>

#include "colossal/amp/mixed_precision_optimizer.h"
#include "colossal/core/error.h"
#include "colossal/parallel/zero/state_pieces.h"  // parse_state_key

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
// ZeRO (parallel/zero/) splits the optimizer's buffers and the masters over the data group (stage 3
// the parameters too): its own gather_* / shard_* turn its 1-D shards into the serial tensors and
// back, keyed the same way (stage 3's parameters through gather_model_state and load_model_state),
// so a checkpoint written under ZeRO at dp=2 resumes at dp=1 without it, and the reverse.

// Note [Checkpoints of a pipeline]
// A pipeline stage's model is a list of its chunks, each a list of the serial model's pieces, which
// keep the serial model's names (Note [Pipeline layers]): its state_dict name "1.0.h.3.ln_1.weight"
// is the serial "h.3.ln_1.weight" (the run assembly hands the map over as EngineOptions::serial_names,
// with the serial model's state_dict order and the serial optimizer's parameter groups). The stage's
// optimizer counts only the stage's parameters in its groups, so "state.<i>.<buffer>" is renamed to
// the serial optimizer's index of the same parameter, and "param_groups.<g>.*" to the serial group
// holding the stage group's parameters (the serial "param_groups.<G>.params" lists are made anew).
// Saving, each stage renames its tensors (after the tensor group's gather, under pp x tp) and sends
// them with a header of names, dtypes and shapes to the pipeline's first stage over the writer's
// pipeline group (tensor rank 0); the first stage keeps the first copy of a tensor two stages hold
// (GPT-2's tied wte: equal on both, its gradient summed between them, so are its moments and master)
// and orders the model's tensors as the serial model does, so the file is the one a serial run
// writes. Loading, every stage reads the whole file and takes its own tensors under its own names
// and indices (then its tensor rank's shards): pp=2 -> pp=1, pp=1 -> pp=2 and another cut of the
// pieces all read the same file. The scheduler, the loss scaler (its overflow flag is reduced over
// the pipeline) and the generators are the first stage's.

namespace {

using parallel::tp::ShardSpec;

using parallel::zero::parse_state_key;  // (i, buffer) from "state.<i>.<buffer>"

/// (g, option) from an optimizer key "param_groups.<g>.<option>".
bool parse_group_key(std::string_view key, size_t& group, std::string_view& option) {
  constexpr std::string_view kGroups = "param_groups.";
  if (!key.starts_with(kGroups)) return false;
  key.remove_prefix(kGroups.size());
  const size_t dot = key.find('.');
  if (dot == std::string_view::npos) return false;
  auto [end, ec] = std::from_chars(key.data(), key.data() + dot, group);
  if (ec != std::errc() || end != key.data() + dot) return false;
  option = key.substr(dot + 1);
  return true;
}

/// [first, first + count) as an i64 vector: a param group's "params" entry.
Tensor index_range(size_t first, size_t count) {
  std::vector<int64_t> indices(count);
  for (size_t k = 0; k < count; ++k) indices[k] = static_cast<int64_t>(first + k);
  return core::from_vector(indices, {static_cast<int64_t>(count)});
}

}  // namespace

CheckpointSharding::CheckpointSharding(Engine& engine) : zero_(engine.zero()) {
  const parallel::ParallelContext& context = engine.context();
  const bool tensor = context.has_group(parallel::GroupKind::kTensor) && context.size(parallel::GroupKind::kTensor) > 1;
  const bool pipeline = engine.options().serial_names != nullptr && context.has_group(parallel::GroupKind::kPipeline) &&
                        context.size(parallel::GroupKind::kPipeline) > 1;
  if (!tensor && !pipeline) return;
  if (tensor) {
    group_ = context.group(parallel::GroupKind::kTensor);
    specs_ = parallel::tp::collect_shard_specs(engine.model());
  }

  std::unordered_map<const core::TensorImpl*, std::string> names;
  for (const auto& [name, parameter] : engine.model().named_parameters()) names.emplace(parameter.impl(), name);
  if (amp::MixedPrecisionOptimizer* amp = engine.amp()) {
    // The optimizer steps the fp32 masters, index-aligned with the model's parameters.
    for (size_t k = 0; k < amp->master_params().size(); ++k) {
      auto it = names.find(amp->model_params()[k].impl());
      if (it != names.end()) names.emplace(amp->master_params()[k].impl(), it->second);
    }
  }
  if (zero_ != nullptr) {
    // The optimizer steps ZeRO's 1-D shards, index-aligned with the handler's parameter names.
    optimizer_names_ = zero_->param_names();
  }
  for (const optim::ParamGroup& param_group : engine.optimizer().param_groups()) {
    if (zero_ != nullptr) break;
    for (const Tensor& parameter : param_group.params) {
      auto it = names.find(parameter.impl());
      COLOSSAL_CHECK(it != names.end(),
                     "checkpoint: the optimizer updates a tensor of shape {} that is none of the model's parameters; "
                     "a tensor-parallel or pipeline checkpoint needs each optimizer state named by its parameter",
                     parameter.shape());
      optimizer_names_.push_back(it->second);
    }
  }
  if (!pipeline) return;

  pipeline_ = context.group(parallel::GroupKind::kPipeline);
  serial_ = engine.options().serial_names;
  pipeline_gathers_ = !tensor || context.rank(parallel::GroupKind::kTensor) == 0;
  for (const auto& [stage_name, serial_name] : serial_->model) stage_names_[serial_name].push_back(stage_name);
  for (const auto& [name, tensor_value] : engine.model().state_dict()) {
    COLOSSAL_CHECK(serial_->model.contains(name),
                   "checkpoint: the pipeline stage's tensor \"{}\" has no name in the serial model (the stage's "
                   "serial names were made for another model)",
                   name);
  }
  size_t index = 0;
  for (size_t g = 0; g < serial_->optimizer_groups.size(); ++g) {
    for (const std::string& name : serial_->optimizer_groups[g]) serial_index_.emplace(name, std::pair(index++, g));
  }
  size_t first = 0;
  for (const optim::ParamGroup& param_group : engine.optimizer().param_groups()) {
    const size_t size = param_group.params.size();
    COLOSSAL_CHECK(size > 0, "checkpoint: pipeline stage {} has an empty optimizer parameter group", pipeline_->rank());
    const size_t serial_group = serial_index_.at(serial_->model.at(optimizer_names_[first])).second;
    for (size_t k = first; k < first + size; ++k) {
      const std::string& serial_name = serial_->model.at(optimizer_names_[k]);
      auto it = serial_index_.find(serial_name);
      COLOSSAL_CHECK(it != serial_index_.end() && it->second.second == serial_group,
                     "checkpoint: pipeline stage {}'s optimizer groups parameter \"{}\" {} the serial optimizer does",
                     pipeline_->rank(), serial_name,
                     it == serial_index_.end() ? "though it is none of the parameters" : "otherwise than");
    }
    group_sizes_.push_back(size);
    serial_groups_.push_back(serial_group);
    first += size;
  }
}

std::vector<std::string> CheckpointSharding::serial_parameter_names() const {
  std::vector<std::string> names;
  if (!pipelined()) return names;
  for (const std::vector<std::string>& group : serial_->optimizer_groups)
    names.insert(names.end(), group.begin(), group.end());
  return names;
}

size_t CheckpointSharding::serial_index(size_t index) const {
  return serial_index_.at(serial_->model.at(optimizer_names_.at(index))).first;
}

size_t CheckpointSharding::serial_group(size_t g) const {
  COLOSSAL_CHECK(g < serial_groups_.size(), "checkpoint: pipeline stage {} has no optimizer group {}",
                 pipeline_->rank(), g);
  return serial_groups_[g];
}

std::vector<std::pair<std::string, Tensor>> CheckpointSharding::gather_stages(
    std::vector<std::pair<std::string, Tensor>> local, const char* what) const {
  comm::ProcessGroup& group = *pipeline_;
  const Device device = group.device();
  if (group.rank() != 0) {
    // The header: one line "name dtype d0,d1,..." per tensor, then the tensors in its order.
    std::string header;
    for (const auto& [name, tensor] : local) {
      header += fmt::format("{} {} ", name, static_cast<int>(tensor.dtype()));
      for (size_t d = 0; d < tensor.shape().size(); ++d) header += fmt::format("{}{}", d ? "," : "", tensor.shape()[d]);
      header += '\n';
    }
    const std::vector<uint8_t> bytes(header.begin(), header.end());
    group.send(core::from_vector<int64_t>({static_cast<int64_t>(bytes.size())}, {1}, {DType::i64, device}), 0);
    if (!bytes.empty()) {
      group.send(core::from_vector(bytes, {static_cast<int64_t>(bytes.size())}, {DType::u8, device}), 0);
    }
    for (const auto& [name, tensor] : local) {
      if (tensor.numel() > 0) group.send(tensor.detach().to(device).contiguous(), 0);
    }
    return local;
  }
  std::vector<std::pair<std::string, Tensor>> out;
  std::set<std::string> seen;
  for (auto& entry : local) {
    if (seen.insert(entry.first).second) out.push_back(std::move(entry));
  }
  for (int stage = 1; stage < group.size(); ++stage) {
    Tensor length = core::empty({1}, {DType::i64, device});
    group.recv(length, stage);
    const int64_t size = length.item<int64_t>();
    COLOSSAL_CHECK(size >= 0, "checkpoint: pipeline stage {} announced a {} header of {} bytes", stage, what, size);
    if (size == 0) continue;
    Tensor bytes = core::empty({size}, {DType::u8, device});
    group.recv(bytes, stage);
    const std::vector<uint8_t> text_bytes = bytes.to(core::kCpu).to_vector<uint8_t>();
    const std::string text(text_bytes.begin(), text_bytes.end());
    size_t start = 0;
    while (start < text.size()) {
      const size_t end = text.find('\n', start);
      const std::string line = text.substr(start, end - start);
      start = end == std::string::npos ? text.size() : end + 1;
      const size_t a = line.find(' '), b = line.find(' ', a + 1);
      COLOSSAL_CHECK(a != std::string::npos && b != std::string::npos,
                     "checkpoint: pipeline stage {} sent a malformed {} header line \"{}\"", stage, what, line);
      const std::string name = line.substr(0, a);
      const auto dtype = static_cast<DType>(std::stoi(line.substr(a + 1, b - a - 1)));
      Shape shape;
      for (size_t p = b + 1; p < line.size();) {
        const size_t comma = std::min(line.find(',', p), line.size());
        shape.push_back(std::stoll(line.substr(p, comma - p)));
        p = comma + 1;
      }
      Tensor tensor = core::empty(shape, {dtype, device});
      if (tensor.numel() > 0) group.recv(tensor, stage);
      if (seen.insert(name).second) out.emplace_back(name, tensor);
    }
  }
  return out;
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
  // ZeRO-3's parameters are shards over the data group: whole on each tensor rank first, then each
  // tensor rank's tensor gathered over the tensor group, as the optimizer's state below.
  const nn::StateDict tensor_rank = zero_ != nullptr ? zero_->gather_model_state(model) : model;
  nn::StateDict whole;
  if (active()) {
    for (const auto& [name, tensor] : tensor_rank) whole.insert(name, gather(tensor, model_spec(name)));
  } else {
    whole = tensor_rank;
  }
  if (!pipelined() || !pipeline_gathers_) return whole;
  std::vector<std::pair<std::string, Tensor>> local;
  std::set<std::string> seen;
  for (const auto& [name, tensor] : whole) {
    const std::string& serial_name = serial_->model.at(name);
    if (seen.insert(serial_name).second) local.emplace_back(serial_name, tensor);
  }
  const std::vector<std::pair<std::string, Tensor>> all = gather_stages(std::move(local), "model");
  nn::StateDict out;
  if (pipeline_->rank() != 0) return out;  // only the first stage writes
  const std::map<std::string, Tensor> by_name(all.begin(), all.end());
  for (const std::string& name : serial_->model_order) {
    auto it = by_name.find(name);
    COLOSSAL_CHECK(it != by_name.end(), "checkpoint: no stage of the pipeline holds the serial model's \"{}\"", name);
    out.insert(name, it->second);
  }
  return out;
}

optim::StateDict CheckpointSharding::gather_optimizer(const optim::StateDict& optimizer) const {
  // ZeRO's data-group shards first (into this tensor rank's tensors), then the tensor group's.
  const optim::StateDict tensor_rank = zero_ != nullptr ? zero_->gather_optimizer_state(optimizer) : optimizer;
  optim::StateDict whole;
  if (active()) {
    for (const auto& [key, tensor] : tensor_rank) whole.emplace(key, gather(tensor, optimizer_spec(key, tensor)));
  } else {
    whole = tensor_rank;
  }
  if (!pipelined() || !pipeline_gathers_) return whole;
  std::vector<std::pair<std::string, Tensor>> local;
  for (const auto& [key, tensor] : whole) {
    size_t index = 0;
    std::string_view tail;
    if (parse_state_key(key, index, tail)) {
      local.emplace_back(fmt::format("state.{}.{}", serial_index(index), tail), tensor);
    } else if (parse_group_key(key, index, tail)) {
      if (tail != "params") local.emplace_back(fmt::format("param_groups.{}.{}", serial_group(index), tail), tensor);
    } else {
      local.emplace_back(key, tensor);
    }
  }
  const std::vector<std::pair<std::string, Tensor>> all = gather_stages(std::move(local), "optimizer");
  optim::StateDict out;
  if (pipeline_->rank() != 0) return out;
  out.insert(all.begin(), all.end());
  size_t first = 0;
  for (size_t g = 0; g < serial_->optimizer_groups.size(); ++g) {
    const size_t size = serial_->optimizer_groups[g].size();
    out[fmt::format("param_groups.{}.params", g)] = index_range(first, size);
    first += size;
  }
  return out;
}

optim::StateDict CheckpointSharding::gather_amp(const optim::StateDict& amp) const {
  const optim::StateDict tensor_rank = zero_ != nullptr ? zero_->gather_amp_state(amp) : amp;
  optim::StateDict whole;
  if (active()) {
    for (const auto& [key, tensor] : tensor_rank) whole.emplace(key, gather(tensor, amp_spec(key)));
  } else {
    whole = tensor_rank;
  }
  if (!pipelined() || !pipeline_gathers_) return whole;
  constexpr std::string_view kMaster = "master.";
  std::vector<std::pair<std::string, Tensor>> local;
  for (const auto& [key, tensor] : whole) {
    local.emplace_back(key.starts_with(kMaster) ? "master." + serial_->model.at(key.substr(kMaster.size())) : key,
                       tensor);
  }
  const std::vector<std::pair<std::string, Tensor>> all = gather_stages(std::move(local), "mixed-precision");
  optim::StateDict out;
  if (pipeline_->rank() == 0) out.insert(all.begin(), all.end());
  return out;
}

void CheckpointSharding::load_model(Engine& engine, const nn::StateDict& model) const {
  if (parallel::zero::ZeroHandler* zero = engine.zero()) {
    zero->load_model_state(engine.model(), model);
  } else {
    engine.model().load_state_dict(model, /*strict=*/true);
  }
}

nn::StateDict CheckpointSharding::shard_model(const nn::StateDict& model) const {
  nn::StateDict stage;
  if (pipelined()) {
    // The file must hold the serial model's tensors, all of them; this stage takes its own.
    const std::set<std::string> known(serial_->model_order.begin(), serial_->model_order.end());
    for (const auto& [name, tensor] : model) {
      COLOSSAL_CHECK(known.contains(name),
                     "tensor \"model.{}\" is none of the model's (was the checkpoint written for another model "
                     "config?)",
                     name);
    }
    for (const std::string& name : serial_->model_order) {
      COLOSSAL_CHECK(model.contains(name), "the model's tensor \"{}\" is missing (\"model.{}\"){}", name, name,
                     stage_names_.contains(name) ? fmt::format(", and pipeline stage {} needs it", pipeline_->rank())
                                                 : std::string());
    }
    for (const auto& [serial_name, stage_names] : stage_names_) {
      for (const std::string& name : stage_names) stage.insert(name, model.at(serial_name));
    }
  } else {
    stage = model;
  }
  if (!active()) return stage;
  nn::StateDict out;
  for (const auto& [name, tensor] : stage) out.insert(name, shard("model." + name, tensor, model_spec(name)));
  return out;
}

optim::StateDict CheckpointSharding::shard_optimizer(const optim::StateDict& optimizer) const {
  optim::StateDict stage;
  if (pipelined()) {
    std::map<size_t, size_t> to_stage;  // serial index -> this stage's
    for (size_t i = 0; i < optimizer_names_.size(); ++i) to_stage.emplace(serial_index(i), i);
    std::map<size_t, std::vector<size_t>> stage_groups;  // serial group -> this stage's
    for (size_t g = 0; g < serial_groups_.size(); ++g) stage_groups[serial_groups_[g]].push_back(g);
    for (const auto& [key, tensor] : optimizer) {
      size_t index = 0;
      std::string_view tail;
      if (parse_state_key(key, index, tail)) {
        if (auto it = to_stage.find(index); it != to_stage.end()) {
          stage.emplace(fmt::format("state.{}.{}", it->second, tail), tensor);
        }
      } else if (parse_group_key(key, index, tail)) {
        COLOSSAL_CHECK(index < serial_->optimizer_groups.size(),
                       "tensor \"optimizer.{}\" names parameter group {}, but the model's optimizer has {}", key, index,
                       serial_->optimizer_groups.size());
        if (tail == "params") {
          COLOSSAL_CHECK(tensor.numel() == static_cast<int64_t>(serial_->optimizer_groups[index].size()),
                         "tensor \"optimizer.{}\": parameter group {} was saved with {} parameter(s), but the "
                         "model's optimizer has {} there (another model or optimizer config?)",
                         key, index, tensor.numel(), serial_->optimizer_groups[index].size());
          continue;
        }
        if (auto it = stage_groups.find(index); it != stage_groups.end()) {
          for (size_t g : it->second) stage.emplace(fmt::format("param_groups.{}.{}", g, tail), tensor);
        }
      } else {
        stage.emplace(key, tensor);
      }
    }
    size_t first = 0;
    for (size_t g = 0; g < group_sizes_.size(); ++g) {
      stage[fmt::format("param_groups.{}.params", g)] = index_range(first, group_sizes_[g]);
      first += group_sizes_[g];
    }
  } else {
    stage = optimizer;
  }
  optim::StateDict out;
  if (active()) {
    for (const auto& [key, tensor] : stage) {
      out.emplace(key, shard("optimizer." + key, tensor, optimizer_spec(key, tensor)));
    }
  } else {
    out = std::move(stage);
  }
  // This tensor rank's tensors, then ZeRO's data-group shard of them.
  return zero_ != nullptr ? zero_->shard_optimizer_state(out) : out;
}

optim::StateDict CheckpointSharding::shard_amp(const optim::StateDict& amp) const {
  optim::StateDict stage;
  if (pipelined()) {
    constexpr std::string_view kMaster = "master.";
    for (const auto& [key, tensor] : amp) {
      if (!key.starts_with(kMaster)) {
        stage.emplace(key, tensor);
        continue;
      }
      auto it = stage_names_.find(key.substr(kMaster.size()));
      if (it == stage_names_.end()) continue;  // another stage's
      for (const std::string& name : it->second) stage.emplace("master." + name, tensor);
    }
  } else {
    stage = amp;
  }
  optim::StateDict out;
  if (active()) {
    for (const auto& [key, tensor] : stage) out.emplace(key, shard("amp." + key, tensor, amp_spec(key)));
  } else {
    out = std::move(stage);
  }
  return zero_ != nullptr ? zero_->shard_amp_state(out) : out;
}

}  // namespace colossal::engine
