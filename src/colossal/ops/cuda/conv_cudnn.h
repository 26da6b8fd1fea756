// How the CUDA conv2d kernels (conv_kernels.cu) reach cuDNN. bf16/f16 convolutions go through
// cuDNN's backend graph API with execution plans cached per shape (cudnn_graph.h): ~10 us of host
// time per call where the legacy API spends ~140 us (it rebuilds the same machinery on every call),
// which made ResNet-50 training host-bound. f32 and f64 (strict-precision math types the backend
// does not expose), batches split for 32-bit indexing, misaligned pointers and graphs cuDNN declines
// stay on the legacy API.
#pragma once

#include <atomic>
#include <cstdint>

namespace colossal::ops::cuda {

/// Whether bf16/f16 convolutions may use the graph API (the default), or all use the legacy API.
/// The environment variable COLOSSAL_CUDNN_CONV_GRAPH=0 sets the default off.
void set_conv_graph_enabled(bool enabled);
bool conv_graph_enabled();

/// Convolution passes (forward, backward data, backward filter) that ran through the graph API.
inline std::atomic<int64_t> conv_graph_counter{0};

}  // namespace colossal::ops::cuda
