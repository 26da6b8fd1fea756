// ZeRO's checkpoint state mapping: see state_pieces.h.
#include "colossal/parallel/zero/state_pieces.h"

#include <algorithm>
#include <charconv>
#include <optional>
#include <unordered_map>

#include "colossal/autograd/grad_mode.h"  // NoGradGuard
#include "colossal/core/error.h"
#include "colossal/ops/elementwise.h"  // add_

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
    for (const Tensor& master : masters) {
      if (master.device() == group.device()) {
        group.broadcast(master, 0);
        continue;
      }
      // Masters in host memory (Note [Masters on the host]) go through the group's device one at a time.
      Tensor staged = master.to(group.device());
      group.broadcast(staged, 0);
      Tensor(master).copy_(staged);
    }
  }
}

// Note [Shard gradient dtype]
// A window's reduced gradients wait in the shard from the reduce-scatter that makes them until the
// step, through the rest of backward, beside the activations. Kept in f32 they cost 4 Psi / Nd bytes
// where the ZeRO paper counts 2 Psi / Nd; that was most of what gpt2-xl's model states had above
// the paper's formulas at dp=2 (+14% at stage 3). The reduce-scatter's output is already 16-bit under
// naive fp16 and bf16, and when the window is one backward (stage 1 always: it reduces in the last
// backward only) nothing is added to it, so the shard keeps it as it is and becomes f32 only at
// finish(), after backward, when the activations are gone: the same values the f32 shard held
// (a 16-bit number is exact in f32). Stages 2 and 3 with accumulation add every micro-step's
// reduction into the shard, which must be f32 for that; so must the optimizer offload's copies to
// the host. The window's first reduction tells which case it is (LowLevelZero makes the shard when
// it launches that reduction, ZeRO-3 when it lands: the earliest launched).
// Where the step's fused update reads 16-bit gradients as they are (bf16 without a loss scale, Note
// [Fused mixed-precision step] in amp/mixed_precision_optimizer.cpp) the shard stays 16-bit through
// the step too: shard_gradient_for_step.
// A 16-bit shard is made without zeros and each reduction copied into its slice (LowLevelZero
// reduce-scatters straight into it): every bucket or chunk is reduced once in the window (finish()
// sends those that got no gradient as zeros), so every slice is written once.
Tensor make_shard_gradient(int64_t numel, const std::vector<DType>& reduced, bool from_last_backward, bool offloaded,
                           Device device) {
  const bool one_dtype =
      !reduced.empty() && std::all_of(reduced.begin(), reduced.end(), [&](DType d) { return d == reduced.front(); });
  if (one_dtype && core::is_reduced_float(reduced.front()) && from_last_backward && !offloaded) {
    return core::empty({numel}, TensorOptions(reduced.front(), device));
  }
  return core::zeros({numel}, TensorOptions(DType::f32, device));
}

void land_reduction(const Tensor& dst, const Tensor& out) {
  Tensor slice = dst;  // a handle on the shard's slice, which the ops write through
  if (slice.dtype() == DType::f32) {
    ops::add_(slice, out);
  } else {
    slice.copy_(out);
  }
}

bool step_reads_shard_gradient_as_is(const Tensor& shard_grad, const amp::MixedPrecisionOptimizer* amp,
                                     bool offloaded) {
  // The fused update converts a 16-bit gradient as it reads it: the same values as the f32 copy (a
  // 16-bit number is exact in f32) without its pass over the shard (6 bytes an element).
  return shard_grad.dtype() == DType::f32 ||
         (amp != nullptr && !offloaded && amp->scaler() == nullptr && amp->fuses_step(std::nullopt, /*norm_type=*/2.0));
}

Tensor shard_gradient_for_step(const Tensor& shard_grad, const amp::MixedPrecisionOptimizer* amp, bool offloaded) {
  return step_reads_shard_gradient_as_is(shard_grad, amp, offloaded) ? shard_grad : shard_grad.to(DType::f32);
}

}  // namespace colossal::parallel::zero
