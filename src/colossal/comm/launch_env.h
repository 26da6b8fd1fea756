// The environment variables through which a launcher tells each rank its place in the job: the
// names `colossal run` (cli/run.cpp) sets and bootstrap (comm/bootstrap.cpp) reads, named once here
// with who sets each and who reads it, along with torchrun's, Open MPI's and Slurm's that bootstrap
// also understands.
#pragma once

#include <string_view>

namespace colossal::comm::env {

// ---- torchrun's names, which `colossal run` sets too --------------------------------------------
// Set by `colossal run` (processes backend: per rank; mpi backend: its shell step derives the
// per-rank ones from Open MPI's below) and by torchrun; read by bootstrap (parse_dist_env), where
// COLOSSAL_LAUNCHER tells ours from torchrun's.

inline constexpr std::string_view kRank = "RANK";                        ///< global rank, 0 to WORLD_SIZE - 1
inline constexpr std::string_view kLocalRank = "LOCAL_RANK";             ///< rank on this node; picks the GPU
inline constexpr std::string_view kWorldSize = "WORLD_SIZE";             ///< ranks in the job
inline constexpr std::string_view kLocalWorldSize = "LOCAL_WORLD_SIZE";  ///< ranks on this node
/// This node's index (--node_rank). Set for programs that want it; bootstrap does not need it.
inline constexpr std::string_view kGroupRank = "GROUP_RANK";
inline constexpr std::string_view kMasterAddr = "MASTER_ADDR";  ///< host of rank 0 (the TCP rendezvous)
/// Port on MASTER_ADDR: the rendezvous binds it under our launcher, MASTER_PORT + 1 under torchrun
/// (Note [Rendezvous port under torchrun] in bootstrap.cpp). Also read under Open MPI and Slurm
/// when a user sets it.
inline constexpr std::string_view kMasterPort = "MASTER_PORT";

// ---- ours alone ---------------------------------------------------------------------------------

/// "1" in every rank `colossal run` starts: bootstrap then reads the variables above as ours
/// (EnvSource::launcher) even when Open MPI's are present too (the mpi backend).
inline constexpr std::string_view kColossalLauncher = "COLOSSAL_LAUNCHER";
/// Which backend started the ranks: "processes" or "mpi" (cli::to_string(LaunchBackend)). Set by
/// `colossal run` for the ranks' programs and tests; nothing in the library branches on it.
inline constexpr std::string_view kLaunchBackend = "COLOSSAL_LAUNCH_BACKEND";
/// Names the job for the TCP rendezvous (comm/tcp_rendezvous.h, RendezvousOptions::job_id): rank 0
/// turns away a rank whose job id differs. Set by the user (any text, the same in every rank), else
/// by `colossal run` on one node (a fresh id per launch; Note [A job id per launch] in cli/run.cpp);
/// read by bootstrap (DistEnv::job_id), where it wins over the launchers' own ids below.
inline constexpr std::string_view kColossalJobId = "COLOSSAL_JOB_ID";
/// Seconds the TCP rendezvous waits for the other ranks (default 300). Set by the user; read by
/// comm/tcp_rendezvous.cpp (default_rendezvous_timeout).
inline constexpr std::string_view kRendezvousTimeout = "COLOSSAL_RENDEZVOUS_TIMEOUT";

/// Seconds any collective or send/recv may stay outstanding before the rank ends with a message
/// naming it (comm/watchdog.h; default 300). Set by the user (or a test); read when a world group is
/// made (comm/timeout.cpp, resolve_collective_timeout), where it overrides the program's choice:
/// parallel.timeout_s under `colossal train`, InitOptions::timeout elsewhere.
inline constexpr std::string_view kCollectiveTimeout = "COLOSSAL_COLLECTIVE_TIMEOUT";

/// OpenMP threads per rank: `colossal run` sets cores / local ranks unless the user has; libgomp
/// reads it.
inline constexpr std::string_view kOmpNumThreads = "OMP_NUM_THREADS";

/// torchrun's run id (--rdzv-id; a fresh one per --standalone run): the job id under torchrun.
inline constexpr std::string_view kTorchelasticRunId = "TORCHELASTIC_RUN_ID";

// ---- Open MPI's (mpirun sets them in every rank) -------------------------------------------------
// Read by bootstrap (EnvSource::openmpi) and by `colossal run`'s shell step under the mpi backend,
// which copies them into RANK, LOCAL_RANK, WORLD_SIZE and LOCAL_WORLD_SIZE.

inline constexpr std::string_view kOmpiRank = "OMPI_COMM_WORLD_RANK";
inline constexpr std::string_view kOmpiSize = "OMPI_COMM_WORLD_SIZE";
inline constexpr std::string_view kOmpiLocalRank = "OMPI_COMM_WORLD_LOCAL_RANK";
inline constexpr std::string_view kOmpiLocalSize = "OMPI_COMM_WORLD_LOCAL_SIZE";

// ---- Slurm's (srun sets them in every task; read by bootstrap, EnvSource::slurm) ------------------

inline constexpr std::string_view kSlurmProcId = "SLURM_PROCID";    ///< global rank
inline constexpr std::string_view kSlurmNtasks = "SLURM_NTASKS";    ///< ranks in the step
inline constexpr std::string_view kSlurmLocalId = "SLURM_LOCALID";  ///< rank on this node
inline constexpr std::string_view kSlurmNodeId = "SLURM_NODEID";    ///< this node's index in the lists below
/// Tasks per node as "2(x3),1", for the step and for the job; the first set is used.
inline constexpr std::string_view kSlurmStepTasksPerNode = "SLURM_STEP_TASKS_PER_NODE";
inline constexpr std::string_view kSlurmTasksPerNode = "SLURM_TASKS_PER_NODE";
inline constexpr std::string_view kSlurmNtasksPerNode = "SLURM_NTASKS_PER_NODE";  ///< from --ntasks-per-node
/// Host lists ("gpu-[003-004]"); the first host is rank 0's when MASTER_ADDR is not set.
inline constexpr std::string_view kSlurmStepNodeList = "SLURM_STEP_NODELIST";
inline constexpr std::string_view kSlurmJobNodeList = "SLURM_JOB_NODELIST";
inline constexpr std::string_view kSlurmNodeList = "SLURM_NODELIST";
/// The job's id, from which bootstrap picks a MASTER_PORT when none is set; with the step's id, the
/// job id of the rendezvous (DistEnv::job_id).
inline constexpr std::string_view kSlurmJobId = "SLURM_JOB_ID";
inline constexpr std::string_view kSlurmStepId = "SLURM_STEP_ID";

}  // namespace colossal::comm::env
