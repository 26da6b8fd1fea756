// Return-code checks for the CUDA runtime (internal: includes CUDA headers). Failures throw
// colossal::Error naming the call, the error and its description.
#pragma once

#include <cuda_runtime_api.h>

#include "colossal/core/error.h"

#define COLOSSAL_CUDA_CHECK(expr)                                                                          \
  do {                                                                                                     \
    const cudaError_t colossal_cuda_status_ = (expr);                                                      \
    if (colossal_cuda_status_ != cudaSuccess) [[unlikely]] {                                               \
      COLOSSAL_FAIL("CUDA error {} ({}) from {}", cudaGetErrorName(colossal_cuda_status_),                 \
                    cudaGetErrorString(colossal_cuda_status_), #expr);                                     \
    }                                                                                                      \
  } while (0)

/// After a kernel launch: catches bad launch configurations right away.
#define COLOSSAL_CUDA_CHECK_LAUNCH() COLOSSAL_CUDA_CHECK(cudaGetLastError())
