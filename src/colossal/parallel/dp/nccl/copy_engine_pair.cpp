// CopyEnginePair: see copy_engine_pair.h.
#include "colossal/parallel/dp/copy_engine_pair.h"

#include <cuda.h>  // the driver's stream memory operations' types (the functions come through the runtime)
#include <cuda_runtime.h>
#include <fmt/format.h>

#include <chrono>
#include <cstring>
#include <exception>  // uncaught_exceptions
#include <thread>
#include <utility>

#include "colossal/comm/nccl/pair_reduce.h"
#include "colossal/comm/nccl/pair_window.h"
#include "colossal/comm/watchdog.h"  // WatchedOperation, watch, check_deadline
#include "colossal/core/cuda/cuda_check.h"
#include "colossal/core/cuda_device.h"
#include "colossal/core/error.h"
#include "colossal/core/profiler.h"

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

}  // namespace

struct CopyEnginePair::Shared {
  core::Device device;
  core::Stream stream;                       // sends: packing, the copy of the other's half, its arrival flag
  core::Stream receive;                      // the rest: the average, the copy back, the wait for the other's half
  std::unique_ptr<comm::PairWindow> window;  // every bucket, the receive buffers; the flags

  ~Shared() {
    core::cuda::DeviceGuard guard(device);
    if (stream.handle != nullptr) cudaStreamSynchronize(as_cuda(stream));
    if (receive.handle != nullptr) cudaStreamSynchronize(as_cuda(receive));
    window.reset();  // left allocated and mapped until the process ends (Note [Pair window teardown])
    if (stream.handle != nullptr) core::cuda::destroy_stream(stream);
    if (receive.handle != nullptr) core::cuda::destroy_stream(receive);
  }
  /// Sets the other rank's flag `kind` of bucket b to `value` after `on`'s earlier work (fenced).
  void signal(core::Stream on, Flag kind, size_t b, uint64_t value) const {
    window->signal(on, b * kFlagKinds + kind, value);
  }
  /// Holds `on` until this rank's flag `kind` of bucket b reaches `value`.
  void await(core::Stream on, Flag kind, size_t b, uint64_t value) const {
    window->await(on, b * kFlagKinds + kind, value);
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
  return comm::PairWindow::available(group, why_not);
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
  s.window = std::make_unique<comm::PairWindow>(*group_, at, numels.size() * kFlagKinds);
  s.stream = core::cuda::create_stream(s.device);
  s.receive = core::cuda::create_stream(s.device);
  // The buckets' tensors view the allocation; Shared (which frees it) outlives them through their
  // release.
  for (size_t b = 0; b < numels.size(); ++b) {
    core::Storage storage = core::Storage::wrap(s.window->mine() + flat_offsets_[b],
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
  char* const base = s.window->mine() + flat_offsets_[b];
  char* const peer = s.window->other() + flat_offsets_[b];
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
      COLOSSAL_CUDA_CHECK(cudaMemcpyAsync(s.window->other() + recv_offsets_[b], base + other_begin * element,
                                          static_cast<size_t>(other_numel) * element, cudaMemcpyDeviceToDevice,
                                          as_cuda(s.stream)));
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
      comm::cuda_detail::pair_reduce(base + mine_begin * element, s.window->mine() + recv_offsets_[b], nullptr,
                                     mine_numel, flat.dtype(), /*average=*/true, receive);
      s.signal(s.receive, kFree, b, step);
      COLOSSAL_CUDA_CHECK(cudaMemcpyAsync(peer + mine_begin * element, base + mine_begin * element,
                                          static_cast<size_t>(mine_numel) * element, cudaMemcpyDeviceToDevice,
                                          receive));
    } else {
      // My half averaged with the other's values of it, into both buckets.
      comm::cuda_detail::pair_reduce(base + mine_begin * element, peer + mine_begin * element,
                                     peer + mine_begin * element, mine_numel, flat.dtype(), /*average=*/true, receive);
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
