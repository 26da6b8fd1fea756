// PairAllReduce: the all-reduce (sum) of a two-GPU NCCL group, moved by the copy engines through a
// PairWindow instead of by NCCL's kernels (Note [Pair all-reduce by the copy engines] in
// pair_all_reduce.cpp). NcclProcessGroup takes it for the tensors it accepts once
// use_pair_all_reduce (comm/pair_all_reduce.h) turned it on.
#pragma once

#include <cuda_runtime.h>

#include <array>
#include <cstdint>

#include "colossal/comm/nccl/pair_window.h"
#include "colossal/comm/process_group.h"

namespace colossal::comm {

class PairAllReduce {
 public:
  /// A window of `window_bytes` (two halves: what the other rank sends in each phase); tensors of
  /// at least `min_bytes` go through it, in pieces when larger than the window. Collective over
  /// `group` (two ranks, PairWindow::available).
  PairAllReduce(ProcessGroup& group, int64_t window_bytes, int64_t min_bytes);

  /// Whether it reduces `tensor` with `op`: a sum of a contiguous f32, bf16 or f16 tensor of at least
  /// min_bytes.
  bool takes(const Tensor& tensor, ReduceOp op) const;
  /// Queues on `stream` the sum of `tensor` over the pair, in place. Both ranks must call it in the
  /// same order with tensors of the same size, and `stream` must run the calls one after another
  /// (the window is reused without further flags: the Note says why that is safe).
  void enqueue(const Tensor& tensor, core::Stream stream);

 private:
  PairWindow window_;
  int rank_ = 0;
  int64_t half_bytes_ = 0;
  int64_t min_bytes_ = 0;
  uint64_t generation_ = 0;
  /// `bytes` from src to dst on `s`: the SMs' stores (by_kernel, where aligned) or a copy engine.
  void copy(void* dst, const void* src, int64_t bytes, cudaStream_t s, bool by_kernel) const;
  /// Who moves the data of the first copy (into the other's A), of the sums (into the other's B)
  /// and of the last copy (B into the tensor): the SMs' stores (true) or a copy engine. The sums by
  /// the adding kernel itself, the rest by copy engines: the fastest that leaves the SMs alone
  /// (COLOSSAL_PAIR_MODE to measure the others).
  std::array<bool, 3> by_kernel_{false, true, false};
  bool trace_ = false;  ///< COLOSSAL_TRACE_COMM: each piece's enqueueing on stderr
  int blocks_ = 128;    ///< the kernels' most blocks
};

}  // namespace colossal::comm
