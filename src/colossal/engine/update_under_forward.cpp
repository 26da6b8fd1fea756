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

struct UpdateUnderForward::Part {
  std::vector<Tensor> stepped;       // what the optimizer steps in this part
  std::vector<Tensor> model_params;  // the model's tensors of those (their .grad is held too)
  std::vector<Tensor> held;          // the gradients this part's update reads, until waited for
  std::optional<core::cuda::Event> done;
  bool recorded = false;  // the last run issued this part and the current stream has not waited for it
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
  for (const parallel::zero::Unit& unit : units) {
    auto part = std::make_unique<Part>();
    for (size_t k : unit.params) {
      placed[k] = true;
      part->stepped.push_back(stepped[k]);
      part->model_params.push_back(model_params[k]);
    }
    if (device_.is_cuda()) part->done.emplace();
    hooks_.push_back(UnitHook{unit.module, parts_.size()});
    parts_.push_back(std::move(part));
  }
  for (size_t k = 0; k < model_params.size(); ++k) {
    if (placed[k]) continue;  // a tensor no module of the model holds: with the model's own
    parts_.front()->stepped.push_back(stepped[k]);
    parts_.front()->model_params.push_back(model_params[k]);
  }
  if (device_.is_cuda()) done_.emplace();
  for (UnitHook& hook : hooks_) {
    const bool is_model = hook.module == &model_;
    hook.id = hook.module->register_forward_pre_hook([this, &hook, is_model](nn::Module&, const Tensor&) {
      if (!checked_) {  // the first forward: whose hooks run
        if (is_model) {
          for (UnitHook& h : hooks_) h.ran = false;
        }
        hook.ran = true;
      }
      wait_part(hook.part);
    });
  }
  model_hook_ = model_.register_forward_hook([this](nn::Module&, const Tensor&, const Tensor&) {
    if (!checked_) {
      checked_ = true;
      hooked_ = std::all_of(hooks_.begin(), hooks_.end(),
                            [&](const UnitHook& h) { return h.ran || parts_[h.part]->stepped.empty(); });
    }
    wait();  // whatever the forward's units did not wait for, before backward reads anything
    return Tensor();
  });
}

UpdateUnderForward::~UpdateUnderForward() {
  for (const UnitHook& hook : hooks_) hook.module->remove_forward_hook(hook.id);
  model_.remove_forward_hook(model_hook_);
  try {
    synchronize();  // the update's kernels read what is freed next
  } catch (...) {
  }
}

void UpdateUnderForward::run(optim::Optimizer& optimizer, const std::function<void()>& update) {
  wait();  // the last run's, should nothing have waited for it yet
  std::vector<std::vector<Tensor>> parts;
  for (const auto& part : parts_) {
    parts.push_back(part->stepped);
    part->held.clear();
    for (const std::vector<Tensor>* list : {&part->stepped, &part->model_params}) {
      for (const Tensor& t : *list) {
        if (Tensor grad = t.grad(); grad.defined()) part->held.push_back(std::move(grad));
      }
    }
  }
  pending_ = true;
  if (!device_.is_cuda()) {
    optimizer.step_next_in_parts(std::move(parts), [this](size_t p) { parts_[p]->recorded = true; });
    update();
    return;
  }
  const core::Stream compute = core::cuda::current_stream(device_);
  const core::Stream side = update_stream(device_);
  // The update reads what the backward (and the handler) left on the current stream.
  done_->record(compute);
  done_->block(side);
  optimizer.step_next_in_parts(std::move(parts), [this, side](size_t p) {
    parts_[p]->done->record(side);
    parts_[p]->recorded = true;
  });
  {
    core::cuda::StreamGuard guard(side);
    update();
  }
  done_->record(side);
}

void UpdateUnderForward::wait_part(size_t p) {
  Part& part = *parts_[p];
  if (!part.recorded) return;
  if (device_.is_cuda()) part.done->block(core::cuda::current_stream(device_));
  part.recorded = false;
  part.held.clear();  // freed in the current stream's order, now behind the update's reads
  ++parts_waited_in_hooks_;
}

void UpdateUnderForward::wait() {
  if (!pending_) return;
  if (device_.is_cuda()) done_->block(core::cuda::current_stream(device_));
  for (auto& part : parts_) {
    part->recorded = false;
    part->held.clear();
  }
  pending_ = false;
}

void UpdateUnderForward::synchronize() const {
  if (pending_ && device_.is_cuda()) done_->synchronize();
}

}  // namespace colossal::engine
