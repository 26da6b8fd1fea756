// PairWindow: see pair_window.h.
#include "colossal/comm/nccl/pair_window.h"

#include <cuda_runtime.h>
#include <fmt/format.h>
#include <unistd.h>  // gethostname

#include <cstring>
#include <fstream>

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
/// of its allocation.
struct Identity {
  char host[48] = {};
  char bus_id[32] = {};
  cudaIpcMemHandle_t handle{};
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

/// `ok` on both ranks of `group` (an all-reduce of one flag).
bool agree(ProcessGroup& group, bool ok) {
  Tensor both = core::full({1}, ok ? 1.0 : 0.0, TensorOptions(DType::i32, group.device()));
  group.all_reduce(both, ReduceOp::min);
  return both.item<int32_t>() == 1;
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
    why = fmt::format(
        "the other rank's GPU ({}) is not visible to rank {} (another host, or hidden by "
        "CUDA_VISIBLE_DEVICES)",
        other.bus_id, group.rank());
  } else {
    int can = 0;
    COLOSSAL_CUDA_CHECK(cudaDeviceCanAccessPeer(&can, group.device().index, other_device));
    if (can == 0) why = fmt::format("GPU {} cannot map GPU {}'s memory", group.device().index, other_device);
  }
  // Both ranks answer alike (the window is built by both or neither): the verdict is agreed on.
  const bool both = agree(group, why.empty());
  if (!why.empty()) return no(std::move(why));
  if (!both) return no("the other rank cannot map this rank's GPU memory");
  return true;
}

PairWindow::PairWindow(ProcessGroup& group, size_t data_bytes, size_t counters)
    : device_(group.device()), data_bytes_(data_bytes), counters_(counters) {
  COLOSSAL_CHECK(group.size() == 2, "PairWindow: the group has {} ranks, not 2 [{}]", group.size(), group.describe());
  core::cuda::DeviceGuard guard(device_);
  counters_offset_ = align_up(data_bytes);
  const size_t counter_bytes = counters * sizeof(uint64_t);
  COLOSSAL_CUDA_CHECK(cudaMalloc(&base_, counters_offset_ + align_up(counter_bytes)));
  COLOSSAL_CUDA_CHECK(cudaMemset(mine() + counters_offset_, 0, counter_bytes));
  COLOSSAL_CUDA_CHECK(cudaDeviceSynchronize());  // the counters are zero before the other rank can write them
  Identity identity;
  COLOSSAL_CUDA_CHECK(cudaIpcGetMemHandle(&identity.handle, base_));
  const Identity other = exchange(group, identity);
  std::string why;
  const cudaError_t opened = cudaIpcOpenMemHandle(&peer_base_, other.handle, cudaIpcMemLazyEnablePeerAccess);
  if (opened != cudaSuccess) {
    cudaGetLastError();
    peer_base_ = nullptr;
    why = fmt::format("cudaIpcOpenMemHandle failed: {}", cudaGetErrorString(opened));
  }
  if (!agree(group, why.empty())) {
    // Neither rank uses the other's memory: each undoes its own.
    if (peer_base_ != nullptr) cudaIpcCloseMemHandle(peer_base_);
    cudaFree(base_);
    COLOSSAL_FAIL("PairWindow [{}]: {}", group.describe(),
                  why.empty() ? "the other rank could not map this rank's window" : why);
  }
}

// Note [Pair window teardown]
// Each rank of a pair maps the other's window (CUDA IPC), and a rank must not free its window while
// the other still maps it. So the other must close its mapping first (cudaIpcCloseMemHandle), and
// that close waits on the other process: on 2 H100s (session 22, COLOSSAL_TRACE_COMM's teardown
// lines) a rank's close waited until the other rank's NCCL communicator was aborted, whether the
// other was then spinning in a collective meant as a meeting (session 21's hangs at the tests' ends:
// the next collective) or asleep on the host in a meeting through shared memory, with both streams
// synchronized; it returned at once only when both ranks closed within the same few hundred
// microseconds. No teardown that closes the mappings before the communicators go was safe, so none
// is attempted: a window, and its mapping of the other's, stay until the process ends, when the
// driver releases both (every run above ended so, at once). The cost is the windows of the groups a
// process makes and drops: one per group that turned the pair on (32 MiB a GPU for a tensor group,
// the buckets for data parallelism's CopyEnginePair), so a process that makes such groups over and
// over keeps them all.
PairWindow::~PairWindow() = default;

void PairWindow::signal(core::Stream stream, size_t c, uint64_t value) const {
  COLOSSAL_CHECK(c < counters_, "PairWindow: counter {} of {}", c, counters_);
  core::cuda::write_value(stream, other() + counters_offset_ + c * sizeof(uint64_t), value);
}

void PairWindow::await(core::Stream stream, size_t c, uint64_t value) const {
  core::cuda::wait_value(stream, counter(c), value);
}

const void* PairWindow::counter(size_t c) const {
  COLOSSAL_CHECK(c < counters_, "PairWindow: counter {} of {}", c, counters_);
  return mine() + counters_offset_ + c * sizeof(uint64_t);
}

}  // namespace colossal::comm
