// DataParallel: see data_parallel.h.
#include "colossal/parallel/dp/data_parallel.h"

#include <fmt/format.h>

#include <algorithm>
#include <cstdlib>
#include <map>
#include <string_view>
#include <utility>

#include "colossal/autograd/function.h"   // register_grad_ready_hook
#include "colossal/autograd/grad_mode.h"  // NoGradGuard
#include "colossal/core/build_config.h"
#include "colossal/core/error.h"
#include "colossal/core/profiler.h"  // Scope
#include "colossal/parallel/dp/copy_engine_pair.h"
#include "colossal/parallel/env_override.h"

namespace colossal::parallel {

// Note [Bucket order]
// Collectives must be issued in the same order on every rank, but gradients need not become ready
// in the same order everywhere (threads, unused parameters). So a bucket is launched only when it is
// full AND every bucket before it has been launched; buckets are laid out in reverse registration
// order, which is close to the order backward produces gradients, so in practice each launches as
// soon as it fills and the all-reduce overlaps the rest of backward. A bucket is one flat buffer of
// its parameters' dtype and device.
//
// Note [Gradients as bucket views]
// When a bucket launches, each of its gradients is copied into the bucket's slice for it and the
// parameter's .grad becomes a view of that slice (torch DDP's gradient_as_bucket_view), so the
// all-reduce averages the gradients in place and finish() has nothing to copy back: one copy of the
// gradients per step instead of two. A gradient that already is its slice's view (kept from the last
// window, or accumulated into in place) is not copied at all. The optimizer and the mixed-precision
// wrapper read the views like any gradient; zero_grad drops them, and the next window's launch makes
// them again.
//
// Note [Packing off the compute stream]
// The copies into a bucket run on the communicator's stream, just before its all-reduce
// (ProcessGroup::all_reduce_packed), not on the stream backward runs on: profiled on 2x H200 with
// GPT-2 124M, the ~140 small copies per step on the compute stream took 0.28 ms plus 0.21 ms of gaps
// between them, all on the step's critical path. The Work holds the original gradients until the
// reduction is known to be done (a later launch finds it completed, or finish() waits), so their
// memory is not reused under the copy. A bucket of one parameter (GPT-2's tied wte, 77 MB in bf16,
// the step's last and largest) has nothing to pack: its gradient, which the autograd engine keeps
// exclusive (AccumulateGrad), is all-reduced in place, with no copy and no bucket buffer.

// Note [Buckets in the order gradients arrive]
// Reverse registration order (Note [Bucket order]) is a guess at the order backward produces the
// gradients, and where it is wrong a bucket waits, full but for one parameter, for a gradient that
// comes late, and holds back every bucket after it. GPT-2's is wrong at its end: the tied wte is
// registered first, so it is the last bucket, yet its gradient is complete before wpe's, which shares
// a bucket with h.0: on 2 H100s wte's 77 MB all-reduce started 0.6 ms after backward's last kernel,
// behind h.0's bucket, and the update's late part waited for it (session 14's traces). So, as torch
// DDP does, the first synchronised backward records the order in which the gradients are marked ready,
// and finish() then lays the buckets out again in that order (parameters that got no gradient last):
// rank 0's order, broadcast, so that every rank launches the same buckets in the same order. That
// step's averaged gradients are copied into the new buckets once, and the old buffers freed.

struct DataParallel::Bucket {
  std::vector<std::string> names;
  std::vector<Tensor> params;
  std::vector<int64_t> offsets;  // element offset of each parameter in the flat buffer
  Tensor flat;                   // undefined for a bucket of one parameter (reduced in place)
  std::vector<bool> ready;
  size_t num_ready = 0;
  bool launched = false;
  comm::Work work;
};

DataParallel::DataParallel(nn::Module& model, std::shared_ptr<comm::ProcessGroup> group, DataParallelOptions options)
    : model_(model), group_(std::move(group)), options_(options) {
  COLOSSAL_CHECK(group_ != nullptr, "DataParallel needs a process group");
  if (const char* mb = std::getenv("COLOSSAL_DP_BUCKET_MB"); mb != nullptr && *mb != '\0') {
    char* end = nullptr;
    const double value = std::strtod(mb, &end);
    COLOSSAL_CHECK(end != mb && *end == '\0' && value > 0,
                   "COLOSSAL_DP_BUCKET_MB must be a positive number of MiB, got '{}'", mb);
    options_.bucket_bytes = static_cast<int64_t>(value * (1 << 20));
  }
  options_.late_buckets = env_count("COLOSSAL_DP_LATE_BUCKETS", "buckets", 1000).value_or(options_.late_buckets);
  options_.rebuild_buckets = env_switch("COLOSSAL_DP_REBUILD_BUCKETS").value_or(options_.rebuild_buckets);
  if (const char* ce = std::getenv("COLOSSAL_DP_COPY_ENGINE"); ce != nullptr && *ce != '\0') {
    const std::string_view value(ce);
    COLOSSAL_CHECK(value == "0" || value == "1" || value == "2",
                   "COLOSSAL_DP_COPY_ENGINE must be 0 (NCCL), 1 (copy engines) or 2 (direct loads), got '{}'", value);
    options_.pair_reduction = value == "0"   ? PairReduction::nccl
                              : value == "1" ? PairReduction::copy_engines
                                             : PairReduction::direct_loads;
  }
  if (options_.pair_reduction != PairReduction::nccl) {
#if COLOSSAL_WITH_NCCL
    std::string why;
    COLOSSAL_CHECK(CopyEnginePair::available(*group_, &why),
                   "DataParallel: reducing without NCCL (COLOSSAL_DP_COPY_ENGINE) needs two GPUs of one host that can "
                   "map each other's memory, but {} ({}); unset it to reduce with NCCL",
                   why, group_->describe());
#else
    COLOSSAL_CHECK(false,
                   "DataParallel: reducing without NCCL (COLOSSAL_DP_COPY_ENGINE) needs a build with CUDA and NCCL");
#endif
  }
  COLOSSAL_CHECK(options_.bucket_bytes > 0, "DataParallel: bucket_bytes must be > 0, got {}", options_.bucket_bytes);
  COLOSSAL_CHECK(options_.late_buckets >= 0, "DataParallel: late_buckets must be >= 0, got {}", options_.late_buckets);
  if (options_.broadcast_parameters) broadcast_parameters();

  // Reverse registration order; a new bucket whenever the size cap, the dtype or the device changes.
  auto named = model_.named_parameters();
  std::reverse(named.begin(), named.end());
  for (auto& [name, param] : named) {
    if (!param.requires_grad()) continue;
    COLOSSAL_CHECK(param.device() == group_->device(),
                   "DataParallel: parameter '{}' is on {} but the {} group's tensors live on {}", name, param.device(),
                   group_->backend_name(), group_->device());
    params_.emplace_back(name, param);
  }
  std::vector<size_t> order(params_.size());
  for (size_t i = 0; i < order.size(); ++i) order[i] = i;
  build_buckets(order);
  for (size_t i = 0; i < params_.size(); ++i) {
    autograd::register_grad_ready_hook(params_[i].second, [this, i](Tensor&) { mark_ready(i); });
  }
}

void DataParallel::build_buckets(const std::vector<size_t>& order) {
  buckets_.clear();
  locate_.assign(params_.size(), {0, 0});
  Bucket* current = nullptr;
  int64_t current_bytes = 0;
  for (const size_t i : order) {
    const auto& [name, param] = params_[i];
    const int64_t bytes = param.nbytes();
    const bool fits = current != nullptr && current_bytes + bytes <= options_.bucket_bytes &&
                      current->params.front().dtype() == param.dtype();
    if (!fits) {
      buckets_.push_back(std::make_unique<Bucket>());
      current = buckets_.back().get();
      current_bytes = 0;
    }
    locate_[i] = {buckets_.size() - 1, current->params.size()};
    current->names.push_back(name);
    current->offsets.push_back(current_bytes / static_cast<int64_t>(core::element_size(param.dtype())));
    current->params.push_back(param);
    current_bytes += bytes;
  }
  // With the copy engines, once the layout is final: every bucket (a lone parameter's too) in the
  // pair's shared allocation.
  copy_engine_.reset();  // its window stays until the process ends (Note [Pair window teardown])
#if COLOSSAL_WITH_NCCL
  if (options_.pair_reduction != PairReduction::nccl && (rebuilt_ || !options_.rebuild_buckets)) {
    std::vector<int64_t> numels;
    std::vector<DType> dtypes;
    for (const auto& bucket : buckets_) {
      numels.push_back(bucket->offsets.back() + bucket->params.back().numel());
      dtypes.push_back(bucket->params.front().dtype());
    }
    copy_engine_ = std::make_unique<CopyEnginePair>(group_, numels, dtypes, options_.pair_reduction);
  }
#endif
  for (size_t b = 0; b < buckets_.size(); ++b) {
    Bucket& bucket = *buckets_[b];
    const int64_t numel = bucket.offsets.back() + bucket.params.back().numel();
    if (copy_engine_) {
      bucket.flat = copy_engine_->flat(b);
    } else if (bucket.params.size() > 1) {
      bucket.flat = core::empty({numel}, TensorOptions(bucket.params.front().dtype(), group_->device()));
    }
    bucket.ready.assign(bucket.params.size(), false);
  }
}

void DataParallel::rebuild_in_arrival_order() {
  // Note [Buckets in the order gradients arrive]
  rebuilt_ = true;
  std::vector<bool> seen(params_.size(), false);
  std::vector<int64_t> order;
  order.reserve(params_.size());
  for (const size_t i : arrival_) {
    if (!seen[i]) order.push_back(static_cast<int64_t>(i));
    seen[i] = true;
  }
  std::vector<size_t> rest;  // what got no gradient, in its old order
  for (size_t i = 0; i < params_.size(); ++i) {
    if (!seen[i]) rest.push_back(i);
  }
  std::sort(rest.begin(), rest.end(), [this](size_t a, size_t b) { return locate_[a] < locate_[b]; });
  for (const size_t i : rest) order.push_back(static_cast<int64_t>(i));
  arrival_.clear();
  Tensor agreed = core::from_vector<int64_t>(order, {static_cast<int64_t>(order.size())}).to(group_->device());
  group_->broadcast(agreed, 0);
  std::vector<size_t> chosen;
  for (const int64_t i : agreed.to(Device{}).to_vector<int64_t>()) chosen.push_back(static_cast<size_t>(i));
  build_buckets(chosen);
  // This step's averaged gradients move into the new buckets, so that from here on every gradient
  // is a view of the bucket bucket_names() places it in (and the old buffers are freed now).
  autograd::NoGradGuard no_grad;
  for (auto& bucket : buckets_) {
    if (!bucket->flat.defined()) continue;
    for (size_t slot = 0; slot < bucket->params.size(); ++slot) {
      Tensor& param = bucket->params[slot];
      const Tensor grad = param.grad();
      if (!grad.defined()) continue;
      Tensor view = bucket->flat.narrow(0, bucket->offsets[slot], param.numel()).view(param.shape());
      view.copy_(grad);
      param.set_grad(view);
    }
  }
}

DataParallel::~DataParallel() = default;

void DataParallel::broadcast_parameters() {
  autograd::NoGradGuard no_grad;
  for (const auto& [name, tensor] : model_.state_dict()) {
    COLOSSAL_CHECK(tensor.is_contiguous(), "DataParallel: '{}' is not contiguous", name);
    group_->broadcast(tensor, 0);
  }
}

void DataParallel::mark_ready(size_t param) {
  if (!sync_) return;
  if (options_.rebuild_buckets && !rebuilt_) arrival_.push_back(param);
  const auto [b, slot] = locate_[param];
  Bucket& bucket = *buckets_[b];
  COLOSSAL_CHECK(!bucket.launched,
                 "DataParallel: parameter '{}' got a second gradient in one synchronised backward after its bucket "
                 "was sent (a parameter used by two backward passes needs set_sync(false) on the first)",
                 bucket.names[slot]);
  pending_ = true;
  if (!bucket.ready[slot]) {
    bucket.ready[slot] = true;
    ++bucket.num_ready;
  }
  launch_ready_in_order();
}

void DataParallel::launch_ready_in_order() {
  while (next_launch_ < buckets_.size() && buckets_[next_launch_]->num_ready == buckets_[next_launch_]->params.size()) {
    launch(next_launch_);
    ++next_launch_;
  }
}

void DataParallel::launch(size_t b) {
  Bucket& bucket = *buckets_[b];
  autograd::NoGradGuard no_grad;
  core::profiler::Scope scope("dp: bucket launch", group_->device());
  // Reductions already done give back the gradients their Work holds (Note [Packing off the
  // compute stream]); waiting on a completed one costs the stream nothing.
  for (auto& other : buckets_) {
    if (other->launched && other->work.is_completed()) {
      other->work.wait();
      other->work = comm::Work();
    }
  }
  if (!bucket.flat.defined()) {
    // One parameter: reduce its gradient in place (a zero one when it got none).
    Tensor& param = bucket.params.front();
    Tensor grad = param.grad();
    if (!grad.defined() || !grad.is_contiguous() || grad.dtype() != param.dtype()) {
      grad = grad.defined() ? grad.to(param.dtype()).contiguous().clone() : core::zeros_like(param);
      param.set_grad(grad);
    }
    bucket.work = group_->all_reduce(grad, comm::ReduceOp::avg, /*async=*/true);
    bucket.launched = true;
    return;
  }
  std::vector<Tensor> parts(bucket.params.size());
  for (size_t i = 0; i < bucket.params.size(); ++i) {
    Tensor& param = bucket.params[i];
    Tensor slice = bucket.flat.narrow(0, bucket.offsets[i], param.numel());
    const Tensor grad = param.grad();
    if (grad.defined() && grad.raw_data() == slice.raw_data() && grad.is_contiguous()) {
      parts[i] = grad;  // already the view: packs onto itself, a no-op copy the backend skips
      continue;
    }
    // An unused parameter contributes nothing: its undefined part zeroes its slice.
    if (grad.defined())
      parts[i] = grad.dtype() == param.dtype() && grad.is_contiguous() ? grad : grad.to(param.dtype()).contiguous();
    param.set_grad(slice.view(param.shape()));  // Note [Gradients as bucket views]
  }
#if COLOSSAL_WITH_NCCL
  if (copy_engine_) {
    bucket.work = copy_engine_->all_reduce_avg(b, std::move(parts), bucket.offsets);
    bucket.launched = true;
    return;
  }
#endif
  bucket.work = group_->all_reduce_packed(bucket.flat, parts, bucket.offsets, comm::ReduceOp::avg, /*async=*/true);
  bucket.launched = true;
}

void DataParallel::launch_the_rest() {
  // Buckets with parameters that got no gradient never filled: send them now, in order.
  for (; next_launch_ < buckets_.size(); ++next_launch_) launch(next_launch_);
}

bool DataParallel::issue_all() {
  if (pending_) launch_the_rest();
  return true;
}

std::vector<Tensor> DataParallel::finish_all_but_late() {
  const size_t late = std::min(buckets_.size(), static_cast<size_t>(options_.late_buckets));
  if (!pending_ || late == 0) {
    finish();
    return {};
  }
  launch_the_rest();
  autograd::NoGradGuard no_grad;
  // Buckets launch in index order, so the last ones launched are the last `late` indices.
  for (size_t b = 0; b + late < buckets_.size(); ++b) {
    buckets_[b]->work.wait();
    buckets_[b]->work = comm::Work();  // finish() finds it done
  }
  std::vector<Tensor> params;
  for (size_t b = buckets_.size() - late; b < buckets_.size(); ++b) {
    for (const Tensor& param : buckets_[b]->params) params.push_back(param);
  }
  return params;
}

void DataParallel::finish() {
  if (!pending_) return;
  launch_the_rest();
  autograd::NoGradGuard no_grad;
  for (auto& bucket : buckets_) {
    // The gradients are views of the bucket (Note [Gradients as bucket views]): once the caller's
    // stream waits for the all-reduce, they hold the averages.
    bucket->work.wait();
    for (size_t i = 0; i < bucket->params.size(); ++i) bucket->ready[i] = false;
    bucket->num_ready = 0;
    bucket->launched = false;
    bucket->work = comm::Work();
  }
  next_launch_ = 0;
  pending_ = false;
  if (options_.rebuild_buckets && !rebuilt_) rebuild_in_arrival_order();
}

std::vector<std::vector<std::string>> DataParallel::bucket_names() const {
  std::vector<std::vector<std::string>> out;
  for (const auto& bucket : buckets_) out.push_back(bucket->names);
  return out;
}

}  // namespace colossal::parallel
