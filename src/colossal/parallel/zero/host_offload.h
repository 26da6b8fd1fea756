// HostOffload: the host side of ZeRO's optimizer offload (zero.offload_optimizer) for LowLevelZero
// (stages 1 and 2, buckets) and Zero3 (stage 3, chunks): this rank's fp32 master shard and the
// gradient shard in pinned host memory, the optimizer's moments in host memory, the host optimizer
// step (optim/host_optimizer.h) per bucket, and where the updated parameters in the model's dtype go
// (Output): a staging buffer copied to the device after the step (its own, or one the caller lends:
// stage 3's pinned spare buffer of a device shard), or the parameters' own host memory (stage 3's
// host shards).
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
  /// Where the host step writes a bucket's updated parameters (the chunk's layout, the model's dtype,
  /// contiguous on the host), and whether they are copied to the device after the step.
  struct Output {
    /// A staging buffer, copied into the device's parameters after the step (copy_updated_chunk,
    /// updated_chunk): the caller's `buffer` (stage 3: the chunk manager's pinned spare buffer of a
    /// device shard), or, undefined, one of this object's own, made when first needed and counted in
    /// pinned_bytes().
    static Output staging(Tensor buffer = Tensor()) { return Output{std::move(buffer), true}; }
    /// The parameters' own memory on the host (stage 3: a host shard): written in place, nothing is
    /// copied after.
    static Output direct(Tensor buffer) { return Output{std::move(buffer), false}; }
    Tensor buffer;
    bool copied_to_device = true;
  };
  /// A bucket: where its chunk starts in the shard, its size, the model's dtype, its pieces and where
  /// its update goes (by default a staging buffer of this object's).
  struct Bucket {
    int64_t shard_offset = 0, chunk = 0;
    DType dtype = DType::f32;
    std::vector<Piece> pieces;
    Output output = Output::staging();
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
  Tensor updated_chunk(size_t b);
  /// Copies bucket b's updated parameters (its staging buffer) into `dst` (the chunk's numel and
  /// dtype, on the device or the host), on the current stream; the next step writes the staging
  /// buffer only once that stream passed the copy.
  void copy_updated_chunk(size_t b, const Tensor& dst);
  /// Where bucket b's updates go from the next step on (a buffer of its own is released once no
  /// longer used). Between windows only: waits for the worker. The step writes the new buffer only
  /// once the device's current stream passed this call, so copies the caller issued on it into or out
  /// of the buffer before (stage 3's shard moves) land first. See Note [Optimizer offload].
  void set_output(size_t b, Output output);
  /// The buffer the host step writes bucket b's update into (this object's own staging buffer:
  /// undefined until made), and whether that is copied to the device after the step.
  Tensor output_buffer(size_t b) const;
  bool output_copied_to_device(size_t b) const { return buckets_.at(b).output.copied_to_device; }
  /// Forgets which buckets the window stepped (after the all-gather, or when the window is dropped,
  /// once the worker is idle).
  void end_window();
  /// Whether buckets are stepped during backward.
  bool steps_during_backward() const { return step_during_backward_; }
  /// Bytes of pinned host memory this object owns (masters, gradient shard and its own staging
  /// buffers, not the buffers an Output lends it; 0 off the GPU, where they are plain host memory).
  int64_t pinned_bytes() const;
  /// Bytes of host memory the masters, gradient shard, own staging buffers and the optimizer's
  /// moments take, pinned or not.
  int64_t host_bytes() const;

 private:
  Tensor host_empty(int64_t numel, DType dtype) const;
  void bind_items(size_t b);
  int64_t buffer_bytes() const;  // masters, gradient shard and own staging buffers
  void step_bucket(size_t b, double grad_scale);
  void wait_copy(size_t b);
  void wait_output_free(size_t b);
  void mark_output_used(size_t b);
  void work();
  void wait_idle();

  optim::Optimizer& optimizer_;
  Device device_;
  std::vector<Bucket> buckets_;
  bool step_during_backward_;
  Tensor master_, gradient_;     // f32, shard_numel: pinned on a GPU machine
  std::vector<Tensor> staging_;  // per bucket: its own staging buffer (undefined until needed or when lent one)
  std::vector<std::vector<optim::HostStepItem>> items_;  // per bucket

  // GPU only: the device-to-host copies' stream, and per bucket an event recorded after its gradient's
  // copy and one recorded on the compute stream after the last use of its output (Copy).
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
