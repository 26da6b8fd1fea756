// The versions of the vendor libraries the ops run on, as loaded at run time (what `colossal info`
// prints): OpenBLAS on the CPU; cuBLASLt and cuDNN in CUDA builds.
#pragma once

#include <string>

namespace colossal::ops {

/// "OpenBLAS 0.3.21 ... (2 threads)".
std::string blas_version();
/// cuBLASLt's version ("13.0.2"), or "not built" without CUDA.
std::string cublaslt_version();
/// cuDNN's version ("9.14.0"), or "not built" without CUDA.
std::string cudnn_version();

}  // namespace colossal::ops
