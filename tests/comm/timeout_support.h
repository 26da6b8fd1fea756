// For the collective-timeout tests (timeout_test.cpp, timeout_multigpu_test.cpp): a timed-out rank
// ends its process, so each scenario runs as a child job. run_child starts a command in a process
// group of its own with extra environment variables, collects its output, and kills the whole group
// if it overruns; leftover_processes finds any process of the job still alive afterwards.
#pragma once

#include <dirent.h>
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <iterator>
#include <map>
#include <string>
#include <thread>
#include <utility>
#include <vector>

extern char** environ;

namespace colossal::comm::testing {

struct ChildResult {
  bool exited = false;   ///< ended by exit (not a signal, not killed for overrunning)
  int exit_code = -1;    ///< when exited
  bool overran = false;  ///< still running at the limit: the test killed it
  double seconds = 0;    ///< from start to end
  std::string output;    ///< stdout and stderr, interleaved
};

/// The environment variable every child job of a test gets, with a value unique to the test, so
/// that leftover_processes can find the job's processes wherever they were started.
inline constexpr const char* kMarkerVariable = "COLOSSAL_TIMEOUT_TEST_JOB";

/// Runs `argv` with this process's environment plus `extra`, in a new process group, for at most
/// `limit`; kills the group with SIGKILL when it overruns.
inline ChildResult run_child(const std::vector<std::string>& argv, const std::map<std::string, std::string>& extra,
                             std::chrono::milliseconds limit) {
  std::map<std::string, std::string> env;
  for (char** e = environ; *e != nullptr; ++e) {
    const std::string entry(*e);
    const size_t eq = entry.find('=');
    if (eq != std::string::npos) env[entry.substr(0, eq)] = entry.substr(eq + 1);
  }
  for (const auto& [name, value] : extra) env[name] = value;
  std::vector<std::string> env_strings;
  for (const auto& [name, value] : env) env_strings.push_back(name + "=" + value);
  std::vector<char*> envp, args;
  for (auto& s : env_strings) envp.push_back(s.data());
  envp.push_back(nullptr);
  std::vector<std::string> argv_copy = argv;
  for (auto& s : argv_copy) args.push_back(s.data());
  args.push_back(nullptr);

  int pipe_fds[2];
  if (::pipe2(pipe_fds, O_CLOEXEC) != 0) return {};
  posix_spawn_file_actions_t actions;
  posix_spawn_file_actions_init(&actions);
  posix_spawn_file_actions_adddup2(&actions, pipe_fds[1], 1);
  posix_spawn_file_actions_adddup2(&actions, pipe_fds[1], 2);
  posix_spawnattr_t attributes;
  posix_spawnattr_init(&attributes);
  posix_spawnattr_setflags(&attributes, POSIX_SPAWN_SETPGROUP);
  posix_spawnattr_setpgroup(&attributes, 0);
  const auto start = std::chrono::steady_clock::now();
  pid_t pid = -1;
  const int spawn_error = ::posix_spawnp(&pid, args[0], &actions, &attributes, args.data(), envp.data());
  posix_spawn_file_actions_destroy(&actions);
  posix_spawnattr_destroy(&attributes);
  ::close(pipe_fds[1]);
  ChildResult result;
  if (spawn_error != 0) {
    ::close(pipe_fds[0]);
    result.output = "cannot start " + argv[0] + ": " + std::strerror(spawn_error);
    return result;
  }

  const auto deadline = start + limit;
  bool pipe_open = true;
  int status = 0;
  bool reaped = false;
  while (!reaped) {
    if (pipe_open) {
      pollfd fd{pipe_fds[0], POLLIN, 0};
      if (::poll(&fd, 1, 20) > 0) {
        char buffer[4096];
        const ssize_t n = ::read(pipe_fds[0], buffer, sizeof buffer);
        if (n > 0) {
          result.output.append(buffer, static_cast<size_t>(n));
        } else if (n == 0) {
          pipe_open = false;
        }
      }
    } else {
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
    if (::waitpid(pid, &status, WNOHANG) == pid) reaped = true;
    if (!reaped && std::chrono::steady_clock::now() > deadline && !result.overran) {
      result.overran = true;
      ::kill(-pid, SIGKILL);
    }
  }
  result.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  // What is still buffered in the pipe (writers that outlived the child are killed with its group).
  ::kill(-pid, SIGKILL);
  for (;;) {
    pollfd fd{pipe_fds[0], POLLIN, 0};
    if (!pipe_open || ::poll(&fd, 1, 200) <= 0) break;
    char buffer[4096];
    const ssize_t n = ::read(pipe_fds[0], buffer, sizeof buffer);
    if (n <= 0) break;
    result.output.append(buffer, static_cast<size_t>(n));
  }
  ::close(pipe_fds[0]);
  result.exited = !result.overran && WIFEXITED(status);
  result.exit_code = result.exited ? WEXITSTATUS(status) : -1;
  return result;
}

/// The ids of live processes (zombies aside) whose environment holds kMarkerVariable=`job`.
inline std::vector<int> leftover_processes(const std::string& job) {
  std::vector<int> found;
  const std::string needle = std::string(kMarkerVariable) + "=" + job;
  DIR* proc = ::opendir("/proc");
  if (proc == nullptr) return found;
  while (dirent* entry = ::readdir(proc)) {
    const int pid = std::atoi(entry->d_name);
    if (pid <= 0 || pid == ::getpid()) continue;
    const std::string dir = std::string("/proc/") + entry->d_name;
    std::ifstream stat_file(dir + "/stat");
    std::string stat((std::istreambuf_iterator<char>(stat_file)), std::istreambuf_iterator<char>());
    const size_t paren = stat.rfind(')');
    if (paren != std::string::npos && paren + 2 < stat.size() && stat[paren + 2] == 'Z') continue;
    std::ifstream environ_file(dir + "/environ", std::ios::binary);
    std::string variables((std::istreambuf_iterator<char>(environ_file)), std::istreambuf_iterator<char>());
    size_t at = 0;
    while (at < variables.size()) {
      const size_t end = variables.find('\0', at);
      const std::string variable = variables.substr(at, end == std::string::npos ? std::string::npos : end - at);
      if (variable == needle) {
        found.push_back(pid);
        break;
      }
      if (end == std::string::npos) break;
      at = end + 1;
    }
  }
  ::closedir(proc);
  return found;
}

/// Waits up to `limit` for the job's processes to be gone (a killed process takes a moment to be
/// reaped by its parent) and returns those still alive.
inline std::vector<int> wait_for_no_leftovers(const std::string& job, std::chrono::milliseconds limit) {
  const auto deadline = std::chrono::steady_clock::now() + limit;
  std::vector<int> left = leftover_processes(job);
  while (!left.empty() && std::chrono::steady_clock::now() < deadline) {
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
    left = leftover_processes(job);
  }
  return left;
}

/// The number of seconds in "waited 2.1 s" of a timeout message, or -1.
inline double waited_seconds(const std::string& output) {
  const std::string key = "waited ";
  const size_t at = output.find(key);
  if (at == std::string::npos) return -1;
  return std::strtod(output.c_str() + at + key.size(), nullptr);
}

}  // namespace colossal::comm::testing
