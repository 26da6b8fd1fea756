// `colossal run`: the launcher. Starts the ranks of a distributed job on this node with the
// environment every rank bootstraps from (RANK, WORLD_SIZE, MASTER_ADDR, ... as torchrun sets
// them), prefixes each line they print with "[rank N] ", and when one rank fails stops the others
// within seconds and reports which rank failed and how.
#pragma once

#include <string>
#include <string_view>
#include <vector>

namespace CLI {
class App;
}  // namespace CLI

namespace colossal::cli {

// Note [Launcher backends]
// `processes` starts one process per local rank itself, as torchrun does: each rank learns its
// place from RANK / LOCAL_RANK / WORLD_SIZE and meets the others at MASTER_ADDR:MASTER_PORT (NCCL's
// bootstrap on GPUs); with several nodes, run one launcher per node with --nnodes and --node_rank.
// `mpi` hands the ranks to one `mpirun -np N --oversubscribe --tag-output` instead, because an MPI
// rank must be started by mpirun to join the job (one started by hand is a world of its own): this
// is how CPU ranks talk. A small shell step sets RANK, LOCAL_RANK and WORLD_SIZE from Open MPI's
// OMPI_COMM_WORLD_* before running the command, so the program sees the same variables under
// both. mpirun's tags ("[1,2]<stdout>:") are rewritten to "[rank 2] "; when a rank fails, mpirun
// aborts the job itself, and the shell step tells the launcher which rank failed and how (Note
// [Naming the failed rank under mpirun] in run.cpp). `auto` picks mpi when no GPU is visible, this
// build has MPI and mpirun is on PATH, and processes otherwise. COLOSSAL_LAUNCH_BACKEND tells the
// ranks which one started them.
enum class LaunchBackend {
  kAuto,       ///< "auto": mpi without a GPU (when MPI is built in and mpirun found), else processes
  kProcesses,  ///< "processes": one child process per local rank
  kMpi,        ///< "mpi": all ranks under one mpirun (single node; more hosts through mpirun_args)
};

/// "auto", "processes", "mpi".
std::string_view to_string(LaunchBackend backend);

struct LaunchOptions {
  int nproc_per_node = 1;                 ///< ranks started on this node
  int nnodes = 1;                         ///< nodes in the job, each running its own launcher (processes)
  int node_rank = 0;                      ///< this node's index: its ranks are node_rank * nproc_per_node + local
  std::string master_addr = "127.0.0.1";  ///< where rank 0 listens for the others (MASTER_ADDR)
  int master_port = 29500;                ///< and on which port (MASTER_PORT)
  LaunchBackend backend = LaunchBackend::kAuto;
  /// After one rank fails (or on Ctrl-C) the others get SIGTERM, and SIGKILL this many seconds later
  /// if they are still running.
  double grace_seconds = 3;
  std::string mpirun = "mpirun";         ///< the mpirun program (searched on PATH) for the mpi backend
  std::vector<std::string> mpirun_args;  ///< extra mpirun arguments (e.g. "--bind-to", "none")
  int output_fd = 1;                     ///< where the ranks' prefixed stdout goes
  int error_fd = 2;                      ///< where their prefixed stderr and the launcher's messages go
};

struct LaunchResult {
  /// What `colossal run` exits with: 0 when every rank succeeded, else the failing rank's exit code
  /// (128 + signal when a signal killed it), 128 + signal when interrupted, 127 when a rank could
  /// not be started.
  int exit_code = 0;
  int failed_rank = -1;      ///< the first rank that failed; -1 when none did or it is unknown
  int rank_exit_code = 0;    ///< its exit code, when it exited
  int rank_signal = 0;       ///< the signal that killed it, when one did
  int ranks_stopped = 0;     ///< other ranks still running that the launcher stopped (processes backend)
  int interrupt_signal = 0;  ///< SIGINT / SIGTERM / SIGHUP that the launcher received and forwarded
  LaunchBackend backend = LaunchBackend::kProcesses;  ///< the backend that ran
  /// The summary written to error_fd, e.g. "colossal run: rank 2 exited with code 3; stopped the
  /// other 3 ranks"; empty on success.
  std::string message;
};

/// The backend `requested` means on this machine (auto resolved; others returned as they are).
LaunchBackend resolve_backend(LaunchBackend requested, const std::string& mpirun = "mpirun");

/// Runs `command` (program and arguments; the program is searched on PATH) as
/// options.nproc_per_node ranks and waits for them. Each rank gets stdin from /dev/null and the
/// environment: RANK, LOCAL_RANK, WORLD_SIZE, LOCAL_WORLD_SIZE, GROUP_RANK (the node rank),
/// MASTER_ADDR, MASTER_PORT, COLOSSAL_LAUNCHER=1, COLOSSAL_LAUNCH_BACKEND, COLOSSAL_JOB_ID (the
/// user's, else with nnodes = 1 a fresh one per launch: Note [A job id per launch] in run.cpp), and
/// OMP_NUM_THREADS = cores / local ranks unless already set. Every line a rank prints goes to output_fd (stdout) or
/// error_fd (stderr) as "[rank N] line", whole lines at a time. SIGINT, SIGTERM and SIGHUP received
/// meanwhile are forwarded to the ranks (a second one kills them); the handlers are process-wide,
/// so run one launch() at a time. Should the launcher die, even by SIGKILL, the ranks die with it
/// (Note [Children die with the launcher] in run.cpp): keep the calling thread alive until launch()
/// returns, as the kernel ties the ranks to it. Throws colossal::Error for bad options (no command, sizes out of
/// range, mpi without mpirun).
LaunchResult launch(const LaunchOptions& options, const std::vector<std::string>& command);

/// Registers `run` on app: `colossal run --nproc_per_node N [--nnodes --node_rank --master_addr
/// --master_port --backend] -- CMD ARGS...`. Its callback runs launch() and ends parsing with
/// CLI::RuntimeError(exit code) when a rank failed, so CLI11_PARSE returns that code.
CLI::App* add_run_command(CLI::App& app);

}  // namespace colossal::cli
