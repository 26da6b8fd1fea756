// The optimizer's update left running into the next forward: each of the model's units (the blocks,
// then the model itself) waits in its forward pre-hook for the update of its own parameters, which a
// stream of its own runs part by part (Note [Update under the next forward] in engine/engine.cpp).
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <vector>

#include "colossal/core/cuda_device.h"
#include "colossal/core/device.h"
#include "colossal/core/tensor.h"
#include "colossal/nn/module.h"
#include "colossal/optim/optimizer.h"

namespace colossal::engine {

class UpdateUnderForward {
 public:
  /// `stepped[k]` is the tensor the optimizer steps for the model's parameter `model_params[k]` (the
  /// parameter itself, or its f32 master under mixed precision). A stepped tensor of no unit goes
  /// with the model's own parameters, which are updated first. Hooks the model's units.
  UpdateUnderForward(nn::Module& model, const std::vector<Tensor>& model_params, const std::vector<Tensor>& stepped);
  ~UpdateUnderForward();
  UpdateUnderForward(const UpdateUnderForward&) = delete;
  UpdateUnderForward& operator=(const UpdateUnderForward&) = delete;

  /// Whether a forward through the model has ended and every unit's pre-hook ran in the first one:
  /// only then may an update run under the next forward.
  bool units_hooked() const { return checked_ && hooked_; }
  /// Runs `update` (which must call the optimizer's step() at most once) with that step in parts, one
  /// per unit in the order the forward reaches them. On a GPU it runs on the update stream, which
  /// first waits for the current stream's work; the current stream waits only in the units'
  /// pre-hooks, for each part, and at the end of the next forward, for everything. The gradients the
  /// update reads (the optimizer's and the model's .grad) are kept alive until then, so
  /// that the memory is not reused under it. On the CPU it runs in parts at once.
  void run(optim::Optimizer& optimizer, const std::function<void()>& update);
  /// The current stream waits for all of the last run (a no-op when nothing is pending).
  void wait();
  /// The host waits for all of the last run.
  void synchronize() const;
  /// The parts run so far that the forward's pre-hooks waited for one by one (not at the end):
  /// what the tests read to see the overlap is real.
  int64_t parts_waited_in_hooks() const { return parts_waited_in_hooks_; }
  size_t num_parts() const { return parts_.size(); }

 private:
  struct Part;
  void wait_part(size_t part);

  nn::Module& model_;
  Device device_;
  std::vector<std::unique_ptr<Part>> parts_;  // the model's own first, then the units in forward order
  struct UnitHook {
    nn::Module* module;
    size_t part;
    int64_t id = -1;
    bool ran = false;
  };
  std::vector<UnitHook> hooks_;  // the model's last (its pre-hook runs first)
  int64_t model_hook_ = -1;
  bool checked_ = false;
  bool hooked_ = false;
  bool pending_ = false;                   // a run has not yet been waited for as a whole
  std::optional<core::cuda::Event> done_;  // after the whole run (made on a GPU only)
  int64_t parts_waited_in_hooks_ = 0;
};

}  // namespace colossal::engine
