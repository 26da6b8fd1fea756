// ZeRO's checkpoint state mapping: see state_pieces.h.
#include "colossal/parallel/zero/state_pieces.h"

#include <charconv>
#include <unordered_map>

#include "colossal/autograd/grad_mode.h"  // NoGradGuard
#include "colossal/core/error.h"

namespace colossal::parallel::zero {

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

optim::StateDict map_optimizer_state(const optim::StateDict& state, size_t num_params, const PieceMap& map) {
  autograd::NoGradGuard no_grad;
  optim::StateDict out;
  for (const auto& [key, tensor] : state) {  // sorted: the same order on every rank
    size_t index = 0;
    std::string_view buffer;
    if (parse_state_key(key, index, buffer) && buffer != "step") {
      COLOSSAL_CHECK(index < num_params,
                     "checkpoint tensor \"optimizer.{}\" names parameter {}, but the optimizer has {}", key, index,
                     num_params);
      out.emplace(key, map(tensor, index, "optimizer." + key));
    } else {
      out.emplace(key, tensor);
    }
  }
  return out;
}

optim::StateDict map_amp_state(const optim::StateDict& state, const std::vector<std::string>& names,
                               const PieceMap& map) {
  constexpr std::string_view kMasterPrefix = "master.";
  autograd::NoGradGuard no_grad;
  std::unordered_map<std::string, size_t> index;
  for (size_t k = 0; k < names.size(); ++k) index.emplace(names[k], k);
  optim::StateDict out;
  for (const auto& [key, tensor] : state) {
    const auto it = key.starts_with(kMasterPrefix) ? index.find(key.substr(kMasterPrefix.size())) : index.end();
    out.emplace(key, it == index.end() ? tensor : map(tensor, it->second, "amp." + key));
  }
  return out;
}

void check_no_optimizer_state(const optim::Optimizer& optimizer, std::string_view who) {
  for (size_t g = 0; g < optimizer.param_groups().size(); ++g) {
    for (size_t i = 0; i < optimizer.param_groups()[g].params.size(); ++i) {
      const optim::ParamState* state = optimizer.find_state(g, i);
      COLOSSAL_CHECK(state == nullptr || (state->buffers.empty() && state->step == 0),
                     "{}: the {} optimizer has state already (param group {}, {}); build ZeRO before the first "
                     "step and load checkpoints through the Engine",
                     who, optimizer.name(), g, optimizer.param_groups()[g].param_label(i));
    }
  }
}

void broadcast_initial_state(nn::Module& model, const std::vector<Tensor>& masters,
                             const amp::MixedPrecisionOptimizer* amp, comm::ProcessGroup& group, std::string_view who) {
  for (const auto& [name, tensor] : model.state_dict()) {
    COLOSSAL_CHECK(tensor.is_contiguous(), "{}: '{}' is not contiguous", who, name);
    group.broadcast(tensor, 0);
  }
  if (amp != nullptr && amp->mode() != amp::AmpMode::torch) {
    for (const Tensor& master : masters) group.broadcast(master, 0);
  }
}

}  // namespace colossal::parallel::zero
