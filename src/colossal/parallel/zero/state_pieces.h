// What every ZeRO stage (LowLevelZero, Zero3) does alike: its start (the optimizer without state,
// rank 0's model and masters broadcast), and the optimizer's and mixed precision's per-parameter
// tensors in a checkpoint mapped between this rank's pieces and the whole (serial) tensors, where the
// stages differ only in how one parameter's piece is gathered or cut (Note [Checkpoints of a sharded
// model] in engine/checkpoint_sharding.cpp).
#pragma once

#include <cstddef>
#include <functional>
#include <string>
#include <string_view>
#include <vector>

#include "colossal/amp/mixed_precision_optimizer.h"
#include "colossal/comm/process_group.h"
#include "colossal/core/tensor.h"
#include "colossal/nn/module.h"
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

/// Every ZeRO stage's precondition: `optimizer` has no state yet (ZeRO rebinds its param groups, so
/// it must be built before the first step; checkpoints load through the Engine). Throws naming `who`,
/// the group and the parameter.
void check_no_optimizer_state(const optim::Optimizer& optimizer, std::string_view who);

/// Rank 0's model (parameters and buffers, each contiguous) and, under naive fp16 / bf16, its fp32
/// `masters` to every rank of `group`, so the replicas start equal. Collective.
void broadcast_initial_state(nn::Module& model, const std::vector<Tensor>& masters,
                             const amp::MixedPrecisionOptimizer* amp, comm::ProcessGroup& group, std::string_view who);

/// A window's shard gradient of `numel` elements on `device`, made when its first reduction lands
/// (Note [Shard gradient dtype] in state_pieces.cpp): in the reduced dtype when `reduced` (every
/// bucket's or chunk's dtype) is one 16-bit dtype, that reduction came from the window's last
/// backward and the gradients stay on the device, left unset since each slice is then written once;
/// else f32 zeros, which the window's micro-steps add into.
Tensor make_shard_gradient(int64_t numel, const std::vector<DType>& reduced, bool from_last_backward, bool offloaded,
                           Device device);

/// A landed reduction `out` into its slice `dst` of the shard gradient: copied into a 16-bit shard,
/// added into an f32 one.
void land_reduction(const Tensor& dst, const Tensor& out);

/// The shard gradient for the optimizer: as it is where it is f32 already or where `amp`'s fused step
/// reads 16-bit gradients as they are (bf16, no loss scale: Note [Fused mixed-precision step]), else
/// its f32 form. `offloaded`: the host step takes it (as f32).
Tensor shard_gradient_for_step(const Tensor& shard_grad, const amp::MixedPrecisionOptimizer* amp, bool offloaded);
/// Whether shard_gradient_for_step gives `shard_grad` itself.
bool step_reads_shard_gradient_as_is(const Tensor& shard_grad, const amp::MixedPrecisionOptimizer* amp, bool offloaded);

}  // namespace colossal::parallel::zero
