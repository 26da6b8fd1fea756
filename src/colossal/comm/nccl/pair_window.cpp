// PairWindow: see pair_window.h.
#include "colossal/comm/nccl/pair_window.h"

#include <cuda_runtime.h>
#include <fcntl.h>  // O_CREAT, O_RDWR
#include <fmt/format.h>
#include <sys/mman.h>  // shm_open, mmap
#include <unistd.h>    // ftruncate, getpid

#include <atomic>
#include <cstring>
#include <fstream>
#include <thread>

#include "colossal/core/cuda/cuda_check.h"
#include "colossal/core/cuda_device.h"  // DeviceGuard, write_value, wait_value
#include "colossal/core/error.h"
#include "colossal/core/tensor.h"

namespace colossal::comm {

namespace {

constexpr size_t kAlign = 512;
size_t align_up(size_t n) {
  return (n + kAlign - 1) / kAlign * kAlign;
}

/// A GPU's identity for the pair: the host it is on (its boot id), its PCI bus id, the IPC handle
/// of its allocation, and (rank 0's) the name of the host memory the two share.
struct Identity {
  char host[48] = {};
  char bus_id[32] = {};
  cudaIpcMemHandle_t handle{};
  char meeting[64] = {};
};

/// This host's identity: the kernel's boot id (two containers of one machine share it; two machines
/// do not), else the host name.
void read_host(char (&host)[48]) {
  std::string id;
  std::getline(std::ifstream("/proc/sys/kernel/random/boot_id"), id);
  if (id.empty()) {
    char name[48] = {};
    gethostname(name, sizeof name - 1);
    id = name;
  }
  std::snprintf(host, sizeof host, "%s", id.c_str());
}

/// Exchanges `mine` with the other rank of `group` (an all_gather on the group's device).
Identity exchange(ProcessGroup& group, const Identity& mine) {
  Tensor local = core::empty({static_cast<int64_t>(sizeof(Identity))}, TensorOptions(DType::u8, core::kCpu));
  std::memcpy(local.raw_data(), &mine, sizeof(Identity));
  const Tensor sent = local.to(group.device());
  const Tensor all =
      core::empty({static_cast<int64_t>(2 * sizeof(Identity))}, TensorOptions(DType::u8, group.device()));
  group.all_gather(all, sent);
  const Tensor host = all.to(core::kCpu);
  Identity other;
  std::memcpy(&other, static_cast<const char*>(host.raw_data()) + (1 - group.rank()) * sizeof(Identity),
              sizeof(Identity));
  return other;
}

}  // namespace

bool PairWindow::available(ProcessGroup& group, std::string* why_not) {
  auto no = [&](std::string why) {
    if (why_not != nullptr) *why_not = std::move(why);
    return false;
  };
  if (group.size() != 2) return no(fmt::format("the group has {} ranks, not 2", group.size()));
  if (group.backend_name() != "nccl" || !group.device().is_cuda())
    return no(fmt::format("the group is {} on {}, not NCCL on a GPU", group.backend_name(), group.device()));
  core::cuda::DeviceGuard guard(group.device());
  Identity mine;
  read_host(mine.host);
  COLOSSAL_CUDA_CHECK(cudaDeviceGetPCIBusId(mine.bus_id, sizeof mine.bus_id, group.device().index));
  const Identity other = exchange(group, mine);
  std::string why;
  int other_device = -1;
  if (std::strncmp(mine.host, other.host, sizeof mine.host) != 0) {
    why = fmt::format("the two ranks run on different hosts (boot ids {} and {})", mine.host, other.host);
  } else if (cudaDeviceGetByPCIBusId(&other_device, other.bus_id) != cudaSuccess) {
    cudaGetLastError();
    why = fmt::format("the other rank's GPU ({}) is not visible to rank {} (another host, or hidden by "
                      "CUDA_VISIBLE_DEVICES)",
                      other.bus_id, group.rank());
  } else {
    int can = 0;
    COLOSSAL_CUDA_CHECK(cudaDeviceCanAccessPeer(&can, group.device().index, other_device));
    if (can == 0) why = fmt::format("GPU {} cannot map GPU {}'s memory", group.device().index, other_device);
  }
  // Both ranks answer alike (the window is built by both or neither): the verdict is agreed on.
  Tensor both = core::full({1}, why.empty() ? 1.0 : 0.0, TensorOptions(DType::i32, group.device()));
  group.all_reduce(both, ReduceOp::min);
  if (!why.empty()) return no(std::move(why));
  if (both.item<int32_t>() == 0) return no("the other rank cannot map this rank's GPU memory");
  return true;
}

struct PairWindow::Meeting {
  /// Each rank's phase in close(); kLeft once it gave up.
  std::atomic<uint64_t> phase[2];
};

namespace {
constexpr uint64_t kLeft = ~uint64_t{0};
static_assert(std::atomic<uint64_t>::is_always_lock_free, "the meeting place is shared between processes");

/// `ok` on both ranks of `group` (an all-reduce of one flag).
bool agree(ProcessGroup& group, bool ok) {
  Tensor both = core::full({1}, ok ? 1.0 : 0.0, TensorOptions(DType::i32, group.device()));
  group.all_reduce(both, ReduceOp::min);
  return both.item<int32_t>() == 1;
}

/// Maps the shared memory `name` (created, zeroed, when `create`); null, with `why`, on failure.
void* map_meeting(const char* name, bool create, std::string& why) {
  const int fd = shm_open(name, O_RDWR | (create ? O_CREAT | O_EXCL : 0), 0600);
  if (fd < 0) {
    why = fmt::format("shm_open({}) failed: {}", name, std::strerror(errno));
    return nullptr;
  }
  if (create && ftruncate(fd, 4096) != 0) {
    why = fmt::format("ftruncate of {} failed: {}", name, std::strerror(errno));
    ::close(fd);
    return nullptr;
  }
  void* at = mmap(nullptr, 4096, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  ::close(fd);
  if (at == MAP_FAILED) {
    why = fmt::format("mmap of {} failed: {}", name, std::strerror(errno));
    return nullptr;
  }
  return at;
}
}  // namespace

PairWindow::PairWindow(ProcessGroup& group, size_t data_bytes, size_t counters)
    : device_(group.device()), data_bytes_(data_bytes), counters_(counters), rank_(group.rank()) {
  COLOSSAL_CHECK(group.size() == 2, "PairWindow: the group has {} ranks, not 2 [{}]", group.size(), group.describe());
  core::cuda::DeviceGuard guard(device_);
  counters_offset_ = align_up(data_bytes);
  const size_t counter_bytes = counters * sizeof(uint64_t);
  COLOSSAL_CUDA_CHECK(cudaMalloc(&base_, counters_offset_ + align_up(counter_bytes)));
  COLOSSAL_CUDA_CHECK(cudaMemset(mine() + counters_offset_, 0, counter_bytes));
  COLOSSAL_CUDA_CHECK(cudaDeviceSynchronize());  // the counters are zero before the other rank can write them
  Identity identity;
  COLOSSAL_CUDA_CHECK(cudaIpcGetMemHandle(&identity.handle, base_));
  std::string why;
  void* meeting = nullptr;
  if (rank_ == 0) {
    static std::atomic<int> windows{0};
    std::snprintf(identity.meeting, sizeof identity.meeting, "/colossal-pair-%d-%d", static_cast<int>(getpid()),
                  windows.fetch_add(1));
    meeting = map_meeting(identity.meeting, /*create=*/true, why);
  }
  const Identity other = exchange(group, identity);
  if (rank_ == 1) meeting = map_meeting(other.meeting, /*create=*/false, why);
  if (meeting != nullptr) {
    const cudaError_t opened = cudaIpcOpenMemHandle(&peer_base_, other.handle, cudaIpcMemLazyEnablePeerAccess);
    if (opened != cudaSuccess) {
      cudaGetLastError();
      peer_base_ = nullptr;
      why = fmt::format("cudaIpcOpenMemHandle failed: {}", cudaGetErrorString(opened));
    }
  }
  const bool both = agree(group, why.empty());  // rank 1 has mapped the name: rank 0 may remove it
  if (rank_ == 0 && meeting != nullptr) shm_unlink(identity.meeting);
  if (!both) {
    // Neither rank used the other's memory: each undoes its own.
    if (peer_base_ != nullptr) cudaIpcCloseMemHandle(peer_base_);
    if (meeting != nullptr) munmap(meeting, 4096);
    cudaFree(base_);
    COLOSSAL_FAIL("PairWindow [{}]: {}", group.describe(),
                  why.empty() ? "the other rank could not map this rank's window" : why);
  }
  meeting_ = static_cast<Meeting*>(meeting);
}

bool PairWindow::meet(uint64_t phase, std::chrono::steady_clock::time_point until) {
  meeting_->phase[rank_].store(phase, std::memory_order_release);
  for (int polls = 0;; ++polls) {
    const uint64_t other = meeting_->phase[1 - rank_].load(std::memory_order_acquire);
    if (other == kLeft) return false;
    if (other >= phase) return true;
    if (std::chrono::steady_clock::now() > until) return false;
    std::this_thread::sleep_for(polls < 1000 ? std::chrono::microseconds(20) : std::chrono::microseconds(1000));
  }
}

// Note [Pair window teardown]
// Each rank of a pair maps the other's window (CUDA IPC). Closing that mapping
// (cudaIpcCloseMemHandle) waits until the other GPU is idle: on 2 H100s a rank that closed while
// the other's GPU ran a collective waiting for it (the next NCCL call, or an all-reduce meant as a
// meeting) waited until that collective was aborted (session 22's traces, COLOSSAL_TRACE_COMM) and
// without an abort forever: the tests' hangs of session 21. And a rank must not free its window
// while the other still maps it. So the ranks meet on the host, in memory their two processes
// share, where no GPU waits: each synchronizes its stream, meets the other, closes its mapping,
// meets it again, and only then frees its own (PairWindow::close). A rank that cannot meet the
// other within the caller's deadline (it died, or gave up) leaves its window allocated and mapped
// until the process ends, and says so to the other, which stops waiting. NcclProcessGroup's
// PairAllReduce and data parallelism's CopyEnginePair close their windows this way. (A kernel of
// another communicator still running on the other GPU and waiting for this rank would hold the close
// the same way: the callers tear a window down after their last collective has completed.)
bool PairWindow::close(std::chrono::milliseconds deadline) {
  if (closed_) return true;
  core::cuda::DeviceGuard guard(device_);
  const auto until = std::chrono::steady_clock::now() + deadline;
  // Neither GPU runs anything of the window's now, and neither host will launch work that waits
  // for the other before the second meeting: closing the mapping (which waits for the other GPU)
  // cannot wait on a kernel that waits for this rank.
  if (!meet(1, until)) {
    leave();
    return false;
  }
  if (peer_base_ != nullptr) cudaIpcCloseMemHandle(peer_base_);
  peer_base_ = nullptr;
  // The other no longer maps this rank's memory.
  if (!meet(2, until)) {
    leave();
    return false;
  }
  cudaFree(base_);
  base_ = nullptr;
  munmap(meeting_, 4096);
  meeting_ = nullptr;
  closed_ = true;
  return true;
}

void PairWindow::leave() {
  if (meeting_ != nullptr) meeting_->phase[rank_].store(kLeft, std::memory_order_release);
}

PairWindow::~PairWindow() {
  // Not closed: the memory stays allocated and mapped until the process ends (Note [Pair window
  // teardown]); the other rank is told not to wait.
  if (!closed_) leave();
}

void PairWindow::signal(core::Stream stream, size_t c, uint64_t value) const {
  COLOSSAL_CHECK(c < counters_, "PairWindow: counter {} of {}", c, counters_);
  core::cuda::write_value(stream, other() + counters_offset_ + c * sizeof(uint64_t), value);
}

void PairWindow::await(core::Stream stream, size_t c, uint64_t value) const {
  COLOSSAL_CHECK(c < counters_, "PairWindow: counter {} of {}", c, counters_);
  core::cuda::wait_value(stream, mine() + counters_offset_ + c * sizeof(uint64_t), value);
}

}  // namespace colossal::comm
