// The versions of the communication libraries compiled in, as loaded at run time (what
// `colossal info` prints).
#pragma once

#include <string>

namespace colossal::comm {

/// NCCL's version ("2.28.3"), or "not built".
std::string nccl_version();
/// The MPI library's own description (MPI_Get_library_version, first line), or "not built".
std::string mpi_version();

}  // namespace colossal::comm
