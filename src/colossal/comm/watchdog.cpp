// The watchdog (comm/watchdog.h): its thread, the deadline checks of host waits, and the one way a
// timed-out rank ends.
#include "colossal/comm/watchdog.h"

#include "colossal/comm/operation_context.h"  // with_operation_context

#include <atomic>
#include <condition_variable>
#include <cstdio>
#include <cstdlib>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "colossal/comm/launch_env.h"     // kCollectiveTimeout, for the message
#include "colossal/comm/process_group.h"  // ProcessGroup::shared_description, timeout
#include "colossal/comm/timeout.h"        // kCollectiveTimeoutExitCode
#include "colossal/core/error.h"

// Note [Collective watchdog]
// A collective that a peer never joins does not fail: it waits. Where the host waits for it (MPI's
// Work::wait, NCCL's synchronize, a barrier, the synchronous forms), the wait loop itself checks the
// deadline. But much of the waiting is not in our loops: under NCCL, Work::wait() only makes a stream
// wait, and the host later blocks inside CUDA (a copy to the host, a stream synchronize) where no
// loop of ours runs; under MPI, async work may be issued and waited on much later. So each backend
// also hands its operations to one thread per process, which every kWatchdogPollInterval asks each
// outstanding operation whether it finished (cudaEventQuery, or MPI_Testall under a try-lock: never
// blocking) and ends the process when one passes its deadline.
//
// The hot path pays for one registration per operation: a lock held for a push_back. The thread
// takes the new operations in one swap and polls them outside the lock; it sleeps while nothing is
// outstanding.
//
// Ending is std::_Exit after the message, not an exception: a thrown error would unwind through
// destructors that wait for the same hung operation (a Work's destructor keeps its buffers alive
// until the transport lets go of them), and the thread that notices is often not the one that is
// stuck. Before exiting, stop hooks abort what a transport has in flight (NCCL's ncclCommAbort, so
// the kernels spinning on a dead peer stop), bounded by kStopHooksGrace. The launcher (colossal run,
// mpirun, torchrun) sees the non-zero exit and stops the other ranks, which may be hung elsewhere.
//
// The thread is never joined: it lives until the process ends, so it also watches operations that
// hang while the program exits. Polls therefore tolerate a runtime that is shutting down: a CUDA
// query failing during teardown counts as finished, and MPI is only polled while it is not being
// finalized (mpi::BackgroundCall in comm/mpi/mpi_runtime.h).

namespace colossal::comm {

namespace {

using Clock = WatchedOperation::Clock;

std::string seconds_text(std::chrono::milliseconds d) {
  return fmt::format("{:g} s", static_cast<double>(d.count()) / 1000.0);
}

void wait_if_ending();
[[noreturn]] void end_process(const std::string& message);

class Watchdog {
 public:
  static Watchdog& instance() {
    // Leaked on purpose: see the Note (the thread outlives static destruction).
    static Watchdog* watchdog = new Watchdog();
    return *watchdog;
  }

  void watch(std::shared_ptr<WatchedOperation> operation) {
    {
      std::lock_guard lock(mutex_);
      incoming_.push_back(std::move(operation));
      if (!started_) {
        started_ = true;
        std::atexit(&wait_if_ending);
        std::thread([this] { run(); }).detach();
        std::thread([this] { guard(); }).detach();
      }
    }
    wake_.notify_one();
  }

  void add_stop_hook(std::function<void()> hook) {
    std::lock_guard lock(hooks_mutex_);
    hooks_.push_back(std::move(hook));
  }

  void run_stop_hooks() noexcept {
    std::vector<std::function<void()>> hooks;
    {
      // A hook registered concurrently with the end is not worth waiting for.
      std::unique_lock lock(hooks_mutex_, std::try_to_lock);
      if (lock) hooks = hooks_;
    }
    for (auto& hook : hooks) {
      try {
        hook();
      } catch (...) {
      }
    }
  }

 private:
  Watchdog() = default;

  void run() {
    std::vector<std::shared_ptr<WatchedOperation>> outstanding;
    for (;;) {
      {
        std::unique_lock lock(mutex_);
        if (outstanding.empty()) {
          wake_.wait(lock, [&] { return !incoming_.empty(); });
        } else {
          wake_.wait_for(lock, kWatchdogPollInterval);
        }
        for (auto& op : incoming_) outstanding.push_back(std::move(op));
        incoming_.clear();
      }
      const Clock::time_point now = Clock::now();
      std::erase_if(outstanding, [&](const std::shared_ptr<WatchedOperation>& op) {
        // Both queries are guarded (Note [A blocked poll]): NCCL's asynchronous-error query takes the
        // communicator's locks, which a thread blocked inside NCCL may hold.
        set_polling(op);
        const bool done = op->poll();
        std::optional<std::string> error = done ? std::nullopt : op->transport_error();
        set_polling(nullptr);
        if (done) return true;
        if (error) end_process_for_transport_error(*op, *error);
        if (now >= op->deadline()) end_process_for_timeout(*op);
        return false;
      });
    }
  }

  void set_polling(std::shared_ptr<WatchedOperation> op) {
    std::lock_guard lock(polling_mutex_);
    polling_ = std::move(op);
    poll_started_ = Clock::now();
  }

  /// Note [A blocked poll]: a poll is a CUDA or MPI query that should return at once, but a driver can
  /// hold it (a CUDA call of another thread that takes the context's lock while a kernel spins on a
  /// peer that never comes). Then the thread above cannot end the process; this one, which calls
  /// nothing that can block, does, once the operation being polled is past its deadline and its poll
  /// has been stuck for kBlockedPollLimit.
  void guard() {
    for (;;) {
      std::this_thread::sleep_for(kWatchdogPollInterval * 5);
      std::shared_ptr<WatchedOperation> op;
      Clock::time_point started;
      {
        std::lock_guard lock(polling_mutex_);
        op = polling_;
        started = poll_started_;
      }
      const Clock::time_point now = Clock::now();
      if (op != nullptr && now - started >= kBlockedPollLimit && now >= op->deadline()) {
        end_process(timeout_message(*op, now) +
                    "colossal: (the watchdog's query of that operation itself blocked: the CUDA driver or MPI is "
                    "stuck too)\n");
      }
    }
  }

  static constexpr std::chrono::seconds kBlockedPollLimit{5};
  std::mutex polling_mutex_;
  std::shared_ptr<WatchedOperation> polling_;
  Clock::time_point poll_started_;
  std::mutex mutex_;
  std::condition_variable wake_;
  std::vector<std::shared_ptr<WatchedOperation>> incoming_;
  bool started_ = false;
  std::mutex hooks_mutex_;
  std::vector<std::function<void()>> hooks_;
};

/// Set once a thread has decided to end the process (end_process).
std::atomic<bool> ending{false};

/// Registered with std::atexit when the watchdog starts: a thread that returns from main or calls
/// exit() while the watchdog is ending the process waits here for the watchdog's _Exit, so the exit
/// code is the timeout's. (The stop hooks' ncclCommAbort releases a host stuck in CUDA behind the
/// hung collective, and that thread may otherwise reach exit first with its own code.)
void wait_if_ending() {
  if (!ending.load()) return;
  for (;;) std::this_thread::sleep_for(std::chrono::hours(1));
}

/// Prints `message`, stops the transports and exits; the first caller wins.
[[noreturn]] void end_process(const std::string& message) {
  if (ending.exchange(true)) {
    // Another thread is ending the process already: its exit will end this thread too.
    for (;;) std::this_thread::sleep_for(std::chrono::hours(1));
  }
  std::fputs(message.c_str(), stderr);
  std::fflush(stderr);
  try {
    // Whatever the stop hooks or a flush of stdout block on, the process ends.
    std::thread([] {
      std::this_thread::sleep_for(kStopHooksGrace);
      std::_Exit(kCollectiveTimeoutExitCode);
    }).detach();
  } catch (...) {
  }
  Watchdog::instance().run_stop_hooks();
  std::fflush(stdout);
  std::fflush(stderr);
  std::_Exit(kCollectiveTimeoutExitCode);
}

std::string rank_text(const WatchedOperation& op) {
  return fmt::format("rank {} (rank {} of its group)", op.world_rank(), op.group_rank());
}

}  // namespace

WatchedOperation::WatchedOperation(const ProcessGroup& group, std::string operation)
    : operation_(with_operation_context(std::move(operation))),
      group_(group.shared_description()),
      world_rank_(group.global_ranks()[static_cast<size_t>(group.rank())]),
      group_rank_(group.rank()),
      issued_(Clock::now()),
      timeout_(group.timeout()) {}

void watch(std::shared_ptr<WatchedOperation> operation) {
  Watchdog::instance().watch(std::move(operation));
}

void add_stop_hook(std::function<void()> hook) {
  Watchdog::instance().add_stop_hook(std::move(hook));
}

void stop_transports() noexcept {
  Watchdog::instance().run_stop_hooks();
}

std::string timeout_message(const WatchedOperation& op, Clock::time_point now) {
  const auto waited = std::chrono::duration_cast<std::chrono::milliseconds>(now - op.issued());
  return fmt::format(
      "colossal: collective timeout: {} waited {:.1f} s for {} [{}], which never completed (the timeout is {}). "
      "A rank of the group did not join it (it skipped the call, called the group's operations in another "
      "order, or is stuck elsewhere), a peer died, or a link stalled. Ending this process with exit code {} "
      "rather than hang; if the wait was legitimate, raise parallel.timeout_s or {} (seconds).\n",
      rank_text(op), static_cast<double>(waited.count()) / 1000.0, op.operation(), op.group(),
      seconds_text(op.timeout()), kCollectiveTimeoutExitCode, env::kCollectiveTimeout);
}

void end_process_for_timeout(const WatchedOperation& op) {
  end_process(timeout_message(op, Clock::now()));
}

void end_process_for_transport_error(const WatchedOperation& op, std::string_view error) {
  const auto waited = std::chrono::duration_cast<std::chrono::milliseconds>(Clock::now() - op.issued());
  end_process(fmt::format(
      "colossal: communication failed: {} was waiting {:.1f} s for {} [{}] when the transport reported: {}. A peer "
      "probably died or its link broke. Ending this process with exit code {} rather than hang.\n",
      rank_text(op), static_cast<double>(waited.count()) / 1000.0, op.operation(), op.group(), error,
      kCollectiveTimeoutExitCode));
}

void check_deadline(const WatchedOperation& op, Clock::time_point deadline) {
  if (Clock::now() >= deadline) end_process_for_timeout(op);
}

}  // namespace colossal::comm
