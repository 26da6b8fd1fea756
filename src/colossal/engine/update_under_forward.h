// The optimizer's update left running into the next forward: each of the model's units (the blocks,
// then the model itself) waits in its forward pre-hook for the update of its own parameters, which a
// stream of its own runs part by part (Note [Update under the next forward] in engine/engine.cpp).
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
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
  /// Each unit's parameters are stepped in this many pieces of about equal size, each behind a gate of
  /// its own: a tensor-parallel block idles twice in its forward (attention's all-reduce and the
  /// MLP's), and each idle point opens one piece of the next block's update.
  static constexpr size_t kPiecesPerUnit = 2;

  /// `stepped[k]` is the tensor the optimizer steps for the model's parameter `model_params[k]` (the
  /// parameter itself, or its f32 master under mixed precision). A stepped tensor of no unit goes
  /// with the model's own parameters, which are updated first. Hooks the model's units; on a GPU also
  /// listens for the idle points of this thread (Note [Idle points]) and registers a gate opener
  /// (Note [Gates open before a device-wide wait]).
  UpdateUnderForward(nn::Module& model, const std::vector<Tensor>& model_params, const std::vector<Tensor>& stepped);
  ~UpdateUnderForward();
  UpdateUnderForward(const UpdateUnderForward&) = delete;
  UpdateUnderForward& operator=(const UpdateUnderForward&) = delete;

  /// Whether a forward through the model has ended and every unit's pre-hook ran in the first one:
  /// only then may an update run under the next forward.
  bool units_hooked() const { return checked_ && hooked_; }
  /// Runs `update` (which must call the optimizer's step() at most once) with that step in pieces,
  /// kPiecesPerUnit per unit in the order the forward reaches the units. On a GPU it runs on the update
  /// stream, which first waits for the current stream's work; the model's own pieces go at once, each
  /// later piece waits for its gate, which the next forward opens at its idle points or, at the latest,
  /// in the pre-hook of the unit that needs it. The current stream waits only in the units' pre-hooks,
  /// for their pieces, and at the end of the next forward, for everything. The gradients the update
  /// reads (the optimizer's and the model's .grad) are kept alive until then, so that the memory is not
  /// reused under it. On the CPU it runs in pieces at once.
  void run(optim::Optimizer& optimizer, const std::function<void()>& update);
  /// The current stream waits for all of the last run (its gates opened first; a no-op when nothing
  /// is pending).
  void wait();
  /// The host waits for all of the last run (its gates opened first).
  void synchronize();
  /// The host waits until the last run's ungated pieces (the model's own) are done: the gradient norm
  /// and the overflow check come before them, so they can be read (Engine::last_grad_norm) without
  /// opening the rest.
  void synchronize_first_pieces() const;
  /// The units whose pre-hooks waited for their pieces one by one (not at the end), counted over the
  /// runs so far: what the tests read to see the overlap is real.
  int64_t parts_waited_in_hooks() const { return parts_waited_in_hooks_; }
  /// The update's parts: one per unit (each stepped in kPiecesPerUnit pieces).
  size_t num_parts() const { return hooks_.size(); }
  /// The pieces of the last run opened so far at idle points (not by a pre-hook or a wait), counted
  /// over the runs: what the tests read to see the idle points open gates.
  int64_t pieces_opened_at_idle_points() const { return opened_at_idle_; }

 private:
  struct Piece;
  void wait_unit(size_t unit);
  /// Opens the gates of the last run's pieces up to `piece` (an index into pieces_) from `stream`.
  void open(size_t piece, core::Stream stream);
  /// Opens the next shut gate of the last run from `stream`; false when none is left.
  bool open_next(core::Stream stream);

  nn::Module& model_;
  Device device_;
  std::vector<std::unique_ptr<Piece>> pieces_;  // the model's own first, then the units in forward order
  struct UnitHook {
    nn::Module* module;
    size_t first_piece;
    int64_t id = -1;
    bool ran = false;
  };
  std::vector<UnitHook> hooks_;  // the model's first (its pre-hook runs first)
  int64_t model_hook_ = -1;
  bool checked_ = false;
  bool hooked_ = false;
  bool pending_ = false;                   // a run has not yet been waited for as a whole
  bool in_forward_ = false;                // between the model's forward pre-hook and its forward hook
  std::optional<core::cuda::Event> done_;  // after the whole run (made on a GPU only)
  // The gates (GPU only): piece p of run r waits on the update stream until gates_[p] >= r; the pieces
  // of the model's own unit are not gated. One word per piece, each written only with the current
  // run's number, so that a late write from a stream behind never shuts a gate again.
  std::optional<core::cuda::DeviceWords> gates_;
  std::mutex gate_mutex_;
  uint64_t runs_ = 0;
  size_t opened_ = 0;     // the pieces [0, opened_] of the last run are open
  bool stepped_ = false;  // the last run's optimizer step issued its pieces
  int64_t opener_ = -1;   // Note [Gates open before a device-wide wait]
  std::function<void(core::Stream)> previous_listener_;
  int64_t parts_waited_in_hooks_ = 0;
  int64_t opened_at_idle_ = 0;
};

}  // namespace colossal::engine
