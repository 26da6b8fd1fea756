// NcclProcessGroup (comm/nccl/nccl_process_group.h): NCCL collectives on the group's own stream,
// ordered against the caller's stream with CUDA events; unique-id exchange; ncclCommSplit.
#include "colossal/comm/nccl/nccl_process_group.h"

#include "colossal/comm/launch_env.h"
#include "colossal/comm/nccl/pair_all_reduce.h"
#include "colossal/comm/nccl/pair_p2p.h"
#include "colossal/comm/timeout.h"   // resolve_collective_timeout
#include "colossal/comm/watchdog.h"  // WatchedOperation, watch, add_stop_hook

#include <cuda_runtime_api.h>
#include <nccl.h>

#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <exception>  // uncaught_exceptions
#include <mutex>
#include <optional>
#include <string_view>
#include <thread>
#include <utility>

#include "colossal/core/build_config.h"
#include "colossal/core/cuda/cuda_check.h"
#include "colossal/core/cuda_device.h"  // DeviceGuard, Event, current_stream, create_stream
#include "colossal/core/profiler.h"     // begin_stream_range

#if COLOSSAL_WITH_MPI
#include "colossal/comm/mpi/mpi_runtime.h"
#endif

// Note [NCCL stream ordering]
// Each group owns a stream; a collective must not start before the caller's work that produced its
// tensors, and the caller must not read the result before the collective ends. So each call
//   1. records an event on the caller's current stream and makes the group's stream wait on it;
//   2. enqueues the NCCL call(s) on the group's stream;
//   3. records a completion event there.
// Work::wait() makes the caller's current stream (and the stream current at the call, if another)
// wait on that event; no host blocking, as in PyTorch. Work::synchronize() blocks the host, polling
// ncclCommGetAsyncError so a dead peer turns into an error instead of a hang, and the deadline.
// Every call is also handed to the watchdog (Note [Collective watchdog] in comm/watchdog.cpp), which
// queries the completion event from its thread: the host that only made a stream wait, and later
// blocks inside CUDA behind a collective a peer never joined, still ends within the timeout, after
// the stop hook aborted every communicator of the process (abort_all_communicators).
// Memory: tensors belong to the stream current when they were allocated (core/storage.cpp) and are
// freed in its order. The Work keeps the tensors alive until that stream waits for the collective
// (wait(), or the Work's destructor, which enqueues the same wait), so a freed tensor's memory cannot
// be reused while NCCL still reads or writes it, provided the tensors were allocated on the stream
// current at the call, the usual case.

#define COLOSSAL_NCCL_CHECK(expr, ...)                                                                \
  do {                                                                                                \
    const ncclResult_t colossal_nccl_rc_ = (expr);                                                    \
    if (colossal_nccl_rc_ != ncclSuccess) [[unlikely]] {                                              \
      COLOSSAL_FAIL("NCCL error from {}: {} ({}) [{}]", #expr, ncclGetErrorString(colossal_nccl_rc_), \
                    ncclGetLastError(nullptr), ::fmt::format(__VA_ARGS__));                           \
    }                                                                                                 \
  } while (0)

namespace colossal::comm {

namespace detail {
/// Lives as long as the group or any of its Work: the communicator and its stream.
struct NcclCommState {
  ncclComm_t comm = nullptr;
  Device device;
  core::Stream stream;
  int rank = 0;
  int size = 1;
  std::atomic<bool> aborted{false};
  /// ncclCommAbort frees the communicator: the calls that read it from any thread besides enqueuing
  /// (the async-error checks, the watchdog's included) hold this and test `aborted` first.
  std::mutex abort_mutex;
  /// Large sums between two GPUs by the copy engines, once use_pair_all_reduce turned it on.
  std::unique_ptr<PairAllReduce> pair;
  /// Sends and receives between two GPUs by the copy engines, once use_pair_p2p turned it on.
  std::unique_ptr<PairP2P> p2p;

  NcclCommState(ncclComm_t c, Device d) : comm(c), device(d) {
    core::cuda::DeviceGuard guard(device);
    COLOSSAL_NCCL_CHECK(ncclCommUserRank(comm, &rank), "reading the rank of a new communicator on {}", device);
    COLOSSAL_NCCL_CHECK(ncclCommCount(comm, &size), "reading the size of a new communicator on {}", device);
    stream = core::cuda::create_stream(device, core::cuda::StreamPriority::high);
  }
  ~NcclCommState() {
    try {
      core::cuda::DeviceGuard guard(device);
      release_pair();
      release_p2p();
      // Destroy waits for the communicator's enqueued work; an aborted one is already gone.
      if (!aborted.load()) ncclCommDestroy(comm);
      core::cuda::destroy_stream(stream);
    } catch (...) {
      // Nothing useful to do about a failing teardown in a destructor.
    }
  }

  /// The pair's window stays allocated and mapped until the process ends (Note [Pair window teardown]
  /// in comm/nccl/pair_window.cpp); its stream's work is waited for first, so that the communicator's
  /// teardown finds nothing of the pair's in flight.
  void release_pair() noexcept {
    if (!pair) return;
    // Not after an abort, nor while unwinding from an error: a piece may wait for a peer that is gone.
    if (!aborted.load() && std::uncaught_exceptions() == 0)
      cudaStreamSynchronize(static_cast<cudaStream_t>(stream.handle));
    pair.reset();
  }
  /// The same for the sends and receives by the copy engines (their own streams).
  void release_p2p() noexcept {
    if (!p2p) return;
    try {
      if (!aborted.load() && std::uncaught_exceptions() == 0) p2p->drain();
    } catch (...) {
    }
    p2p.reset();
  }

  /// Any thread: the watchdog's stop hook calls it while the owner may be blocked in CUDA.
  void abort() noexcept {
    std::lock_guard lock(abort_mutex);
    if (aborted.exchange(true)) return;
    cudaSetDevice(device.index);  // the hook's thread may have another device current, or none
    ncclCommAbort(comm);
  }

  /// Throws (after aborting the communicator) when NCCL failed in the background, e.g. a peer died.
  /// `operation` and `group` name the call for the message.
  void check_async_error(std::string_view operation, std::string_view group) {
    std::unique_lock lock(abort_mutex);
    COLOSSAL_CHECK(!aborted.load(), "{} [{}]: the NCCL communicator was aborted", operation, group);
    ncclResult_t state = ncclSuccess;
    COLOSSAL_NCCL_CHECK(ncclCommGetAsyncError(comm, &state), "{} [{}]", operation, group);
    if (state != ncclSuccess && state != ncclInProgress) {
      const std::string detail = ncclGetLastError(comm);
      lock.unlock();
      abort();
      COLOSSAL_FAIL("{} [{}]: NCCL failed asynchronously: {} ({}); the communicator was aborted", operation, group,
                    ncclGetErrorString(state), detail);
    }
  }

  /// The watchdog's form of check_async_error: the error's text, or nullopt when there is none or
  /// the communicator is busy being aborted. Never blocks, never throws.
  std::optional<std::string> async_error() noexcept {
    std::unique_lock lock(abort_mutex, std::try_to_lock);
    if (!lock || aborted.load()) return std::nullopt;
    ncclResult_t state = ncclSuccess;
    if (ncclCommGetAsyncError(comm, &state) != ncclSuccess) return std::nullopt;
    if (state == ncclSuccess || state == ncclInProgress) return std::nullopt;
    try {
      return fmt::format("NCCL {} ({})", ncclGetErrorString(state), ncclGetLastError(comm));
    } catch (...) {
      return std::string(ncclGetErrorString(state));
    }
  }
};
}  // namespace detail

namespace {

using detail::NcclCommState;

// Every communicator of the process, so that a rank ending on a timeout stops them all: a
// collective on one group may be queued behind the hung one of another.
std::mutex live_states_mutex;
std::vector<std::weak_ptr<NcclCommState>> live_states;

void abort_all_communicators() noexcept {
  std::vector<std::shared_ptr<NcclCommState>> states;
  {
    std::unique_lock lock(live_states_mutex, std::try_to_lock);
    if (!lock) return;  // a group being made right now; the process ends anyway
    for (const auto& weak : live_states) {
      if (auto state = weak.lock()) states.push_back(std::move(state));
    }
  }
  for (const auto& state : states) state->abort();
}

void register_communicator(const std::shared_ptr<NcclCommState>& state) {
  static std::once_flag hook_added;
  std::call_once(hook_added, [] { add_stop_hook(abort_all_communicators); });
  std::lock_guard lock(live_states_mutex);
  std::erase_if(live_states, [](const std::weak_ptr<NcclCommState>& weak) { return weak.expired(); });
  live_states.push_back(state);
}

cudaStream_t as_cuda(core::Stream s) {
  return static_cast<cudaStream_t>(s.handle);
}

ncclDataType_t nccl_type(DType dtype) {
  switch (dtype) {
    case DType::f32:
      return ncclFloat32;
    case DType::f64:
      return ncclFloat64;
    case DType::f16:
      return ncclFloat16;
    case DType::bf16:
      return ncclBfloat16;
    case DType::i32:
      return ncclInt32;
    case DType::i64:
      return ncclInt64;
    case DType::u8:
      return ncclUint8;
    case DType::boolean:
      return ncclUint8;  // 0/1 bytes: max is or, min is and
  }
  COLOSSAL_FAIL("no NCCL datatype for dtype {}", static_cast<int>(dtype));
}

// ncclAvg sums and divides integers (truncating) and pre-multiplies floats by 1/size, so a float
// average may differ from sum/size in the last bit.
ncclRedOp_t nccl_op(ReduceOp op) {
  switch (op) {
    case ReduceOp::sum:
      return ncclSum;
    case ReduceOp::avg:
      return ncclAvg;
    case ReduceOp::max:
      return ncclMax;
    case ReduceOp::min:
      return ncclMin;
  }
  COLOSSAL_FAIL("no NCCL op for ReduceOp {}", static_cast<int>(op));
}

size_t count(const Tensor& t) {
  return static_cast<size_t>(t.numel());
}

/// A copy of `t` (on the caller's stream), for inputs that alias their outputs in ways NCCL does not allow.
Tensor staged_copy(const Tensor& t) {
  Tensor copy = empty_like(t);
  copy.copy_(t);
  return copy;
}

/// One call as the watchdog sees it: the completion event recorded after it on the group's stream.
class NcclOperation final : public WatchedOperation {
 public:
  /// Creates the event, so the group's device must be current.
  NcclOperation(const ProcessGroup& group, std::string operation, std::shared_ptr<NcclCommState> state)
      : WatchedOperation(group, std::move(operation)), state_(std::move(state)) {}

  core::cuda::Event& done() { return done_; }
  NcclCommState& state() { return *state_; }
  /// The NCCL calls are enqueued and done() recorded after them: poll() may query it.
  void mark_enqueued() { enqueued_.store(true, std::memory_order_release); }

  bool poll() noexcept override {
    // An aborted communicator drops its work; whoever aborted it has reported why.
    if (state_->aborted.load()) return true;
    // Still inside the enqueue (ncclGroupEnd may block on the host, connecting to a peer that never
    // comes): not done, and the deadline runs (Note [Watched before enqueued]).
    if (!enqueued_.load(std::memory_order_acquire)) return false;
    // The watchdog's thread picks the device itself: its first CUDA call would otherwise make a
    // context on GPU 0 in every rank's process.
    if (cudaSetDevice(state_->device.index) != cudaSuccess) return true;
    try {
      return done_.query();
    } catch (...) {
      return true;  // a failed device: the owner's next CUDA call reports it
    }
  }

  std::optional<std::string> transport_error() noexcept override { return state_->async_error(); }

 private:
  std::shared_ptr<NcclCommState> state_;
  core::cuda::Event done_;
  std::atomic<bool> enqueued_{false};
};

class NcclWork final : public Work::Impl {
 public:
  NcclWork(std::shared_ptr<NcclOperation> operation, core::Stream caller, std::vector<Tensor> tensors,
           bool host_blocking)
      : operation_(std::move(operation)),
        caller_(caller),
        tensors_(std::move(tensors)),
        host_blocking_(host_blocking) {}

  ~NcclWork() override {
    if (tensors_.empty()) return;
    try {
      // Order the tensors' frees (on the caller's stream) after the collective. See the Note above.
      core::cuda::DeviceGuard guard(state().device);
      operation_->done().block(caller_);
    } catch (...) {
    }
  }

  void wait() override {
    if (host_blocking_) return synchronize();
    check_async_error();
    core::cuda::DeviceGuard guard(state().device);
    const core::Stream current = core::cuda::current_stream(state().device);
    operation_->done().block(current);
    if (current != caller_) operation_->done().block(caller_);
    tensors_.clear();
  }

  void synchronize() override {
    core::cuda::DeviceGuard guard(state().device);
    while (!operation_->done().query()) {
      check_async_error();
      check_deadline(*operation_);
      std::this_thread::sleep_for(std::chrono::microseconds(50));
    }
    tensors_.clear();
  }

  bool is_completed() override {
    check_async_error();
    core::cuda::DeviceGuard guard(state().device);
    if (!operation_->done().query()) return false;
    tensors_.clear();
    return true;
  }

 private:
  NcclCommState& state() { return operation_->state(); }
  void check_async_error() { state().check_async_error(operation_->operation(), operation_->group()); }

  std::shared_ptr<NcclOperation> operation_;
  core::Stream caller_;
  std::vector<Tensor> tensors_;
  bool host_blocking_ = false;
};

/// A blocking host call (ncclCommSplit) as the watchdog sees it: done once the call returns.
class HostCall final : public WatchedOperation {
 public:
  HostCall(const ProcessGroup& group, std::string operation) : WatchedOperation(group, std::move(operation)) {}
  bool poll() noexcept override { return done_.load(std::memory_order_acquire); }
  void finish() { done_.store(true, std::memory_order_release); }

 private:
  std::atomic<bool> done_{false};
};

/// COLOSSAL_TRACE_COMM=1: every operation's enqueue, on stderr with the rank and a timestamp, for
/// finding where ranks part ways (the watchdog names only the operation that timed out).
void trace_comm(const char* phase, const WatchedOperation& operation) {
  static const bool enabled = [] {
    const char* v = std::getenv("COLOSSAL_TRACE_COMM");
    return v != nullptr && *v != '\0' && std::string_view(v) != "0";
  }();
  if (!enabled) return;
  const auto us =
      std::chrono::duration_cast<std::chrono::microseconds>(std::chrono::steady_clock::now().time_since_epoch());
  std::fprintf(stderr, "[comm trace] rank %d %lld us %s: %s [%s]\n", operation.world_rank(),
               static_cast<long long>(us.count()), phase, operation.operation().c_str(), operation.group().c_str());
  std::fflush(stderr);
}

/// Runs `enqueue()` (work on `stream`: the group's, or one of the copy engines' pair streams) as one
/// call the watchdog sees, its completion event recorded on `stream` after it; returns the call.
template <class Enqueue>
std::shared_ptr<NcclOperation> watched_on(const ProcessGroup& group, const std::shared_ptr<NcclCommState>& state,
                                          std::string what, core::Stream stream, Enqueue&& enqueue) {
  auto operation = std::make_shared<NcclOperation>(group, std::move(what), state);
  state->check_async_error(operation->operation(), operation->group());
  // Note [Watched before enqueued]: NCCL connects to a peer lazily, inside the first ncclGroupEnd
  // (or collective) that needs the connection, blocking the host until the peer makes the matching
  // call. A peer that never does (a mismatched exchange) would hang this thread before any event
  // exists to poll; so the watchdog holds the operation from now, and its deadline covers the enqueue.
  watch(operation);
  trace_comm("enqueue", *operation);
  const int64_t range = core::profiler::begin_stream_range(operation->operation(), stream);
  try {
    enqueue();
  } catch (...) {
    operation->mark_enqueued();  // done() was never recorded: polls as complete, the caller has the error
    throw;
  }
  core::profiler::end_stream_range(range, stream);
  operation->done().record(stream);
  operation->mark_enqueued();
  trace_comm("enqueued", *operation);
  return operation;
}

/// Runs `enqueue(comm, stream)` on the group's stream between the two events of Note [NCCL stream
/// ordering], hands the call to the watchdog and returns the Work waiting for it. `what` names the
/// call and its tensors; the group is `group`, whose communicator `state` is.
template <class Enqueue>
Work launch(const ProcessGroup& group, const std::shared_ptr<NcclCommState>& state, std::string what,
            std::vector<Tensor> tensors, Enqueue&& enqueue, bool host_blocking = false) {
  core::cuda::DeviceGuard guard(state->device);
  const core::Stream caller = core::cuda::current_stream(state->device);
  core::cuda::Event ready;
  ready.record(caller);
  ready.block(state->stream);
  std::shared_ptr<NcclOperation> operation =
      watched_on(group, state, std::move(what), state->stream, [&] { enqueue(state->comm, as_cuda(state->stream)); });
  return Work(std::make_shared<NcclWork>(std::move(operation), caller, std::move(tensors), host_blocking));
}

/// ncclGroupStart/End around `body`, ending the group even when an enqueue throws.
template <class Body>
void grouped(const std::string& what, Body&& body) {
  COLOSSAL_NCCL_CHECK(ncclGroupStart(), "{}", what);
  try {
    body();
  } catch (...) {
    ncclGroupEnd();
    throw;
  }
  COLOSSAL_NCCL_CHECK(ncclGroupEnd(), "{}", what);
}

ncclUniqueId exchange_unique_id(const DistEnv& env, std::chrono::milliseconds rendezvous_timeout) {
  ncclUniqueId id;
  std::memset(&id, 0, sizeof id);
  if (env.rank == 0) COLOSSAL_NCCL_CHECK(ncclGetUniqueId(&id), "making the unique id [{}]", env.describe());
  if (env.world_size == 1) return id;
#if COLOSSAL_WITH_MPI
  if (env.source == EnvSource::openmpi) {
    mpi::ensure_initialized();
    int mpi_size = 0, mpi_rank = 0;
    COLOSSAL_MPI_CHECK(MPI_Comm_size(MPI_COMM_WORLD, &mpi_size), "reading MPI_COMM_WORLD's size");
    COLOSSAL_MPI_CHECK(MPI_Comm_rank(MPI_COMM_WORLD, &mpi_rank), "reading this process's MPI rank");
    COLOSSAL_CHECK(mpi_size == env.world_size && mpi_rank == env.rank,
                   "nccl: MPI_COMM_WORLD has this process as rank {} of {}, but the environment says {}", mpi_rank,
                   mpi_size, env.describe());
    COLOSSAL_MPI_CHECK(MPI_Bcast(&id, sizeof id, MPI_BYTE, 0, MPI_COMM_WORLD), "sending the NCCL unique id [{}]",
                       env.describe());
    return id;
  }
#endif
  COLOSSAL_CHECK(
      env.source != EnvSource::openmpi || env.local_world_size == env.world_size || env.master_addr != "127.0.0.1",
      "nccl: under mpirun on several nodes this build (without MPI) needs rank 0's host for the TCP "
      "rendezvous: pass {} and {} to every rank (mpirun -x), or build with MPI [{}]",
      env::kMasterAddr, env::kMasterPort, env.describe());
  RendezvousOptions options;
  options.addr = env.master_addr;
  options.port = env.rendezvous_port();
  options.rank = env.rank;
  options.world_size = env.world_size;
  options.job_id = env.job_id;  // a rank of another job on this port is turned away
  options.timeout = rendezvous_timeout;
  std::vector<uint8_t> blob(sizeof id);
  std::memcpy(blob.data(), &id, sizeof id);
  blob = tcp_rendezvous_broadcast(options, blob);
  COLOSSAL_CHECK(blob.size() == sizeof id, "nccl: the rendezvous delivered {} bytes, a unique id has {}", blob.size(),
                 sizeof id);
  std::memcpy(&id, blob.data(), sizeof id);
  return id;
}

// Note [NCCL CTA policy]
// NCCL's kernels take SMs for as long as a collective runs, and under data parallelism they run
// beside backward's kernels: on 2 H100s, GPT-2 124M's backward ran ~0.6 ms (3%) slower on the rank
// that set the pace than on one GPU alone with the same kernels (session 14). NCCL 2.27 added a
// per-communicator CTA policy; "efficiency" uses as few CTAs as still give decent bandwidth, for
// applications that overlap communication with compute. COLOSSAL_NCCL_CTA_POLICY = default |
// efficiency | zero sets it on every communicator this process makes (world and splits); unset,
// NCCL's own choice (and its NCCL_CTA_POLICY variable) stands.
ncclConfig_t communicator_config() {
  ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
  const char* policy = std::getenv("COLOSSAL_NCCL_CTA_POLICY");
  if (policy == nullptr || *policy == '\0') return config;
  const std::string_view value(policy);
#if defined(NCCL_CTA_POLICY_EFFICIENCY)
  if (value == "default") {
    config.CTAPolicy = NCCL_CTA_POLICY_DEFAULT;
  } else if (value == "efficiency") {
    config.CTAPolicy = NCCL_CTA_POLICY_EFFICIENCY;
#if defined(NCCL_CTA_POLICY_ZERO)
  } else if (value == "zero") {
    config.CTAPolicy = NCCL_CTA_POLICY_ZERO;
#endif
  } else {
    COLOSSAL_CHECK(false,
                   "COLOSSAL_NCCL_CTA_POLICY = '{}' is not a CTA policy this NCCL ({}) knows: use default, "
                   "efficiency{}",
                   value, NCCL_VERSION_CODE,
#if defined(NCCL_CTA_POLICY_ZERO)
                   " or zero"
#else
                   ""
#endif
    );
  }
#else
  COLOSSAL_CHECK(value == "default",
                 "COLOSSAL_NCCL_CTA_POLICY = '{}': this NCCL ({}) has no CTA policies (NCCL 2.27 "
                 "added them); unset it",
                 value, NCCL_VERSION_CODE);
#endif
  return config;
}

}  // namespace

std::shared_ptr<NcclProcessGroup> NcclProcessGroup::create_world(const DistEnv& env, Device device,
                                                                 std::chrono::milliseconds rendezvous_timeout) {
  COLOSSAL_CHECK(device.is_cuda(), "nccl: the world group needs a CUDA device, got {}", device);
  const ncclUniqueId id = exchange_unique_id(env, rendezvous_timeout);
  core::cuda::DeviceGuard guard(device);
  ncclComm_t comm = nullptr;
  ncclConfig_t config = communicator_config();  // Note [NCCL CTA policy]
  COLOSSAL_NCCL_CHECK(ncclCommInitRankConfig(&comm, env.world_size, id, env.rank, &config),
                      "joining the world on {} [{}]", device, env.describe());
  auto world = std::make_shared<NcclProcessGroup>(comm, device);
  world->set_timeout(resolve_collective_timeout(kDefaultCollectiveTimeout));
  return world;
}

NcclProcessGroup::NcclProcessGroup(ncclComm* comm, Device device)
    : NcclProcessGroup(std::make_shared<NcclCommState>(comm, device)) {}

NcclProcessGroup::NcclProcessGroup(std::shared_ptr<NcclCommState> state)
    : ProcessGroup(state->rank, state->size), state_(std::move(state)) {
  register_communicator(state_);
}

NcclProcessGroup::~NcclProcessGroup() = default;

Device NcclProcessGroup::device() const {
  return state_->device;
}
core::Stream NcclProcessGroup::stream() const {
  return state_->stream;
}
void NcclProcessGroup::abort() {
  state_->abort();
}

bool NcclProcessGroup::use_pair_all_reduce(int64_t window_bytes, int64_t min_bytes, std::string* why_not) {
  if (!PairWindow::available(*this, why_not)) return false;
  core::cuda::DeviceGuard guard(state_->device);
  state_->release_pair();  // a window being replaced (Note [Pair window teardown])
  state_->pair = std::make_unique<PairAllReduce>(*this, window_bytes, min_bytes);
  return true;
}

bool NcclProcessGroup::use_pair_p2p(int64_t slot_bytes, int64_t slots, std::string* why_not) {
  if (!PairWindow::available(*this, why_not)) return false;
  core::cuda::DeviceGuard guard(state_->device);
  state_->release_p2p();  // a window being replaced (Note [Pair window teardown])
  state_->p2p = std::make_unique<PairP2P>(*this, slot_bytes, slots);
  return true;
}

bool NcclProcessGroup::receives_post_early() const {
  return state_->p2p != nullptr;
}

Work NcclProcessGroup::do_all_reduce(const Tensor& tensor, ReduceOp op) {
  if (state_->pair && state_->pair->takes(tensor, op)) {  // Note [Pair all-reduce by the copy engines]
    const std::string what =
        fmt::format("all_reduce (sum, by the copy engines) of a {} tensor of shape {}", tensor.dtype(), tensor.shape());
    return launch(*this, state_, what, {tensor},
                  [&](ncclComm_t, cudaStream_t) { state_->pair->enqueue(tensor, state_->stream); });
  }
  const std::string what =
      fmt::format("all_reduce ({}) of a {} tensor of shape {}", reduce_op_name(op), tensor.dtype(), tensor.shape());
  return launch(*this, state_, what, {tensor}, [&](ncclComm_t comm, cudaStream_t stream) {
    COLOSSAL_NCCL_CHECK(ncclAllReduce(tensor.raw_data(), tensor.raw_data(), count(tensor), nccl_type(tensor.dtype()),
                                      nccl_op(op), comm, stream),
                        "{} [{}]", what, describe());
  });
}

namespace {

/// The packed collectives: `parts` packed into `flat` on the group's stream, which already waits for
/// the caller's (Note [NCCL stream ordering]), then `collective(comm, stream)` there. The parts are
/// read on the group's stream, so the Work holds them (and `keep`) until it is waited for.
template <class Collective>
Work launch_packed(const ProcessGroup& group, const std::shared_ptr<NcclCommState>& state, std::string what,
                   const Tensor& flat, const std::vector<Tensor>& parts, const std::vector<int64_t>& offsets,
                   std::vector<Tensor> keep, Collective&& collective) {
  keep.insert(keep.end(), parts.begin(), parts.end());
  keep.push_back(flat);
  return launch(group, state, std::move(what), std::move(keep), [&](ncclComm_t comm, cudaStream_t stream) {
    {
      core::cuda::StreamGuard on_group_stream(state->stream);
      pack_parts(flat, parts, offsets);
    }
    collective(comm, stream);
  });
}

}  // namespace

Work NcclProcessGroup::do_all_reduce_packed(const Tensor& flat, const std::vector<Tensor>& parts,
                                            const std::vector<int64_t>& offsets, ReduceOp op) {
  const std::string what = fmt::format("all_reduce ({}) of {} tensors packed into a {} tensor of shape {}",
                                       reduce_op_name(op), parts.size(), flat.dtype(), flat.shape());
  return launch_packed(*this, state_, what, flat, parts, offsets, {}, [&](ncclComm_t comm, cudaStream_t stream) {
    COLOSSAL_NCCL_CHECK(ncclAllReduce(flat.raw_data(), flat.raw_data(), count(flat), nccl_type(flat.dtype()),
                                      nccl_op(op), comm, stream),
                        "{} [{}]", what, describe());
  });
}

Work NcclProcessGroup::do_reduce_scatter(const Tensor& output, const Tensor& input, ReduceOp op) {
  // NCCL works in place when output is this rank's chunk of input; other aliasing goes through a copy.
  const auto* my_chunk = static_cast<const char*>(input.raw_data()) + static_cast<size_t>(rank()) * output.nbytes();
  const bool in_place = output.numel() > 0 && output.raw_data() == my_chunk;
  const Tensor source = !in_place && overlaps(output, input) ? staged_copy(input) : input;
  const std::string what = fmt::format("reduce_scatter ({}) of a {} input of shape {} into {}", reduce_op_name(op),
                                       input.dtype(), input.shape(), output.shape());
  return launch(*this, state_, what, {output, source}, [&](ncclComm_t comm, cudaStream_t stream) {
    COLOSSAL_NCCL_CHECK(ncclReduceScatter(source.raw_data(), output.raw_data(), count(output), nccl_type(input.dtype()),
                                          nccl_op(op), comm, stream),
                        "{} [{}]", what, describe());
  });
}

Work NcclProcessGroup::do_reduce_scatter_packed(const Tensor& output, const Tensor& flat,
                                                const std::vector<Tensor>& parts, const std::vector<int64_t>& offsets,
                                                ReduceOp op) {
  const std::string what = fmt::format("reduce_scatter ({}) of {} tensors packed into a {} tensor of shape {}, into {}",
                                       reduce_op_name(op), parts.size(), flat.dtype(), flat.shape(), output.shape());
  return launch_packed(*this, state_, what, flat, parts, offsets, {output}, [&](ncclComm_t comm, cudaStream_t stream) {
    COLOSSAL_NCCL_CHECK(ncclReduceScatter(flat.raw_data(), output.raw_data(), count(output), nccl_type(flat.dtype()),
                                          nccl_op(op), comm, stream),
                        "{} [{}]", what, describe());
  });
}

Work NcclProcessGroup::do_all_gather(const Tensor& output, const Tensor& input) {
  const auto* my_chunk = static_cast<const char*>(output.raw_data()) + static_cast<size_t>(rank()) * input.nbytes();
  const bool in_place = input.numel() > 0 && input.raw_data() == my_chunk;
  const Tensor source = !in_place && overlaps(output, input) ? staged_copy(input) : input;
  const std::string what =
      fmt::format("all_gather of a {} input of shape {} into {}", input.dtype(), input.shape(), output.shape());
  return launch(*this, state_, what, {output, source}, [&](ncclComm_t comm, cudaStream_t stream) {
    COLOSSAL_NCCL_CHECK(
        ncclAllGather(source.raw_data(), output.raw_data(), count(input), nccl_type(input.dtype()), comm, stream),
        "{} [{}]", what, describe());
  });
}

Work NcclProcessGroup::do_broadcast(const Tensor& tensor, int root) {
  const std::string what =
      fmt::format("broadcast from rank {} of a {} tensor of shape {}", root, tensor.dtype(), tensor.shape());
  return launch(*this, state_, what, {tensor}, [&](ncclComm_t comm, cudaStream_t stream) {
    COLOSSAL_NCCL_CHECK(ncclBroadcast(tensor.raw_data(), tensor.raw_data(), count(tensor), nccl_type(tensor.dtype()),
                                      root, comm, stream),
                        "{} [{}]", what, describe());
  });
}

Work NcclProcessGroup::do_reduce(const Tensor& tensor, int root, ReduceOp op) {
  const std::string what = fmt::format("reduce ({}) to rank {} of a {} tensor of shape {}", reduce_op_name(op), root,
                                       tensor.dtype(), tensor.shape());
  // recvbuff is only written on the root, so the other ranks' tensors stay unchanged.
  return launch(*this, state_, what, {tensor}, [&](ncclComm_t comm, cudaStream_t stream) {
    COLOSSAL_NCCL_CHECK(ncclReduce(tensor.raw_data(), tensor.raw_data(), count(tensor), nccl_type(tensor.dtype()),
                                   nccl_op(op), root, comm, stream),
                        "{} [{}]", what, describe());
  });
}

namespace {

/// Note [Pair sends and receives by the copy engines] (comm/nccl/pair_p2p.cpp): the batch's sends on
/// the pair's send stream, its receives on its receive stream. The Work is the receives' (the sends'
/// tensors held until copied), or the sends' where there is no receive.
Work pair_send_recv(const ProcessGroup& group, const std::shared_ptr<NcclCommState>& state,
                    const std::vector<P2POp>& ops) {
  core::cuda::DeviceGuard guard(state->device);
  PairP2P& pair = *state->p2p;
  const core::Stream caller = core::cuda::current_stream(state->device);
  std::vector<P2POp> send_ops, receive_ops;
  std::vector<Tensor> sends, receives;
  for (const P2POp& p2p : ops) {
    const bool is_send = p2p.kind == P2POp::Kind::send;
    (is_send ? send_ops : receive_ops).push_back(p2p);
    (is_send ? sends : receives).push_back(p2p.tensor);
  }
  std::shared_ptr<NcclOperation> sent;
  if (!sends.empty()) {
    sent = watched_on(group, state, describe_p2p(send_ops) + " by the copy engines", pair.send_stream(),
                      [&] { pair.enqueue_sends(sends, caller); });
    if (receives.empty()) return Work(std::make_shared<NcclWork>(sent, caller, std::move(sends), false));
  }
  std::shared_ptr<NcclOperation> received =
      watched_on(group, state, describe_p2p(receive_ops) + " by the copy engines", pair.receive_stream(),
                 [&] { pair.enqueue_receives(receives, caller); });
  if (sent) pair.hold(std::move(sends), [sent] { return sent->done().query(); });
  return Work(std::make_shared<NcclWork>(received, caller, std::move(receives), false));
}

}  // namespace

Work NcclProcessGroup::do_batch_send_recv(const std::vector<P2POp>& ops) {
  if (state_->p2p) return pair_send_recv(*this, state_, ops);
  std::vector<Tensor> tensors;
  for (const P2POp& p2p : ops) tensors.push_back(p2p.tensor);
  const std::string what = describe_p2p(ops);
  // NCCL has no tags: a send matches the receive its peer issues in the same order.
  return launch(*this, state_, what, std::move(tensors), [&](ncclComm_t comm, cudaStream_t stream) {
    grouped(what, [&] {
      for (const P2POp& p2p : ops) {
        if (p2p.kind == P2POp::Kind::send) {
          COLOSSAL_NCCL_CHECK(
              ncclSend(p2p.tensor.raw_data(), count(p2p.tensor), nccl_type(p2p.tensor.dtype()), p2p.peer, comm, stream),
              "send of a tensor of shape {} to rank {} in {}", p2p.tensor.shape(), p2p.peer, what);
        } else {
          COLOSSAL_NCCL_CHECK(
              ncclRecv(p2p.tensor.raw_data(), count(p2p.tensor), nccl_type(p2p.tensor.dtype()), p2p.peer, comm, stream),
              "recv into a tensor of shape {} from rank {} in {}", p2p.tensor.shape(), p2p.peer, what);
        }
      }
    });
  });
}

Work NcclProcessGroup::do_all_to_all(const Tensor& output, const Tensor& input) {
  const Tensor source = overlaps(output, input) ? staged_copy(input) : input;
  const size_t chunk = count(input) / static_cast<size_t>(size());
  const size_t chunk_bytes = chunk * input.element_size();
  const ncclDataType_t type = nccl_type(input.dtype());
  const std::string what = fmt::format("all_to_all of a {} tensor of shape {}", input.dtype(), input.shape());
  return launch(*this, state_, what, {output, source}, [&](ncclComm_t comm, cudaStream_t stream) {
    grouped(what, [&] {
      for (int peer = 0; peer < size(); ++peer) {
        const size_t offset = static_cast<size_t>(peer) * chunk_bytes;
        COLOSSAL_NCCL_CHECK(
            ncclSend(static_cast<const char*>(source.raw_data()) + offset, chunk, type, peer, comm, stream), "{} [{}]",
            what, describe());
        COLOSSAL_NCCL_CHECK(ncclRecv(static_cast<char*>(output.raw_data()) + offset, chunk, type, peer, comm, stream),
                            "{} [{}]", what, describe());
      }
    });
  });
}

Work NcclProcessGroup::do_barrier() {
  // NCCL has no barrier: a one-element all-reduce, whose Work blocks the host.
  Tensor token = zeros({1}, TensorOptions(DType::f32, device()));
  const std::string what = std::string("barrier");
  return launch(
      *this, state_, what, {token},
      [&](ncclComm_t comm, cudaStream_t stream) {
        COLOSSAL_NCCL_CHECK(ncclAllReduce(token.raw_data(), token.raw_data(), 1, ncclFloat32, ncclSum, comm, stream),
                            "{} [{}]", what, describe());
      },
      /*host_blocking=*/true);
}

std::shared_ptr<ProcessGroup> NcclProcessGroup::do_split(int color, int key) {
  state_->check_async_error("split", describe());
  core::cuda::DeviceGuard guard(state_->device);
  ncclConfig_t config = communicator_config();  // Note [NCCL CTA policy]
  ncclComm_t child = nullptr;
  // ncclCommSplit blocks the host until every rank of the group calls it: watched like a collective.
  auto call = std::make_shared<HostCall>(*this, fmt::format("split with color {} and key {}", color, key));
  watch(call);
  trace_comm("enqueue", *call);
  const ncclResult_t rc = ncclCommSplit(state_->comm, color < 0 ? NCCL_SPLIT_NOCOLOR : color, key, &child, &config);
  call->finish();
  trace_comm("enqueued", *call);
  COLOSSAL_NCCL_CHECK(rc, "split with color {} and key {} [{}]", color, key, describe());
  if (child == nullptr) return nullptr;
  return std::make_shared<NcclProcessGroup>(child, state_->device);
}

}  // namespace colossal::comm
