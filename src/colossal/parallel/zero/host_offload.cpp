// HostOffload: see host_offload.h.
#include "colossal/parallel/zero/host_offload.h"

#include <utility>

#include "colossal/core/cuda_device.h"  // pinned_empty, copy_async, Event, streams
#include "colossal/core/error.h"

namespace colossal::parallel::zero {

// Note [Optimizer offload]
// zero.offload_optimizer moves the optimizer of a ZeRO (stage 1 or 2) rank's shard to the host: the
// fp32 masters (of every model dtype: for an f32 model they are host copies of its parameters) and
// the moments live in host memory, and only the parameters (model dtype) and the gradients' buckets
// stay on the GPU. One window:
//  1. backward: as each bucket's reduce-scatter completes in the window's last backward (stage 1:
//     its only reducing one; stage 2: the last of the window's, which completes the f32 accumulation
//     in the device shard gradient), its chunk of the shard gradient is copied to the pinned host
//     gradient on a copy stream (after an event on the compute stream), so the copies run under the
//     rest of backward.
//  2. Where nothing needs every gradient before the step — no clipping (the global norm) and no fp16
//     loss scale (the overflow check, which may skip the step) — a worker thread takes each bucket as
//     its copy lands and steps it on the host (optim::host_step, with the moments and step counts of
//     the optimizer object, so checkpoints and schedulers see one optimizer) while the GPU's backward
//     goes on. With bf16 or fp32 and no clipping that is the whole step, hidden behind backward except
//     for the last buckets.
//  3. finish(): every copy is waited for, and the optimizer's host tensors get the host gradient as
//     .grad, so mixed precision's unscale and overflow check and the clipping norm (parallel/
//     gradient_statistics.h, reduced over the data group as for any ZeRO shard) run as they always do,
//     on the host. Then the Engine (or MixedPrecisionOptimizer) calls the handler's host step instead of
//     optimizer.step(): the buckets not stepped yet, with clipping's factor (Optimizer::
//     release_grad_scale); a skipped fp16 step steps nothing.
//  4. The host step writes each updated parameter, converted to the model's dtype, into a pinned
//     staging buffer laid out as the bucket's chunk; after_update copies each chunk to the device and
//     all-gathers it, writing every rank's piece, this rank's included, into the parameters.
// The moments are plain host memory: they never cross PCIe, and page-locking tens of GB would only
// take memory from the OS. The masters, gradients and staging buffers cross it every step: pinned.
// A bucket stepped during backward uses the hyper-parameters its param group has then, which are the
// update's (the LR scheduler steps after the update); code that changes them between backward and
// the update (a before_update hook) must turn clipping on or step without offload.
// Stage 3 uses the same object with its chunks as the buckets and no all-gather: the update goes into
// the chunk's shard, directly where that lives on the host (Output::direct), else into a staging
// buffer the chunk manager lends (Output::staging with a buffer: the pinned buffer it keeps for the
// device shard's next eviction), so a chunk holds one pinned host buffer whichever way its update
// goes; Note [ZeRO-3 offload] in zero3.cpp. Only this object's own staging buffers count in
// pinned_bytes(); the lender counts what it lends.
// A buffer the step writes may still be read or written by the device: the asynchronous copy of the
// last update out of a staging buffer (copy_updated_chunk), and for a lent buffer whatever its owner
// copied into or out of it before handing it over (set_output; stage 3's shard moves). Both run on
// the compute stream before the next window's backward, and the step writes a bucket only after its
// gradient copy of that window landed (step 1: the copy stream waited for the compute stream first)
// or, without step-during-backward, after every gradient copy landed: that already orders the
// writes after those copies. But it is an argument about how the handlers call this object (a step
// without a backward in between would break it), so each bucket's output also carries an event
// recorded on the compute stream after its last such use, which the step waits for before writing
// (Copy::output_free: long passed in the common case, so it costs nothing). A buffer of this
// object's own is released only once the stream passed it too.

struct HostOffload::Copy {
  core::cuda::Event done;         // the gradient's copy to the host
  core::cuda::Event output_free;  // the compute stream passed the output buffer's last use
};

HostOffload::HostOffload(optim::Optimizer& optimizer, Device device, int64_t shard_numel, std::vector<Bucket> buckets,
                         bool step_during_backward)
    : optimizer_(optimizer),
      device_(device),
      buckets_(std::move(buckets)),
      step_during_backward_(step_during_backward) {
  COLOSSAL_CHECK(optim::host_step_supports(optimizer_),
                 "zero.offload_optimizer = true steps the optimizer on the host, which runs Adam, AdamW and LAMB; "
                 "the {} optimizer is none of them (set optimizer.name to \"adamw\", \"adam\" or \"lamb\", or "
                 "zero.offload_optimizer = false)",
                 optimizer_.name());
  master_ = host_empty(shard_numel, DType::f32);
  gradient_ = host_empty(shard_numel, DType::f32);
  staging_.resize(buckets_.size());
  items_.resize(buckets_.size());
  for (size_t b = 0; b < buckets_.size(); ++b) bind_items(b);
  stepped_.assign(buckets_.size(), false);
  if (device_.is_cuda()) {
    copy_stream_ = core::cuda::create_stream(device_);
    for (size_t b = 0; b < buckets_.size(); ++b) copies_.push_back(std::make_unique<Copy>());
  }
  if (step_during_backward_) worker_ = std::thread([this] { work(); });
}

HostOffload::~HostOffload() {
  if (worker_.joinable()) {
    {
      std::lock_guard lock(mutex_);
      stopping_ = true;
    }
    wake_.notify_all();
    worker_.join();
  }
  if (device_.is_cuda()) {
    core::cuda::synchronize(copy_stream_);
    copies_.clear();
    core::cuda::destroy_stream(copy_stream_);
  }
}

Tensor HostOffload::host_empty(int64_t numel, DType dtype) const {
  Tensor t = device_.is_cuda() ? core::cuda::pinned_empty({numel}, dtype) : core::empty({numel}, {dtype, core::kCpu});
  t.fill_(0.0);
  return t;
}

void HostOffload::bind_items(size_t b) {
  const Bucket& bucket = buckets_[b];
  Tensor out = bucket.output.buffer;
  if (out.defined()) {
    COLOSSAL_CHECK(
        !out.device().is_cuda() && out.is_contiguous() && out.numel() == bucket.chunk && out.dtype() == bucket.dtype,
        "ZeRO offload: bucket {}'s output is {} {} elements on {}, expected {} contiguous {} on the host", b,
        out.numel(), out.dtype(), out.device(), bucket.chunk, bucket.dtype);
    if (staging_[b].defined()) {  // a buffer of its own is no longer written: released once no copy reads it
      wait_output_free(b);
      staging_[b] = Tensor();
    }
  } else {
    COLOSSAL_CHECK(bucket.output.copied_to_device, "ZeRO offload: bucket {} is written directly but given no buffer",
                   b);
    if (!staging_[b].defined()) staging_[b] = host_empty(bucket.chunk, bucket.dtype);
    out = staging_[b];
  }
  std::vector<optim::HostStepItem> items;
  for (const Piece& piece : bucket.pieces) {
    const int64_t at = piece.numel == 0 ? 0 : piece.chunk_offset;
    items.push_back(optim::HostStepItem{piece.group, piece.index, gradient(piece.shard_offset, piece.numel),
                                        out.narrow(0, at, piece.numel)});
  }
  items_[b] = std::move(items);
}

void HostOffload::set_output(size_t b, Output output) {
  wait_idle();
  buckets_.at(b).output = std::move(output);
  bind_items(b);
  mark_output_used(b);  // after the owner's copies into or out of the buffer
}

Tensor HostOffload::output_buffer(size_t b) const {
  const Output& output = buckets_.at(b).output;
  return output.buffer.defined() ? output.buffer : staging_[b];
}

void HostOffload::mark_output_used(size_t b) {
  if (device_.is_cuda()) copies_[b]->output_free.record(core::cuda::current_stream(device_));
}

void HostOffload::wait_output_free(size_t b) {
  if (device_.is_cuda()) copies_[b]->output_free.synchronize();  // returns at once for an event never recorded
}

Tensor HostOffload::master(int64_t offset, int64_t numel) const {
  return master_.narrow(0, numel == 0 ? 0 : offset, numel);
}

Tensor HostOffload::gradient(int64_t offset, int64_t numel) const {
  return gradient_.narrow(0, numel == 0 ? 0 : offset, numel);
}

void HostOffload::gradient_ready(size_t b, const Tensor& chunk) {
  const Bucket& bucket = buckets_[b];
  COLOSSAL_CHECK(chunk.numel() == bucket.chunk && chunk.dtype() == DType::f32,
                 "ZeRO offload: bucket {}'s gradient chunk has {} {} elements, expected {} f32", b, chunk.numel(),
                 chunk.dtype(), bucket.chunk);
  const Tensor host = gradient(bucket.shard_offset, bucket.chunk);
  if (device_.is_cuda()) {
    core::cuda::Event reduced;
    reduced.record(core::cuda::current_stream(device_));
    reduced.block(copy_stream_);
    core::cuda::copy_async(host, chunk, copy_stream_);
    copies_[b]->done.record(copy_stream_);
  } else {
    host.copy_(chunk);
  }
  if (!step_during_backward_) return;
  {
    std::lock_guard lock(mutex_);
    queue_.push_back(b);
  }
  wake_.notify_one();
}

void HostOffload::wait_copy(size_t b) {
  if (device_.is_cuda()) copies_[b]->done.synchronize();  // returns at once for an event never recorded
}

void HostOffload::wait_for_gradients() {
  for (size_t b = 0; b < buckets_.size(); ++b) wait_copy(b);
}

void HostOffload::step_bucket(size_t b, double grad_scale) {
  wait_copy(b);
  wait_output_free(b);
  optim::host_step(optimizer_, items_[b], grad_scale);
}

void HostOffload::work() {
  while (true) {
    size_t b = 0;
    {
      std::unique_lock lock(mutex_);
      wake_.wait(lock, [&] { return stopping_ || !queue_.empty(); });
      if (queue_.empty()) return;  // stopping, nothing left
      b = queue_.front();
      queue_.pop_front();
      busy_ = true;
    }
    std::exception_ptr failure;
    try {
      step_bucket(b, 1.0);
    } catch (...) {
      failure = std::current_exception();
    }
    {
      std::lock_guard lock(mutex_);
      stepped_[b] = true;
      if (failure && !failure_) failure_ = failure;
      busy_ = false;
    }
    idle_.notify_all();
  }
}

void HostOffload::wait_idle() {
  std::unique_lock lock(mutex_);
  idle_.wait(lock, [&] { return queue_.empty() && !busy_; });
}

void HostOffload::step(double grad_scale) {
  if (!step_during_backward_) {
    wait_for_gradients();
    for (size_t b = 0; b < buckets_.size(); ++b) wait_output_free(b);
    std::vector<optim::HostStepItem> all;
    for (const auto& items : items_) all.insert(all.end(), items.begin(), items.end());
    optim::host_step(optimizer_, all, grad_scale);  // one pass over every bucket: all threads busy
    return;
  }
  COLOSSAL_CHECK(grad_scale == 1.0,
                 "ZeRO offload: the buckets were stepped during backward, but the step was given a gradient scale "
                 "of {} (clipping or loss scaling must turn stepping during backward off)",
                 grad_scale);
  wait_idle();
  // Buckets whose gradient never came over (no element on any rank) still count a step.
  std::exception_ptr failure;
  {
    std::lock_guard lock(mutex_);
    for (size_t b = 0; b < buckets_.size(); ++b) {
      if (!stepped_[b]) queue_.push_back(b);
    }
  }
  wake_.notify_one();
  wait_idle();
  {
    std::lock_guard lock(mutex_);
    failure = std::exchange(failure_, nullptr);
  }
  if (failure) std::rethrow_exception(failure);
}

void HostOffload::step_with_optimizer_scale() {
  const Tensor scale = optimizer_.release_grad_scale();  // clipping's factor, when clipping
  step(scale.defined() ? scale.to(core::kCpu).item<double>() : 1.0);
}

Tensor HostOffload::updated_chunk(size_t b) {
  if (!device_.is_cuda()) {
    COLOSSAL_CHECK(buckets_[b].output.copied_to_device,
                   "ZeRO offload: bucket {} writes its update into the parameters' own memory", b);
    return output_buffer(b);
  }
  Tensor chunk = core::empty({buckets_[b].chunk}, {buckets_[b].dtype, device_});
  copy_updated_chunk(b, chunk);
  return chunk;
}

void HostOffload::copy_updated_chunk(size_t b, const Tensor& dst) {
  const Tensor staging = output_buffer(b);
  COLOSSAL_CHECK(buckets_[b].output.copied_to_device && staging.defined(),
                 "ZeRO offload: bucket {} writes its update into the parameters' own memory, not a staging buffer", b);
  if (dst.device().is_cuda()) {
    core::cuda::copy_async(dst, staging, core::cuda::current_stream(dst.device()));
    mark_output_used(b);  // the next step writes the buffer only after this copy read it
  } else {
    dst.copy_(staging);
  }
}

void HostOffload::end_window() {
  if (step_during_backward_) wait_idle();
  std::lock_guard lock(mutex_);
  stepped_.assign(buckets_.size(), false);
  failure_ = nullptr;
}

int64_t HostOffload::buffer_bytes() const {
  int64_t bytes = static_cast<int64_t>(master_.nbytes() + gradient_.nbytes());
  for (const Tensor& staging : staging_) {
    if (staging.defined()) bytes += static_cast<int64_t>(staging.nbytes());
  }
  return bytes;
}

int64_t HostOffload::pinned_bytes() const {
  return device_.is_cuda() ? buffer_bytes() : 0;
}

int64_t HostOffload::host_bytes() const {
  int64_t bytes = buffer_bytes();
  for (size_t g = 0; g < optimizer_.param_groups().size(); ++g) {  // the moments
    for (size_t i = 0; i < optimizer_.param_groups()[g].params.size(); ++i) {
      if (const optim::ParamState* state = optimizer_.find_state(g, i)) {
        for (const auto& [name, buffer] : state->buffers) bytes += static_cast<int64_t>(buffer.nbytes());
      }
    }
  }
  return bytes;
}

}  // namespace colossal::parallel::zero
