// The watchdog: a rank whose collective never completes (a peer skipped it, died, or a link stalled)
// ends with a message instead of hanging. The backends describe every operation they issue as a
// WatchedOperation; a background thread polls those it can, and every host wait checks the deadline
// itself. See Note [Collective watchdog] in watchdog.cpp.
#pragma once

#include <chrono>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <string_view>

namespace colossal::comm {

class ProcessGroup;

/// One outstanding operation of a group, as the watchdog sees it: what it is, on which group and rank,
/// when it was issued and how long it may take. A backend makes one per operation (a subclass that
/// can tell whether the operation finished) and shares it between its Work and watch().
class WatchedOperation {
 public:
  using Clock = std::chrono::steady_clock;

  /// `operation` names the call and its tensors ("all_reduce (sum) of a f32 tensor of shape [4]"),
  /// followed by the issuing thread's OperationContext (comm/operation_context.h) when there is one;
  /// the group's description, ranks and timeout are read from `group` now, so the operation can be
  /// reported after the group is gone.
  WatchedOperation(const ProcessGroup& group, std::string operation);
  virtual ~WatchedOperation() = default;
  WatchedOperation(const WatchedOperation&) = delete;
  WatchedOperation& operator=(const WatchedOperation&) = delete;

  /// Whether the operation has finished. The watchdog's thread calls it while the issuing thread
  /// goes on, so it must neither block (try a lock, never wait for one) nor throw; an operation that
  /// cannot answer says false, and one whose state cannot be read any more (a failed device) says
  /// true: its owner will see the error.
  virtual bool poll() noexcept = 0;
  /// A failure the transport reported in the background while the operation was outstanding
  /// (NCCL's asynchronous errors), or nullopt. Same rules as poll().
  virtual std::optional<std::string> transport_error() noexcept { return std::nullopt; }

  const std::string& operation() const { return operation_; }
  /// ProcessGroup::describe() of the group, when the operation was issued.
  const std::string& group() const { return *group_; }
  int world_rank() const { return world_rank_; }
  int group_rank() const { return group_rank_; }
  Clock::time_point issued() const { return issued_; }
  std::chrono::milliseconds timeout() const { return timeout_; }
  Clock::time_point deadline() const { return issued_ + timeout_; }

 private:
  std::string operation_;
  std::shared_ptr<const std::string> group_;
  int world_rank_ = 0;
  int group_rank_ = 0;
  Clock::time_point issued_;
  std::chrono::milliseconds timeout_;
};

/// Hands `operation` to the watchdog's thread (started on first use), which polls it every
/// kWatchdogPollInterval until it finishes and ends the process (end_process_for_timeout) if its
/// deadline passes first, or if its transport reports an error. Only for operations whose poll()
/// answers from another thread; the others rely on their host waits' deadline checks.
void watch(std::shared_ptr<WatchedOperation> operation);

/// How often the watchdog's thread polls what it watches: a timed-out rank ends at most this much
/// after its deadline.
inline constexpr std::chrono::milliseconds kWatchdogPollInterval{100};
/// How long the stop hooks may take before the process ends anyway (a transport's abort can hang
/// on a broken link too).
inline constexpr std::chrono::seconds kStopHooksGrace{5};

/// The message a rank prints when `operation` timed out: this rank (world and group rank), the
/// operation with its tensors, the group, how long it waited by `now`, and what to do.
std::string timeout_message(const WatchedOperation& operation, WatchedOperation::Clock::time_point now);

/// Ends this process because `operation` passed its deadline: prints timeout_message on stderr,
/// runs the stop hooks, flushes stdout and stderr and exits with kCollectiveTimeoutExitCode
/// (comm/timeout.h) through std::_Exit, so no destructor waits on the hung operation. Safe from any
/// thread: when two threads get here, the first reports and the second waits for the exit.
[[noreturn]] void end_process_for_timeout(const WatchedOperation& operation);
/// The same for an operation whose transport failed in the background (`error` says how).
[[noreturn]] void end_process_for_transport_error(const WatchedOperation& operation, std::string_view error);

/// Ends the process (end_process_for_timeout) when `deadline` has passed: for every loop in which
/// the host waits for `operation`.
void check_deadline(const WatchedOperation& operation, WatchedOperation::Clock::time_point deadline);
inline void check_deadline(const WatchedOperation& operation) {
  check_deadline(operation, operation.deadline());
}

/// Registers `hook`, run once before a timed-out process exits, to stop a transport's work in flight
/// (the NCCL backend aborts its communicators, so their kernels stop). Hooks run on the thread that
/// ends the process and must not throw; after kStopHooksGrace the process exits whatever they do.
void add_stop_hook(std::function<void()> hook);

/// Runs the stop hooks now, on this thread: for a rank leaving on an error, before its groups are torn
/// down. Tearing down an NCCL communicator waits for its operations in flight, which a peer that
/// went on to a collective this rank will never join keeps waiting forever; aborted first, the
/// teardown returns at once and the rank exits with its error (the launcher then stops the peers).
void stop_transports() noexcept;

}  // namespace colossal::comm
