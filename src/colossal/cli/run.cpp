// `colossal run`: starts the ranks (as child processes or under mpirun), relays their output line
// by line with a rank prefix, and stops the job when a rank fails. See Note [Launcher backends].
#include "colossal/cli/run.h"

#include <errno.h>
#include <fcntl.h>
#include <fmt/format.h>
#include <poll.h>
#include <sched.h>      // sched_getaffinity
#include <signal.h>     // sigaction, kill
#include <string.h>     // strsignal, strerror
#include <sys/prctl.h>  // PR_SET_PDEATHSIG
#include <sys/wait.h>
#include <unistd.h>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <array>
#include <chrono>
#include <cstdio>  // snprintf
#include <cstdlib>
#include <filesystem>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <regex>
#include <utility>

#include "colossal/comm/launch_env.h"    // the variables each rank gets
#include "colossal/core/build_config.h"  // COLOSSAL_WITH_MPI
#include "colossal/core/cuda_device.h"   // is_available
#include "colossal/core/error.h"         // colossal::Error

extern char** environ;

namespace colossal::cli {
namespace {

namespace launch_env = comm::env;
using Clock = std::chrono::steady_clock;

// ---- output -------------------------------------------------------------------------------------

void write_all(int fd, std::string_view data) {
  while (!data.empty()) {
    const ssize_t n = ::write(fd, data.data(), data.size());
    if (n < 0) {
      if (errno == EINTR || errno == EAGAIN) continue;
      return;  // a closed terminal or pipe: the ranks still run to the end
    }
    data.remove_prefix(static_cast<size_t>(n));
  }
}

/// Writes what it is fed to fd as whole lines, each behind the prefix. The launcher is the only
/// writer and writes each batch of complete lines with one write(), so lines never interleave.
class LinePrefixer {
 public:
  LinePrefixer(int fd, std::string prefix, std::vector<std::string>* keep = nullptr)
      : fd_(fd), prefix_(std::move(prefix)), keep_(keep) {}

  void feed(std::string_view bytes) {
    std::string out;
    while (!bytes.empty()) {
      const size_t newline = bytes.find('\n');
      if (newline == std::string_view::npos) {
        pending_.append(bytes);
        // A line without an end is cut rather than held forever (progress bars redraw with '\r').
        if (pending_.size() >= kMaxLine) emit(out);
        break;
      }
      pending_.append(bytes.substr(0, newline));
      emit(out);
      bytes.remove_prefix(newline + 1);
    }
    write_all(fd_, out);
  }

  /// Writes a last line that has no newline.
  void finish() {
    std::string out;
    if (!pending_.empty()) emit(out);
    write_all(fd_, out);
  }

 private:
  static constexpr size_t kMaxLine = 64 * 1024;

  void emit(std::string& out) {
    out += prefix_;
    out += pending_;
    out += '\n';
    if (keep_ != nullptr) keep_->push_back(pending_);
    pending_.clear();
  }

  int fd_;
  std::string prefix_;
  std::vector<std::string>* keep_;
  std::string pending_;
};

std::string rank_prefix(int rank) {
  return fmt::format("[rank {}] ", rank);
}

/// Splits mpirun's --tag-output streams ("[1,2]<stdout>:text") back into per-rank lines. mpirun
/// tags every chunk a rank writes, also chunks that end mid-line (the next tag may follow on the
/// same line) and the continuation of such a line, so text is routed by the latest tag until a
/// newline; untagged lines are mpirun's own and are kept for the failure report.
class MpiOutputRouter {
 public:
  MpiOutputRouter(int out_fd, int err_fd)
      : out_fd_(out_fd),
        err_fd_(err_fd),
        mpirun_out_(out_fd, "[mpirun] ", &mpirun_lines_),
        mpirun_err_(err_fd, "[mpirun] ", &mpirun_lines_) {}

  void feed(bool from_stderr, std::string_view bytes, bool final = false) {
    Stream& s = streams_[from_stderr ? 1 : 0];
    s.buffer.append(bytes);
    size_t pos = 0;
    while (pos < s.buffer.size()) {
      if (s.buffer[pos] == '[') {
        const TagMatch tag = match_tag(std::string_view(s.buffer).substr(pos));
        if (tag.incomplete && !final) break;  // wait for the rest of a tag cut by the read
        if (tag.length > 0) {
          s.rank = tag.rank;
          s.rank_stderr = tag.to_stderr;
          pos += tag.length;
          continue;
        }
      }
      // Text runs to a newline (inclusive) or to the next possible tag.
      const size_t end = s.buffer.find_first_of("\n[", s.buffer[pos] == '[' ? pos + 1 : pos);
      const size_t stop = end == std::string::npos ? s.buffer.size() : (s.buffer[end] == '\n' ? end + 1 : end);
      const std::string_view text = std::string_view(s.buffer).substr(pos, stop - pos);
      if (s.rank >= 0) {
        rank_prefixer(s.rank, s.rank_stderr).feed(text);
      } else {
        (from_stderr ? mpirun_err_ : mpirun_out_).feed(text);
      }
      if (text.back() == '\n') s.rank = -1;
      pos = stop;
    }
    s.buffer.erase(0, pos);
  }

  void finish() {
    feed(false, "", true);
    feed(true, "", true);
    for (auto& [key, prefixer] : ranks_) prefixer.finish();
    mpirun_out_.finish();
    mpirun_err_.finish();
  }

  const std::vector<std::string>& mpirun_lines() const { return mpirun_lines_; }

 private:
  struct Stream {
    std::string buffer;
    int rank = -1;  ///< the rank whose text continues here; -1: mpirun's own
    bool rank_stderr = false;
  };
  struct TagMatch {
    size_t length = 0;  ///< 0: no tag here
    bool incomplete = false;
    int rank = -1;
    bool to_stderr = false;
  };

  /// "[<jobid>,<rank>]<stdout|stderr|stddiag>:" at the start of text.
  static TagMatch match_tag(std::string_view text) {
    static const std::regex tag(R"(^\[\d+,(\d{1,9})\]<(stdout|stderr|stddiag)>:)");
    static const std::regex tag_prefix(R"(^\[(\d+(,(\d+(\](<[a-z]*>?)?)?)?)?)?$)");
    std::match_results<std::string_view::const_iterator> m;
    if (std::regex_search(text.begin(), text.end(), m, tag)) {
      return {static_cast<size_t>(m.length(0)), false, std::stoi(m[1].str()), m[2].str() != "stdout"};
    }
    const std::string_view head = text.substr(0, std::min<size_t>(text.size(), 48));
    TagMatch none;
    none.incomplete = head.size() == text.size() && std::regex_match(head.begin(), head.end(), tag_prefix);
    return none;
  }

  LinePrefixer& rank_prefixer(int rank, bool to_stderr) {
    const auto key = std::make_pair(rank, to_stderr);
    auto it = ranks_.find(key);
    if (it == ranks_.end())
      it = ranks_.emplace(key, LinePrefixer(to_stderr ? err_fd_ : out_fd_, rank_prefix(rank))).first;
    return it->second;
  }

  int out_fd_;
  int err_fd_;
  Stream streams_[2];
  std::map<std::pair<int, bool>, LinePrefixer> ranks_;
  std::vector<std::string> mpirun_lines_;
  LinePrefixer mpirun_out_;
  LinePrefixer mpirun_err_;
};

// ---- signals ------------------------------------------------------------------------------------

int g_signal_pipe = -1;

extern "C" void note_signal(int signo) {
  const int saved = errno;
  const auto byte = static_cast<unsigned char>(signo);
  [[maybe_unused]] const ssize_t n = ::write(g_signal_pipe, &byte, 1);
  errno = saved;
}

/// While alive: SIGINT, SIGTERM and SIGHUP are turned into bytes on a pipe (for the loop to forward
/// to the ranks), and SIGPIPE is ignored (a closed output must not kill the launcher and orphan
/// the ranks). The previous dispositions come back on destruction.
class SignalCapture {
 public:
  SignalCapture() {
    if (::pipe2(pipe_, O_CLOEXEC | O_NONBLOCK) != 0) throw Error(fmt::format("pipe: {}", strerror(errno)));
    g_signal_pipe = pipe_[1];
    struct sigaction action = {};
    action.sa_handler = note_signal;
    sigemptyset(&action.sa_mask);
    for (size_t i = 0; i < kForwarded.size(); ++i) sigaction(kForwarded[i], &action, &previous_[i]);
    struct sigaction ignore = {};
    ignore.sa_handler = SIG_IGN;
    sigaction(SIGPIPE, &ignore, &previous_pipe_);
  }
  ~SignalCapture() {
    for (size_t i = 0; i < kForwarded.size(); ++i) sigaction(kForwarded[i], &previous_[i], nullptr);
    sigaction(SIGPIPE, &previous_pipe_, nullptr);
    g_signal_pipe = -1;
    ::close(pipe_[0]);
    ::close(pipe_[1]);
  }
  SignalCapture(const SignalCapture&) = delete;
  SignalCapture& operator=(const SignalCapture&) = delete;

  int read_fd() const { return pipe_[0]; }

 private:
  static constexpr std::array<int, 3> kForwarded = {SIGINT, SIGTERM, SIGHUP};
  int pipe_[2] = {-1, -1};
  struct sigaction previous_[3] = {};
  struct sigaction previous_pipe_ = {};
};

/// "SIGSEGV", or "signal 70" for one without a name.
std::string signal_name(int signo) {
  const char* abbreviation = sigabbrev_np(signo);
  return abbreviation != nullptr ? fmt::format("SIG{}", abbreviation) : fmt::format("signal {}", signo);
}

// ---- children -----------------------------------------------------------------------------------

struct Child {
  pid_t pid = -1;         ///< also its process group (each child leads its own)
  int rank = -1;          ///< global rank; -1 for mpirun
  int fds[2] = {-1, -1};  ///< read ends of its stdout and stderr
  bool running = false;
  int status = 0;
};

std::string plural(int n, std::string_view word) {
  return fmt::format("{} {}{}", n, word, n == 1 ? "" : "s");
}

/// The environment for a child: ours, with `set` replacing variables of the same name.
std::vector<std::string> child_environment(const std::vector<std::pair<std::string, std::string>>& set) {
  std::vector<std::string> env;
  for (char** e = environ; *e != nullptr; ++e) {
    const std::string_view entry(*e);
    const std::string_view name = entry.substr(0, entry.find('='));
    const bool replaced = std::any_of(set.begin(), set.end(), [&](const auto& kv) { return kv.first == name; });
    if (!replaced) env.emplace_back(entry);
  }
  for (const auto& [name, value] : set) env.push_back(name + "=" + value);
  return env;
}

/// The full path of program (searched on PATH unless it names a path), or empty.
std::string find_program(const std::string& program) {
  if (program.find('/') != std::string::npos) return ::access(program.c_str(), X_OK) == 0 ? program : "";
  const char* path = std::getenv("PATH");
  std::string_view dirs = path != nullptr ? path : "/usr/local/bin:/usr/bin:/bin";
  while (!dirs.empty()) {
    const size_t colon = dirs.find(':');
    const std::string dir(dirs.substr(0, colon));
    dirs.remove_prefix(colon == std::string_view::npos ? dirs.size() : colon + 1);
    const std::string candidate = (dir.empty() ? std::string(".") : dir) + "/" + program;
    if (::access(candidate.c_str(), X_OK) == 0 && !std::filesystem::is_directory(candidate)) return candidate;
  }
  return "";
}

// Note [Children die with the launcher]
// `kill -9` of the launcher must not leave a job training on (and writing checkpoints) with nobody
// watching it, but SIGKILL gives the launcher no chance to stop anything. So each child is forked
// with PR_SET_PDEATHSIG: the kernel signals it when the launcher's thread that forked it ends, however
// it ends (launch() runs on the thread that calls it, so that thread must live as long as the job).
// The flag is set between fork and exec, and the child then compares getppid() with the launcher's
// pid: had the launcher died in between, the child would already have been reparented and no signal
// would come. A rank gets SIGKILL; mpirun gets SIGTERM, because its ranks are its children in process
// groups of their own (no orted on the local node in Open MPI 4.1), which SIGTERM makes it kill
// (with whatever each started) while SIGKILL leaves them running: measured with mpirun -np 2 of
// `sh -c 'sleep 300'`, both shells and sleeps were gone a moment after SIGTERM and reparented to
// init after SIGKILL. The flag is not inherited across fork, so what a rank starts itself (a shell
// script's programs) would outlive it: a JobWatchdog, a process forked at the start of each launch
// that only waits for the launcher's end of a pipe to close, then sends each child's process group
// SIGKILL (each rank leads one, and its own children stay in it unless they move out). mpirun needs
// no watchdog, as it stops its ranks' groups itself, and must not get a second SIGTERM: Open MPI
// takes a second one as "exit now" and leaves the ranks running (seen with the watchdog's SIGTERM
// arriving just after the kernel's).

/// The process that stops the job's process groups when the launcher dies without saying it is done
/// (Note [Children die with the launcher]). It is forked, not exec'd, so it runs only
/// async-signal-safe calls, in a fixed table (a launcher with other threads may have held a lock at
/// the fork). It leaves the launcher's session, so that a signal to the launcher's process group or
/// terminal does not take it along.
class JobWatchdog {
 public:
  JobWatchdog() {
    int fds[2];
    if (::pipe2(fds, O_CLOEXEC) != 0) throw Error(fmt::format("pipe: {}", strerror(errno)));
    pid_ = ::fork();
    if (pid_ == 0) watch(fds[0]);
    const int fork_error = errno;
    ::close(fds[0]);
    if (pid_ < 0) {
      ::close(fds[1]);
      throw Error(fmt::format("fork: {}", strerror(fork_error)));
    }
    fd_ = fds[1];
  }
  ~JobWatchdog() {
    send({0, 0});  // done: the launcher has stopped and reaped its children itself
    ::close(fd_);
    ::waitpid(pid_, nullptr, 0);
  }
  JobWatchdog(const JobWatchdog&) = delete;
  JobWatchdog& operator=(const JobWatchdog&) = delete;

  /// Should the launcher die, send signo to process group `group`.
  void guard(pid_t group, int signo) { send({group, signo}); }
  /// The group's leader has been reaped: its id may be reused, so it is no longer signalled.
  void release(pid_t group) { send({group, 0}); }

 private:
  struct Record {
    int32_t group;  ///< 0: done
    int32_t signo;  ///< 0: release
  };
  static constexpr int kMaxGroups = 4096;

  void send(Record record) {
    // 8 bytes: one atomic pipe write, never split between reads.
    while (::write(fd_, &record, sizeof record) < 0 && errno == EINTR) {
    }
  }

  [[noreturn]] static void watch(int fd) {
    ::setsid();
    struct sigaction default_action = {};
    default_action.sa_handler = SIG_DFL;
    sigemptyset(&default_action.sa_mask);
    for (int signo : {SIGINT, SIGTERM, SIGHUP, SIGPIPE}) ::sigaction(signo, &default_action, nullptr);
    ::dup2(fd, 0);
    ::close_range(1, ~0U, 0);  // the ranks' pipes, the launcher's output: nothing of ours to hold
    Record groups[kMaxGroups];
    int count = 0;
    Record batch[64];
    for (;;) {
      const ssize_t n = ::read(0, batch, sizeof batch);
      if (n < 0 && errno == EINTR) continue;
      if (n <= 0) break;  // the launcher is gone
      for (ssize_t k = 0; k < n / static_cast<ssize_t>(sizeof(Record)); ++k) {
        const Record r = batch[k];
        if (r.group == 0) ::_exit(0);
        if (r.signo == 0) {
          for (int g = 0; g < count; ++g) {
            if (groups[g].group == r.group) groups[g] = groups[--count];
          }
        } else if (count < kMaxGroups) {
          groups[count++] = r;
        }
      }
    }
    for (int g = 0; g < count; ++g) ::kill(-groups[g].group, groups[g].signo);
    ::_exit(0);
  }

  pid_t pid_ = -1;
  int fd_ = -1;
};

/// Starts argv in a new process group with stdin from /dev/null and stdout/stderr into fresh
/// pipes, to receive death_signal when the launcher dies (Note [Children die with the launcher]);
/// returns the error text when it cannot be started.
std::optional<std::string> spawn(Child& child, const std::vector<std::string>& argv,
                                 const std::vector<std::string>& env, int death_signal) {
  // Everything the child needs is prepared here: between fork and exec only async-signal-safe calls
  // are allowed (other threads' locks may be held forever in the child).
  // A path is left to exec, which says why it cannot run it; a bare name is searched on PATH.
  const std::string program = argv[0].find('/') != std::string::npos ? argv[0] : find_program(argv[0]);
  if (program.empty()) return fmt::format("{}: {}", argv[0], strerror(ENOENT));
  std::vector<char*> c_argv, c_env;
  for (const std::string& a : argv) c_argv.push_back(const_cast<char*>(a.c_str()));
  c_argv.push_back(nullptr);
  for (const std::string& e : env) c_env.push_back(const_cast<char*>(e.c_str()));
  c_env.push_back(nullptr);

  int out[2], err[2], exec_error[2];
  if (::pipe2(out, O_CLOEXEC) != 0) return fmt::format("pipe: {}", strerror(errno));
  if (::pipe2(err, O_CLOEXEC) != 0) {
    const int saved = errno;
    for (int fd : out) ::close(fd);
    return fmt::format("pipe: {}", strerror(saved));
  }
  // Closed by a successful exec; carries exec's errno otherwise.
  if (::pipe2(exec_error, O_CLOEXEC) != 0) {
    const int saved = errno;
    for (int fd : {out[0], out[1], err[0], err[1]}) ::close(fd);
    return fmt::format("pipe: {}", strerror(saved));
  }
  const pid_t launcher = ::getpid();
  const pid_t pid = ::fork();
  if (pid == 0) {
    ::setpgid(0, 0);
    if (::prctl(PR_SET_PDEATHSIG, death_signal) != 0 || ::getppid() != launcher) ::_exit(127);
    // dup2 onto itself would keep O_CLOEXEC (a launcher started with its stdout closed).
    const auto move_to = [](int from, int to) {
      if (from == to) {
        ::fcntl(to, F_SETFD, 0);
      } else {
        ::dup2(from, to);
      }
    };
    const int null = ::open("/dev/null", O_RDONLY | O_CLOEXEC);
    if (null >= 0) move_to(null, 0);
    move_to(out[1], 1);
    move_to(err[1], 2);
    // The launcher catches or ignores these (SignalCapture); the rank must get the defaults.
    struct sigaction default_action = {};
    default_action.sa_handler = SIG_DFL;
    sigemptyset(&default_action.sa_mask);
    for (int signo : {SIGINT, SIGTERM, SIGHUP, SIGPIPE}) ::sigaction(signo, &default_action, nullptr);
    sigset_t empty;
    sigemptyset(&empty);
    ::sigprocmask(SIG_SETMASK, &empty, nullptr);
    ::execve(program.c_str(), c_argv.data(), c_env.data());
    const int error = errno;
    [[maybe_unused]] const ssize_t n = ::write(exec_error[1], &error, sizeof error);
    ::_exit(127);
  }
  const int fork_error = errno;
  // Also here, so that a signal to the group cannot miss a child that has not run yet.
  if (pid > 0) ::setpgid(pid, pid);
  for (int fd : {out[1], err[1], exec_error[1]}) ::close(fd);
  int error = pid < 0 ? fork_error : 0;
  if (pid > 0) {
    ssize_t n;
    do {
      n = ::read(exec_error[0], &error, sizeof error);
    } while (n < 0 && errno == EINTR);
    if (n != static_cast<ssize_t>(sizeof error)) error = 0;  // exec closed the pipe: it ran
    if (error != 0) ::waitpid(pid, nullptr, 0);
  }
  ::close(exec_error[0]);
  if (error != 0) {
    for (int fd : {out[0], err[0]}) ::close(fd);
    return fmt::format("{}: {}", pid < 0 ? "fork" : argv[0], strerror(error));
  }
  child.pid = pid;
  child.fds[0] = out[0];
  child.fds[1] = err[0];
  child.running = true;
  return std::nullopt;
}

/// The poll loop shared by both backends: relays output to `sink`, reaps children, forwards
/// signals, and once stop() is called sends SIGTERM and then, after the grace period, SIGKILL.
class Supervisor {
 public:
  using Sink = std::function<void(size_t child, bool from_stderr, std::string_view bytes)>;

  Supervisor(std::vector<Child>& children, double grace_seconds, const SignalCapture& signals, Sink sink)
      : children_(children),
        grace_(std::chrono::duration<double>(grace_seconds)),
        signals_(signals),
        sink_(std::move(sink)) {}

  /// SIGTERM to every child's process group now, SIGKILL after the grace period.
  void stop() {
    if (kill_at_) return;
    signal_all(SIGTERM);
    kill_at_ = Clock::now() + std::chrono::duration_cast<Clock::duration>(grace_);
  }

  int running_count() const {
    return static_cast<int>(
        std::count_if(children_.begin(), children_.end(), [](const Child& c) { return c.running; }));
  }

  /// Runs until every child has exited and its output is read. on_exit is called as each child is
  /// reaped; on_tick on every turn of the loop (at least every 50 ms).
  void run(const std::function<void(size_t child)>& on_exit, const std::function<void()>& on_tick = {}) {
    std::optional<Clock::time_point> all_exited_at;
    for (;;) {
      std::vector<pollfd> fds = {{signals_.read_fd(), POLLIN, 0}};
      std::vector<std::pair<size_t, int>> owners;  // (child, stream) of fds[1..]
      for (size_t i = 0; i < children_.size(); ++i) {
        for (int s = 0; s < 2; ++s) {
          if (children_[i].fds[s] < 0) continue;
          fds.push_back({children_[i].fds[s], POLLIN, 0});
          owners.emplace_back(i, s);
        }
      }
      if (running_count() == 0) {
        if (!all_exited_at) all_exited_at = Clock::now();
        // Output still open after its process ended belongs to something the rank left behind;
        // read what comes promptly, then stop listening.
        if (owners.empty() || Clock::now() - *all_exited_at > std::chrono::seconds(1)) break;
      }
      ::poll(fds.data(), fds.size(), 50);
      if (fds[0].revents & POLLIN) forward_signals();
      for (size_t f = 1; f < fds.size(); ++f) {
        if ((fds[f].revents & (POLLIN | POLLHUP | POLLERR)) == 0) continue;
        auto [i, s] = owners[f - 1];
        char buffer[65536];
        const ssize_t n = ::read(children_[i].fds[s], buffer, sizeof buffer);
        if (n > 0) {
          sink_(i, s == 1, std::string_view(buffer, static_cast<size_t>(n)));
        } else if (n == 0 || (errno != EINTR && errno != EAGAIN)) {
          ::close(children_[i].fds[s]);
          children_[i].fds[s] = -1;
        }
      }
      if (on_tick) on_tick();
      for (size_t i = 0; i < children_.size(); ++i) {
        if (!children_[i].running) continue;
        int status = 0;
        if (::waitpid(children_[i].pid, &status, WNOHANG) == children_[i].pid) {
          children_[i].running = false;
          children_[i].status = status;
          on_exit(i);
        }
      }
      if (kill_at_ && Clock::now() >= *kill_at_) {
        signal_all(SIGKILL);
        kill_at_ = Clock::time_point::max();  // once
      }
    }
    for (Child& c : children_) {
      for (int& fd : c.fds) {
        if (fd >= 0) ::close(fd);
        fd = -1;
      }
    }
  }

  int interrupt_signal() const { return interrupt_signal_; }
  int stopped_by_interrupt() const { return stopped_by_interrupt_; }

 private:
  void signal_all(int signo) {
    // The whole process group, so that what a rank started (a shell's child) goes too.
    for (const Child& c : children_) {
      if (c.pid > 0) ::kill(-c.pid, signo);
    }
  }

  void forward_signals() {
    unsigned char received[16];
    const ssize_t n = ::read(signals_.read_fd(), received, sizeof received);
    for (ssize_t k = 0; k < n; ++k) {
      if (interrupt_signal_ == 0) {
        interrupt_signal_ = received[k];
        stopped_by_interrupt_ = running_count();
        signal_all(received[k]);
        kill_at_ = Clock::now() + std::chrono::duration_cast<Clock::duration>(grace_);
      } else {
        signal_all(SIGKILL);  // asked twice: no more waiting
      }
    }
  }

  std::vector<Child>& children_;
  std::chrono::duration<double> grace_;
  const SignalCapture& signals_;
  Sink sink_;
  std::optional<Clock::time_point> kill_at_;
  int interrupt_signal_ = 0;
  int stopped_by_interrupt_ = 0;
};

/// "rank 2 exited with code 3" or "rank 2 was killed by SIGSEGV (Segmentation fault)".
std::string describe_exit(int rank, int status) {
  if (WIFSIGNALED(status)) {
    return fmt::format("rank {} was killed by {} ({})", rank, signal_name(WTERMSIG(status)),
                       strsignal(WTERMSIG(status)));
  }
  return fmt::format("rank {} exited with code {}", rank, WEXITSTATUS(status));
}

int exit_code_of(int status) {
  return WIFSIGNALED(status) ? 128 + WTERMSIG(status) : WEXITSTATUS(status);
}

bool failed(int status) {
  return !(WIFEXITED(status) && WEXITSTATUS(status) == 0);
}

int available_cores() {
  cpu_set_t set;
  if (sched_getaffinity(0, sizeof set, &set) == 0) return std::max(1, CPU_COUNT(&set));
  return static_cast<int>(std::max(1L, sysconf(_SC_NPROCESSORS_ONLN)));
}

void finish_result(LaunchResult& result, const LaunchOptions& options) {
  if (!result.message.empty()) write_all(options.error_fd, result.message + "\n");
}

void check_options(const LaunchOptions& o, const std::vector<std::string>& command) {
  if (command.empty()) throw Error("no command to run: give it after --, e.g. colossal run --nproc_per_node 2 -- CMD");
  if (o.nproc_per_node < 1) throw Error(fmt::format("--nproc_per_node = {} must be at least 1", o.nproc_per_node));
  if (o.nnodes < 1) throw Error(fmt::format("--nnodes = {} must be at least 1", o.nnodes));
  if (o.node_rank < 0 || o.node_rank >= o.nnodes) {
    throw Error(fmt::format("--node_rank = {} must be between 0 and --nnodes - 1 = {}", o.node_rank, o.nnodes - 1));
  }
  if (o.master_port < 1 || o.master_port > 65535) {
    throw Error(fmt::format("--master_port = {} must be between 1 and 65535", o.master_port));
  }
  if (o.grace_seconds < 0) throw Error(fmt::format("the grace period {} s must not be negative", o.grace_seconds));
}

// Note [A job id per launch]
// The TCP rendezvous turns away a rank of another job (comm/tcp_rendezvous.h, RendezvousOptions::
// job_id): a rank left over from an earlier job, or a second job started on the same port, must not
// join this one. The job is named by COLOSSAL_JOB_ID. A user's value is passed on unchanged; without
// one, a launcher that starts the whole job (--nnodes 1) makes a fresh id, this host's name, the
// launcher's pid and the start time in nanoseconds, which no other launch shares. With several
// nodes each node runs a launcher of its own, and ids made apart would differ and turn away each
// other's ranks, so none is made: the user names the job, the same on every node.

/// COLOSSAL_JOB_ID for the ranks of this launch (Note [A job id per launch]); empty: none is set.
std::string job_id_for(const LaunchOptions& o) {
  if (const char* user = std::getenv(std::string(launch_env::kColossalJobId).c_str()); user != nullptr && *user != 0) {
    return user;
  }
  if (o.nnodes != 1) return "";
  char host[256] = {};
  if (::gethostname(host, sizeof host - 1) != 0) std::snprintf(host, sizeof host, "localhost");
  const auto now =
      std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::system_clock::now().time_since_epoch());
  return fmt::format("colossal-run-{}-{}-{}", host, static_cast<long>(::getpid()), now.count());
}

/// Variables every rank gets from either backend (RANK and LOCAL_RANK are per rank).
std::vector<std::pair<std::string, std::string>> common_environment(const LaunchOptions& o, LaunchBackend backend) {
  std::vector<std::pair<std::string, std::string>> env = {
      {std::string(launch_env::kWorldSize), std::to_string(o.nnodes * o.nproc_per_node)},
      {std::string(launch_env::kLocalWorldSize), std::to_string(o.nproc_per_node)},
      {std::string(launch_env::kGroupRank), std::to_string(o.node_rank)},
      {std::string(launch_env::kMasterAddr), o.master_addr},
      {std::string(launch_env::kMasterPort), std::to_string(o.master_port)},
      {std::string(launch_env::kColossalLauncher), "1"},
      {std::string(launch_env::kLaunchBackend), std::string(to_string(backend))},
  };
  if (std::string job_id = job_id_for(o); !job_id.empty()) {
    env.emplace_back(launch_env::kColossalJobId, std::move(job_id));
  }
  // Ranks sharing the cores should not each start a thread per core.
  const std::string omp_threads(launch_env::kOmpNumThreads);
  if (std::getenv(omp_threads.c_str()) == nullptr) {
    env.emplace_back(omp_threads, std::to_string(std::max(1, available_cores() / o.nproc_per_node)));
  }
  return env;
}

LaunchResult launch_processes(const LaunchOptions& o, const std::vector<std::string>& command) {
  LaunchResult result;
  result.backend = LaunchBackend::kProcesses;
  const std::vector<std::pair<std::string, std::string>> common = common_environment(o, result.backend);

  SignalCapture signals;
  JobWatchdog watchdog;  // after SignalCapture: its last write must not meet a default SIGPIPE
  std::vector<Child> children(static_cast<size_t>(o.nproc_per_node));
  std::vector<std::array<std::unique_ptr<LinePrefixer>, 2>> prefixers(children.size());
  for (size_t i = 0; i < children.size(); ++i) {
    const int rank = o.node_rank * o.nproc_per_node + static_cast<int>(i);
    children[i].rank = rank;
    prefixers[i][0] = std::make_unique<LinePrefixer>(o.output_fd, rank_prefix(rank));
    prefixers[i][1] = std::make_unique<LinePrefixer>(o.error_fd, rank_prefix(rank));
  }
  Supervisor supervisor(children, o.grace_seconds, signals, [&](size_t i, bool from_stderr, std::string_view bytes) {
    prefixers[i][from_stderr ? 1 : 0]->feed(bytes);
  });

  std::optional<std::string> spawn_error;
  for (size_t i = 0; i < children.size() && !spawn_error; ++i) {
    auto env = common;
    env.emplace_back(launch_env::kRank, std::to_string(children[i].rank));
    env.emplace_back(launch_env::kLocalRank, std::to_string(i));
    if (auto error = spawn(children[i], command, child_environment(env), SIGKILL)) {
      spawn_error = fmt::format("cannot start rank {}: {}", children[i].rank, *error);
      result.failed_rank = children[i].rank;
      result.ranks_stopped = supervisor.running_count();
      supervisor.stop();
    } else {
      watchdog.guard(children[i].pid, SIGKILL);
    }
  }

  int failed_index = -1;
  supervisor.run([&](size_t i) {
    watchdog.release(children[i].pid);
    if (failed_index >= 0 || spawn_error || supervisor.interrupt_signal() != 0 || !failed(children[i].status)) return;
    failed_index = static_cast<int>(i);
    result.ranks_stopped = supervisor.running_count();
    supervisor.stop();
  });
  for (auto& pair : prefixers) {
    pair[0]->finish();
    pair[1]->finish();
  }

  const auto stopped = [&](int n) {
    return n == 0 ? std::string("no other rank was running") : "stopped the other " + plural(n, "rank");
  };
  if (spawn_error) {
    result.exit_code = 127;
    result.message = fmt::format("colossal run: {}; {}", *spawn_error, stopped(result.ranks_stopped));
  } else if (failed_index >= 0) {
    const Child& c = children[static_cast<size_t>(failed_index)];
    result.failed_rank = c.rank;
    result.exit_code = exit_code_of(c.status);
    if (WIFSIGNALED(c.status)) {
      result.rank_signal = WTERMSIG(c.status);
    } else {
      result.rank_exit_code = WEXITSTATUS(c.status);
    }
    result.message =
        fmt::format("colossal run: {}; {}", describe_exit(c.rank, c.status), stopped(result.ranks_stopped));
  } else if (supervisor.interrupt_signal() != 0) {
    result.interrupt_signal = supervisor.interrupt_signal();
    result.ranks_stopped = supervisor.stopped_by_interrupt();
    result.exit_code = 128 + result.interrupt_signal;
    result.message = fmt::format("colossal run: interrupted by {}; stopped {}", signal_name(result.interrupt_signal),
                                 plural(result.ranks_stopped, "rank"));
  }
  finish_result(result, o);
  return result;
}

// Note [Naming the failed rank under mpirun]
// mpirun's own report ("Process name: [[14827,1],2]" / "Exit code: 3") is not always printed: when
// a rank dies by a signal, or every rank fails at once, Open MPI 4.1 prints only "1 process
// returned a non-zero exit code". So each rank's shell step runs the command (not exec: it must
// outlive it) and, when it fails, leaves its exit status in a file rank.<RANK> of a folder the
// launcher watches. Ranks that mpirun stops afterwards die with their shell and leave nothing, but
// a rank may fail of the first one's death before mpirun stops it: a peer killed mid all-reduce
// makes Open MPI's shared-memory transport fail in the others ("Read -1, expected 278288"), and
// their steps write files too, within milliseconds (too close for file times, which move by the
// kernel's tick). So after its file each failing step claims a symlink `first` -> rank.<RANK>,
// which only one can create: the rank whose shell saw its command end first, the one killed (its
// shell wakes at once, while the others must first notice the broken link). The lowest rank with a
// file is the fallback for a step stopped between its file and its claim. A shell reports death by
// signal n as status 128 + n, which is read back as the signal. mpirun's report is the fallback
// when no step left a file (e.g. ranks on other hosts).

struct RankFailure {
  int rank = -1;
  int exit_code = 0;
  int signal = 0;
};

RankFailure from_status(int rank, int status_code) {
  RankFailure f{rank, status_code, 0};
  if (status_code > 128 && status_code <= 128 + SIGRTMAX) f.signal = status_code - 128;
  return f;
}

/// The status a rank's step left in `file`, for `rank`.
std::optional<RankFailure> read_status_file(const std::filesystem::path& file, int rank) {
  std::FILE* in = std::fopen(file.c_str(), "r");
  if (in == nullptr) return std::nullopt;
  int code = 0;
  const bool read = std::fscanf(in, "%d", &code) == 1;
  std::fclose(in);
  if (!read) return std::nullopt;
  return from_status(rank, code);
}

/// The rank whose step claimed `first` in dir, if one has.
std::optional<RankFailure> read_first_failure(const std::filesystem::path& dir) {
  std::error_code ec;
  const std::filesystem::path target = std::filesystem::read_symlink(dir / "first", ec);
  const std::string name = target.filename().string();
  if (ec || name.rfind("rank.", 0) != 0) return std::nullopt;
  return read_status_file(dir / name, std::atoi(name.c_str() + 5));
}

/// The lowest rank with a status file in dir, if any.
std::optional<RankFailure> read_lowest_failure(const std::filesystem::path& dir) {
  std::optional<RankFailure> lowest;
  std::error_code ec;
  for (const auto& entry : std::filesystem::directory_iterator(dir, ec)) {
    const std::string name = entry.path().filename().string();
    if (name.rfind("rank.", 0) != 0) continue;
    const int rank = std::atoi(name.c_str() + 5);
    if (lowest && rank >= lowest->rank) continue;
    if (auto failure = read_status_file(entry.path(), rank)) lowest = failure;
  }
  return lowest;
}

std::optional<RankFailure> parse_mpirun_report(const std::vector<std::string>& lines) {
  static const std::regex process_name(R"(Process name:\s*\[\[\d+,\d+\],(\d{1,9})\])");
  static const std::regex exit_code(R"(Exit code:\s*(\d{1,9}))");
  static const std::regex on_signal(R"(process rank (\d{1,9}) with PID .* exited on signal (\d{1,9}))");
  RankFailure failure;
  std::smatch m;
  for (const std::string& line : lines) {
    if (std::regex_search(line, m, on_signal)) return RankFailure{std::stoi(m[1].str()), 0, std::stoi(m[2].str())};
    if (std::regex_search(line, m, process_name)) failure.rank = std::stoi(m[1].str());
    if (failure.rank >= 0 && std::regex_search(line, m, exit_code)) {
      return from_status(failure.rank, std::stoi(m[1].str()));
    }
  }
  return std::nullopt;
}

/// A temporary folder, removed with what is in it.
class TemporaryDirectory {
 public:
  TemporaryDirectory() {
    std::string pattern = (std::filesystem::temp_directory_path() / "colossal-run-XXXXXX").string();
    if (::mkdtemp(pattern.data()) == nullptr) throw Error(fmt::format("mkdtemp {}: {}", pattern, strerror(errno)));
    path_ = pattern;
  }
  ~TemporaryDirectory() {
    std::error_code ec;
    std::filesystem::remove_all(path_, ec);
  }
  TemporaryDirectory(const TemporaryDirectory&) = delete;
  TemporaryDirectory& operator=(const TemporaryDirectory&) = delete;
  const std::filesystem::path& path() const { return path_; }

 private:
  std::filesystem::path path_;
};

LaunchResult launch_mpi(const LaunchOptions& o, const std::vector<std::string>& command) {
  LaunchResult result;
  result.backend = LaunchBackend::kMpi;
  if (o.nnodes != 1) {
    throw Error(fmt::format(
        "--nnodes = {} with --backend mpi: mpirun starts every rank from this node; give it the hosts through "
        "--mpirun-arg (e.g. --mpirun-arg=--hostfile=FILE) with --nnodes 1 and --nproc_per_node = all ranks, or use "
        "--backend processes with one launcher per node",
        o.nnodes));
  }
  const std::string mpirun = find_program(o.mpirun);
  if (mpirun.empty()) {
    throw Error(fmt::format("--backend mpi needs {}, which is not on PATH; install Open MPI or use --backend processes",
                            o.mpirun));
  }
  const TemporaryDirectory status_dir;
  const auto env = common_environment(o, result.backend);
  std::vector<std::string> argv = {mpirun, "-np", std::to_string(o.nproc_per_node), "--oversubscribe", "--tag-output"};
  if (::geteuid() == 0) argv.push_back("--allow-run-as-root");  // containers often run as root
  for (const auto& [name, value] : env) {
    argv.push_back("-x");
    argv.push_back(name);
  }
  argv.insert(argv.end(), o.mpirun_args.begin(), o.mpirun_args.end());
  // Each rank takes our variables from Open MPI's, runs the command and leaves a failure's status
  // behind (Note [Naming the failed rank under mpirun]).
  const std::string rank_step = fmt::format(
      "{rank}=${ompi_rank} {local_rank}=${ompi_local_rank} {world}=${ompi_size} {local_world}=${ompi_local_size}; "
      "export {rank} {local_rank} {world} {local_world}; "
      "d=$1; shift; \"$@\"; c=$?; "
      "if [ $c -ne 0 ]; then echo $c > \"$d/.rank.${rank}\" && mv \"$d/.rank.${rank}\" \"$d/rank.${rank}\" && "
      "ln -s \"rank.${rank}\" \"$d/first\" 2>/dev/null; fi; exit $c",
      fmt::arg("rank", launch_env::kRank), fmt::arg("local_rank", launch_env::kLocalRank),
      fmt::arg("world", launch_env::kWorldSize), fmt::arg("local_world", launch_env::kLocalWorldSize),
      fmt::arg("ompi_rank", launch_env::kOmpiRank), fmt::arg("ompi_local_rank", launch_env::kOmpiLocalRank),
      fmt::arg("ompi_size", launch_env::kOmpiSize), fmt::arg("ompi_local_size", launch_env::kOmpiLocalSize));
  argv.insert(argv.end(), {"sh", "-c", rank_step, "colossal-rank", status_dir.path().string()});
  argv.insert(argv.end(), command.begin(), command.end());

  SignalCapture signals;
  std::vector<Child> children(1);
  MpiOutputRouter router(o.output_fd, o.error_fd);
  Supervisor supervisor(children, o.grace_seconds, signals,
                        [&](size_t, bool from_stderr, std::string_view bytes) { router.feed(from_stderr, bytes); });
  if (auto error = spawn(children[0], argv, child_environment(env), SIGTERM)) {
    throw Error(fmt::format("cannot start mpirun: {}", *error));
  }
  // mpirun aborts the job once a rank has failed; should it still be running a grace period later,
  // it is stopped like a rank.
  std::optional<RankFailure> failure;
  std::optional<Clock::time_point> stop_at;
  supervisor.run([](size_t) {},
                 [&] {
                   if (!failure) failure = read_first_failure(status_dir.path());
                   if (!stop_at && (failure || read_lowest_failure(status_dir.path()))) {
                     stop_at = Clock::now() + std::chrono::duration_cast<Clock::duration>(
                                                  std::chrono::duration<double>(o.grace_seconds));
                   }
                   if (stop_at && Clock::now() >= *stop_at) supervisor.stop();
                 });
  router.finish();

  const int status = children[0].status;
  if (!failure) failure = read_first_failure(status_dir.path());
  if (!failure) failure = read_lowest_failure(status_dir.path());
  if (!failure) failure = parse_mpirun_report(router.mpirun_lines());
  if (supervisor.interrupt_signal() != 0) {
    result.interrupt_signal = supervisor.interrupt_signal();
    result.exit_code = 128 + result.interrupt_signal;
    result.message = fmt::format("colossal run: interrupted by {}; stopped mpirun and its {}",
                                 signal_name(result.interrupt_signal), plural(o.nproc_per_node, "rank"));
  } else if (failed(status)) {
    result.exit_code = exit_code_of(status);
    if (failure) {
      result.failed_rank = failure->rank;
      result.rank_exit_code = failure->signal > 0 ? 0 : failure->exit_code;
      result.rank_signal = failure->signal;
      const std::string how = failure->signal > 0 ? fmt::format("was killed by {} ({})", signal_name(failure->signal),
                                                                strsignal(failure->signal))
                                                  : fmt::format("exited with code {}", failure->exit_code);
      result.message = fmt::format("colossal run: rank {} {}; mpirun stopped the other ranks", failure->rank, how);
    } else {
      result.message = fmt::format("colossal run: mpirun {} (its report is above)",
                                   WIFSIGNALED(status) ? "was killed by " + signal_name(WTERMSIG(status))
                                                       : fmt::format("exited with code {}", WEXITSTATUS(status)));
    }
  }
  finish_result(result, o);
  return result;
}

}  // namespace

std::string_view to_string(LaunchBackend backend) {
  switch (backend) {
    case LaunchBackend::kAuto:
      return "auto";
    case LaunchBackend::kProcesses:
      return "processes";
    case LaunchBackend::kMpi:
      return "mpi";
  }
  return "?";
}

LaunchBackend resolve_backend(LaunchBackend requested, const std::string& mpirun) {
  if (requested != LaunchBackend::kAuto) return requested;
  if (COLOSSAL_WITH_MPI && !core::cuda::is_available() && !find_program(mpirun).empty()) return LaunchBackend::kMpi;
  return LaunchBackend::kProcesses;
}

LaunchResult launch(const LaunchOptions& options, const std::vector<std::string>& command) {
  check_options(options, command);
  if (resolve_backend(options.backend, options.mpirun) == LaunchBackend::kMpi) return launch_mpi(options, command);
  return launch_processes(options, command);
}

CLI::App* add_run_command(CLI::App& app) {
  auto options = std::make_shared<LaunchOptions>();
  auto command = std::make_shared<std::vector<std::string>>();
  CLI::App* run = app.add_subcommand("run", "Start the ranks of a distributed job on this node and watch over them");
  run->footer(fmt::format(
      "Each rank gets {}, {}, {}, {}, {}, {}, {}, {}=1 and {}, {} (yours, or a fresh one per launch on one node), "
      "and {} = cores / ranks unless set; every line it "
      "prints appears as \"[rank N] ...\". When a rank fails the others are stopped (SIGTERM, then SIGKILL after "
      "the grace period) and run exits with the failing rank's code; when the launcher dies, even by SIGKILL, the "
      "ranks die with it.\n"
      "Backends: processes starts each rank itself (one launcher per node with --nnodes/--node_rank); mpi runs "
      "mpirun -np N --oversubscribe (how CPU ranks join an MPI job); auto is mpi when no GPU is visible and mpirun "
      "is available, processes otherwise.\n"
      "Example:\n"
      "  colossal run --nproc_per_node 4 -- colossal train --config configs/gpt2_tokens.toml",
      launch_env::kRank, launch_env::kLocalRank, launch_env::kWorldSize, launch_env::kLocalWorldSize,
      launch_env::kGroupRank, launch_env::kMasterAddr, launch_env::kMasterPort, launch_env::kColossalLauncher,
      launch_env::kLaunchBackend, launch_env::kColossalJobId, launch_env::kOmpNumThreads));
  run->add_option("--nproc_per_node,--nproc-per-node", options->nproc_per_node, "Ranks to start on this node")
      ->capture_default_str();
  run->add_option("--nnodes", options->nnodes, "Nodes in the job, each running its own `colossal run`")
      ->capture_default_str();
  run->add_option("--node_rank,--node-rank", options->node_rank, "This node's index, 0 to nnodes - 1")
      ->capture_default_str();
  run->add_option("--master_addr,--master-addr", options->master_addr, "Address of the node running rank 0")
      ->capture_default_str();
  run->add_option("--master_port,--master-port", options->master_port, "Free port on the master node")
      ->capture_default_str();
  auto backend_name = std::make_shared<std::string>("auto");
  run->add_option(
         "--backend", *backend_name,
         "How ranks are started: processes (children of this launcher), mpi (under mpirun), auto (mpi without a GPU)")
      ->check(CLI::IsMember({"auto", "processes", "mpi"}))
      ->capture_default_str();
  run->add_option("--grace", options->grace_seconds, "Seconds between SIGTERM and SIGKILL when stopping ranks")
      ->capture_default_str();
  run->add_option("--mpirun-arg", options->mpirun_args, "An extra mpirun argument (repeatable; mpi backend)")
      ->allow_extra_args(false);
  run->add_option("command", *command, "The program and its arguments, after --")->required();
  run->callback([options, command, backend_name] {
    options->backend = *backend_name == "mpi"         ? LaunchBackend::kMpi
                       : *backend_name == "processes" ? LaunchBackend::kProcesses
                                                      : LaunchBackend::kAuto;
    LaunchResult result;
    try {
      result = launch(*options, *command);
    } catch (const std::exception& e) {
      fmt::print(stderr, "colossal run: {}\n", e.what());
      throw CLI::RuntimeError(2);
    }
    if (result.exit_code != 0) throw CLI::RuntimeError(result.exit_code);
  });
  return run;
}

}  // namespace colossal::cli
