// PairP2P: the sends and receives of a two-GPU NCCL group moved by the copy engines through a
// PairWindow instead of by NCCL's kernels (Note [Pair sends and receives by the copy engines] in
// pair_p2p.cpp). NcclProcessGroup::batch_send_recv takes it once use_pair_p2p (comm/pair_all_reduce.h)
// turned it on; a pipeline of two stages does (parallel.pipeline_p2p).
#pragma once

#include <cstdint>
#include <deque>
#include <functional>
#include <string>
#include <vector>

#include "colossal/comm/nccl/pair_window.h"
#include "colossal/comm/process_group.h"
#include "colossal/core/device.h"

namespace colossal::comm {

class PairP2P {
 public:
  /// `slots` slots of `slot_bytes` on each GPU, where the other rank's messages land. Collective over
  /// `group` (two ranks, PairWindow::available); both ranks pass the same numbers.
  PairP2P(ProcessGroup& group, int64_t slot_bytes, int64_t slots);
  /// Releases the held tensors and the two streams; waits for nothing (drain() does).
  ~PairP2P();
  PairP2P(const PairP2P&) = delete;
  PairP2P& operator=(const PairP2P&) = delete;

  /// Queues on the send stream, after the work queued on `caller` so far, the copy of each tensor
  /// into the other rank's slots, in order. The i-th message sent meets the other rank's i-th
  /// receive, which must be of the same number of bytes.
  void enqueue_sends(const std::vector<Tensor>& tensors, core::Stream caller);
  /// Queues on the receive stream, after the work queued on `caller` so far, the copy of the next
  /// messages into `tensors`, in order. A message of another size than its tensor's is reported at
  /// the host's next synchronisation (Note [Deferred device checks]), naming both sizes.
  void enqueue_receives(const std::vector<Tensor>& tensors, core::Stream caller);
  core::Stream send_stream() const { return send_stream_; }
  core::Stream receive_stream() const { return receive_stream_; }
  /// Keeps `tensors` alive until `done()` is true: sent tensors whose copies are still queued, which
  /// no stream of the caller waits for. Checked at every later hold and released at teardown.
  void hold(std::vector<Tensor> tensors, std::function<bool()> done);
  /// Waits for every copy queued (not after an abort: a receive may wait for a peer that is gone).
  void drain();

 private:
  PairWindow window_;
  int rank_ = 0;
  int64_t slot_bytes_ = 0;
  int64_t slots_ = 0;
  uint64_t sent_ = 0;      ///< pieces sent so far (the last one's number)
  uint64_t received_ = 0;  ///< pieces received so far
  std::string group_;      ///< the group, for messages
  core::Stream send_stream_;
  core::Stream receive_stream_;
  struct Held {
    std::vector<Tensor> tensors;
    std::function<bool()> done;
  };
  std::deque<Held> held_;
  /// The other rank's message of the slot `slot`'s first piece: its size in bytes.
  const void* size_slot(int64_t slot) const;
  /// A message's piece: its number (from 1, each way), its slot, where it starts in the message and
  /// its length, and the message's size.
  struct Piece {
    uint64_t n;
    int64_t slot;
    int64_t offset;
    int64_t len;
    int64_t bytes;
  };
  /// After the work queued on `caller`, `stream` visits each piece of each of `tensors` in order,
  /// `pieces` counting them.
  template <class Visit>
  void for_each_piece(const std::vector<Tensor>& tensors, core::Stream caller, core::Stream stream, uint64_t& pieces,
                      Visit&& visit);
};

}  // namespace colossal::comm
