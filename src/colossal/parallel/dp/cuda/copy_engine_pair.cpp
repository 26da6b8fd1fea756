// CopyEnginePair: see copy_engine_pair.h.
#include "colossal/parallel/dp/copy_engine_pair.h"

#include <cuda.h>  // the driver's stream memory operations' types (the functions come through the runtime)
#include <cuda_runtime.h>
#include <fmt/format.h>

#include <chrono>
#include <cstring>
#include <thread>
#include <utility>

#include "colossal/comm/watchdog.h"  // WatchedOperation, watch, check_deadline
#include "colossal/core/cuda/cuda_check.h"
#include "colossal/core/cuda_device.h"
#include "colossal/core/error.h"
#include "colossal/core/profiler.h"
#include "colossal/parallel/dp/cuda/pair_average.h"

namespace colossal::parallel {

// Note [Copy-engine all-reduce of a GPU pair]
// NCCL's all-reduce moves data with kernels: on 2 H100s its 24 CTAs hold 18% of the SMs for as long
// as it runs, and the GEMMs beside it ran 33-49% slower (bench/nccl_overlap_bench, session 17); in
// data-parallel training that is backward's kernels losing 0.24-0.68 ms a step beside the buckets'
// reductions (session 16's traces). Between two GPUs the copy engines can move the halves instead,
// over NVLink, while the SMs only add: each rank's buffers (every bucket, a receive buffer for the
// other rank's half of each, and a few flags) are one cudaMalloc allocation whose IPC handle the two
// ranks exchange at set-up, so each writes straight into the other's memory. For bucket b, rank r
// owns half r of its elements; at its s-th reduction each rank, on this pair's stream:
//   1. waits until the other has used the receive buffer it last wrote there (flag free[b] >= s-1);
//   2. copies its own values of the other's half into the other's receive buffer (copy engine);
//   3. sets the other's flag arrived[b] = s, and waits for its own arrived[b] >= s;
//   4. adds the received values into its half and halves them (the average; one short kernel pass);
//   5. sets the other's free[b] = s: the receive buffer may be written again;
//   6. copies its averaged half into the same half of the other's bucket (copy engine), overwriting
//      values the other has already sent in (2), which (3) proved;
//   7. sets the other's done[b] = s and waits for its own done[b] >= s: its bucket is whole.
// Direct mode (COLOSSAL_DP_COPY_ENGINE=2) moves nothing by copy: once both ranks have packed bucket b
// (each sets the other's flag arrived[b] = s), each runs the averaging kernel on its half reading its
// own and the other's bucket and writing the average into both over NVLink (64 blocks: a few SMs for
// the time NVLink takes), then sets the other's done[b] = s and waits for its own.
// Steps 1-3 (and the packing before them) run on one stream of the pair and 4-7 on another, so that
// the next bucket's values go out while this one's average waits for the other rank; step 4 waits
// for this bucket's packing by an event. The flags are the driver's stream memory operations
// (cuStreamWriteValue64 after the stream's earlier work, with a memory barrier; cuStreamWaitValue64
// holding the stream, not an SM, until the value arrives), so no kernel spins. Both ranks reduce the
// buckets in the same order; a rank whose peer never signals holds its stream, and the watchdog ends
// it at the group's timeout, as it would a hung NCCL call. The average is the same as NCCL's:
// (a + b) rounded to the dtype, then halved exactly.
// Measured on 2 H100s with GPT-2 124M (session 17, docs/benchmarks.md): both modes are slower than
// NCCL (33.4-33.8 against 33.0-33.1 ms a step). Backward's kernels no longer lose anything beside the
// reductions, but the update waits about 1 ms for the last buckets (the tied wte's 77 MB), against
// 0.1-0.4 ms with NCCL; so the switch stays off.

namespace {

constexpr size_t kAlign = 512;
size_t align_up(size_t n) {
  return (n + kAlign - 1) / kAlign * kAlign;
}
constexpr int kFlagKinds = 3;
enum Flag { kFree = 0, kArrived = 1, kDone = 2 };

cudaStream_t as_cuda(core::Stream s) {
  return static_cast<cudaStream_t>(s.handle);
}

/// A device's identity for the pair: its PCI bus id, and the IPC handle of its allocation.
struct Identity {
  char bus_id[32] = {};
  cudaIpcMemHandle_t handle{};
};

/// Exchanges `mine` with the other rank of `group` (through an all_gather on the group's device).
Identity exchange(comm::ProcessGroup& group, const Identity& mine) {
  Tensor local = core::empty({static_cast<int64_t>(sizeof(Identity))}, TensorOptions(DType::u8, core::kCpu));
  std::memcpy(local.raw_data(), &mine, sizeof(Identity));
  Tensor sent = local.to(group.device());
  Tensor all = core::empty({static_cast<int64_t>(2 * sizeof(Identity))}, TensorOptions(DType::u8, group.device()));
  group.all_gather(all, sent);
  const Tensor host = all.to(core::kCpu);
  Identity other;
  std::memcpy(&other, static_cast<const char*>(host.raw_data()) + (1 - group.rank()) * sizeof(Identity),
              sizeof(Identity));
  return other;
}

}  // namespace

struct CopyEnginePair::Shared {
  core::Device device;
  core::Stream stream;        // sends: packing, the copy of the other's half, its arrival flag
  core::Stream receive;       // the rest: the average, the copy back, the wait for the other's half
  void* base = nullptr;       // this rank's allocation
  void* peer_base = nullptr;  // the other rank's, mapped here
  size_t flags_offset = 0;

  ~Shared() {
    core::cuda::DeviceGuard guard(device);
    if (stream.handle != nullptr) cudaStreamSynchronize(as_cuda(stream));
    if (receive.handle != nullptr) cudaStreamSynchronize(as_cuda(receive));
    if (peer_base != nullptr) cudaIpcCloseMemHandle(peer_base);
    if (base != nullptr) cudaFree(base);
    if (stream.handle != nullptr) core::cuda::destroy_stream(stream);
    if (receive.handle != nullptr) core::cuda::destroy_stream(receive);
  }
  CUdeviceptr flag(bool peer, Flag kind, size_t b) const {
    const char* at = static_cast<const char*>(peer ? peer_base : base) + flags_offset;
    return reinterpret_cast<CUdeviceptr>(at + (b * kFlagKinds + kind) * sizeof(uint64_t));
  }
  /// Sets the other rank's flag `kind` of bucket b to `value` after `on`'s earlier work (fenced).
  void signal(core::Stream on, Flag kind, size_t b, uint64_t value) const {
    core::cuda::write_value(on, reinterpret_cast<void*>(flag(true, kind, b)), value);
  }
  /// Holds `on` until this rank's flag `kind` of bucket b reaches `value`.
  void await(core::Stream on, Flag kind, size_t b, uint64_t value) const {
    core::cuda::wait_value(on, reinterpret_cast<const void*>(flag(false, kind, b)), value);
  }
};

namespace {

/// One reduction as the watchdog sees it: done once its event has completed.
class PairOperation final : public comm::WatchedOperation {
 public:
  PairOperation(const comm::ProcessGroup& group, std::string what, core::Device device)
      : WatchedOperation(group, std::move(what)), device_(device) {}
  core::cuda::Event& done() { return done_; }
  bool poll() noexcept override {
    if (cudaSetDevice(device_.index) != cudaSuccess) return true;
    try {
      return done_.query();
    } catch (...) {
      return true;
    }
  }

 private:
  core::Device device_;
  core::cuda::Event done_;
};

class PairWork final : public comm::Work::Impl {
 public:
  PairWork(std::shared_ptr<PairOperation> operation, std::shared_ptr<CopyEnginePair::Shared> shared,
           core::Stream caller, std::vector<Tensor> parts)
      : operation_(std::move(operation)), shared_(std::move(shared)), caller_(caller), parts_(std::move(parts)) {}
  ~PairWork() override {
    if (parts_.empty()) return;
    try {
      core::cuda::DeviceGuard guard(shared_->device);
      operation_->done().block(caller_);  // the parts' frees wait for the packing
    } catch (...) {
    }
  }
  void wait() override {
    core::cuda::DeviceGuard guard(shared_->device);
    const core::Stream current = core::cuda::current_stream(shared_->device);
    operation_->done().block(current);
    if (current != caller_) operation_->done().block(caller_);
    parts_.clear();
  }
  void synchronize() override {
    core::cuda::DeviceGuard guard(shared_->device);
    while (!operation_->done().query()) {
      comm::check_deadline(*operation_);
      std::this_thread::sleep_for(std::chrono::microseconds(50));
    }
    parts_.clear();
  }
  bool is_completed() override {
    core::cuda::DeviceGuard guard(shared_->device);
    if (!operation_->done().query()) return false;
    parts_.clear();
    return true;
  }

 private:
  std::shared_ptr<PairOperation> operation_;
  std::shared_ptr<CopyEnginePair::Shared> shared_;
  core::Stream caller_;
  std::vector<Tensor> parts_;
};

}  // namespace

bool CopyEnginePair::available(comm::ProcessGroup& group, std::string* why_not) {
  auto no = [&](std::string why) {
    if (why_not != nullptr) *why_not = std::move(why);
    return false;
  };
  if (group.size() != 2) return no(fmt::format("the group has {} ranks, not 2", group.size()));
  if (group.backend_name() != "nccl" || !group.device().is_cuda())
    return no(fmt::format("the group is {} on {}, not NCCL on a GPU", group.backend_name(), group.device()));
  Identity mine;
  COLOSSAL_CUDA_CHECK(cudaDeviceGetPCIBusId(mine.bus_id, sizeof mine.bus_id, group.device().index));
  const Identity other = exchange(group, mine);
  int other_device = -1;
  if (cudaDeviceGetByPCIBusId(&other_device, other.bus_id) != cudaSuccess) {
    cudaGetLastError();
    return no(fmt::format("the other rank's GPU ({}) is not visible here (another host, or hidden)", other.bus_id));
  }
  int can = 0;
  COLOSSAL_CUDA_CHECK(cudaDeviceCanAccessPeer(&can, group.device().index, other_device));
  if (can == 0) return no(fmt::format("GPU {} cannot map GPU {}'s memory", group.device().index, other_device));
  return true;
}

CopyEnginePair::CopyEnginePair(std::shared_ptr<comm::ProcessGroup> group, const std::vector<int64_t>& numels,
                               const std::vector<DType>& dtypes, PairReduction mode)
    : group_(std::move(group)), shared_(std::make_shared<Shared>()), mode_(mode) {
  COLOSSAL_CHECK(numels.size() == dtypes.size(), "CopyEnginePair: {} sizes for {} dtypes", numels.size(),
                 dtypes.size());
  COLOSSAL_CHECK(mode_ != PairReduction::nccl, "CopyEnginePair: the NCCL reduction is not the pair's to make");
  Shared& s = *shared_;
  s.device = group_->device();
  core::cuda::DeviceGuard guard(s.device);
  // Layout: every bucket, with copies a receive buffer for each (the larger half), the flags; the
  // same on both ranks.
  size_t at = 0;
  for (size_t b = 0; b < numels.size(); ++b) {
    flat_offsets_.push_back(static_cast<int64_t>(at));
    at += align_up(static_cast<size_t>(numels[b]) * core::element_size(dtypes[b]));
  }
  for (size_t b = 0; b < numels.size() && mode_ == PairReduction::copy_engines; ++b) {
    recv_offsets_.push_back(static_cast<int64_t>(at));
    at += align_up(static_cast<size_t>(numels[b] - numels[b] / 2) * core::element_size(dtypes[b]));
  }
  s.flags_offset = at;
  const size_t flag_bytes = numels.size() * kFlagKinds * sizeof(uint64_t);
  at += align_up(flag_bytes);
  COLOSSAL_CUDA_CHECK(cudaMalloc(&s.base, at));
  COLOSSAL_CUDA_CHECK(cudaMemset(static_cast<char*>(s.base) + s.flags_offset, 0, flag_bytes));
  COLOSSAL_CUDA_CHECK(cudaDeviceSynchronize());  // the flags are zero before the other rank can write them
  Identity mine;
  COLOSSAL_CUDA_CHECK(cudaIpcGetMemHandle(&mine.handle, s.base));
  const Identity other = exchange(*group_, mine);
  COLOSSAL_CUDA_CHECK(cudaIpcOpenMemHandle(&s.peer_base, other.handle, cudaIpcMemLazyEnablePeerAccess));
  s.stream = core::cuda::create_stream(s.device);
  s.receive = core::cuda::create_stream(s.device);
  // The buckets' tensors view the allocation; Shared (which frees it) outlives them through their
  // release.
  for (size_t b = 0; b < numels.size(); ++b) {
    core::Storage storage = core::Storage::wrap(static_cast<char*>(s.base) + flat_offsets_[b],
                                                static_cast<size_t>(numels[b]) * core::element_size(dtypes[b]),
                                                s.device, [keep = shared_](void*) { (void)keep; });
    flats_.push_back(
        Tensor(std::make_shared<core::TensorImpl>(std::move(storage), Shape{numels[b]}, Shape{1}, 0, dtypes[b])));
  }
  steps_.assign(numels.size(), 0);
}

comm::Work CopyEnginePair::all_reduce_avg(size_t b, std::vector<Tensor> parts, const std::vector<int64_t>& offsets) {
  COLOSSAL_CHECK(b < flats_.size(), "CopyEnginePair: bucket {} of {}", b, flats_.size());
  Shared& s = *shared_;
  core::cuda::DeviceGuard guard(s.device);
  const Tensor& flat = flats_[b];
  const int rank = group_->rank();
  const int64_t numel = flat.numel();
  const int64_t half0 = numel / 2;
  const int64_t mine_begin = rank == 0 ? 0 : half0, mine_numel = rank == 0 ? half0 : numel - half0;
  const int64_t other_begin = rank == 0 ? half0 : 0, other_numel = numel - mine_numel;
  const size_t element = core::element_size(flat.dtype());
  const uint64_t step = ++steps_[b];

  auto operation = std::make_shared<PairOperation>(
      *group_, fmt::format("copy-engine all_reduce (avg) of bucket {}: {} elements of {}", b, numel, flat.dtype()),
      s.device);
  const core::Stream caller = core::cuda::current_stream(s.device);
  core::cuda::Event ready;
  ready.record(caller);
  ready.block(s.stream);
  comm::watch(operation);
  const bool copies = mode_ == PairReduction::copy_engines;
  char* const base = static_cast<char*>(s.base) + flat_offsets_[b];
  char* const peer = static_cast<char*>(s.peer_base) + flat_offsets_[b];
  core::cuda::Event packed;
  {
    // The sends, on a stream of their own, so that the next bucket's go out while this one's
    // average waits for the other rank (Note [Copy-engine all-reduce of a GPU pair]).
    core::cuda::StreamGuard on(s.stream);
    const int64_t range = core::profiler::begin_stream_range("dp: pair send", s.stream);
    comm::pack_parts(flat, parts, offsets);
    packed.record(s.stream);
    if (copies) {
      // 1-2: the other's half of my values into its receive buffer, once it has used the last ones.
      if (step > 1) s.await(s.stream, kFree, b, step - 1);
      COLOSSAL_CUDA_CHECK(cudaMemcpyAsync(static_cast<char*>(s.peer_base) + recv_offsets_[b],
                                          base + other_begin * element, static_cast<size_t>(other_numel) * element,
                                          cudaMemcpyDeviceToDevice, as_cuda(s.stream)));
    }
    s.signal(s.stream, kArrived, b, step);  // 3 (direct mode: my bucket is there to read)
    core::profiler::end_stream_range(range, s.stream);
  }
  {
    core::cuda::StreamGuard on(s.receive);
    const int64_t range = core::profiler::begin_stream_range("dp: pair average", s.receive);
    packed.block(s.receive);
    s.await(s.receive, kArrived, b, step);
    const cudaStream_t receive = as_cuda(s.receive);
    if (copies) {
      // 4-6: my half averaged with what arrived; the receive buffer is free again; the average
      // into the same half of the other's bucket.
      cuda_detail::pair_average(base + mine_begin * element, static_cast<char*>(s.base) + recv_offsets_[b], nullptr,
                                mine_numel, flat.dtype(), receive);
      s.signal(s.receive, kFree, b, step);
      COLOSSAL_CUDA_CHECK(cudaMemcpyAsync(peer + mine_begin * element, base + mine_begin * element,
                                          static_cast<size_t>(mine_numel) * element, cudaMemcpyDeviceToDevice,
                                          receive));
    } else {
      // My half averaged with the other's values of it, into both buckets.
      cuda_detail::pair_average(base + mine_begin * element, peer + mine_begin * element, peer + mine_begin * element,
                                mine_numel, flat.dtype(), receive);
    }
    // 7: the other's half is in my bucket once it says so.
    s.signal(s.receive, kDone, b, step);
    s.await(s.receive, kDone, b, step);
    core::profiler::end_stream_range(range, s.receive);
  }
  operation->done().record(s.receive);
  return comm::Work(std::make_shared<PairWork>(std::move(operation), shared_, caller, std::move(parts)));
}

}  // namespace colossal::parallel
