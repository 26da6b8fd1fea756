// CopyEnginePair: data parallelism's bucket all-reduce between the two GPUs of a pair, moved by the
// copy engines over NVLink instead of by NCCL's kernels, so that backward's kernels keep every SM.
// See Note [Copy-engine all-reduce of a GPU pair] in copy_engine_pair.cpp. Built with CUDA only;
// DataParallel uses it where DataParallelOptions::pair_reduction (COLOSSAL_DP_COPY_ENGINE=1 or 2) asks,
// on a group of two GPUs of one host that can reach each other's memory.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "colossal/comm/process_group.h"
#include "colossal/core/tensor.h"

namespace colossal::parallel {

/// How data parallelism reduces its buckets: NCCL's all-reduce; or, between two GPUs of one host,
/// CopyEnginePair, the halves moved by the copy engines or averaged by a kernel reading the other
/// GPU's bucket (Note [Copy-engine all-reduce of a GPU pair]).
enum class PairReduction { nccl, copy_engines, direct_loads };

class CopyEnginePair {
 public:
  /// Whether `group` can use it: two ranks over NCCL on CUDA devices that can map each other's
  /// memory. Collective over `group` (the ranks exchange their device's identity).
  static bool available(comm::ProcessGroup& group, std::string* why_not = nullptr);

  /// Allocates one buffer per bucket (`numels[b]` elements of `dtypes[b]`), with copy_engines a
  /// receive buffer for the other rank's half of each, and the flags the ranks signal each other
  /// through, in one allocation whose IPC handle the ranks exchange. `mode`: copy_engines or
  /// direct_loads. Collective over `group`.
  CopyEnginePair(std::shared_ptr<comm::ProcessGroup> group, const std::vector<int64_t>& numels,
                 const std::vector<DType>& dtypes, PairReduction mode);
  /// Inline (Shared's deleter was captured where it was made), so a build without CUDA links too.
  ~CopyEnginePair() = default;
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
  std::vector<int64_t> flat_offsets_, recv_offsets_;  // bytes into the allocation (no receive buffers: direct)
  std::vector<uint64_t> steps_;                       // per bucket: reductions so far
  PairReduction mode_;
};

}  // namespace colossal::parallel
