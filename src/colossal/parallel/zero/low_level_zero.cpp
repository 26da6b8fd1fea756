// LowLevelZero: see low_level_zero.h.
#include "colossal/parallel/zero/low_level_zero.h"

#include "colossal/parallel/zero/state_pieces.h"  // map_optimizer_state, map_amp_state

#include <algorithm>
#include <charconv>
#include <deque>
#include <string_view>
#include <unordered_map>
#include <unordered_set>

#include "colossal/autograd/function.h"   // register_grad_ready_hook
#include "colossal/autograd/grad_mode.h"  // NoGradGuard
#include "colossal/core/error.h"
#include "colossal/core/profiler.h"          // Scope
#include "colossal/ops/elementwise.h"        // add_, mul_
#include "colossal/parallel/env_override.h"  // env_switch, env_count

namespace colossal::parallel::zero {

// Note [ZeRO step]
// One window of LowLevelZero, with the Engine around it:
//  1. backward: each parameter's gradient-ready hook marks it in its bucket (Partition: buckets in
//     the order backward produces gradients); a full bucket, once every earlier one has gone (the
//     collectives' order must be the same on every rank), is packed into its flat buffer in chunk
//     order, its parameters' gradients are dropped, and the buffer is reduce-scattered (averaged)
//     asynchronously: rank r receives its chunk. A completed reduction is added into the rank's
//     shard gradient (one buffer of its chunks end to end: f32 where micro-steps accumulate in it,
//     else 16-bit until finish(), Note [Shard gradient dtype] in state_pieces.cpp). Stage 1 does
//     this in the window's last backward only (before it the full gradients accumulate locally, DDP's no_sync);
//     stage 2 in every backward, accumulating the shard, so a full gradient never outlives its bucket.
//  2. finish(): buckets that did not fill (parameters without a gradient) go with zeros, every
//     reduction is waited for, and each shard tensor the optimizer steps gets its slice of the
//     shard gradient as .grad.
//  3. the Engine unscales, checks overflow and clips over those shard gradients; their statistics are
//     reduced over the data group (replicates_gradients() is false: parallel/gradient_statistics.h),
//     which adds each rank's part of the norm once since the shards partition the parameters.
//  4. the optimizer steps the shards: views of the model's f32 parameters (fp32, torch amp) or the
//     f32 masters of the shard (naive fp16, bf16; the wrapper writes them back into their slices).
//  5. after_update: every bucket's chunks are all-gathered, each rank's slices into every replica.
// The optimizer never sees a whole parameter: its param groups hold the 1-D shards (empty ones where
// a rank owns none of a parameter, so that every rank's optimizer has the same parameters, steps and
// state keys, which is what the checkpoint's gather needs).
//
// Note [Parameters in their buckets]
// Under element granularity a bucket's flat buffer is its parameters end to end (rank r's chunk is
// elements [r * chunk, (r + 1) * chunk) of that concatenation). So the gradients are packed into it
// as data parallelism packs its buckets, on the communicator's stream just before the reduce-scatter
// (ProcessGroup::reduce_scatter_packed; Note [Packing off the compute stream] in
// parallel/dp/data_parallel.cpp), with no zero-filled buffer and no copy per piece on the stream
// backward runs on. And the model's parameters are moved into one buffer per bucket of the same
// layout (each parameter's Storage pointed at its slice, as ZeRO-3 binds its chunks: Note
// [Parameters freed in place] in chunk_manager.cpp), so that the step writes this rank's chunk in
// place and after_update is one in-place all-gather per bucket, asynchronous, with nothing copied
// out of it: the stream the next forward runs on waits for the gathers, the host does not. Tensor
// granularity, optimizer offload (its step writes a staging buffer) and a parameter that shares its
// memory keep the per-piece copies.
//
// Note [Gathers under the forward]
// With the parameters in their buckets the step's all-gathers need not end with the step: each of
// the model's units (units.h: the blocks, then the model itself, which holds what no block does)
// waits in its forward pre-hook for the buckets that hold its parameters, so the gathers of the
// later blocks run under the earlier blocks' forward (as Megatron's distributed optimizer does with
// overlap_param_gather). The buckets keep the model's own parameters apart from the blocks'
// (Partition's groups), and those are gathered first, so the model's pre-hook, which runs before any
// block, waits only for them (GPT-2's embeddings and last norm), not for the bucket the last norm
// would share with the last block; the blocks' buckets follow in the order the forward reads them.
// Whatever else reads the parameters waits for every gather first: the next step (finish,
// after_update) and whoever reads the model through Engine::model()
// (GradientHandler::wait_for_parameters). This is only right if each unit's
// parameters are read by that unit or after it, and if the forward calls every unit through
// nn::Module::operator() so that its hooks run: the first forward, which always comes before the
// first step, checks the latter (every unit's pre-hook ran between the model's hooks), and until one
// has, or when one has not, the step waits for its gathers as before.

struct LowLevelZero::Entry {
  std::string name;
  Tensor param;              // the model's parameter, whose gradient backward fills
  Piece own;                 // this rank's piece of it
  int64_t shard_offset = 0;  // where the piece sits in this rank's shard
};

struct LowLevelZero::BucketState {
  std::vector<bool> ready;
  size_t num_ready = 0;
  bool launched = false;
};

struct LowLevelZero::InFlight {
  size_t bucket = 0;
  comm::Work work;
  Tensor flat;            // the packed gradients, held until the reduction is done
  Tensor out;             // this rank's reduced chunk
  bool last = false;      // launched by the window's last backward: the shard's gradient is final once added
  bool in_shard = false;  // out is the shard gradient's slice: nothing to land
};

namespace {

/// Elements [begin, begin + numel) of `t` flattened (a view; t contiguous).
Tensor flat_slice(const Tensor& t, int64_t begin, int64_t numel) {
  return t.detach().view({-1}).narrow(0, numel == 0 ? 0 : begin, numel);
}

}  // namespace

bool uses_tensor_norms(const optim::Optimizer& optimizer) {
  return optimizer.name() == "LAMB" || optimizer.name() == "LARS";
}

LowLevelZero::LowLevelZero(nn::Module& model, optim::Optimizer& optimizer, amp::MixedPrecisionOptimizer* amp,
                           std::shared_ptr<comm::ProcessGroup> group, ZeroOptions options)
    : model_(model), optimizer_(optimizer), amp_(amp), group_(std::move(group)), options_(options) {
  COLOSSAL_CHECK(group_ != nullptr, "ZeRO needs a process group");
  COLOSSAL_CHECK(options_.stage == 1 || options_.stage == 2,
                 "zero.stage = {}: LowLevelZero shards optimizer states (1) and gradients (2); valid: 1, 2",
                 options_.stage);
  COLOSSAL_CHECK(options_.reduce_bucket_bytes > 0, "zero.reduce_bucket_mb must be > 0, got {} bytes",
                 options_.reduce_bucket_bytes);
  COLOSSAL_CHECK(amp_ == nullptr || &amp_->optimizer() == &optimizer_,
                 "ZeRO: the mixed-precision wrapper wraps another optimizer than the one given");
  autograd::NoGradGuard no_grad;

  // The optimizer's parameters in group order, with the model's tensor and name of each.
  std::unordered_map<const core::TensorImpl*, std::string> model_names;
  for (const auto& [name, param] : model_.named_parameters()) model_names.emplace(param.impl(), name);
  std::vector<Tensor> masters;  // the whole tensors the optimizer holds now
  if (amp_ != nullptr) {
    COLOSSAL_CHECK(!amp_->masters_sharded(), "ZeRO: the mixed-precision masters are sharded already");
    for (size_t k = 0; k < amp_->model_params().size(); ++k) {
      entries_.push_back(Entry{amp_->param_names()[k], amp_->model_params()[k], {}, 0});
      masters.push_back(amp_->master_params()[k]);
    }
  } else {
    for (size_t g = 0; g < optimizer_.param_groups().size(); ++g) {
      const optim::ParamGroup& param_group = optimizer_.param_groups()[g];
      for (size_t i = 0; i < param_group.params.size(); ++i) {
        const auto it = model_names.find(param_group.params[i].impl());
        COLOSSAL_CHECK(it != model_names.end(),
                       "ZeRO: {} param group {} holds {}, which is not a parameter of the model; build the "
                       "optimizer over model.named_parameters()",
                       optimizer_.name(), g, param_group.param_label(i));
        entries_.push_back(Entry{it->second, param_group.params[i], {}, 0});
        masters.push_back(param_group.params[i]);
      }
    }
  }
  std::unordered_map<const core::TensorImpl*, size_t> entry_of;
  for (size_t k = 0; k < entries_.size(); ++k) {
    const Entry& e = entries_[k];
    COLOSSAL_CHECK(e.param.device() == group_->device(),
                   "ZeRO: parameter '{}' is on {} but the {} group's tensors live on {}", e.name, e.param.device(),
                   group_->backend_name(), group_->device());
    COLOSSAL_CHECK(e.param.is_contiguous(), "ZeRO: parameter '{}' is not contiguous", e.name);
    entry_of.emplace(e.param.impl(), k);
    names_.push_back(e.name);
  }
  for (const auto& [name, param] : model_.named_parameters()) {
    COLOSSAL_CHECK(!param.requires_grad() || entry_of.contains(param.impl()),
                   "ZeRO: parameter '{}' requires a gradient but is in no param group of the {} optimizer; freeze it "
                   "(requires_grad = false) or give it to the optimizer",
                   name, optimizer_.name());
  }
  check_no_optimizer_state(optimizer_, "ZeRO");

  if (options_.broadcast_parameters) broadcast_initial_state(model_, masters, amp_, *group_, "ZeRO");

  options_.gather_in_forward = env_switch("COLOSSAL_ZERO_GATHER_IN_FORWARD").value_or(options_.gather_in_forward);
  options_.late_buckets = env_count("COLOSSAL_ZERO_LATE_BUCKETS", "buckets", 1000).value_or(options_.late_buckets);
  COLOSSAL_CHECK(options_.late_buckets >= 0, "ZeRO: late_buckets must be >= 0, got {}", options_.late_buckets);
  const Granularity granularity =
      options_.granularity.value_or(uses_tensor_norms(optimizer_) ? Granularity::tensor : Granularity::element);
  // Note [Parameters in their buckets], Note [Gathers under the forward].
  const bool in_buckets = !options_.offload_optimizer && parameters_own_their_memory();
  std::vector<Unit> units;
  std::vector<int> group_of(entries_.size(), 0);
  if (in_buckets && options_.gather_in_forward) {
    std::vector<Tensor> params;
    for (const Entry& e : entries_) params.push_back(e.param);
    units = find_units(model_, params);
    for (size_t k : units.back().params) group_of[k] = 1;  // the model's own parameters
  }

  // Buckets fill in reverse registration order, roughly the order backward produces gradients.
  std::unordered_set<size_t> seen;
  std::vector<ParamSize> sizes;
  auto named = model_.named_parameters();
  std::reverse(named.begin(), named.end());
  for (const auto& [name, param] : named) {
    const auto it = entry_of.find(param.impl());
    if (it == entry_of.end() || !seen.insert(it->second).second) continue;
    fill_order_.push_back(it->second);
    sizes.push_back(ParamSize{param.numel(), static_cast<int64_t>(core::element_size(param.dtype())),
                              static_cast<int>(param.dtype()), group_of[it->second]});
  }
  COLOSSAL_CHECK(fill_order_.size() == entries_.size(),
                 "ZeRO: {} of the optimizer's {} parameters are parameters of the model", fill_order_.size(),
                 entries_.size());
  partition_ = std::make_unique<Partition>(sizes, options_.reduce_bucket_bytes, group_->size(), granularity);
  entry_slot_.resize(entries_.size());
  for (size_t p = 0; p < fill_order_.size(); ++p) entry_slot_[fill_order_[p]] = p;
  for (size_t k = 0; k < entries_.size(); ++k) {
    const size_t p = entry_slot_[k];
    entries_[k].own = partition_->piece(p, group_->rank());
    entries_[k].shard_offset = partition_->shard_offset(partition_->bucket_of(p)) + entries_[k].own.offset;
  }

  if (in_buckets) bind_flat_parameters();

  // The shards the optimizer steps from now on.
  std::vector<int64_t> begins;
  if (options_.offload_optimizer) make_offload();
  const bool own_masters = !offload_ && amp_ != nullptr && amp_->mode() != amp::AmpMode::torch;
  if (own_masters) {
    master_shard_ = core::zeros({partition_->shard_numel()}, TensorOptions(DType::f32, group_->device()));
  }
  for (size_t k = 0; k < entries_.size(); ++k) {
    const Entry& e = entries_[k];
    Tensor shard;
    if (offload_) {
      shard = offload_->master(e.shard_offset, e.own.numel);  // on the host, whatever the model's dtype
      shard.copy_(flat_slice(masters[k], e.own.begin, e.own.numel));
    } else if (own_masters) {
      shard = master_shard_.narrow(0, e.own.numel == 0 ? 0 : e.shard_offset, e.own.numel);
      shard.copy_(flat_slice(masters[k], e.own.begin, e.own.numel));
    } else {
      shard = flat_slice(e.param, e.own.begin, e.own.numel);  // stepped in place
    }
    shards_.push_back(shard);
    begins.push_back(e.own.begin);
  }
  if (amp_ != nullptr) {
    amp_->shard_masters(shards_, begins);
  } else {
    for (auto& param_group : optimizer_.param_groups()) {
      for (Tensor& param : param_group.params) param = shards_[entry_of.at(param.impl())];
    }
  }

  buckets_.resize(partition_->buckets().size());
  for (size_t b = 0; b < buckets_.size(); ++b) {
    const Bucket& bucket = partition_->buckets()[b];
    buckets_[b].ready.assign(bucket.params.size(), false);
    for (size_t slot = 0; slot < bucket.params.size(); ++slot) {
      autograd::register_grad_ready_hook(entries_[fill_order_[bucket.params[slot]]].param,
                                         [this, b, slot](Tensor&) { mark_ready(b, slot); });
    }
  }
  gathers_.resize(buckets_.size());
  if (!units.empty()) hook_units(std::move(units));
}

LowLevelZero::~LowLevelZero() {
  for (const UnitWait& unit : unit_waits_) unit.module->remove_forward_hook(unit.pre_hook);
  if (model_hook_ >= 0) model_.remove_forward_hook(model_hook_);
  wait_for_parameters();
}

void LowLevelZero::hook_units(std::vector<Unit> units) {
  // Note [Gathers under the forward]: each unit waits for the buckets its parameters are in.
  for (Unit& unit : units) {
    std::vector<size_t> buckets;
    for (size_t k : unit.params) buckets.push_back(partition_->bucket_of(entry_slot_[k]));
    std::sort(buckets.begin(), buckets.end());
    buckets.erase(std::unique(buckets.begin(), buckets.end()), buckets.end());
    unit_waits_.push_back(UnitWait{unit.module, std::move(buckets), -1, false});
  }
  const size_t model = unit_waits_.size() - 1;  // find_units puts the model last; its pre-hook runs first
  // Note [Gathers under the forward]: the model's own buckets are gathered first.
  const std::vector<size_t>& own = unit_waits_[model].buckets;
  std::stable_partition(gather_order_.begin(), gather_order_.end(),
                        [&](size_t b) { return std::binary_search(own.begin(), own.end(), b); });
  for (size_t u = 0; u < unit_waits_.size(); ++u) {
    unit_waits_[u].pre_hook =
        unit_waits_[u].module->register_forward_pre_hook([this, u, model](nn::Module&, const Tensor&) {
          if (!units_checked_) {  // the first forward: whose hooks run
            if (u == model) {
              for (UnitWait& unit : unit_waits_) unit.ran = false;
            }
            unit_waits_[u].ran = true;
          }
          wait_for_gathers(unit_waits_[u].buckets);
        });
  }
  model_hook_ = model_.register_forward_hook([this](nn::Module&, const Tensor&, const Tensor&) {
    if (!units_checked_) {
      units_checked_ = true;
      units_hooked_ = std::all_of(unit_waits_.begin(), unit_waits_.end(),
                                  [](const UnitWait& unit) { return unit.ran || unit.buckets.empty(); });
    }
    return Tensor();
  });
}

void LowLevelZero::wait_for_gathers(const std::vector<size_t>& buckets) {
  for (size_t b : buckets) {
    gathers_[b].wait();  // nothing for one already waited for (an empty Work)
    gathers_[b] = comm::Work();
  }
}

void LowLevelZero::wait_for_parameters() {
  for (comm::Work& work : gathers_) {
    work.wait();
    work = comm::Work();
  }
}

bool LowLevelZero::parameters_own_their_memory() const {
  // Pointing a parameter's Storage elsewhere must move it and nothing else.
  for (size_t k = 0; k < entries_.size(); ++k) {
    const Tensor& param = entries_[k].param;
    if (!param.is_contiguous() || param.offset() != 0 || param.storage().nbytes() != param.nbytes()) return false;
    for (size_t q = 0; q < k; ++q) {
      if (entries_[q].param.storage().is_same(param.storage())) return false;
    }
  }
  return true;
}

void LowLevelZero::make_offload() {
  // The optimizer's (group, index) of each entry: entries_ are its parameters in group order.
  std::vector<std::pair<size_t, size_t>> slots;
  for (size_t g = 0; g < optimizer_.param_groups().size(); ++g) {
    for (size_t i = 0; i < optimizer_.param_groups()[g].params.size(); ++i) slots.emplace_back(g, i);
  }
  COLOSSAL_CHECK(slots.size() == entries_.size(), "ZeRO offload: the {} optimizer has {} parameters, ZeRO {}",
                 optimizer_.name(), slots.size(), entries_.size());
  std::vector<HostOffload::Bucket> buckets;
  for (size_t b = 0; b < partition_->buckets().size(); ++b) {
    const Bucket& bucket = partition_->buckets()[b];
    HostOffload::Bucket host{
        partition_->shard_offset(b), bucket.chunk, entries_[fill_order_[bucket.params.front()]].param.dtype(), {}};
    for (size_t param : bucket.params) {
      const size_t k = fill_order_[param];
      const Entry& e = entries_[k];
      host.pieces.push_back(
          HostOffload::Piece{slots[k].first, slots[k].second, e.shard_offset, e.own.offset, e.own.numel});
    }
    buckets.push_back(std::move(host));
  }
  offload_ = std::make_unique<HostOffload>(optimizer_, group_->device(), partition_->shard_numel(), std::move(buckets),
                                           options_.step_during_backward);
}

void LowLevelZero::bind_flat_parameters() {
  // Note [Parameters in their buckets] (parameters_own_their_memory() holds).
  for (size_t b = 0; b < partition_->buckets().size(); ++b) {
    const Bucket& bucket = partition_->buckets()[b];
    const DType dtype = entries_[fill_order_[bucket.params.front()]].param.dtype();
    // Zeros: the padding at the tail stays zero (the step writes pieces only).
    Tensor flat = core::zeros({bucket.chunk * group_->size()}, TensorOptions(dtype, group_->device()));
    const core::Storage& whole = flat.storage();
    auto* base = static_cast<char*>(flat.raw_data());
    for (size_t i = 0; i < bucket.params.size(); ++i) {
      const Tensor& param = entries_[fill_order_[bucket.params[i]]].param;
      flat.narrow(0, bucket.starts[i], param.numel()).copy_(param.detach().view({-1}));
      const size_t at = static_cast<size_t>(bucket.starts[i]) * param.element_size();
      param.storage().swap_allocation(
          core::Storage::wrap(base + at, param.nbytes(), whole.device(), [keep = whole](void*) { (void)keep; }));
    }
    flat_params_.push_back(std::move(flat));
  }
  // The reverse of backward's order, the order the forward reads them (hook_units puts the model's
  // own buckets first).
  for (size_t b = flat_params_.size(); b-- > 0;) gather_order_.push_back(b);
}

std::string_view LowLevelZero::name() const {
  return options_.stage == 1 ? "ZeRO stage 1 (shards optimizer states; bucketed reduce-scatter at the window's end)"
                             : "ZeRO stage 2 (shards optimizer states and gradients; reduce-scatter every backward)";
}

void LowLevelZero::set_sync(bool sync) {
  if (options_.stage == 2) flush_backward();  // a new backward begins: the last one's unfilled buckets go
  sync_ = sync;
}

void LowLevelZero::mark_ready(size_t b, size_t slot) {
  if (options_.stage == 1 && !sync_) return;  // accumulates locally until the window's last backward
  BucketState& bucket = buckets_[b];
  COLOSSAL_CHECK(!bucket.launched,
                 "ZeRO: parameter '{}' got a second gradient in one backward after its bucket was sent (a parameter "
                 "used by two backward passes needs set_sync(false) on the first, at stage 1)",
                 entries_[fill_order_[partition_->buckets()[b].params[slot]]].name);
  backward_marked_ = true;
  if (!bucket.ready[slot]) {
    bucket.ready[slot] = true;
    ++bucket.num_ready;
  }
  launch_ready_in_order();
}

void LowLevelZero::launch_ready_in_order() {
  while (next_launch_ < buckets_.size() && buckets_[next_launch_].num_ready == buckets_[next_launch_].ready.size()) {
    launch(next_launch_);
    ++next_launch_;
  }
}

void LowLevelZero::launch_the_rest() {
  if (!backward_marked_) return;
  for (; next_launch_ < buckets_.size(); ++next_launch_) launch(next_launch_);
}

void LowLevelZero::flush_backward() {
  if (!backward_marked_) return;
  launch_the_rest();
  for (BucketState& bucket : buckets_) {
    bucket.ready.assign(bucket.ready.size(), false);
    bucket.num_ready = 0;
    bucket.launched = false;
  }
  next_launch_ = 0;
  backward_marked_ = false;
}

void LowLevelZero::launch(size_t b) {
  autograd::NoGradGuard no_grad;
  core::profiler::Scope scope("zero: bucket reduce-scatter", group_->device());
  drain(/*all=*/false);
  const Bucket& bucket = partition_->buckets()[b];
  buckets_[b].launched = true;
  window_reduced_ = true;
  if (bucket.chunk == 0) return;  // parameters without elements: nothing to send, on every rank
  const DType dtype = entries_[fill_order_[bucket.params.front()]].param.dtype();
  const int64_t numel = bucket.chunk * group_->size();
  // Note [Shard gradient dtype] in state_pieces.cpp: the window's shard gradient is made by its first
  // reduction. Where that is the window's last backward, every slice is written once, so a bucket of
  // the shard's dtype is reduce-scattered straight into its slice, with no chunk to land afterwards;
  // a window of several backward passes (stage 2) adds each reduction into an f32 shard instead.
  if (!shard_grad_.defined()) {
    shard_grad_ =
        make_shard_gradient(partition_->shard_numel(), reduced_dtypes(), sync_, offload_ != nullptr, group_->device());
    shard_grad_element_size_ = static_cast<int64_t>(shard_grad_.element_size());
    shard_grad_written_once_ = sync_;
  }
  const bool in_shard = shard_grad_written_once_ && shard_grad_.dtype() == dtype;
  Tensor out = in_shard ? shard_grad_.narrow(0, partition_->shard_offset(b), bucket.chunk)
                        : core::empty({bucket.chunk}, TensorOptions(dtype, group_->device()));
  // Note [Averaging 16-bit gradients]: a 16-bit bucket is divided by the group's size before a sum,
  // rather than summed and then divided, so that the partial sums stay within the largest rank's
  // gradient: summed first, fp16 gradients that every rank holds finite (loss-scaled, close to
  // 65504) overflow on the way, and the step is skipped where the serial run steps. NCCL's avg
  // premultiplies the same way; the MPI backend's sums first. Dividing by a power of two is exact.
  const bool divide_first = core::is_reduced_float(dtype) && group_->size() > 1 && group_->backend_name() != "nccl";
  // Each gradient at its parameter's place in the flat buffer (Partition's starts), packed where the
  // reduction runs (Note [Parameters in their buckets]); an undefined part zeroes up to the next one:
  // a parameter without a gradient in this backward, and the padding between and after them.
  std::vector<size_t> order(bucket.params.size());
  for (size_t i = 0; i < order.size(); ++i) order[i] = i;
  std::sort(order.begin(), order.end(), [&](size_t x, size_t y) { return bucket.starts[x] < bucket.starts[y]; });
  std::vector<Tensor> parts;
  std::vector<int64_t> offsets;
  int64_t filled = 0;
  for (size_t i : order) {
    Entry& e = entries_[fill_order_[bucket.params[i]]];
    const Tensor grad = e.param.grad();
    e.param.set_grad(Tensor());  // the bucket holds it now
    if (e.param.numel() == 0) continue;
    if (bucket.starts[i] > filled) {
      parts.emplace_back();
      offsets.push_back(filled);
    }
    parts.push_back(!grad.defined()                                 ? Tensor()
                    : grad.dtype() == dtype && grad.is_contiguous() ? grad
                                                                    : grad.to(dtype).contiguous());
    offsets.push_back(bucket.starts[i]);
    filled = bucket.starts[i] + e.param.numel();
  }
  if (filled < numel) {
    parts.emplace_back();
    offsets.push_back(filled);
  }
  Tensor flat = core::empty({numel}, TensorOptions(dtype, group_->device()));
  comm::Work work;
  if (divide_first) {
    comm::pack_parts(flat, parts, offsets);
    ops::mul_(flat, 1.0 / static_cast<double>(group_->size()));
    work = group_->reduce_scatter(out, flat, comm::ReduceOp::sum, /*async=*/true);
  } else {
    work = group_->reduce_scatter_packed(out, flat, parts, offsets, comm::ReduceOp::avg, /*async=*/true);
  }
  in_flight_.push_back(InFlight{b, std::move(work), std::move(flat), std::move(out), sync_, in_shard});
}

std::vector<DType> LowLevelZero::reduced_dtypes() const {
  std::vector<DType> dtypes;
  for (const Bucket& bucket : partition_->buckets()) {
    if (!bucket.params.empty()) dtypes.push_back(entries_[fill_order_[bucket.params.front()]].param.dtype());
  }
  return dtypes;
}

void LowLevelZero::drain(bool all, size_t end) {
  while (!in_flight_.empty() && in_flight_.front().bucket < end) {
    InFlight& front = in_flight_.front();
    if (!all && !front.work.is_completed()) break;
    front.work.wait();
    COLOSSAL_CHECK(shard_grad_.defined(), "ZeRO: a reduction of bucket {} landed with no shard gradient", front.bucket);
    const Bucket& bucket = partition_->buckets()[front.bucket];
    Tensor dst = shard_grad_.narrow(0, partition_->shard_offset(front.bucket), bucket.chunk);
    if (!front.in_shard) land_reduction(dst, front.out);
    // Offload: the bucket's gradient is complete; to the host (and the step, where it may start now).
    if (offload_ && front.last && !discarding_) offload_->gradient_ready(front.bucket, dst);
    in_flight_.erase(in_flight_.begin());
  }
}

Tensor LowLevelZero::shard_gradient(size_t k) const {
  const Entry& e = entries_[k];
  return shard_grad_.narrow(0, e.own.numel == 0 ? 0 : e.shard_offset, e.own.numel);
}

std::vector<Tensor> LowLevelZero::finish_all_but_late() {
  // Note [Update beside the last reductions] in engine/engine.cpp: the shards of every bucket but the
  // last `late_buckets` get their gradients now, the late ones' slices of the same shard gradient once
  // finish() has landed their reductions. Only where the step reads the shard gradient as it lands
  // (f32, or 16-bit read as it is: shard_gradient_for_step makes no copy) and on the device.
  const size_t late = std::min(buckets_.size(), static_cast<size_t>(options_.late_buckets));
  if (late == 0 || offload_ || !backward_marked_) {
    finish();
    return {};
  }
  autograd::NoGradGuard no_grad;
  wait_for_parameters();
  launch_the_rest();
  const size_t first_late = buckets_.size() - late;  // buckets launch in index order
  drain(/*all=*/true, first_late);
  if (!shard_grad_.defined() || !step_reads_shard_gradient_as_is(shard_grad_, amp_, /*offloaded=*/false)) {
    finish();
    return {};
  }
  std::vector<Tensor> late_shards;
  for (size_t k = 0; k < entries_.size(); ++k) {
    shards_[k].set_grad(shard_gradient(k));
    if (partition_->bucket_of(entry_slot_[k]) >= first_late) late_shards.push_back(shards_[k]);
  }
  return late_shards;
}

void LowLevelZero::finish() {
  autograd::NoGradGuard no_grad;
  wait_for_parameters();  // the step after this one writes this rank's chunks
  flush_backward();
  drain(/*all=*/true);
  if (!window_reduced_) return;
  if (!shard_grad_.defined()) {
    shard_grad_ = core::zeros({partition_->shard_numel()}, TensorOptions(DType::f32, group_->device()));
  }
  if (offload_) offload_->wait_for_gradients();  // the copies read shard_grad_, released below
  shard_grad_ = shard_gradient_for_step(shard_grad_, amp_, offload_ != nullptr);
  for (size_t k = 0; k < entries_.size(); ++k) {
    const Entry& e = entries_[k];
    shards_[k].set_grad(offload_ ? offload_->gradient(e.shard_offset, e.own.numel) : shard_gradient(k));
  }
  // The optimizer's zero_grad releases the buffer with the shards' gradients.
  shard_grad_ = Tensor();
  window_reduced_ = false;
}

void LowLevelZero::zero_grad() {
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
  // The optimizer holds the shards, not the model's parameters: their local gradients (stage 1's
  // accumulation) are dropped here.
  for (Entry& e : entries_) {
    if (e.param.grad().defined()) e.param.set_grad(Tensor());
  }
}

bool LowLevelZero::issue_all() {
  launch_the_rest();
  return true;
}

void LowLevelZero::after_update(bool stepped) {
  if (!stepped) {
    if (offload_) offload_->end_window();
    return;
  }
  autograd::NoGradGuard no_grad;
  core::profiler::Scope scope("zero: parameter all-gather", group_->device());
  const int rank = group_->rank();
  if (!flat_params_.empty()) {
    // Note [Parameters in their buckets]: this rank's chunk holds its updated pieces already (stepped
    // in place, or written back by the wrapper). Note [Gathers under the forward]: gather_order_.
    for (size_t b : gather_order_) {
      const int64_t chunk = partition_->buckets()[b].chunk;
      if (chunk == 0) continue;
      gathers_[b] = group_->all_gather(flat_params_[b], flat_params_[b].narrow(0, rank * chunk, chunk),
                                       /*async=*/true);
    }
    if (!gathers_under_forward()) wait_for_parameters();
    return;
  }
  for (size_t b = 0; b < partition_->buckets().size(); ++b) {
    const Bucket& bucket = partition_->buckets()[b];
    if (bucket.chunk == 0) continue;
    const DType dtype = entries_[fill_order_[bucket.params.front()]].param.dtype();
    Tensor mine;
    if (offload_) {
      mine = offload_->updated_chunk(b);  // the host step's staging buffer, on the device
    } else {
      mine = core::zeros({bucket.chunk}, TensorOptions(dtype, group_->device()));
      for (size_t i = 0; i < bucket.params.size(); ++i) {
        const Entry& e = entries_[fill_order_[bucket.params[i]]];
        if (e.own.numel > 0)
          mine.narrow(0, e.own.offset, e.own.numel).copy_(flat_slice(e.param, e.own.begin, e.own.numel));
      }
    }
    Tensor all = core::empty({bucket.chunk * group_->size()}, TensorOptions(dtype, group_->device()));
    group_->all_gather(all, mine);
    for (size_t i = 0; i < bucket.params.size(); ++i) {
      const Entry& e = entries_[fill_order_[bucket.params[i]]];
      for (const Piece& piece : bucket.pieces[i]) {
        // Without offload this rank's piece was stepped in place (or written back by the wrapper).
        if (piece.rank == rank && !offload_) continue;
        flat_slice(e.param, piece.begin, piece.numel)
            .copy_(all.narrow(0, piece.rank * bucket.chunk + piece.offset, piece.numel));
      }
    }
  }
  if (offload_) offload_->end_window();
}

Tensor LowLevelZero::gather_piece(const Tensor& local, size_t k) const {
  const Entry& e = entries_[k];
  const size_t p = entry_slot_[k];
  COLOSSAL_CHECK(local.numel() == e.own.numel,
                 "ZeRO: a tensor of parameter '{}' has {} elements but this rank's shard of it has {}", e.name,
                 local.numel(), e.own.numel);
  const int64_t most = partition_->max_piece(p);
  Tensor whole = core::empty({e.param.numel()}, TensorOptions(local.dtype(), group_->device()));
  if (most > 0) {
    Tensor mine = core::zeros({most}, TensorOptions(local.dtype(), group_->device()));
    if (e.own.numel > 0) mine.narrow(0, 0, e.own.numel).copy_(local.reshape({-1}));
    Tensor all = core::empty({most * group_->size()}, TensorOptions(local.dtype(), group_->device()));
    group_->all_gather(all, mine);
    const Bucket& bucket = partition_->buckets()[partition_->bucket_of(p)];
    for (const Piece& piece : bucket.pieces[partition_->slot_of(p)]) {
      whole.narrow(0, piece.begin, piece.numel).copy_(all.narrow(0, piece.rank * most, piece.numel));
    }
  }
  return whole.view(e.param.shape());
}

Tensor LowLevelZero::own_piece(const Tensor& whole, size_t k, const std::string& key) const {
  const Entry& e = entries_[k];
  COLOSSAL_CHECK(whole.numel() == e.param.numel(),
                 "checkpoint tensor \"{}\" has shape {} but parameter '{}' has shape {} (was the checkpoint written "
                 "for another model config?)",
                 key, whole.shape(), e.name, e.param.shape());
  return whole.contiguous().view({-1}).narrow(0, e.own.numel == 0 ? 0 : e.own.begin, e.own.numel).clone();
}

optim::StateDict LowLevelZero::gather_optimizer_state(const optim::StateDict& state) const {
  return map_optimizer_state(state, entries_.size(),
                             [&](const Tensor& t, size_t k, const std::string&) { return gather_piece(t, k); });
}

optim::StateDict LowLevelZero::shard_optimizer_state(const optim::StateDict& state) const {
  return map_optimizer_state(state, entries_.size(),
                             [&](const Tensor& t, size_t k, const std::string& key) { return own_piece(t, k, key); });
}

optim::StateDict LowLevelZero::gather_amp_state(const optim::StateDict& state) const {
  return map_amp_state(state, names_,
                       [&](const Tensor& t, size_t k, const std::string&) { return gather_piece(t, k); });
}

optim::StateDict LowLevelZero::shard_amp_state(const optim::StateDict& state) const {
  return map_amp_state(state, names_,
                       [&](const Tensor& t, size_t k, const std::string& key) { return own_piece(t, k, key); });
}

std::vector<std::pair<std::string, Tensor>> LowLevelZero::gather_gradients() const {
  autograd::NoGradGuard no_grad;
  std::vector<std::pair<std::string, Tensor>> out;
  for (size_t k = 0; k < entries_.size(); ++k) {
    Tensor grad = shards_[k].grad();
    if (!grad.defined()) grad = core::zeros({entries_[k].own.numel}, TensorOptions(DType::f32, group_->device()));
    out.emplace_back(entries_[k].name, gather_piece(grad, k));
  }
  return out;
}

void LowLevelZero::step_on_host() {
  COLOSSAL_CHECK(offload_ != nullptr, "ZeRO: step_on_host without zero.offload_optimizer");
  core::profiler::Scope scope("zero: host optimizer step", group_->device());
  offload_->step_with_optimizer_scale();
}

void LowLevelZero::load_masters_from_model() {
  if (!offload_ || (amp_ != nullptr && amp_->mode() != amp::AmpMode::torch)) return;
  autograd::NoGradGuard no_grad;
  for (size_t k = 0; k < entries_.size(); ++k) {
    const Entry& e = entries_[k];
    shards_[k].copy_(flat_slice(e.param, e.own.begin, e.own.numel));
  }
}

int64_t LowLevelZero::host_bytes() const {
  return offload_ ? offload_->host_bytes() : 0;
}

int64_t LowLevelZero::pinned_host_bytes() const {
  return offload_ ? offload_->pinned_bytes() : 0;
}

ModelStateBytes LowLevelZero::model_state_bytes() const {
  ModelStateBytes bytes;
  int64_t largest_bucket = 0;
  for (const Entry& e : entries_) bytes.parameters += static_cast<int64_t>(e.param.nbytes());
  for (const Bucket& bucket : partition_->buckets()) {
    const auto element = static_cast<int64_t>(entries_[fill_order_[bucket.params.front()]].param.element_size());
    largest_bucket = std::max(largest_bucket, bucket.chunk * (group_->size() + 1) * element);
  }
  // The window's shard (Note [Shard gradient dtype] in state_pieces.cpp) and the buckets in flight.
  // Stage 1 also keeps the whole 16-bit gradients over the window, but each is dropped when its
  // bucket is packed, before its shard lands: the two together never exceed the larger one.
  const int64_t shard = partition_->shard_numel() * shard_grad_element_size_;
  bytes.gradients = (options_.stage == 1 ? std::max(bytes.parameters, shard) : shard) + largest_bucket;
  if (master_shard_.defined()) bytes.master_weights = static_cast<int64_t>(master_shard_.nbytes());
  if (offload_) return bytes;  // masters and moments on the host: host_bytes()
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
