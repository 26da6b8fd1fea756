// CopyEnginePair: data parallelism's bucket all-reduce between the two GPUs of a pair, moved by the
// copy engines over NVLink instead of by NCCL's kernels, so that backward's kernels keep every SM.
// See Note [Copy-engine all-reduce of a GPU pair] in copy_engine_pair.cpp. Built with CUDA only;
// DataParallel uses it where COLOSSAL_DP_COPY_ENGINE=1 and the group is two GPUs of one host that can
// reach each other's memory.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "colossal/comm/process_group.h"
#include "colossal/core/tensor.h"

namespace colossal::parallel {

class CopyEnginePair {
 public:
  /// Whether `group` can use it: two ranks over NCCL on CUDA devices that can map each other's
  /// memory. Collective over `group` (the ranks exchange their device's identity).
  static bool available(comm::ProcessGroup& group, std::string* why_not = nullptr);

  /// copies: the halves move by cudaMemcpyAsync (the copy engines) and the SMs only add; direct:
  /// one kernel per bucket averages this rank's half, reading and writing the other's over NVLink.
  enum class Mode { copies, direct };

  /// Allocates one buffer per bucket (`numels[b]` elements of `dtypes[b]`), a receive buffer for
  /// the other rank's half of each, and the flags the ranks signal each other through, in one
  /// allocation whose IPC handle the ranks exchange. Collective over `group`.
  CopyEnginePair(std::shared_ptr<comm::ProcessGroup> group, const std::vector<int64_t>& numels,
                 const std::vector<DType>& dtypes, Mode mode = Mode::copies);
  ~CopyEnginePair();
  CopyEnginePair(const CopyEnginePair&) = delete;
  CopyEnginePair& operator=(const CopyEnginePair&) = delete;

  /// Bucket b's buffer (the gradients become views of it).
  const Tensor& flat(size_t b) const { return flats_.at(b); }

  /// Packs `parts` into flat(b) at `offsets` (comm::pack_parts) and averages it with the other
  /// rank's, on this pair's stream after the caller's stream's work so far. The returned Work's
  /// wait() makes the caller's stream wait for the average; the parts are held until then.
  comm::Work all_reduce_avg(size_t b, std::vector<Tensor> parts, const std::vector<int64_t>& offsets);

  /// The allocation, the other rank's mapping of it and the pair's stream, shared with the Works
  /// in flight (copy_engine_pair.cpp).
  struct Shared;

 private:
  std::shared_ptr<comm::ProcessGroup> group_;
  std::shared_ptr<Shared> shared_;
  std::vector<Tensor> flats_;
  std::vector<Tensor> recvs_;
  std::vector<int64_t> flat_offsets_, recv_offsets_;  // bytes into the allocation
  std::vector<uint64_t> steps_;
  Mode mode_ = Mode::copies;  // per bucket: reductions so far
};

}  // namespace colossal::parallel
