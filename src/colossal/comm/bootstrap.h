// Bootstrap: which rank this process is, of how many, and where rank 0 listens, read from the
// environment the launcher left (our `colossal run`, torchrun, Open MPI's mpirun, Slurm's srun), plus
// the TCP rendezvous (comm/tcp_rendezvous.h) that hands rank 0's NCCL unique id to every rank.
#pragma once

#include <functional>
#include <map>
#include <optional>
#include <string>
#include <string_view>

#include "colossal/comm/tcp_rendezvous.h"  // tcp_rendezvous_broadcast, RendezvousOptions

namespace colossal::comm {

/// Who started this process. When several launchers' variables are present the first in this order
/// wins: launcher (COLOSSAL_LAUNCHER=1), torchrun (RANK or WORLD_SIZE set), openmpi
/// (OMPI_COMM_WORLD_RANK set: mpirun inside a Slurm allocation is Open MPI), slurm (SLURM_PROCID
/// set), else single (one process).
enum class EnvSource { single, launcher, torchrun, openmpi, slurm };
std::string_view env_source_name(EnvSource source);

struct DistEnv {
  /// This process's rank in the world, 0 <= rank < world_size.
  int rank = 0;
  /// Processes in the job.
  int world_size = 1;
  /// Rank among the processes on this node; picks the GPU (cuda:local_rank).
  int local_rank = 0;
  /// Processes on this node.
  int local_world_size = 1;
  /// Host of rank 0, where the TCP rendezvous listens.
  std::string master_addr = "127.0.0.1";
  /// Base port on master_addr; rendezvous_port() is the one the rendezvous binds.
  int master_port = 29500;
  EnvSource source = EnvSource::single;
  /// Names the job for the TCP rendezvous (RendezvousOptions::job_id): COLOSSAL_JOB_ID when set, else
  /// torchrun's TORCHELASTIC_RUN_ID, Slurm's SLURM_JOB_ID.SLURM_STEP_ID, or "" (our launcher and
  /// Open MPI set none).
  std::string job_id;

  /// The port the TCP rendezvous uses: master_port + 1 under torchrun, else master_port.
  /// See Note [Rendezvous port under torchrun] in bootstrap.cpp.
  int rendezvous_port() const;
  /// "rank 1 of 4 (local 1 of 2), from torchrun, rank 0 at node0:29500": for logs and messages.
  std::string describe() const;
};

/// Looks a variable up; nullopt when unset.
using EnvLookup = std::function<std::optional<std::string>(const std::string& name)>;

/// Reads a DistEnv from the variables `lookup` gives. Partial or inconsistent environments (RANK without
/// WORLD_SIZE, a rank outside the world, a port that is not a number) throw colossal::Error naming the
/// variables and what would be valid.
DistEnv parse_dist_env(const EnvLookup& lookup);
/// The same over a map (tests, or a launcher preparing a child's environment).
DistEnv parse_dist_env(const std::map<std::string, std::string>& variables);
/// The same over this process's environment.
DistEnv read_dist_env();

/// The first host of a Slurm host list: "gpu-[003-004,007],login1" -> "gpu-003".
std::string first_slurm_host(std::string_view host_list);

}  // namespace colossal::comm
