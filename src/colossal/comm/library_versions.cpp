// Library versions: see library_versions.h.
#include "colossal/comm/library_versions.h"

#include <fmt/format.h>

#include "colossal/core/build_config.h"

#if COLOSSAL_WITH_NCCL
#include <nccl.h>
#endif
#if COLOSSAL_WITH_MPI
#include <mpi.h>
#endif

namespace colossal::comm {

std::string nccl_version() {
#if COLOSSAL_WITH_NCCL
  int v = 0;
  if (ncclGetVersion(&v) != ncclSuccess) return "unknown (ncclGetVersion failed)";
  return fmt::format("{}.{}.{}", v / 10000, v / 100 % 100, v % 100);  // NCCL >= 2.9: major*10000+minor*100+patch
#else
  return "not built";
#endif
}

std::string mpi_version() {
#if COLOSSAL_WITH_MPI
  char text[MPI_MAX_LIBRARY_VERSION_STRING] = {};
  int length = 0;
  if (MPI_Get_library_version(text, &length) != MPI_SUCCESS) return "unknown";
  std::string version(text, static_cast<size_t>(length));
  if (const size_t end = version.find_first_of(",\n"); end != std::string::npos) version.resize(end);
  return version;
#else
  return "not built";
#endif
}

}  // namespace colossal::comm
