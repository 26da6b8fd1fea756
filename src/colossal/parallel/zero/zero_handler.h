// ZeroHandler: what the Engine, checkpoints, the memory log and the layout harness ask of any ZeRO
// stage, whichever shards it keeps: LowLevelZero (stages 1 and 2: optimizer states and gradients
// sharded, parameters whole) and Zero3 (stage 3: parameters sharded too, parallel/zero/zero3.h). The
// optimizer steps shards(); checkpoints gather each shard into the serial tensor and cut it back.
#pragma once

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "colossal/core/error.h"  // COLOSSAL_FAIL
#include "colossal/core/tensor.h"
#include "colossal/nn/module.h"
#include "colossal/nn/state_dict.h"
#include "colossal/optim/optimizer.h"  // optim::StateDict
#include "colossal/parallel/gradient_handler.h"

namespace colossal::parallel::zero {

/// Where ZeRO-3 keeps this rank's parameter shards between uses (config zero.placement_policy;
/// parallel/zero/chunk_manager.h).
enum class Placement {
  cuda,   ///< on the device
  cpu,    ///< in pinned host memory, copied to the device for each gather
  auto_,  ///< on the device while they fit beside the measured non-model memory, the rest on the host
};

/// Bytes of model state this rank holds (the ZeRO paper's accounting: no activations, no buffers).
struct ModelStateBytes {
  int64_t parameters = 0;        ///< the model's parameters (whole at stages 1 and 2, this rank's shard at 3)
  int64_t gradients = 0;         ///< see each handler's model_state_bytes
  int64_t master_weights = 0;    ///< fp32 masters of the shard (naive fp16 / bf16)
  int64_t optimizer_states = 0;  ///< the optimizer's buffers (moments, momentum) of the shard
  int64_t total() const { return parameters + gradients + master_weights + optimizer_states; }
};

class ZeroHandler : public GradientHandler {
 public:
  /// 1, 2 or 3.
  virtual int stage() const = 0;
  /// The tensors the optimizer steps (1-D shards, empty where this rank owns none of a parameter),
  /// index-aligned with param_names(): the clipping norm is taken over their gradients.
  virtual const std::vector<Tensor>& shards() const = 0;
  virtual const std::vector<std::string>& param_names() const = 0;

  /// Checkpoints hold the serial optimizer and mixed-precision state (Note [Checkpoints of a
  /// sharded model] in engine/checkpoint_sharding.cpp). gather_* all-gather each shard's tensors
  /// ("state.<i>.<buffer>", "master.<name>") into the whole parameter's (every rank of the group
  /// calls them together, with the same keys); shard_* cut this rank's pieces out of whole ones.
  virtual optim::StateDict gather_optimizer_state(const optim::StateDict& state) const = 0;
  virtual optim::StateDict shard_optimizer_state(const optim::StateDict& state) const = 0;
  virtual optim::StateDict gather_amp_state(const optim::StateDict& state) const = 0;
  virtual optim::StateDict shard_amp_state(const optim::StateDict& state) const = 0;
  /// The model's state dict with every parameter whole (stage 3 all-gathers its shards; collective,
  /// like the gathers above). Stages 1 and 2 hold whole parameters: `state` as it is.
  virtual nn::StateDict gather_model_state(const nn::StateDict& state) const { return state; }
  /// Loads whole tensors (a checkpoint's, the serial names) into `model` (the handler's): stage 3
  /// keeps this rank's shard of each parameter. No communication.
  virtual void load_model_state(nn::Module& model, const nn::StateDict& state) {
    model.load_state_dict(state, /*strict=*/true);
  }

  /// After finish(): every parameter's reduced gradient, whole (all-gathered over the group), by
  /// name: for tests and debugging. Collective.
  virtual std::vector<std::pair<std::string, Tensor>> gather_gradients() const = 0;
  /// This rank's model states now (for LogMemoryHook and the memory benchmarks): device memory.
  virtual ModelStateBytes model_state_bytes() const = 0;

  // Optimizer offload (zero.offload_optimizer; parallel/zero/host_offload.h, Note [Optimizer offload]).
  /// Whether the optimizer steps on the host.
  virtual bool offloads_optimizer() const { return false; }
  /// With offload: the window's optimizer step, on the host, in place of optimizer.step() (the Engine
  /// and MixedPrecisionOptimizer call it), with the gradient scale the optimizer was given (clipping's
  /// factor); the handler's after_update puts the updated parameters where the model reads them.
  virtual void step_on_host() { COLOSSAL_FAIL("ZeRO: step_on_host without zero.offload_optimizer = true"); }
  /// With offload and an f32 model (no mixed precision, or torch's): the host masters are copies of
  /// the model's parameters; this copies them again from the model (after a checkpoint loaded it).
  /// Nothing otherwise: the wrapper's masters are their own state.
  virtual void load_masters_from_model() {}
  /// Bytes of host memory this rank's model states take (with offload: masters, moments, gradient
  /// shard and staging buffers; stage 3 adds its chunks' host buffers, the shards kept on the host and
  /// the spare buffers of those on the device, with or without offload), and of those the pinned
  /// (page-locked) ones. Each buffer counts once.
  virtual int64_t host_bytes() const { return 0; }
  virtual int64_t pinned_host_bytes() const { return 0; }
};

}  // namespace colossal::parallel::zero
