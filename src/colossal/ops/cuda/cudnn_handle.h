// The cuDNN handle of each device for the CUDA kernels that call cuDNN (convolution), bound to the
// device's current stream on each use, and COLOSSAL_CUDNN_CHECK, which names the failing call, the
// cuDNN status and cuDNN's own description of the last error. Internal: includes cudnn.h.
#pragma once

#include <cudnn.h>

#include <mutex>
#include <string>

#include "colossal/core/device.h"
#include "colossal/core/error.h"

namespace colossal::ops::cuda {
/// cuDNN's description of the last error on this thread ("" when it has none).
std::string cudnn_last_error();
}  // namespace colossal::ops::cuda

#define COLOSSAL_CUDNN_CHECK(expr)                                                                    \
  do {                                                                                                \
    const cudnnStatus_t colossal_cudnn_status_ = (expr);                                              \
    if (colossal_cudnn_status_ != CUDNN_STATUS_SUCCESS) [[unlikely]] {                                \
      COLOSSAL_FAIL("cuDNN error {} from {}: {}", cudnnGetErrorString(colossal_cudnn_status_), #expr, \
                    ::colossal::ops::cuda::cudnn_last_error());                                       \
    }                                                                                                 \
  } while (0)

namespace colossal::ops::cuda {

/// Exclusive use of `device`'s cuDNN handle for a scope, bound to the device's current stream.
/// There is one handle per device rather than per thread: a handle carries its stream, so threads
/// that drive the same device take turns, holding the lock only while cuDNN enqueues work (it never
/// waits for the GPU). The handle lives until the process ends; destroying it during static
/// teardown would race the CUDA runtime's own shutdown. Do not nest two on one device.
class CudnnHandle {
 public:
  explicit CudnnHandle(core::Device device);
  CudnnHandle(const CudnnHandle&) = delete;
  CudnnHandle& operator=(const CudnnHandle&) = delete;

  cudnnHandle_t get() const { return handle_; }

 private:
  std::unique_lock<std::mutex> lock_;
  cudnnHandle_t handle_ = nullptr;
};

}  // namespace colossal::ops::cuda
