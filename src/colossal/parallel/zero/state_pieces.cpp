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

}  // namespace colossal::parallel::zero
