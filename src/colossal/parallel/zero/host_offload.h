// HostOffload: the host side of ZeRO's optimizer offload (zero.offload_optimizer) for LowLevelZero
// (stages 1 and 2, buckets) and Zero3 (stage 3, chunks): this rank's fp32 master shard and the
// gradient shard in pinned host memory, the optimizer's moments in host memory, the host optimizer
// step (optim/host_optimizer.h) per bucket, and where the updated parameters in the model's dtype go:
// staging buffers copied to the device, or a host tensor of the caller's (stage 3's host shards).
// Gradients come over per bucket as soon as their reduce-scatter is done, on a copy stream; where no
// statistic of all gradients must come first the buckets are stepped by a worker thread while backward
// goes on. See Note [Optimizer offload] in host_offload.cpp.
#pragma once

#include <condition_variable>
#include <cstdint>
#include <deque>
#include <exception>
#include <memory>
#include <mutex>
#include <thread>
#include <vector>

#include "colossal/core/device.h"
#include "colossal/core/tensor.h"
#include "colossal/optim/host_optimizer.h"
#include "colossal/optim/optimizer.h"

namespace colossal::parallel::zero {

class HostOffload {
 public:
  /// One parameter's piece in a bucket: the optimizer's parameter (group, index), where its piece
  /// sits in this rank's shard and in its bucket's chunk, and how many elements it has (0 where this
  /// rank owns none of it: it is still stepped, so its step count and state keys match every rank's).
  struct Piece {
    size_t group = 0, index = 0;
    int64_t shard_offset = 0, chunk_offset = 0, numel = 0;
  };
  /// A bucket: where its chunk starts in the shard, its size, the model's dtype and its pieces.
  struct Bucket {
    int64_t shard_offset = 0, chunk = 0;
    DType dtype = DType::f32;
    std::vector<Piece> pieces;
    /// Where the host step writes the bucket's updated parameters (the chunk's layout, the model's
    /// dtype, contiguous on the host): undefined for a staging buffer of its own (updated_chunk).
    Tensor out;
  };

  /// Host buffers for a shard of `shard_numel` f32 elements cut into `buckets`, for `optimizer`
  /// (Adam, AdamW or LAMB: optim::host_step_supports), whose gradients arrive from `device` (pinned
  /// host memory where it is a GPU). With `step_during_backward` a worker thread steps each bucket as
  /// soon as its gradient is on the host. Throws naming zero.offload_optimizer and the optimizer when
  /// it cannot be stepped on the host.
  HostOffload(optim::Optimizer& optimizer, Device device, int64_t shard_numel, std::vector<Bucket> buckets,
              bool step_during_backward);
  ~HostOffload();
  HostOffload(const HostOffload&) = delete;
  HostOffload& operator=(const HostOffload&) = delete;

  /// The host f32 masters: elements [offset, offset + numel) of the shard (the optimizer's parameters
  /// are these views).
  Tensor master(int64_t offset, int64_t numel) const;
  /// The host gradient shard's elements [offset, offset + numel) (complete after wait_for_gradients).
  Tensor gradient(int64_t offset, int64_t numel) const;
  /// Bucket b's reduced f32 gradient chunk (on the device) is final for this window: copies it to
  /// the host, and with step_during_backward hands the bucket to the worker. `chunk` must stay alive
  /// until wait_for_gradients.
  void gradient_ready(size_t b, const Tensor& chunk);
  /// Waits until every gradient handed over has reached the host.
  void wait_for_gradients();
  /// The window's optimizer step: the buckets not stepped yet, every gradient times `grad_scale`
  /// (which must be 1 when buckets were stepped during backward), then waits for the worker. Rethrows
  /// what the worker threw.
  void step(double grad_scale);
  /// step() with the gradient scale the optimizer was given (clipping's factor,
  /// Optimizer::release_grad_scale; 1 without one): the handlers' step_on_host.
  void step_with_optimizer_scale();
  /// Bucket b's updated parameters in the model's dtype, on the device, laid out as its chunk: the
  /// staging buffer copied over (on the current stream), or the buffer itself on the CPU.
  Tensor updated_chunk(size_t b) const;
  /// Copies bucket b's updated parameters (its staging buffer) into `dst` (the chunk's numel and
  /// dtype, on the device or the host), on the current stream.
  void copy_updated_chunk(size_t b, const Tensor& dst) const;
  /// Points bucket b's updated parameters at `out` (as Bucket::out; undefined: its staging buffer,
  /// made when first needed). Between windows only: waits for the worker.
  void set_output(size_t b, const Tensor& out);
  /// Forgets which buckets the window stepped (after the all-gather, or when the window is dropped,
  /// once the worker is idle).
  void end_window();
  /// Whether buckets are stepped during backward.
  bool steps_during_backward() const { return step_during_backward_; }
  /// Bytes of pinned host memory (masters, gradient shard and staging buffers; 0 off the GPU, where
  /// they are plain host memory).
  int64_t pinned_bytes() const;
  /// Bytes of host memory the masters, gradient shard, staging buffers and the optimizer's moments
  /// take, pinned or not.
  int64_t host_bytes() const;

 private:
  Tensor host_empty(int64_t numel, DType dtype) const;
  void bind_items(size_t b);
  int64_t buffer_bytes() const;  // masters, gradient shard and staging buffers
  void step_bucket(size_t b, double grad_scale);
  void wait_copy(size_t b);
  void work();
  void wait_idle();

  optim::Optimizer& optimizer_;
  Device device_;
  std::vector<Bucket> buckets_;
  bool step_during_backward_;
  Tensor master_, gradient_;     // f32, shard_numel: pinned on a GPU machine
  std::vector<Tensor> staging_;  // per bucket: the updated chunk in the model's dtype (undefined until needed)
  std::vector<std::vector<optim::HostStepItem>> items_;  // per bucket

  // The device-to-host copies (GPU only): their stream and one event per bucket, recorded after it.
  core::Stream copy_stream_{};
  struct Copy;
  std::vector<std::unique_ptr<Copy>> copies_;

  // The worker and its queue; stepped_ and failure_ are guarded by mutex_.
  std::mutex mutex_;
  std::condition_variable wake_, idle_;
  std::deque<size_t> queue_;
  bool busy_ = false, stopping_ = false;
  std::vector<bool> stepped_;
  std::exception_ptr failure_;
  std::thread worker_;
};

}  // namespace colossal::parallel::zero
