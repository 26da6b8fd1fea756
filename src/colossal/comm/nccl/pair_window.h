// PairWindow: one allocation on each GPU of a pair of ranks, mapped into the other rank's process
// (CUDA IPC), with counters each rank raises in the other's memory and waits on in its own. The
// copy-engine reductions of a GPU pair are built on it: data parallelism's bucket average
// (parallel/dp/copy_engine_pair.h, Note [Copy-engine all-reduce of a GPU pair]) and the NCCL group's
// all-reduce of large tensors between two GPUs (pair_all_reduce.h, Note [Pair all-reduce by the copy
// engines]). Built with NCCL (and so CUDA) only.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

#include "colossal/comm/process_group.h"
#include "colossal/core/device.h"  // Device, Stream

namespace colossal::comm {

class PairWindow {
 public:
  /// Whether `group` can have one: two ranks over NCCL whose GPUs can map each other's memory (one
  /// host). Collective over `group` (the ranks exchange their GPU's identity); `why_not` says what
  /// is missing.
  static bool available(ProcessGroup& group, std::string* why_not = nullptr);

  /// `data_bytes` of device memory on this rank's GPU and `counters` 8-byte counters after it, all
  /// zero, mapped into the other rank's process and the other's mapped here. Collective over `group`
  /// (two ranks, available()); throws on both ranks if either cannot map the other's.
  PairWindow(ProcessGroup& group, size_t data_bytes, size_t counters);
  /// Frees nothing: both allocations and both mappings stay until the process ends (Note [Pair window
  /// teardown] in pair_window.cpp says why).
  ~PairWindow();
  PairWindow(const PairWindow&) = delete;
  PairWindow& operator=(const PairWindow&) = delete;

  core::Device device() const { return device_; }
  size_t data_bytes() const { return data_bytes_; }
  /// This rank's data, and the other rank's as mapped here (writes through it cross NVLink).
  char* mine() const { return static_cast<char*>(base_); }
  char* other() const { return static_cast<char*>(peer_base_); }

  /// Queues on `stream`: once its earlier work is done and visible, the other rank's counter `c`
  /// becomes `value` (the driver's stream memory operation, no kernel).
  void signal(core::Stream stream, size_t c, uint64_t value) const;
  /// Queues on `stream` a hold (no SM) until this rank's counter `c` is at least `value`.
  void await(core::Stream stream, size_t c, uint64_t value) const;
  /// This rank's counter `c` (device memory the other rank writes).
  const void* counter(size_t c) const;

 private:
  core::Device device_;
  size_t data_bytes_ = 0;
  size_t counters_ = 0;
  size_t counters_offset_ = 0;
  void* base_ = nullptr;
  void* peer_base_ = nullptr;
};

}  // namespace colossal::comm
