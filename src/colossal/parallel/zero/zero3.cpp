// Zero3: see zero3.h.
#include "colossal/parallel/zero/zero3.h"

#include "colossal/parallel/zero/state_pieces.h"  // map_optimizer_state, map_amp_state
#include "colossal/parallel/zero/units.h"         // find_units

#include <algorithm>
#include <charconv>
#include <set>
#include <string_view>
#include <unordered_map>

#include "colossal/autograd/function.h"   // Function, apply, register_grad_ready_hook
#include "colossal/autograd/grad_mode.h"  // GradMode, NoGradGuard
#include "colossal/core/error.h"
#include "colossal/core/profiler.h"    // Scope
#include "colossal/ops/elementwise.h"  // add_, mul_

namespace colossal::parallel::zero {

// Note [ZeRO-3 units]
// A unit is a module whose parameters are gathered together: the model (what no other unit holds:
// GPT-2's embeddings, tied head and last norm) and every module held in a Sequential or ModuleList
// outside another unit (the transformer blocks, an MLP's layers), each packed into its own chunks.
// Forward hooks (nn::Module, Note [Forward hooks]) acquire a unit's chunks before its forward and
// release them after; the hook after forward also puts an identity autograd node (BackwardHook) on
// the unit's output, whose backward runs before any of the unit's backward nodes (they were recorded
// before it) and acquires the chunks again. A unit's backward is over when every one of its
// parameters' gradient-ready hooks has fired: its chunks' gradients are reduce-scattered and its
// chunks released. The first forward and backward record the units' order; from then on acquiring a
// unit prefetches the next one's chunks (an asynchronous all-gather on the communicator's stream, and
// for host shards a copy on the chunk manager's stream), so they arrive while this one computes.
// Activation checkpointing recomputes a block inside its backward, after the identity node gathered
// the block's chunks, and needs nothing more. Every decision depends only on the model and the order
// of the hooks, the same on every rank, so the collectives are issued in the same order everywhere.

// Note [ZeRO-3 step]
// One window, with the Engine around it:
//  1. forward: units gather and free their chunks as above.
//  2. backward: as a unit's backward ends, each of its chunks' gradients is packed into a flat
//     buffer in chunk order (the parameters' full gradients dropped) and reduce-scattered
//     (averaged; 16-bit buckets divided first, Note [Averaging 16-bit gradients] in
//     low_level_zero.cpp) asynchronously; a completed reduction is added into the rank's shard
//     gradient, so accumulation over micro-steps happens in the shard (stage 2's rule); f32 where it
//     does, else 16-bit until finish() (Note [Shard gradient dtype] in state_pieces.cpp).
//  3. finish(): units that got no gradient send zeros, reductions are waited for, every chunk is
//     freed, the shards are fetched to the device, and each tensor the optimizer steps gets its
//     slice of the shard gradient. The Engine unscales, checks overflow and clips over those
//     (replicates_gradients() is false: the statistics are reduced over the data group).
//  4. the optimizer steps the pieces: views of the chunk shards (fp32 and torch amp) or f32 masters
//     the mixed-precision wrapper writes back into those views (naive fp16, bf16).
//  5. after_update: no all-gather (the next forward gathers), the shards are placed for the next
//     step (Note [Chunk placement] in chunk_manager.cpp).

struct Zero3::Unit {
  nn::Module* module = nullptr;
  std::vector<size_t> params;  // indices into params_
  std::vector<bool> ready;     // per params entry: its gradient arrived in this backward
  size_t num_ready = 0;
  bool reduced = false;  // this backward sent its gradients
  int64_t pre_hook = -1, hook = -1;
};

// Note [ZeRO-3 offload]
// zero.offload_optimizer at stage 3 is Note [Optimizer offload] (host_offload.cpp) with the chunks as
// its buckets: the shard's f32 masters (host copies of an f32 model's shards) and the moments live on
// the host, and no shard is ever brought to the device for the step.
//  - backward: as a chunk's reduce-scatter of the window's last backward completes (drain), its f32
//    gradient shard is copied to the pinned host gradient on HostOffload's copy stream; with neither
//    clipping nor an fp16 loss scale the worker thread steps the chunk on the host right away, while
//    the rest of backward runs (the Engine decides, as at stages 1 and 2).
//  - finish(): the shards stay where the placement put them; the optimizer's tensors (host masters)
//    get the host gradient, so unscaling, the overflow check and the clipping norm over the data
//    group run on it as for any ZeRO shard; step_on_host() steps what is left with clipping's factor.
//  - the host step writes each updated parameter in the model's dtype straight into the chunk's
//    shard where that is on the host ("cpu", and what "auto" evicted: no copy at all), else into the
//    pinned host buffer the chunk manager keeps for the device shard's next eviction (its spare,
//    ChunkManager::host_buffer, made for a chunk that never had one: "cuda"), which after_update
//    copies into the device shard ("cuda", what "auto" kept). Where each chunk's update goes is set
//    again after every placement (offload_output). So every chunk has one pinned host buffer, its
//    host shard or its spare, under any placement: "auto" pins what "cpu" pins (with a staging
//    buffer of the offload's own beside the spare it pinned a second copy of every device shard:
//    19 GiB on a 10B-parameter GPT), and host_bytes()/pinned_host_bytes() count each buffer once.
//    The host shard is written only after its unit's backward has read it: the worker waits for the
//    gradient's copy, which follows the unit's backward on the compute stream, which follows the
//    gather's copy of the host shard.
//    Sharing the spare is safe because everything else that touches it runs on the compute stream
//    and the step writes it only after that stream passed them:
//     * after_update's copy of the update out of it into the device shard (asynchronous, on the
//       compute stream) vs the next window's step writing it: the worker steps a chunk after the
//       chunk's gradient copy of the next window landed, which waited for the compute stream at a
//       point after that copy (without step-during-backward the step runs after finish() waited for
//       every gradient copy); and HostOffload records an event after the copy that each step waits
//       for, so a chunk stepped without a gradient this window is covered too.
//     * an eviction (place_after_step moving the shard to the host) copies the device shard into the
//       spare, which becomes the host shard: the copy is synchronous and on the compute stream
//       after after_update's copy, so the shard already holds the update and writes back the very
//       bytes the buffer holds; from then on the update goes into it directly.
//     * a move to the device ("auto" keeping a host shard) copies the host shard asynchronously into
//       the device shard and keeps the host buffer as the spare: set_output, called after the
//       placement, records the event the next step waits for before writing it.

struct Zero3::InFlight {
  size_t chunk = 0;
  comm::Work work;
  Tensor flat;
  Tensor out;
  bool last = false;  // reduced by the window's last backward: the shard's gradient is final once added
};

/// Identity forward; its backward acquires the unit's chunks before the unit's backward runs.
class Zero3::BackwardHook final : public autograd::Function {
 public:
  BackwardHook(Zero3* owner, size_t unit) : owner_(owner), unit_(unit) {}
  std::string name() const override { return "Zero3BackwardHook"; }
  std::vector<Tensor> forward(autograd::FunctionContext&, const std::vector<Tensor>& inputs) override {
    return {inputs[0]};
  }
  std::vector<Tensor> backward(autograd::FunctionContext&, const std::vector<Tensor>& grads) override {
    owner_->backward_begin(unit_);
    return {grads[0]};
  }

 private:
  Zero3* owner_;
  size_t unit_;
};

Zero3::Zero3(nn::Module& model, optim::Optimizer& optimizer, amp::MixedPrecisionOptimizer* amp,
             std::shared_ptr<comm::ProcessGroup> group, ZeroOptions options)
    : model_(model), optimizer_(optimizer), amp_(amp), group_(std::move(group)), options_(options) {
  COLOSSAL_CHECK(group_ != nullptr, "ZeRO-3 needs a process group");
  COLOSSAL_CHECK(options_.stage == 3, "Zero3 is zero.stage = 3, got {}", options_.stage);
  COLOSSAL_CHECK(!uses_tensor_norms(optimizer_),
                 "zero.stage = 3 splits parameters to the element, but the {} optimizer's trust ratios need whole "
                 "tensors; use zero.stage = 1 or 2 (which keep them whole) or an elementwise optimizer (adamw)",
                 optimizer_.name());
  COLOSSAL_CHECK(amp_ == nullptr || &amp_->optimizer() == &optimizer_,
                 "ZeRO-3: the mixed-precision wrapper wraps another optimizer than the one given");
  autograd::NoGradGuard no_grad;

  // The optimizer's parameters in group order, with the model's name of each.
  std::unordered_map<const core::TensorImpl*, std::string> model_names;
  for (const auto& [name, param] : model_.named_parameters()) model_names.emplace(param.impl(), name);
  std::vector<Tensor> masters;
  if (amp_ != nullptr) {
    COLOSSAL_CHECK(!amp_->masters_sharded(), "ZeRO-3: the mixed-precision masters are sharded already");
    params_ = amp_->model_params();
    names_ = amp_->param_names();
    masters = amp_->master_params();
  } else {
    for (size_t g = 0; g < optimizer_.param_groups().size(); ++g) {
      const optim::ParamGroup& param_group = optimizer_.param_groups()[g];
      for (size_t i = 0; i < param_group.params.size(); ++i) {
        const auto it = model_names.find(param_group.params[i].impl());
        COLOSSAL_CHECK(it != model_names.end(),
                       "ZeRO-3: {} param group {} holds {}, which is not a parameter of the model; build the "
                       "optimizer over model.named_parameters()",
                       optimizer_.name(), g, param_group.param_label(i));
        params_.push_back(param_group.params[i]);
        names_.push_back(it->second);
      }
    }
  }
  std::unordered_map<const core::TensorImpl*, size_t> index_of;
  for (size_t k = 0; k < params_.size(); ++k) index_of.emplace(params_[k].impl(), k);
  for (const auto& [name, param] : model_.named_parameters()) {
    COLOSSAL_CHECK(param.requires_grad() && index_of.contains(param.impl()),
                   "ZeRO-3: parameter '{}' {}; zero.stage = 3 shards every parameter and steps it, so each must "
                   "require a gradient and be in a param group of the {} optimizer (use zero.stage = 1 or 2 for "
                   "frozen parameters)",
                   name, param.requires_grad() ? "is in no param group" : "is frozen", optimizer_.name());
  }
  check_no_optimizer_state(optimizer_, "ZeRO-3");
  if (options_.broadcast_parameters) broadcast_initial_state(model_, masters, amp_, *group_, "ZeRO-3");

  // The units (Note [ZeRO-3 units]): containers' members outside another unit, then the model.
  std::vector<std::vector<size_t>> unit_params;
  for (zero::Unit& unit : find_units(model_, params_)) {
    unit_params.push_back(unit.params);
    units_.push_back(Unit{unit.module, std::move(unit.params), {}, 0, false});
    unit_names_.push_back(std::move(unit.name));
  }

  chunks_ = std::make_unique<ChunkManager>(params_, unit_params, options_.chunk_bytes, group_, options_.placement,
                                           options_.device_budget_bytes);
  for (size_t c = 0; c < chunks_->num_chunks(); ++c) {
    grad_offset_.push_back(shard_grad_numel_);
    shard_grad_numel_ += chunks_->shard_numel(c);
  }

  // The tensors the optimizer steps: the shards' pieces, or f32 masters of them (the wrapper's, or
  // on the host with offload, copied from the wrapper's masters or, for an f32 model, the pieces).
  std::vector<int64_t> begins;
  std::vector<Tensor> targets;
  if (options_.offload_optimizer) make_offload();
  const bool wrapper_masters = amp_ != nullptr && amp_->mode() != amp::AmpMode::torch;
  const bool own_masters = wrapper_masters && !offload_;
  if (own_masters) master_shard_ = core::zeros({shard_grad_numel_}, TensorOptions(DType::f32, group_->device()));
  for (size_t k = 0; k < params_.size(); ++k) {
    const Piece own = chunks_->piece_range(k);
    const int64_t at = own.numel == 0 ? 0 : grad_offset_[chunks_->chunk_of(k)] + own.offset;
    Tensor shard = chunks_->piece(k);
    if (own_masters || offload_) {
      if (amp_ != nullptr) targets.push_back(shard);
      Tensor master = offload_ ? offload_->master(at, own.numel) : master_shard_.narrow(0, at, own.numel);
      master.copy_(wrapper_masters ? masters[k].detach().view({-1}).narrow(0, own.numel == 0 ? 0 : own.begin, own.numel)
                                   : shard);
      shard = master;
    }
    shards_.push_back(shard);
    begins.push_back(own.begin);
  }
  if (amp_ != nullptr) {
    amp_->shard_masters(shards_, begins, std::move(targets));
  } else {
    for (auto& param_group : optimizer_.param_groups()) {
      for (Tensor& param : param_group.params) param = shards_[index_of.at(param.impl())];
    }
  }

  for (size_t u = 0; u < units_.size(); ++u) {
    Unit& unit = units_[u];
    unit.ready.assign(unit.params.size(), false);
    unit.pre_hook = unit.module->register_forward_pre_hook([this, u](nn::Module&, const Tensor&) { forward_begin(u); });
    unit.hook = unit.module->register_forward_hook(
        [this, u](nn::Module&, const Tensor&, const Tensor& output) { return forward_end(u, output); });
    for (size_t i = 0; i < unit.params.size(); ++i) {
      autograd::register_grad_ready_hook(params_[unit.params[i]], [this, u, i](Tensor&) { mark_ready(u, i); });
    }
  }
}

Zero3::~Zero3() {
  for (Unit& unit : units_) {
    unit.module->remove_forward_hook(unit.pre_hook);
    unit.module->remove_forward_hook(unit.hook);
  }
  for (InFlight& flight : in_flight_) flight.work.wait();
}

void Zero3::make_offload() {
  // The optimizer's (group, index) of each parameter: params_ are its parameters in group order.
  std::vector<std::pair<size_t, size_t>> slots;
  for (size_t g = 0; g < optimizer_.param_groups().size(); ++g) {
    for (size_t i = 0; i < optimizer_.param_groups()[g].params.size(); ++i) slots.emplace_back(g, i);
  }
  COLOSSAL_CHECK(slots.size() == params_.size(), "ZeRO-3 offload: the {} optimizer has {} parameters, ZeRO {}",
                 optimizer_.name(), slots.size(), params_.size());
  // One bucket per chunk, its update going into the chunk manager's buffers (offload_output): the
  // offload never makes a staging buffer of its own.
  std::vector<HostOffload::Bucket> buckets;
  for (size_t c = 0; c < chunks_->num_chunks(); ++c) {
    HostOffload::Bucket bucket{grad_offset_[c], chunks_->shard_numel(c), chunks_->dtype(c), {}, offload_output(c)};
    for (size_t k : chunks_->chunk_params(c)) {
      const Piece own = chunks_->piece_range(k);
      bucket.pieces.push_back(
          HostOffload::Piece{slots[k].first, slots[k].second, grad_offset_[c] + own.offset, own.offset, own.numel});
    }
    buckets.push_back(std::move(bucket));
  }
  offload_ = std::make_unique<HostOffload>(optimizer_, group_->device(), shard_grad_numel_, std::move(buckets),
                                           options_.step_during_backward);
}

HostOffload::Output Zero3::offload_output(size_t c) {
  // A host shard takes the update directly; a device shard through its spare host buffer (Note
  // [ZeRO-3 offload]).
  if (chunks_->place(c) == ShardPlace::host) return HostOffload::Output::direct(chunks_->shard(c));
  return HostOffload::Output::staging(chunks_->host_buffer(c));
}

std::string_view Zero3::name() const {
  return "ZeRO stage 3 (shards parameters, gradients and optimizer states in chunks; gathers per unit)";
}

void Zero3::prefetch_after(const std::vector<size_t>& order, size_t u) {
  if (!orders_recorded_) return;
  const auto it = std::find(order.begin(), order.end(), u);
  if (it == order.end() || it + 1 == order.end()) return;
  for (size_t c : chunks_->unit_chunks(*(it + 1))) chunks_->prefetch(c);
}

void Zero3::forward_begin(size_t u) {
  core::profiler::Scope scope("zero3: gather for forward", group_->device());
  if (!orders_recorded_ && std::find(forward_order_.begin(), forward_order_.end(), u) == forward_order_.end()) {
    forward_order_.push_back(u);
  }
  for (size_t c : chunks_->unit_chunks(u)) chunks_->acquire(c);
  prefetch_after(forward_order_, u);
}

Tensor Zero3::forward_end(size_t u, const Tensor& output) {
  for (size_t c : chunks_->unit_chunks(u)) chunks_->release(c);
  if (!autograd::GradMode::is_enabled() || !output.defined() || !output.requires_grad()) return Tensor();
  return autograd::apply(std::make_shared<BackwardHook>(this, u), {output})[0];
}

void Zero3::backward_begin(size_t u) {
  core::profiler::Scope scope("zero3: gather for backward", group_->device());
  if (!orders_recorded_ && std::find(backward_order_.begin(), backward_order_.end(), u) == backward_order_.end()) {
    backward_order_.push_back(u);
  }
  backward_marked_ = true;
  for (size_t c : chunks_->unit_chunks(u)) chunks_->acquire(c);
  prefetch_after(backward_order_, u);
}

void Zero3::mark_ready(size_t u, size_t i) {
  Unit& unit = units_[u];
  COLOSSAL_CHECK(!unit.reduced,
                 "ZeRO-3: parameter '{}' got a second gradient in one backward after its unit's gradients were sent",
                 names_[unit.params[i]]);
  backward_marked_ = true;
  if (!unit.ready[i]) {
    unit.ready[i] = true;
    ++unit.num_ready;
  }
  if (unit.num_ready == unit.params.size()) reduce_unit(u);
}

void Zero3::reduce_unit(size_t u) {
  autograd::NoGradGuard no_grad;
  core::profiler::Scope scope("zero3: reduce-scatter", group_->device());
  Unit& unit = units_[u];
  unit.reduced = true;
  window_reduced_ = true;
  drain(/*all=*/false);
  const int size = group_->size();
  for (size_t c : chunks_->unit_chunks(u)) {
    const int64_t shard = chunks_->shard_numel(c);
    if (shard == 0) continue;
    const DType dtype = chunks_->dtype(c);
    // Padding and parameters without a gradient reduce as zeros.
    Tensor flat = core::zeros({shard * size}, TensorOptions(dtype, group_->device()));
    for (size_t p : chunks_->chunk_params(c)) {
      const Tensor grad = params_[p].grad();
      if (!grad.defined()) continue;
      flat.narrow(0, chunks_->offset(p), grad.numel()).copy_(grad.detach().reshape({-1}));
      params_[p].set_grad(Tensor());
    }
    comm::ReduceOp op = comm::ReduceOp::avg;  // Note [Averaging 16-bit gradients] in low_level_zero.cpp
    if (core::is_reduced_float(dtype) && size > 1) {
      ops::mul_(flat, 1.0 / static_cast<double>(size));
      op = comm::ReduceOp::sum;
    }
    Tensor out = core::empty({shard}, TensorOptions(dtype, group_->device()));
    comm::Work work = group_->reduce_scatter(out, flat, op, /*async=*/true);
    in_flight_.push_back(InFlight{c, std::move(work), std::move(flat), std::move(out), sync_});
  }
  for (size_t c : chunks_->unit_chunks(u)) chunks_->release(c);
}

std::vector<DType> Zero3::reduced_dtypes() const {
  std::vector<DType> dtypes;
  for (size_t c = 0; c < chunks_->num_chunks(); ++c) {
    if (chunks_->shard_numel(c) > 0) dtypes.push_back(chunks_->dtype(c));
  }
  return dtypes;
}

void Zero3::drain(bool all) {
  while (!in_flight_.empty()) {
    InFlight& front = in_flight_.front();
    if (!all && !front.work.is_completed()) break;
    front.work.wait();
    if (!shard_grad_.defined()) {
      // Note [Shard gradient dtype] in state_pieces.cpp.
      shard_grad_ =
          make_shard_gradient(shard_grad_numel_, reduced_dtypes(), front.last, offload_ != nullptr, group_->device());
      shard_grad_element_size_ = static_cast<int64_t>(shard_grad_.element_size());
    }
    Tensor dst = shard_grad_.narrow(0, grad_offset_[front.chunk], chunks_->shard_numel(front.chunk));
    land_reduction(dst, front.out);
    // Offload: the chunk's gradient is complete; to the host (and the step, where it may start now).
    if (offload_ && front.last && !discarding_) offload_->gradient_ready(front.chunk, dst);
    in_flight_.erase(in_flight_.begin());
  }
}

void Zero3::flush_backward() {
  if (backward_marked_) {
    for (size_t u = 0; u < units_.size(); ++u) {
      if (!units_[u].reduced) reduce_unit(u);
    }
    orders_recorded_ = true;  // the first forward and backward are over
  }
  for (Unit& unit : units_) {
    unit.ready.assign(unit.ready.size(), false);
    unit.num_ready = 0;
    unit.reduced = false;
  }
  backward_marked_ = false;
  chunks_->release_all();
}

void Zero3::set_sync(bool sync) {
  flush_backward();  // every backward reduces into the shard, as stage 2
  sync_ = sync;      // offload copies the gradients of the window's last backward to the host
}

void Zero3::finish() {
  autograd::NoGradGuard no_grad;
  flush_backward();
  drain(/*all=*/true);
  if (!offload_) chunks_->fetch_all();  // the optimizer steps on the device
  if (!window_reduced_) return;
  if (!shard_grad_.defined()) {
    shard_grad_ = core::zeros({shard_grad_numel_}, TensorOptions(DType::f32, group_->device()));
  }
  if (offload_) offload_->wait_for_gradients();  // the copies read shard_grad_, released below
  shard_grad_ = shard_gradient_for_step(shard_grad_, amp_, offload_ != nullptr);
  for (size_t k = 0; k < params_.size(); ++k) {
    const Piece own = chunks_->piece_range(k);
    const int64_t at = own.numel == 0 ? 0 : grad_offset_[chunks_->chunk_of(k)] + own.offset;
    shards_[k].set_grad(offload_ ? offload_->gradient(at, own.numel) : shard_grad_.narrow(0, at, own.numel));
  }
  shard_grad_ = Tensor();  // the optimizer's zero_grad releases it with the shards' gradients
  window_reduced_ = false;
}

void Zero3::zero_grad() {
  autograd::NoGradGuard no_grad;
  discarding_ = true;  // nothing of a dropped window goes to the host optimizer
  flush_backward();
  drain(/*all=*/true);
  discarding_ = false;
  if (offload_) {
    offload_->wait_for_gradients();
    offload_->end_window();
  }
  shard_grad_ = Tensor();
  window_reduced_ = false;
  for (Tensor& param : params_) {
    if (param.grad().defined()) param.set_grad(Tensor());
  }
}

void Zero3::after_update(bool stepped) {
  // The shards are the parameters: nothing to gather either way.
  if (offload_) {
    autograd::NoGradGuard no_grad;
    if (stepped) {
      for (size_t c = 0; c < chunks_->num_chunks(); ++c) {
        if (offload_->output_copied_to_device(c)) offload_->copy_updated_chunk(c, chunks_->shard(c));
      }
    }
    offload_->end_window();
  }
  chunks_->place_after_step();
  if (offload_) {
    for (size_t c = 0; c < chunks_->num_chunks(); ++c) offload_->set_output(c, offload_output(c));
  }
}

void Zero3::step_on_host() {
  COLOSSAL_CHECK(offload_ != nullptr, "ZeRO-3: step_on_host without zero.offload_optimizer = true");
  core::profiler::Scope scope("zero3: host optimizer step", group_->device());
  offload_->step_with_optimizer_scale();
}

void Zero3::load_masters_from_model() {
  if (!offload_ || (amp_ != nullptr && amp_->mode() != amp::AmpMode::torch)) return;
  autograd::NoGradGuard no_grad;
  for (size_t k = 0; k < params_.size(); ++k) shards_[k].copy_(chunks_->piece(k));
}

int64_t Zero3::chunk_host_bytes() const {
  // Each chunk's host shard or the spare buffer of its device shard (which offload stages updates in).
  const ChunkStats stats = chunks_->stats();
  return stats.host_shard_bytes + stats.spare_host_bytes;
}

int64_t Zero3::host_bytes() const {
  return (offload_ ? offload_->host_bytes() : 0) + chunk_host_bytes();
}

int64_t Zero3::pinned_host_bytes() const {
  // The chunk manager's host buffers are pinned on a GPU machine, as the offload's own buffers.
  if (!group_->device().is_cuda()) return 0;
  return (offload_ ? offload_->pinned_bytes() : 0) + chunk_host_bytes();
}

Tensor Zero3::gather_whole(const Tensor& local, size_t k) const {
  // Rank r holds elements [r S, (r + 1) S) of the chunk, the parameter [o, o + n) of it.
  const size_t c = chunks_->chunk_of(k);
  const int64_t shard = chunks_->shard_numel(c), o = chunks_->offset(k), n = params_[k].numel();
  const int size = group_->size();
  COLOSSAL_CHECK(local.numel() == chunks_->piece_range(k).numel,
                 "ZeRO-3: a tensor of parameter '{}' has {} elements but this rank's shard of it has {}", names_[k],
                 local.numel(), chunks_->piece_range(k).numel);
  int64_t most = 0;
  for (int r = 0; r < size; ++r) most = std::max(most, std::min(o + n, (r + 1) * shard) - std::max(o, r * shard));
  Tensor whole = core::empty({n}, TensorOptions(local.dtype(), group_->device()));
  if (most > 0) {
    Tensor mine = core::zeros({most}, TensorOptions(local.dtype(), group_->device()));
    if (local.numel() > 0) mine.narrow(0, 0, local.numel()).copy_(local.reshape({-1}));
    Tensor all = core::empty({most * size}, TensorOptions(local.dtype(), group_->device()));
    group_->all_gather(all, mine);
    for (int r = 0; r < size; ++r) {
      const int64_t lo = std::max(o, r * shard), hi = std::min(o + n, (r + 1) * shard);
      if (hi > lo) whole.narrow(0, lo - o, hi - lo).copy_(all.narrow(0, r * most, hi - lo));
    }
  }
  return whole.view(params_[k].shape());
}

Tensor Zero3::own_piece(const Tensor& whole, size_t k, const std::string& key) const {
  COLOSSAL_CHECK(whole.numel() == params_[k].numel(),
                 "checkpoint tensor \"{}\" has shape {} but parameter '{}' has shape {} (was the checkpoint written "
                 "for another model config?)",
                 key, whole.shape(), names_[k], params_[k].shape());
  const Piece own = chunks_->piece_range(k);
  return whole.contiguous().view({-1}).narrow(0, own.numel == 0 ? 0 : own.begin, own.numel).clone();
}

optim::StateDict Zero3::gather_optimizer_state(const optim::StateDict& state) const {
  return map_optimizer_state(state, params_.size(), [&](const Tensor& t, size_t k, const std::string&) {
    return gather_whole(t.to(group_->device()), k);
  });
}

optim::StateDict Zero3::shard_optimizer_state(const optim::StateDict& state) const {
  return map_optimizer_state(state, params_.size(),
                             [&](const Tensor& t, size_t k, const std::string& key) { return own_piece(t, k, key); });
}

optim::StateDict Zero3::gather_amp_state(const optim::StateDict& state) const {
  return map_amp_state(state, names_,
                       [&](const Tensor& t, size_t k, const std::string&) { return gather_whole(t, k); });
}

optim::StateDict Zero3::shard_amp_state(const optim::StateDict& state) const {
  return map_amp_state(state, names_,
                       [&](const Tensor& t, size_t k, const std::string& key) { return own_piece(t, k, key); });
}

nn::StateDict Zero3::gather_model_state(const nn::StateDict& state) const {
  autograd::NoGradGuard no_grad;
  std::unordered_map<std::string, size_t> index;
  for (size_t k = 0; k < names_.size(); ++k) index.emplace(names_[k], k);
  nn::StateDict out;
  for (const auto& [name, tensor] : state) {  // the model's order: the same on every rank
    const auto it = index.find(name);
    out.insert(name,
               it == index.end() ? tensor : gather_whole(chunks_->piece(it->second).to(group_->device()), it->second));
  }
  return out;
}

void Zero3::load_model_state(nn::Module& model, const nn::StateDict& state) {
  COLOSSAL_CHECK(&model == &model_, "ZeRO-3: load_model_state was given another model than the one it shards");
  autograd::NoGradGuard no_grad;
  std::unordered_map<std::string, size_t> index;
  for (size_t k = 0; k < names_.size(); ++k) index.emplace(names_[k], k);
  // Check everything before changing anything: buffers through the model's own load, parameters here.
  nn::StateDict buffers;
  for (const auto& [name, tensor] : state) {
    if (!index.contains(name)) buffers.insert(name, tensor);
  }
  for (size_t k = 0; k < names_.size(); ++k) {
    const Tensor* whole = state.find(names_[k]);
    COLOSSAL_CHECK(whole != nullptr, "the model's tensor \"{}\" is missing", names_[k]);
    COLOSSAL_CHECK(whole->shape() == params_[k].shape(), "\"{}\" has shape {} but the model's parameter has shape {}",
                   names_[k], whole->shape(), params_[k].shape());
  }
  const nn::LoadResult result = model_.load_state_dict(buffers, /*strict=*/false);
  COLOSSAL_CHECK(result.unexpected_keys.empty(), "tensor \"{}\" is none of the model's",
                 result.unexpected_keys.empty() ? std::string() : result.unexpected_keys.front());
  for (const std::string& missing : result.missing_keys) {
    COLOSSAL_CHECK(index.contains(missing), "the model's tensor \"{}\" is missing", missing);
  }
  for (size_t k = 0; k < names_.size(); ++k) {
    const Piece own = chunks_->piece_range(k);
    if (own.numel == 0) continue;
    chunks_->piece(k).copy_(state.at(names_[k]).contiguous().view({-1}).narrow(0, own.begin, own.numel));
  }
}

std::vector<std::pair<std::string, Tensor>> Zero3::gather_gradients() const {
  autograd::NoGradGuard no_grad;
  std::vector<std::pair<std::string, Tensor>> out;
  for (size_t k = 0; k < params_.size(); ++k) {
    Tensor grad = shards_[k].grad();
    if (!grad.defined()) {
      grad = core::zeros({chunks_->piece_range(k).numel}, TensorOptions(DType::f32, group_->device()));
    }
    out.emplace_back(names_[k], gather_whole(grad, k));
  }
  return out;
}

ModelStateBytes Zero3::model_state_bytes() const {
  ModelStateBytes bytes;
  int64_t largest_chunk = 0;
  for (size_t c = 0; c < chunks_->num_chunks(); ++c) {
    const int64_t element = static_cast<int64_t>(core::element_size(chunks_->dtype(c)));
    bytes.parameters += chunks_->shard_numel(c) * element;
    largest_chunk = std::max(largest_chunk, chunks_->shard_numel(c) * (group_->size() + 1) * element);
  }
  // The window's shard (Note [Shard gradient dtype] in state_pieces.cpp) and a chunk in flight.
  bytes.gradients = shard_grad_numel_ * shard_grad_element_size_ + largest_chunk;
  // Offload: the shards on the host stay there through the step; masters and moments are host_bytes().
  if (offload_) {
    bytes.parameters -= chunks_->stats().host_shard_bytes;
    return bytes;
  }
  if (master_shard_.defined()) bytes.master_weights = static_cast<int64_t>(master_shard_.nbytes());
  for (size_t g = 0; g < optimizer_.param_groups().size(); ++g) {
    for (size_t i = 0; i < optimizer_.param_groups()[g].params.size(); ++i) {
      if (const optim::ParamState* state = optimizer_.find_state(g, i)) {
        for (const auto& [name, buffer] : state->buffers)
          bytes.optimizer_states += static_cast<int64_t>(buffer.nbytes());
      }
    }
  }
  return bytes;
}

}  // namespace colossal::parallel::zero
