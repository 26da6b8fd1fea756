// PairWindow: see pair_window.h.
#include "colossal/comm/nccl/pair_window.h"

#include <cuda_runtime.h>
#include <fmt/format.h>

#include <cstring>

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

/// A GPU's identity for the pair: its PCI bus id, and the IPC handle of its allocation.
struct Identity {
  char bus_id[32] = {};
  cudaIpcMemHandle_t handle{};
};

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
  COLOSSAL_CUDA_CHECK(cudaDeviceGetPCIBusId(mine.bus_id, sizeof mine.bus_id, group.device().index));
  const Identity other = exchange(group, mine);
  std::string why;
  int other_device = -1;
  if (cudaDeviceGetByPCIBusId(&other_device, other.bus_id) != cudaSuccess) {
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
  COLOSSAL_CUDA_CHECK(cudaIpcOpenMemHandle(&peer_base_, other.handle, cudaIpcMemLazyEnablePeerAccess));
}

void PairWindow::close_peer() {
  if (peer_base_ == nullptr) return;
  core::cuda::DeviceGuard guard(device_);
  cudaIpcCloseMemHandle(peer_base_);
  peer_base_ = nullptr;
}

PairWindow::~PairWindow() {
  try {
    close_peer();
    core::cuda::DeviceGuard guard(device_);
    if (base_ != nullptr) cudaFree(base_);
  } catch (...) {
    // Nothing useful to do about a failing teardown in a destructor.
  }
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
