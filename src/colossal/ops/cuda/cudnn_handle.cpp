// One cuDNN handle per device, created on first use and bound to the current stream by each
// CudnnHandle; see cudnn_handle.h for why handles are per device and never destroyed.
#include "colossal/ops/cuda/cudnn_handle.h"

#include <array>
#include <string>

#include "colossal/core/cuda_device.h"  // DeviceGuard, current_stream

namespace colossal::ops::cuda {
namespace {

constexpr int kMaxDevices = 64;

struct DeviceHandle {
  std::mutex mutex;
  cudnnHandle_t handle = nullptr;
};

std::array<DeviceHandle, kMaxDevices>& device_handles() {
  static std::array<DeviceHandle, kMaxDevices> handles;
  return handles;
}

}  // namespace

std::string cudnn_last_error() {
  char message[512] = {};
  cudnnGetLastErrorString(message, sizeof message);
  return message;
}

CudnnHandle::CudnnHandle(core::Device device) {
  COLOSSAL_CHECK(device.is_cuda(), "cuDNN needs a CUDA device, got {}", device);
  COLOSSAL_CHECK(device.index >= 0 && device.index < kMaxDevices, "cuDNN: device index {} exceeds the {} supported",
                 device.index, kMaxDevices);
  DeviceHandle& entry = device_handles()[static_cast<size_t>(device.index)];
  lock_ = std::unique_lock(entry.mutex);
  core::cuda::DeviceGuard guard(device);
  if (entry.handle == nullptr) COLOSSAL_CUDNN_CHECK(cudnnCreate(&entry.handle));
  handle_ = entry.handle;
  COLOSSAL_CUDNN_CHECK(cudnnSetStream(handle_, static_cast<cudaStream_t>(core::cuda::current_stream(device).handle)));
}

}  // namespace colossal::ops::cuda
