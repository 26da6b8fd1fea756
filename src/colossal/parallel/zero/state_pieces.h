// The optimizer's and mixed precision's per-parameter tensors in a checkpoint, as every ZeRO stage
// maps them between this rank's pieces and the whole (serial) tensors: LowLevelZero and Zero3 differ
// only in how one parameter's piece is gathered or cut (Note [Checkpoints of a sharded model] in
// engine/checkpoint_sharding.cpp).
#pragma once

#include <cstddef>
#include <functional>
#include <string>
#include <string_view>
#include <vector>

#include "colossal/core/tensor.h"
#include "colossal/optim/optimizer.h"  // optim::StateDict

namespace colossal::parallel::zero {

/// One parameter's tensor mapped: (the tensor, the parameter's index among the optimizer's
/// parameters, its checkpoint key "optimizer.<key>" or "amp.<key>" for messages).
using PieceMap = std::function<Tensor(const Tensor&, size_t, const std::string&)>;

/// (i, buffer) from an optimizer state key "state.<i>.<buffer>"; false for any other key.
bool parse_state_key(std::string_view key, size_t& index, std::string_view& buffer);

/// `state` (an optimizer's state_dict) with each per-parameter buffer ("state.<i>.<buffer>" but not
/// its "step") replaced by map(tensor, i, "optimizer.<key>"), the rest kept. Throws naming the key when
/// i is not below num_params. Runs without recording autograd.
optim::StateDict map_optimizer_state(const optim::StateDict& state, size_t num_params, const PieceMap& map);

/// `state` (MixedPrecisionOptimizer's state_dict) with each fp32 master "master.<name>" of a parameter
/// in `names` replaced by map(tensor, its index in names, "amp.<key>"), the rest kept.
optim::StateDict map_amp_state(const optim::StateDict& state, const std::vector<std::string>& names,
                               const PieceMap& map);

}  // namespace colossal::parallel::zero
