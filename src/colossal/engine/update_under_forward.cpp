// UpdateUnderForward: see update_under_forward.h and Note [Update under the next forward] in
// engine/engine.cpp.
#include "colossal/engine/update_under_forward.h"

#include <algorithm>
#include <map>
#include <mutex>
#include <unordered_map>
#include <utility>

#include "colossal/core/error.h"           // COLOSSAL_CHECK
#include "colossal/parallel/zero/units.h"  // find_units

namespace colossal::engine {

struct UpdateUnderForward::Piece {
  std::vector<Tensor> stepped;       // what the optimizer steps in this piece
  std::vector<Tensor> model_params;  // the model's tensors of those (their .grad is held too)
  std::vector<Tensor> held;          // the gradients this piece's update reads, until waited for
  std::optional<core::cuda::Event> done;
  bool recorded = false;  // the last run issued this piece and the current stream has not waited for it
};

namespace {

/// The stream the updates run on, one per device for the life of the process: the optimizer's state
/// is made on it at the first update and freed in its order whenever the optimizer goes, so it must
/// outlive every optimizer. Below the compute stream's priority, so that its blocks take the SMs the
/// forward leaves free and do not hold up the forward's kernels.
core::Stream update_stream(Device device) {
  static std::mutex mutex;
  static std::map<int, core::Stream> streams;
  std::lock_guard<std::mutex> lock(mutex);
  auto it = streams.find(device.index);
  if (it == streams.end())
    it = streams.emplace(device.index, core::cuda::create_stream(device, core::cuda::StreamPriority::low)).first;
  return it->second;
}

/// A stream nothing waits on, one per device, from which the gates are opened when no forward will
/// open them (Note [Gates open before a device-wide wait]).
core::Stream gate_stream(Device device) {
  static std::mutex mutex;
  static std::map<int, core::Stream> streams;
  std::lock_guard<std::mutex> lock(mutex);
  auto it = streams.find(device.index);
  if (it == streams.end())
    it = streams.emplace(device.index, core::cuda::create_stream(device, core::cuda::StreamPriority::high)).first;
  return it->second;
}

/// `unit`'s tensors (indices into stepped) cut into `count` runs of consecutive tensors of about equal
/// numel (a tensor is never split; a piece may be empty).
std::vector<std::vector<size_t>> cut_evenly(const std::vector<size_t>& unit, const std::vector<Tensor>& stepped,
                                            size_t count) {
  int64_t total = 0;
  for (size_t k : unit) total += stepped[k].numel();
  std::vector<std::vector<size_t>> pieces(count);
  int64_t sum = 0;
  for (size_t k : unit) {
    // The piece whose share of the total this tensor's middle falls in.
    const int64_t middle = sum + stepped[k].numel() / 2;
    const size_t piece =
        total > 0 ? std::min(count - 1, static_cast<size_t>(middle * static_cast<int64_t>(count) / total)) : 0;
    pieces[piece].push_back(k);
    sum += stepped[k].numel();
  }
  return pieces;
}

}  // namespace

UpdateUnderForward::UpdateUnderForward(nn::Module& model, const std::vector<Tensor>& model_params,
                                       const std::vector<Tensor>& stepped)
    : model_(model) {
  COLOSSAL_CHECK(model_params.size() == stepped.size(), "UpdateUnderForward: {} stepped tensors for {} parameters",
                 stepped.size(), model_params.size());
  if (!model_params.empty()) device_ = model_params.front().device();
  std::vector<parallel::zero::Unit> units = parallel::zero::find_units(model_, model_params);
  // The model's own parameters first: its pre-hook runs before any unit's.
  std::rotate(units.begin(), units.end() - 1, units.end());
  std::vector<bool> placed(model_params.size(), false);
  std::vector<size_t> unplaced;
  for (const parallel::zero::Unit& unit : units) {
    for (size_t k : unit.params) placed[k] = true;
  }
  for (size_t k = 0; k < model_params.size(); ++k) {
    if (!placed[k]) unplaced.push_back(k);  // a tensor no module of the model holds: with the model's own
  }
  for (size_t u = 0; u < units.size(); ++u) {
    std::vector<size_t> members = units[u].params;
    if (u == 0) members.insert(members.end(), unplaced.begin(), unplaced.end());
    hooks_.push_back(UnitHook{units[u].module, pieces_.size()});
    for (const std::vector<size_t>& cut : cut_evenly(members, stepped, kPiecesPerUnit)) {
      auto piece = std::make_unique<Piece>();
      for (size_t k : cut) {
        piece->stepped.push_back(stepped[k]);
        piece->model_params.push_back(model_params[k]);
      }
      if (device_.is_cuda()) piece->done.emplace();
      pieces_.push_back(std::move(piece));
    }
  }
  if (device_.is_cuda()) {
    done_.emplace();
    gates_.emplace(device_, pieces_.size());
    // Note [Idle points]: where the forward waits for a collective, the next piece may run.
    previous_listener_ = core::cuda::set_idle_listener([this](core::Stream stream) {
      if (!pending_ || !in_forward_ || stream != core::cuda::current_stream(device_)) return;
      if (open_next(stream)) ++opened_at_idle_;
    });
    opener_ = core::cuda::add_gate_opener([this] {
      if (pending_) open(pieces_.size() - 1, gate_stream(device_));
    });
  }
  for (size_t u = 0; u < hooks_.size(); ++u) {
    const bool is_model = hooks_[u].module == &model_;
    hooks_[u].id = hooks_[u].module->register_forward_pre_hook([this, u, is_model](nn::Module&, const Tensor&) {
      if (!checked_) {  // the first forward: whose hooks run
        if (is_model) {
          for (UnitHook& h : hooks_) h.ran = false;
        }
        hooks_[u].ran = true;
      }
      if (is_model) in_forward_ = true;
      wait_unit(u);
    });
  }
  model_hook_ = model_.register_forward_hook([this](nn::Module&, const Tensor&, const Tensor&) {
    if (!checked_) {
      checked_ = true;
      hooked_ = std::all_of(hooks_.begin(), hooks_.end(), [&](const UnitHook& h) {
        if (h.ran) return true;
        for (size_t p = h.first_piece; p < h.first_piece + kPiecesPerUnit; ++p) {
          if (!pieces_[p]->stepped.empty()) return false;
        }
        return true;
      });
    }
    wait();  // whatever the forward's units did not wait for, before backward reads anything
    in_forward_ = false;
    return Tensor();
  });
}

UpdateUnderForward::~UpdateUnderForward() {
  for (const UnitHook& hook : hooks_) hook.module->remove_forward_hook(hook.id);
  model_.remove_forward_hook(model_hook_);
  if (device_.is_cuda()) {
    core::cuda::remove_gate_opener(opener_);
    core::cuda::set_idle_listener(std::move(previous_listener_));
  }
  try {
    synchronize();  // the update's kernels read what is freed next
  } catch (...) {
  }
}

void UpdateUnderForward::run(optim::Optimizer& optimizer, const std::function<void()>& update) {
  wait();  // the last run's, should nothing have waited for it yet
  std::vector<std::vector<Tensor>> parts;
  for (const auto& piece : pieces_) {
    parts.push_back(piece->stepped);
    piece->held.clear();
    for (const std::vector<Tensor>* list : {&piece->stepped, &piece->model_params}) {
      for (const Tensor& t : *list) {
        if (Tensor grad = t.grad(); grad.defined()) piece->held.push_back(std::move(grad));
      }
    }
  }
  pending_ = true;
  if (!device_.is_cuda()) {
    optimizer.step_next_in_parts(std::move(parts), [this](size_t p) { pieces_[p]->recorded = true; });
    update();
    return;
  }
  const core::Stream compute = core::cuda::current_stream(device_);
  const core::Stream side = update_stream(device_);
  // The update reads what the backward (and the handler) left on the current stream.
  done_->record(compute);
  done_->block(side);
  {
    std::lock_guard<std::mutex> lock(gate_mutex_);
    ++runs_;
    opened_ = kPiecesPerUnit - 1;  // the model's own pieces go at once
    stepped_ = false;
  }
  optimizer.step_next_in_parts(std::move(parts), [this, side](size_t p) {
    pieces_[p]->done->record(side);
    pieces_[p]->recorded = true;
    stepped_ = true;
    // The next piece waits for its gate (Note [Update under the next forward]).
    if (p + 1 < pieces_.size() && p + 1 >= kPiecesPerUnit) core::cuda::wait_value(side, gates_->address(p + 1), runs_);
  });
  {
    core::cuda::StreamGuard guard(side);
    update();
  }
  done_->record(side);
}

void UpdateUnderForward::open(size_t piece, core::Stream stream) {
  std::lock_guard<std::mutex> lock(gate_mutex_);
  if (!pending_ || !gates_) return;
  const size_t last = std::min(piece, pieces_.size() - 1);
  for (size_t p = opened_ + 1; p <= last; ++p) core::cuda::write_value(stream, gates_->address(p), runs_);
  opened_ = std::max(opened_, last);
}

bool UpdateUnderForward::open_next(core::Stream stream) {
  std::lock_guard<std::mutex> lock(gate_mutex_);
  if (!pending_ || !gates_ || opened_ + 1 >= pieces_.size()) return false;
  ++opened_;
  core::cuda::write_value(stream, gates_->address(opened_), runs_);
  return true;
}

void UpdateUnderForward::wait_unit(size_t u) {
  const size_t first = hooks_[u].first_piece;
  bool waited = false;
  if (device_.is_cuda()) open(first + kPiecesPerUnit - 1, core::cuda::current_stream(device_));
  for (size_t p = first; p < first + kPiecesPerUnit; ++p) {
    Piece& piece = *pieces_[p];
    if (!piece.recorded) continue;
    if (device_.is_cuda()) piece.done->block(core::cuda::current_stream(device_));
    piece.recorded = false;
    piece.held.clear();  // freed in the current stream's order, now behind the update's reads
    waited = true;
  }
  if (waited) ++parts_waited_in_hooks_;
}

void UpdateUnderForward::wait() {
  if (!pending_) return;
  if (device_.is_cuda()) {
    const core::Stream current = core::cuda::current_stream(device_);
    open(pieces_.size() - 1, current);
    done_->block(current);
  }
  for (auto& piece : pieces_) {
    piece->recorded = false;
    piece->held.clear();
  }
  pending_ = false;
}

void UpdateUnderForward::synchronize() {
  if (!pending_ || !device_.is_cuda()) return;
  open(pieces_.size() - 1, gate_stream(device_));
  done_->synchronize();
}

void UpdateUnderForward::synchronize_first_pieces() const {
  if (!pending_ || !device_.is_cuda()) return;
  // Without a step (an fp16 overflow skipped it) no piece waits for a gate.
  (stepped_ ? *pieces_[kPiecesPerUnit - 1]->done : *done_).synchronize();
}

}  // namespace colossal::engine
