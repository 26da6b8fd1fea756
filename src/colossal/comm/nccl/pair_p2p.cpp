// PairP2P: see pair_p2p.h.
#include "colossal/comm/nccl/pair_p2p.h"

#include <cuda_runtime.h>
#include <fmt/format.h>

#include <algorithm>
#include <utility>

#include "colossal/core/cuda/cuda_check.h"
#include "colossal/core/cuda_device.h"  // DeviceGuard, Event, create_stream, defer_check
#include "colossal/core/error.h"
#include "colossal/core/tensor.h"

namespace colossal::comm {

// Note [Pair sends and receives by the copy engines]
// NCCL's point-to-point calls between two GPUs cost a pipeline twice. A send cannot complete before
// its receive is posted, and the two are grouped (Note [Pipeline exchanges]), so each exchange waits
// until both stages have finished the op before it: every exchange sits on the critical path. And a
// receive posted early holds SMs while it waits: a forward beside a pending NCCL receive took 1.56 ms
// instead of 1.05 on an H100 (docs/benchmarks.md, session 24). Between two GPUs of one host the copy
// engines can carry the messages instead, through a PairWindow on each GPU of `slots` slots of
// `slot_bytes`, where the other rank's messages land. A message goes in pieces of at most a slot; the
// n-th piece each way (n = 1, 2, ...) uses slot (n - 1) mod slots. Three counters in each window,
// written by the other rank with the driver's stream memory operations (no kernel, no SM):
//   arrived  the pieces the other rank has put into this rank's slots;
//   freed    the pieces of this rank's that the other rank has taken out of its slots;
//   size[k]  the bytes of the message whose first piece is in slot k.
// The sender, on a send stream of its own, after the caller's work so far: waits for freed >= n -
// slots (the slot's last piece was taken), writes the message's size with its first piece, copies the
// piece into the other's slot by a copy engine over NVLink, and raises the other's arrived to n. The
// receiver, on a receive stream of its own, after the caller's work so far (its buffer may be memory
// just freed there): waits for arrived >= n, copies the slot into its tensor, raises the other's freed
// to n. So a send completes when its copy does, whether or not the receive is posted yet, and a
// receive posted early holds a stream, not an SM.
// Order: as NCCL's, the i-th message one way meets the other rank's i-th receive, and both must have
// the same size; a receive whose message was of another size is reported at the host's next
// synchronisation (the size counter read by a deferred check, Note [Deferred device checks]).
// No cycle of waits comes from the slots: a sender waiting for slot n - slots waits for the receiver to
// take an earlier piece of the same direction, which the sender has already put there, and a
// receiver's stream waits only for its caller's work queued before the receive and for pieces
// already ahead of it in the sender's order. A caller waits for the receive stream where it takes a
// receive (Work::wait) and for the send stream only where it waits for a batch of sends alone; the
// tensors of sends batched with receives are held until their copies are done (hold), so taking a
// receive never waits for this rank's own sends.
// Both streams' work is handed to the watchdog as NCCL's calls are: a rank whose peer never sends or
// never takes holds a stream until the group's timeout ends it, with the message naming the rank, the
// operation and the group. The window is never freed (Note [Pair window teardown]).

namespace {

enum Counter : size_t { kArrived = 0, kFreed = 1, kSizes = 2 };

/// A slot's bytes: a multiple of 256, so that every piece's copy is aligned.
int64_t checked_slot_bytes(int64_t slot_bytes, int64_t slots) {
  COLOSSAL_CHECK(slot_bytes >= 256 && slots >= 1,
                 "PairP2P: {} slots of {} bytes; it needs at least one slot of at least 256 bytes", slots, slot_bytes);
  return (slot_bytes + 255) / 256 * 256;
}

}  // namespace

PairP2P::PairP2P(ProcessGroup& group, int64_t slot_bytes, int64_t slots)
    : window_(group, static_cast<size_t>(checked_slot_bytes(slot_bytes, slots) * slots),
              kSizes + static_cast<size_t>(slots)),
      rank_(group.rank()),
      slot_bytes_(checked_slot_bytes(slot_bytes, slots)),
      slots_(slots),
      group_(group.describe()) {
  send_stream_ = core::cuda::create_stream(window_.device(), core::cuda::StreamPriority::high);
  receive_stream_ = core::cuda::create_stream(window_.device(), core::cuda::StreamPriority::high);
}

PairP2P::~PairP2P() {
  try {
    held_.clear();
    core::cuda::destroy_stream(send_stream_);
    core::cuda::destroy_stream(receive_stream_);
  } catch (...) {
    // Nothing useful to do about a failing teardown in a destructor.
  }
}

void PairP2P::drain() {
  core::cuda::synchronize(send_stream_);
  core::cuda::synchronize(receive_stream_);
  held_.clear();
}

const void* PairP2P::size_slot(int64_t slot) const {
  return window_.counter(kSizes + static_cast<size_t>(slot));
}

template <class Visit>
void PairP2P::for_each_piece(const std::vector<Tensor>& tensors, core::Stream caller, core::Stream stream,
                             uint64_t& pieces, Visit&& visit) {
  core::cuda::DeviceGuard guard(window_.device());
  core::cuda::Event ready;
  ready.record(caller);
  ready.block(stream);
  for (const Tensor& tensor : tensors) {
    const auto bytes = static_cast<int64_t>(tensor.nbytes());
    int64_t offset = 0;
    do {  // an empty message is one piece of no bytes
      const int64_t len = std::min(slot_bytes_, bytes - offset);
      const uint64_t n = ++pieces;
      const auto slot = static_cast<int64_t>((n - 1) % static_cast<uint64_t>(slots_));
      visit(tensor, Piece{n, slot, offset, len, bytes});
      offset += len;
    } while (offset < bytes);
  }
}

void PairP2P::enqueue_sends(const std::vector<Tensor>& tensors, core::Stream caller) {
  const auto s = static_cast<cudaStream_t>(send_stream_.handle);
  const auto slots = static_cast<uint64_t>(slots_);
  for_each_piece(tensors, caller, send_stream_, sent_, [&](const Tensor& tensor, const Piece& p) {
    if (p.n > slots) window_.await(send_stream_, kFreed, p.n - slots);
    if (p.offset == 0)
      window_.signal(send_stream_, kSizes + static_cast<size_t>(p.slot), static_cast<uint64_t>(p.bytes));
    if (p.len > 0) {
      COLOSSAL_CUDA_CHECK(cudaMemcpyAsync(window_.other() + p.slot * slot_bytes_,
                                          static_cast<const char*>(tensor.raw_data()) + p.offset,
                                          static_cast<size_t>(p.len), cudaMemcpyDeviceToDevice, s));
    }
    window_.signal(send_stream_, kArrived, p.n);
  });
}

void PairP2P::enqueue_receives(const std::vector<Tensor>& tensors, core::Stream caller) {
  const auto s = static_cast<cudaStream_t>(receive_stream_.handle);
  for_each_piece(tensors, caller, receive_stream_, received_, [&](const Tensor& tensor, const Piece& p) {
    window_.await(receive_stream_, kArrived, p.n);
    if (p.offset == 0) {
      core::cuda::defer_check(
          receive_stream_, size_slot(p.slot), static_cast<uint64_t>(p.bytes), nullptr,
          [rank = rank_, group = group_, shape = tensor.shape(), dtype = tensor.dtype(),
           bytes = p.bytes](uint64_t sent) {
            return fmt::format(
                "receive by the copy engines: rank {} posted a receive of {} bytes (a {} tensor of shape {}) but "
                "rank {}'s message in its place is {} bytes; the two ranks' sends and receives are out of step "
                "[{}]",
                rank, bytes, dtype, shape, 1 - rank, sent, group);
          });
    }
    if (p.len > 0) {
      COLOSSAL_CUDA_CHECK(cudaMemcpyAsync(static_cast<char*>(tensor.raw_data()) + p.offset,
                                          window_.mine() + p.slot * slot_bytes_, static_cast<size_t>(p.len),
                                          cudaMemcpyDeviceToDevice, s));
    }
    window_.signal(receive_stream_, kFreed, p.n);
  });
}

void PairP2P::hold(std::vector<Tensor> tensors, std::function<bool()> done) {
  // The send stream runs its copies in order: the oldest hold is released first.
  while (!held_.empty() && held_.front().done()) held_.pop_front();
  held_.push_back({std::move(tensors), std::move(done)});
}

}  // namespace colossal::comm
