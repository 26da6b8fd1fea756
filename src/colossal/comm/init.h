// init_process_group: the world group of this job, on the backend this build and machine support
// (NCCL for GPUs, MPI for CPUs), bootstrapped from the launcher's environment (comm/bootstrap.h).
// Sub-groups come from the world's split()/new_group().
#pragma once

#include <chrono>
#include <memory>
#include <string_view>

#include "colossal/comm/bootstrap.h"
#include "colossal/comm/process_group.h"
#include "colossal/comm/timeout.h"  // kDefaultCollectiveTimeout

namespace colossal::comm {

enum class Backend {
  automatic,  ///< nccl where it is compiled in and a GPU is visible, else mpi
  mpi,        ///< CPU tensors over MPI; ranks must be started by mpirun (or srun with MPI)
  nccl,       ///< GPU tensors over NCCL, one GPU per rank
};
std::string_view backend_name(Backend backend);
/// "auto", "mpi" or "nccl"; throws naming the valid names.
Backend parse_backend(std::string_view name);
/// Whether this build and machine can run `backend` (automatic: any of them).
bool backend_available(Backend backend);

struct InitOptions {
  Backend backend = Backend::automatic;
  /// NCCL: the GPU this rank uses; -1 picks cuda:(local_rank % visible GPUs).
  int device = -1;
  /// NCCL outside MPI: how long the TCP rendezvous waits for every rank; zero means
  /// default_rendezvous_timeout() (COLOSSAL_RENDEZVOUS_TIMEOUT, else 300 s).
  std::chrono::milliseconds rendezvous_timeout{0};
  /// How long any operation of the world may stay outstanding before this rank ends with a message
  /// naming it (comm/watchdog.h); sub-groups inherit it. COLOSSAL_COLLECTIVE_TIMEOUT, when set,
  /// overrides it. `colossal train` passes parallel.timeout_s.
  std::chrono::milliseconds timeout = kDefaultCollectiveTimeout;
};

/// The world group, from this process's environment (read_dist_env()).
std::shared_ptr<ProcessGroup> init_process_group(Backend backend = Backend::automatic);
/// The world group for a given environment. Throws naming what is missing (a backend not compiled
/// in, no GPU for NCCL, an MPI world that does not match the environment's).
std::shared_ptr<ProcessGroup> init_process_group(const InitOptions& options, const DistEnv& env);

}  // namespace colossal::comm
