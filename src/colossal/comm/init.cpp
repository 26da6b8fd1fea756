// Chooses and starts the world group's backend (comm/init.h).
#include "colossal/comm/init.h"

#include "colossal/core/build_config.h"
#include "colossal/core/cuda_device.h"  // is_available, device_count

#if COLOSSAL_WITH_MPI
#include "colossal/comm/mpi/mpi_process_group.h"
#endif
#if COLOSSAL_WITH_NCCL
#include "colossal/comm/nccl/nccl_process_group.h"
#endif

namespace colossal::comm {

std::string_view backend_name(Backend backend) {
  switch (backend) {
    case Backend::automatic:
      return "auto";
    case Backend::mpi:
      return "mpi";
    case Backend::nccl:
      return "nccl";
  }
  return "?";
}

Backend parse_backend(std::string_view name) {
  if (name == "auto") return Backend::automatic;
  if (name == "mpi") return Backend::mpi;
  if (name == "nccl") return Backend::nccl;
  COLOSSAL_FAIL("unknown communication backend '{}'; valid: auto, mpi, nccl", name);
}

bool backend_available(Backend backend) {
  switch (backend) {
    case Backend::mpi:
      return COLOSSAL_WITH_MPI;
    case Backend::nccl:
      return COLOSSAL_WITH_NCCL && core::cuda::is_available();
    case Backend::automatic:
      return backend_available(Backend::mpi) || backend_available(Backend::nccl);
  }
  return false;
}

namespace {

std::shared_ptr<ProcessGroup> init_mpi(const DistEnv& env) {
#if COLOSSAL_WITH_MPI
  auto world = MpiProcessGroup::create_world();
  // The MPI world is whatever mpirun started; a torchrun or launcher job (no mpirun) gets a world of 1.
  COLOSSAL_CHECK(world->size() == env.world_size && world->rank() == env.rank,
                 "the mpi backend found rank {} of {} in MPI_COMM_WORLD, but the {} environment says rank {} of {}; "
                 "the mpi backend needs its ranks started by mpirun (or srun with MPI): start the job with mpirun, "
                 "or use the nccl backend with GPUs",
                 world->rank(), world->size(), env_source_name(env.source), env.rank, env.world_size);
  return world;
#else
  COLOSSAL_FAIL(
      "the mpi backend is not in this build: install Open MPI (libopenmpi-dev) and configure with -DCOLOSSAL_MPI=ON "
      "[{}]",
      env.describe());
#endif
}

std::shared_ptr<ProcessGroup> init_nccl(const InitOptions& options, const DistEnv& env) {
#if COLOSSAL_WITH_NCCL
  const int visible = core::cuda::device_count();
  COLOSSAL_CHECK(visible > 0, "the nccl backend needs a GPU, but none is visible (CUDA_VISIBLE_DEVICES?) [{}]",
                 env.describe());
  const int device = options.device >= 0 ? options.device : env.local_rank % visible;
  COLOSSAL_CHECK(device < visible, "the nccl backend was asked for cuda:{}, but {} GPU(s) are visible [{}]", device,
                 visible, env.describe());
  const auto timeout =
      options.rendezvous_timeout.count() > 0 ? options.rendezvous_timeout : default_rendezvous_timeout();
  return NcclProcessGroup::create_world(env, core::cuda_device(device), timeout);
#else
  COLOSSAL_FAIL(
      "the nccl backend is not in this build: it needs a CUDA build (-DCOLOSSAL_CUDA=ON) with NCCL found "
      "(NCCL_ROOT=<dir with include/nccl.h and lib/libnccl.so>) [{}]",
      env.describe());
#endif
}

std::shared_ptr<ProcessGroup> make_world(const InitOptions& options, const DistEnv& env) {
  switch (options.backend) {
    case Backend::mpi:
      return init_mpi(env);
    case Backend::nccl:
      return init_nccl(options, env);
    case Backend::automatic:
      break;
  }
  if (backend_available(Backend::nccl)) return init_nccl(options, env);
  if (backend_available(Backend::mpi)) return init_mpi(env);
  COLOSSAL_FAIL(
      "no communication backend can run here: this build has {} and {}; build with Open MPI (-DCOLOSSAL_MPI=ON) for "
      "CPU tensors, or run a CUDA build with NCCL on a machine with GPUs",
      COLOSSAL_WITH_NCCL ? "NCCL but no GPU is visible" : "no NCCL", COLOSSAL_WITH_MPI ? "MPI" : "no MPI");
}

}  // namespace

std::shared_ptr<ProcessGroup> init_process_group(const InitOptions& options, const DistEnv& env) {
  // Read before the world is made, so that a bad COLOSSAL_COLLECTIVE_TIMEOUT fails before the ranks
  // wait for each other.
  const std::chrono::milliseconds timeout = resolve_collective_timeout(options.timeout);
  std::shared_ptr<ProcessGroup> world = make_world(options, env);
  world->set_timeout(timeout);
  return world;
}

std::shared_ptr<ProcessGroup> init_process_group(Backend backend) {
  InitOptions options;
  options.backend = backend;
  return init_process_group(options, read_dist_env());
}

}  // namespace colossal::comm
