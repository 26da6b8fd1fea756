// Library versions: see library_versions.h.
#include "colossal/ops/library_versions.h"

#include <cblas.h>  // openblas_get_config, openblas_get_num_threads
#include <fmt/format.h>

#include "colossal/core/build_config.h"

#if COLOSSAL_WITH_CUDA
#include <cublasLt.h>
#include <cudnn.h>
#endif

namespace colossal::ops {

std::string blas_version() {
  return fmt::format("{} ({} threads)", openblas_get_config(), openblas_get_num_threads());
}

#if COLOSSAL_WITH_CUDA
std::string cublaslt_version() {
  const size_t v = cublasLtGetVersion();  // major * 10000 + minor * 100 + patch
  return fmt::format("{}.{}.{}", v / 10000, v / 100 % 100, v % 100);
}

std::string cudnn_version() {
  const size_t v = cudnnGetVersion();  // cuDNN 9: major * 10000 + minor * 100 + patch
  return fmt::format("{}.{}.{}", v / 10000, v / 100 % 100, v % 100);
}
#else
std::string cublaslt_version() {
  return "not built";
}
std::string cudnn_version() {
  return "not built";
}
#endif

}  // namespace colossal::ops
