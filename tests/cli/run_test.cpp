// Tests of `colossal run` (cli/run.h) on `sh -c` ranks: the environment each rank sees (and that
// bootstrap reads it back), "[rank N] " prefixes on whole lines, the job stopped within seconds when
// one rank fails (exit code, signal, a rank that ignores SIGTERM), Ctrl-C forwarded, a program that
// cannot start, option errors, the command line, the job dying with a SIGKILLed launcher, and the
// same under mpirun when Open MPI is installed.
#include "colossal/cli/run.h"

#include <fcntl.h>
#include <fmt/format.h>
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <map>
#include <optional>
#include <regex>
#include <set>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "colossal/comm/bootstrap.h"     // parse_dist_env: what the ranks read
#include "colossal/comm/launch_env.h"    // the variables' names
#include "colossal/core/build_config.h"  // COLOSSAL_WITH_MPI
#include "colossal/core/cuda_device.h"   // is_available
#include "colossal/core/error.h"

namespace colossal::cli {
namespace {

struct Captured {
  LaunchResult result;
  std::vector<std::string> out;  ///< lines the ranks printed on stdout, as relayed
  std::vector<std::string> err;  ///< their stderr lines and the launcher's messages
  double seconds = 0;
};

std::vector<std::string> read_lines(std::FILE* file) {
  std::fflush(file);
  std::rewind(file);
  std::vector<std::string> lines;
  std::string line;
  for (int c; (c = std::fgetc(file)) != EOF;) {
    if (c == '\n') {
      lines.push_back(line);
      line.clear();
    } else {
      line += static_cast<char>(c);
    }
  }
  if (!line.empty()) lines.push_back(line + "<no newline>");
  return lines;
}

/// Runs the launcher with its output captured in temporary files.
Captured run_launcher(LaunchOptions options, const std::vector<std::string>& command) {
  std::FILE* out = std::tmpfile();
  std::FILE* err = std::tmpfile();
  options.output_fd = fileno(out);
  options.error_fd = fileno(err);
  Captured run;
  const auto start = std::chrono::steady_clock::now();
  run.result = launch(options, command);
  run.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  run.out = read_lines(out);
  run.err = read_lines(err);
  std::fclose(out);
  std::fclose(err);
  return run;
}

LaunchOptions processes(int nproc) {
  LaunchOptions o;
  o.nproc_per_node = nproc;
  o.backend = LaunchBackend::kProcesses;
  return o;
}

std::vector<std::string> sh(const std::string& script) {
  return {"sh", "-c", script};
}

std::multiset<std::string> as_set(const std::vector<std::string>& lines) {
  return {lines.begin(), lines.end()};
}

bool contains(const std::vector<std::string>& lines, const std::string& text) {
  return std::any_of(lines.begin(), lines.end(),
                     [&](const std::string& l) { return l.find(text) != std::string::npos; });
}

std::string joined(const std::vector<std::string>& lines) {
  std::ostringstream s;
  for (const std::string& l : lines) s << l << "\n";
  return s.str();
}

// How long a stopped job may take: ranks are told within 50 ms of the failure (the poll interval)
// and killed after the grace period (3 s by default); 10 s leaves room for a loaded CI machine
// while still failing a launcher that waits for the 60 s sleeps.
constexpr double kStopBoundSeconds = 10;

// ---- processes backend ---------------------------------------------------------------------------

TEST(RunProcesses, AllRanksSucceedAndEveryLineIsPrefixed) {
  const Captured run = run_launcher(processes(3), sh("echo \"hello from $RANK\"; echo \"warning $RANK\" >&2"));
  EXPECT_EQ(run.result.exit_code, 0);
  EXPECT_EQ(run.result.failed_rank, -1);
  EXPECT_EQ(run.result.message, "");
  EXPECT_EQ(as_set(run.out),
            (std::multiset<std::string>{"[rank 0] hello from 0", "[rank 1] hello from 1", "[rank 2] hello from 2"}));
  EXPECT_EQ(as_set(run.err),
            (std::multiset<std::string>{"[rank 0] warning 0", "[rank 1] warning 1", "[rank 2] warning 2"}));
}

TEST(RunProcesses, RanksSeeTheirPlaceInTheJob) {
  LaunchOptions o = processes(2);
  o.nnodes = 2;
  o.node_rank = 1;
  o.master_addr = "10.0.0.7";
  o.master_port = 12345;
  const Captured run = run_launcher(o, sh("echo \"$RANK $LOCAL_RANK $WORLD_SIZE $LOCAL_WORLD_SIZE $GROUP_RANK "
                                          "$MASTER_ADDR $MASTER_PORT $COLOSSAL_LAUNCHER $COLOSSAL_LAUNCH_BACKEND\""));
  EXPECT_EQ(run.result.exit_code, 0) << joined(run.err);
  // The second node's ranks are 2 and 3 of 4.
  EXPECT_EQ(as_set(run.out), (std::multiset<std::string>{"[rank 2] 2 0 4 2 1 10.0.0.7 12345 1 processes",
                                                         "[rank 3] 3 1 4 2 1 10.0.0.7 12345 1 processes"}));
}

TEST(RunProcesses, LinesFromManyRanksNeverInterleave) {
  // Each rank writes 2000 long lines as fast as it can, in pieces (printf per field), so the
  // launcher reads partial lines from every pipe; each relayed line must be one rank's whole line.
  const Captured run = run_launcher(
      processes(4),
      sh("i=0; while [ $i -lt 2000 ]; do printf 'rank %s ' $RANK; printf 'line %s ' $i; "
         "printf '%s\\n' xxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxx; i=$((i+1)); done"));
  EXPECT_EQ(run.result.exit_code, 0);
  ASSERT_EQ(run.out.size(), 4u * 2000u);
  const std::regex whole(R"(\[rank (\d)\] rank \1 line \d+ x{63})");
  for (const std::string& line : run.out) ASSERT_TRUE(std::regex_match(line, whole)) << line;
}

TEST(RunProcesses, ALastLineWithoutNewlineIsStillRelayed) {
  const Captured run = run_launcher(processes(1), sh("printf 'no newline'"));
  EXPECT_EQ(run.out, (std::vector<std::string>{"[rank 0] no newline"}));
}

TEST(RunProcesses, OneFailingRankStopsTheOthersWithinSeconds) {
  const Captured run =
      run_launcher(processes(4), sh("if [ \"$RANK\" = 2 ]; then sleep 0.2; echo bye >&2; exit 3; fi; sleep 60"));
  EXPECT_LT(run.seconds, kStopBoundSeconds);
  EXPECT_EQ(run.result.exit_code, 3);
  EXPECT_EQ(run.result.failed_rank, 2);
  EXPECT_EQ(run.result.rank_exit_code, 3);
  EXPECT_EQ(run.result.ranks_stopped, 3);
  EXPECT_EQ(run.result.message, "colossal run: rank 2 exited with code 3; stopped the other 3 ranks");
  EXPECT_TRUE(contains(run.err, "[rank 2] bye"));
  EXPECT_EQ(run.err.back(), run.result.message);
}

TEST(RunProcesses, ARankIgnoringSigtermIsKilledAfterTheGracePeriod) {
  char dir[] = "/tmp/colossal_run_test_XXXXXX";
  ASSERT_NE(::mkdtemp(dir), nullptr);
  LaunchOptions o = processes(3);
  o.grace_seconds = 0.5;
  // Ranks 1 and 2 ignore SIGTERM (so does their sleep: ignored signals survive exec) and say so
  // with a file; rank 0 fails once both are ready.
  const Captured run = run_launcher(
      o, {"sh", "-c",
          "if [ \"$RANK\" = 0 ]; then while [ $(ls \"$0\" | wc -l) -lt 2 ]; do sleep 0.05; done; exit 1; fi; "
          "trap '' TERM; touch \"$0/ready.$RANK\"; sleep 60",
          dir});
  std::filesystem::remove_all(dir);
  EXPECT_GE(run.seconds, 0.5);
  EXPECT_LT(run.seconds, kStopBoundSeconds);
  EXPECT_EQ(run.result.exit_code, 1);
  EXPECT_EQ(run.result.message, "colossal run: rank 0 exited with code 1; stopped the other 2 ranks");
}

TEST(RunProcesses, ARankKilledByASignalIsNamed) {
  const Captured run = run_launcher(processes(2), sh("if [ \"$RANK\" = 1 ]; then kill -SEGV $$; fi; sleep 60"));
  EXPECT_LT(run.seconds, kStopBoundSeconds);
  EXPECT_EQ(run.result.exit_code, 128 + SIGSEGV);
  EXPECT_EQ(run.result.failed_rank, 1);
  EXPECT_EQ(run.result.rank_signal, SIGSEGV);
  EXPECT_EQ(run.result.message,
            "colossal run: rank 1 was killed by SIGSEGV (Segmentation fault); stopped the other 1 rank");
}

TEST(RunProcesses, InterruptIsForwardedToTheRanks) {
  // Ctrl-C reaches the launcher alone (the ranks have their own process groups); it passes it on.
  std::thread interrupter([] {
    std::this_thread::sleep_for(std::chrono::milliseconds(300));
    ::kill(::getpid(), SIGINT);
  });
  const Captured run = run_launcher(processes(2), sh("echo started; sleep 60"));
  interrupter.join();
  EXPECT_LT(run.seconds, kStopBoundSeconds);
  EXPECT_EQ(run.result.interrupt_signal, SIGINT);
  EXPECT_EQ(run.result.exit_code, 128 + SIGINT);
  EXPECT_EQ(run.result.message, "colossal run: interrupted by SIGINT; stopped 2 ranks");
}

TEST(RunProcesses, AProgramThatCannotStartIsReported) {
  const Captured run = run_launcher(processes(2), {"/nonexistent/program", "x"});
  EXPECT_EQ(run.result.exit_code, 127);
  EXPECT_EQ(run.result.failed_rank, 0);
  EXPECT_EQ(run.result.message,
            "colossal run: cannot start rank 0: /nonexistent/program: No such file or directory; no other rank was "
            "running");
}

TEST(RunOptions, BadOptionsAreRejectedBeforeAnythingStarts) {
  const auto message = [](LaunchOptions o, std::vector<std::string> command) -> std::string {
    try {
      launch(o, command);
    } catch (const Error& e) {
      return e.what();
    }
    return "";
  };
  EXPECT_EQ(message(processes(0), sh("true")), "--nproc_per_node = 0 must be at least 1");
  EXPECT_EQ(message(processes(1), {}),
            "no command to run: give it after --, e.g. colossal run --nproc_per_node 2 -- CMD");
  LaunchOptions o = processes(1);
  o.nnodes = 2;
  o.node_rank = 2;
  EXPECT_EQ(message(o, sh("true")), "--node_rank = 2 must be between 0 and --nnodes - 1 = 1");
  o.node_rank = 0;
  o.master_port = 70000;
  EXPECT_EQ(message(o, sh("true")), "--master_port = 70000 must be between 1 and 65535");
}

TEST(RunOptions, AutoPicksMpiOnlyWithoutAGpu) {
  const bool has_mpirun = ::access("/usr/bin/mpirun", X_OK) == 0 || ::system("command -v mpirun >/dev/null") == 0;
  const LaunchBackend expected =
      COLOSSAL_WITH_MPI && has_mpirun && !core::cuda::is_available() ? LaunchBackend::kMpi : LaunchBackend::kProcesses;
  EXPECT_EQ(resolve_backend(LaunchBackend::kAuto), expected);
  EXPECT_EQ(resolve_backend(LaunchBackend::kAuto, "/nonexistent/mpirun"), LaunchBackend::kProcesses);
  EXPECT_EQ(resolve_backend(LaunchBackend::kProcesses), LaunchBackend::kProcesses);
}

// ---- the command line ----------------------------------------------------------------------------

int parse_run(std::vector<std::string> args) {
  CLI::App app{"colossal"};
  app.require_subcommand(1);
  add_run_command(app);
  args.insert(args.begin(), "colossal");
  std::vector<char*> argv;
  for (std::string& a : args) argv.push_back(a.data());
  try {
    app.parse(static_cast<int>(argv.size()), argv.data());
  } catch (const CLI::ParseError& e) {
    return e.get_exit_code();
  }
  return 0;
}

TEST(RunCommand, ExitsWithTheFailingRanksCode) {
  EXPECT_EQ(parse_run({"run", "--nproc_per_node", "2", "--backend", "processes", "--", "sh", "-c", "exit 0"}), 0);
  EXPECT_EQ(parse_run({"run", "--nproc-per-node=2", "--backend=processes", "--grace", "1", "--", "sh", "-c",
                       "if [ $RANK = 1 ]; then exit 5; fi; sleep 60"}),
            5);
  EXPECT_NE(parse_run({"run", "--backend", "nccl", "--", "true"}), 0);  // not a backend
  EXPECT_NE(parse_run({"run", "--nproc_per_node", "2"}), 0);            // no command
}

// ---- mpi backend ---------------------------------------------------------------------------------

LaunchOptions mpi(int nproc) {
  LaunchOptions o;
  o.nproc_per_node = nproc;
  o.backend = LaunchBackend::kMpi;
  return o;
}

bool have_mpirun() {
  return resolve_backend(LaunchBackend::kAuto) == LaunchBackend::kMpi ||
         ::system("command -v mpirun >/dev/null 2>&1") == 0;
}

TEST(RunMpi, RanksGetOurVariablesAndPrefixedLines) {
  if (!have_mpirun()) GTEST_SKIP() << "no mpirun on PATH";
  const Captured run =
      run_launcher(mpi(3), sh("echo \"r=$RANK l=$LOCAL_RANK w=$WORLD_SIZE b=$COLOSSAL_LAUNCH_BACKEND m=$MASTER_PORT\"; "
                              "echo \"e$RANK\" >&2; printf 'partial '; sleep 0.1; echo \"line of $RANK\"; echo; "
                              "echo \"[1,$RANK] [x]<\""));
  EXPECT_EQ(run.result.exit_code, 0) << joined(run.err);
  EXPECT_EQ(run.result.backend, LaunchBackend::kMpi);
  EXPECT_EQ(as_set(run.out), (std::multiset<std::string>{
                                 "[rank 0] r=0 l=0 w=3 b=mpi m=29500", "[rank 1] r=1 l=1 w=3 b=mpi m=29500",
                                 "[rank 2] r=2 l=2 w=3 b=mpi m=29500", "[rank 0] partial line of 0",
                                 "[rank 1] partial line of 1", "[rank 2] partial line of 2", "[rank 0] ", "[rank 1] ",
                                 "[rank 2] ", "[rank 0] [1,0] [x]<", "[rank 1] [1,1] [x]<", "[rank 2] [1,2] [x]<"}));
  EXPECT_EQ(as_set(run.err), (std::multiset<std::string>{"[rank 0] e0", "[rank 1] e1", "[rank 2] e2"}));
}

TEST(RunMpi, ARankPrintingATagWithAHugeRankIsRelayedAsText) {
  // Text that looks like mpirun's tag but names a rank past int: relayed, not parsed (std::stoi
  // threw std::out_of_range out of the launcher).
  if (!have_mpirun()) GTEST_SKIP() << "no mpirun on PATH";
  const Captured run = run_launcher(mpi(2), sh("echo \"[1,99999999999]<stdout>:x$RANK\""));
  EXPECT_EQ(run.result.exit_code, 0) << joined(run.err);
  EXPECT_EQ(as_set(run.out),
            (std::multiset<std::string>{"[rank 0] [1,99999999999]<stdout>:x0", "[rank 1] [1,99999999999]<stdout>:x1"}));
}

TEST(RunMpi, OneFailingRankEndsTheJobAndIsNamed) {
  if (!have_mpirun()) GTEST_SKIP() << "no mpirun on PATH";
  const Captured run = run_launcher(mpi(3), sh("if [ \"$RANK\" = 1 ]; then sleep 0.2; exit 3; fi; sleep 60"));
  EXPECT_LT(run.seconds, kStopBoundSeconds);
  EXPECT_EQ(run.result.exit_code, 3) << joined(run.err);
  EXPECT_EQ(run.result.failed_rank, 1);
  EXPECT_EQ(run.result.rank_exit_code, 3);
  EXPECT_EQ(run.result.message, "colossal run: rank 1 exited with code 3; mpirun stopped the other ranks");
  EXPECT_EQ(run.err.back(), run.result.message);
}

TEST(RunMpi, ARankKilledByASignalIsNamed) {
  // Open MPI's own report leaves this rank unnamed; the launcher's status files name it.
  if (!have_mpirun()) GTEST_SKIP() << "no mpirun on PATH";
  const Captured run = run_launcher(mpi(3), sh("if [ \"$RANK\" = 2 ]; then kill -SEGV $$; fi; sleep 60"));
  EXPECT_LT(run.seconds, kStopBoundSeconds);
  EXPECT_EQ(run.result.exit_code, 128 + SIGSEGV) << joined(run.err);
  EXPECT_EQ(run.result.failed_rank, 2);
  EXPECT_EQ(run.result.rank_signal, SIGSEGV);
  EXPECT_EQ(run.result.message,
            "colossal run: rank 2 was killed by SIGSEGV (Segmentation fault); mpirun stopped the other ranks");
}

TEST(RunMpi, MoreThanOneNodeNeedsTheProcessesBackendOrAHostfile) {
  LaunchOptions o = mpi(2);
  o.nnodes = 2;
  EXPECT_THROW(launch(o, sh("true")), Error);
}

// ---- what the ranks bootstrap from ----------------------------------------------------------------

/// Each rank's environment, from the "[rank N] NAME=value" lines that `env` printed.
std::map<int, std::map<std::string, std::string>> rank_environments(const std::vector<std::string>& lines) {
  static const std::regex line(R"(^\[rank (\d+)\] ([A-Za-z_][A-Za-z0-9_]*)=(.*)$)");
  std::map<int, std::map<std::string, std::string>> environments;
  std::smatch m;
  for (const std::string& l : lines) {
    if (std::regex_match(l, m, line)) environments[std::stoi(m[1].str())][m[2].str()] = m[3].str();
  }
  return environments;
}

/// Every rank reads back, through bootstrap (comm/bootstrap.h), the place the launcher gave it.
void expect_ranks_bootstrap_from_the_launcher(const LaunchOptions& options, std::string_view backend) {
  const Captured run = run_launcher(options, {"env"});
  ASSERT_EQ(run.result.exit_code, 0) << joined(run.err);
  const auto environments = rank_environments(run.out);
  ASSERT_EQ(environments.size(), static_cast<size_t>(options.nproc_per_node)) << joined(run.out);
  for (const auto& [rank, variables] : environments) {
    const comm::DistEnv env = comm::parse_dist_env(variables);
    EXPECT_EQ(env.source, comm::EnvSource::launcher) << env.describe();
    EXPECT_EQ(env.rank, rank);
    EXPECT_EQ(env.local_rank, rank);
    EXPECT_EQ(env.world_size, options.nproc_per_node);
    EXPECT_EQ(env.local_world_size, options.nproc_per_node);
    EXPECT_EQ(env.master_port, options.master_port);
    EXPECT_EQ(variables.at(std::string(comm::env::kLaunchBackend)), backend);
    // One job id, the launcher's, in every rank (the TCP rendezvous compares them).
    EXPECT_FALSE(env.job_id.empty());
    EXPECT_EQ(env.job_id, comm::parse_dist_env(environments.begin()->second).job_id);
  }
}

TEST(RunProcesses, RanksBootstrapFromWhatTheLauncherSets) {
  LaunchOptions o = processes(2);
  o.master_port = 29611;
  expect_ranks_bootstrap_from_the_launcher(o, "processes");
}

TEST(RunMpi, RanksBootstrapFromWhatTheLauncherSets) {
  if (!have_mpirun()) GTEST_SKIP() << "no mpirun on PATH";
  LaunchOptions o = mpi(2);
  o.master_port = 29612;
  expect_ranks_bootstrap_from_the_launcher(o, "mpi");
}

// ---- the job id (Note [A job id per launch] in run.cpp) ---------------------------------------------

/// The COLOSSAL_JOB_ID each rank saw, by rank.
std::map<int, std::string> job_ids(const LaunchOptions& options) {
  const Captured run = run_launcher(options, sh("echo \"id=$COLOSSAL_JOB_ID\""));
  EXPECT_EQ(run.result.exit_code, 0) << joined(run.err);
  static const std::regex line(R"(^\[rank (\d+)\] id=(.*)$)");
  std::map<int, std::string> ids;
  std::smatch m;
  for (const std::string& l : run.out) {
    if (std::regex_match(l, m, line)) ids[std::stoi(m[1].str())] = m[2].str();
  }
  return ids;
}

/// Sets or unsets an environment variable for one scope.
class ScopedVariable {
 public:
  ScopedVariable(std::string_view name, const char* value) : name_(name) {
    if (const char* old = std::getenv(name_.c_str())) old_ = old;
    if (value != nullptr) {
      ::setenv(name_.c_str(), value, 1);
    } else {
      ::unsetenv(name_.c_str());
    }
  }
  ~ScopedVariable() {
    if (old_) {
      ::setenv(name_.c_str(), old_->c_str(), 1);
    } else {
      ::unsetenv(name_.c_str());
    }
  }
  ScopedVariable(const ScopedVariable&) = delete;
  ScopedVariable& operator=(const ScopedVariable&) = delete;

 private:
  std::string name_;
  std::optional<std::string> old_;
};

TEST(RunProcesses, EachLaunchGivesItsRanksOneFreshJobId) {
  const ScopedVariable unset(comm::env::kColossalJobId, nullptr);
  const std::map<int, std::string> first = job_ids(processes(3)), second = job_ids(processes(3));
  ASSERT_EQ(first.size(), 3u);
  ASSERT_EQ(second.size(), 3u);
  EXPECT_FALSE(first.at(0).empty());
  for (const auto& [rank, id] : first) EXPECT_EQ(id, first.at(0)) << "rank " << rank;
  for (const auto& [rank, id] : second) EXPECT_EQ(id, second.at(0)) << "rank " << rank;
  EXPECT_NE(first.at(0), second.at(0)) << "two launches share a job id";
}

TEST(RunProcesses, TheUsersJobIdIsPassedOn) {
  const ScopedVariable user(comm::env::kColossalJobId, "my-job-7");
  EXPECT_EQ(job_ids(processes(2)), (std::map<int, std::string>{{0, "my-job-7"}, {1, "my-job-7"}}));
  // Several nodes, one launcher each: the user's id is what they share.
  LaunchOptions o = processes(2);
  o.nnodes = 2;
  o.node_rank = 1;
  EXPECT_EQ(job_ids(o), (std::map<int, std::string>{{2, "my-job-7"}, {3, "my-job-7"}}));
}

TEST(RunProcesses, SeveralNodesMakeNoJobIdOfTheirOwn) {
  // Each node's launcher would make a different one and the rendezvous would turn the other
  // nodes' ranks away.
  const ScopedVariable unset(comm::env::kColossalJobId, nullptr);
  LaunchOptions o = processes(2);
  o.nnodes = 2;
  EXPECT_EQ(job_ids(o), (std::map<int, std::string>{{0, ""}, {1, ""}}));
}

TEST(RunMpi, RanksGetOneFreshJobId) {
  if (!have_mpirun()) GTEST_SKIP() << "no mpirun on PATH";
  const ScopedVariable unset(comm::env::kColossalJobId, nullptr);
  const std::map<int, std::string> first = job_ids(mpi(2)), second = job_ids(mpi(2));
  ASSERT_EQ(first.size(), 2u);
  ASSERT_EQ(second.size(), 2u);
  EXPECT_FALSE(first.at(0).empty());
  EXPECT_EQ(first.at(1), first.at(0));
  EXPECT_EQ(second.at(1), second.at(0));
  EXPECT_NE(first.at(0), second.at(0));
}

// ---- the launcher's death ------------------------------------------------------------------------
// `kill -9` of the launcher must take the job with it (Note [Children die with the launcher] in
// run.cpp). The launcher runs in a forked copy of this test, which is then killed; every process of
// the job carries a marker in its environment (mpirun passes ours on to the ranks), found by
// scanning /proc.

/// Reads a /proc file whole; empty when the process is gone or the file unreadable.
std::string read_proc_file(const std::filesystem::path& path) {
  std::FILE* file = std::fopen(path.c_str(), "rb");
  if (file == nullptr) return "";
  std::string text;
  char buffer[4096];
  for (size_t n; (n = std::fread(buffer, 1, sizeof buffer, file)) > 0;) text.append(buffer, n);
  std::fclose(file);
  return text;
}

/// Live (not zombie) processes whose environment holds `marker`, as "pid comm".
std::vector<std::pair<pid_t, std::string>> marked_processes(const std::string& marker) {
  std::vector<std::pair<pid_t, std::string>> found;
  std::error_code ec;
  for (const auto& entry : std::filesystem::directory_iterator("/proc", ec)) {
    const std::string name = entry.path().filename().string();
    if (name.empty() || !std::all_of(name.begin(), name.end(), [](char c) { return c >= '0' && c <= '9'; })) continue;
    const std::string environment = read_proc_file(entry.path() / "environ");
    if (environment.find(marker) == std::string::npos) continue;
    // "pid (comm) S ...": the state follows the last ')'.
    const std::string stat = read_proc_file(entry.path() / "stat");
    const size_t paren = stat.rfind(')');
    if (paren == std::string::npos || paren + 2 >= stat.size() || stat[paren + 2] == 'Z') continue;
    std::string comm = read_proc_file(entry.path() / "comm");
    if (!comm.empty() && comm.back() == '\n') comm.pop_back();
    found.emplace_back(std::stoi(name), comm);
  }
  return found;
}

/// Kills what is left of a job this test started, also when an expectation failed on the way.
class JobCleanup {
 public:
  explicit JobCleanup(std::string marker) : marker_(std::move(marker)) {}
  ~JobCleanup() {
    if (launcher_ > 0) {
      ::kill(launcher_, SIGKILL);
      ::waitpid(launcher_, nullptr, 0);
    }
    for (const auto& [pid, comm] : marked_processes(marker_)) ::kill(pid, SIGKILL);
  }
  JobCleanup(const JobCleanup&) = delete;
  JobCleanup& operator=(const JobCleanup&) = delete;

  void set_launcher(pid_t pid) { launcher_ = pid; }
  void launcher_reaped() { launcher_ = -1; }

 private:
  std::string marker_;
  pid_t launcher_ = -1;
};

std::string describe(const std::vector<std::pair<pid_t, std::string>>& processes) {
  std::string text;
  for (const auto& [pid, comm] : processes) text += fmt::format("{} ({}) ", pid, comm);
  return text;
}

/// Starts a launcher of ranks that are shells running `sleep` (so each rank has a child of its own)
/// in a child process, SIGKILLs it once the sleeps run, and checks that no process of the job is
/// left a few seconds later.
void expect_job_dies_with_its_launcher(LaunchOptions options) {
  static int job = 0;
  const std::string variable = "COLOSSAL_RUN_TEST_JOB";
  const std::string value = fmt::format("{}-{}", ::getpid(), job++);
  const std::string marker = variable + "=" + value;
  JobCleanup cleanup(marker);
  std::fflush(nullptr);  // nothing buffered may be written twice
  const pid_t launcher = ::fork();
  ASSERT_GE(launcher, 0);
  if (launcher == 0) {
    ::setenv(variable.c_str(), value.c_str(), 1);
    const int null = ::open("/dev/null", O_WRONLY);
    options.output_fd = null;
    options.error_fd = null;
    try {
      launch(options, sh("sleep 30; :"));
    } catch (...) {
    }
    ::_exit(0);
  }
  cleanup.set_launcher(launcher);

  const auto count_sleeps = [&] {
    const auto processes = marked_processes(marker);
    return std::count_if(processes.begin(), processes.end(), [](const auto& p) { return p.second == "sleep"; });
  };
  const auto start = std::chrono::steady_clock::now();
  while (count_sleeps() < options.nproc_per_node &&
         std::chrono::steady_clock::now() - start < std::chrono::seconds(10)) {
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  ASSERT_EQ(count_sleeps(), options.nproc_per_node)
      << "the ranks never started: " << describe(marked_processes(marker));

  ::kill(launcher, SIGKILL);
  ::waitpid(launcher, nullptr, 0);
  cleanup.launcher_reaped();
  // The ranks are told by the kernel at once and their groups by the watchdog; mpirun stops its
  // ranks before it exits (about a second here). 5 s leaves room for a loaded machine; a broken
  // launcher leaves the 30 s sleeps.
  const auto killed = std::chrono::steady_clock::now();
  std::vector<std::pair<pid_t, std::string>> left = marked_processes(marker);
  while (!left.empty() && std::chrono::steady_clock::now() - killed < std::chrono::seconds(5)) {
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
    left = marked_processes(marker);
  }
  EXPECT_TRUE(left.empty()) << "still running after the launcher was killed: " << describe(left);
}

TEST(RunProcesses, RanksDieWithAKilledLauncher) {
  expect_job_dies_with_its_launcher(processes(2));
}

TEST(RunMpi, MpirunAndItsRanksDieWithAKilledLauncher) {
  if (!have_mpirun()) GTEST_SKIP() << "no mpirun on PATH";
  expect_job_dies_with_its_launcher(mpi(2));
}

}  // namespace
}  // namespace colossal::cli
