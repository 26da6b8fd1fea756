// MpiProcessGroup (comm/mpi/mpi_process_group.h): each collective posts one or more nonblocking MPI
// requests; its Work waits on them, then finishes on the host what MPI does not do (avg's division,
// checking a receive got the size it expected). Tensors stay referenced until the requests finish.
#include "colossal/comm/mpi/mpi_process_group.h"

#include "colossal/comm/timeout.h"   // resolve_collective_timeout
#include "colossal/comm/watchdog.h"  // WatchedOperation, watch, check_deadline

#include <algorithm>
#include <climits>
#include <functional>
#include <mutex>
#include <optional>
#include <thread>
#include <type_traits>
#include <utility>

namespace colossal::comm {

namespace {

int comm_rank(MPI_Comm comm) {
  int rank = 0;
  COLOSSAL_MPI_CHECK(MPI_Comm_rank(comm, &rank), "reading this process's rank");
  return rank;
}

int comm_size(MPI_Comm comm) {
  int size = 0;
  COLOSSAL_MPI_CHECK(MPI_Comm_size(comm, &size), "reading the communicator's size");
  return size;
}

bool mpi_finalized() {
  int finalized = 0;
  MPI_Finalized(&finalized);
  return finalized != 0;
}

/// MPI counts are ints; larger tensors would need derived datatypes, which nothing needs yet.
int element_count(std::string_view op, int64_t numel, const ProcessGroup& group) {
  COLOSSAL_CHECK(numel <= INT_MAX,
                 "{}: {} elements is over the MPI backend's limit of {} per call; split the tensor into chunks [{}]",
                 op, numel, INT_MAX, group.describe());
  return static_cast<int>(numel);
}

/// avg = sum / size, in the tensor's dtype (integer division for integer dtypes).
void divide_in_place(const Tensor& t, int divisor) {
  core::dispatch_arithmetic(t.dtype(), "avg", [&]<class T>() {
    T* p = t.data<T>();
    const int64_t n = t.numel();
    for (int64_t i = 0; i < n; ++i) {
      if constexpr (std::is_integral_v<T>) {
        p[i] = static_cast<T>(static_cast<int64_t>(p[i]) / divisor);
      } else {
        using Acc = core::acc_t<T>;
        p[i] = T(static_cast<Acc>(p[i]) / static_cast<Acc>(divisor));
      }
    }
  });
}

/// A copy of `t` in fresh memory, for inputs that alias their outputs in ways MPI does not allow.
Tensor staged_copy(const Tensor& t) {
  Tensor copy = empty_like(t);
  copy.copy_(t);
  return copy;
}

using Finisher = std::function<void(const std::vector<MPI_Status>&)>;

/// The requests of one operation, shared by its Work and, where another thread may call MPI, the
/// watchdog (Note [Collective watchdog] in comm/watchdog.cpp). MPI forbids testing one request from
/// two threads at once, so both test under mutex_; the watchdog only ever tries it.
class MpiOperation final : public WatchedOperation {
 public:
  MpiOperation(const ProcessGroup& group, std::string operation, std::vector<MPI_Request> requests)
      : WatchedOperation(group, std::move(operation)),
        requests_(std::move(requests)),
        statuses_(requests_.size()),
        watched_(mpi::background_calls_possible()) {}

  /// Whether the watchdog's thread polls this operation (and so drives its progress).
  bool watched() const { return watched_; }

  bool poll() noexcept override {
    const mpi::BackgroundCall call;
    if (!call) return false;
    std::unique_lock lock(mutex_, std::try_to_lock);
    return lock && test_locked();
  }

  /// Tests once from the host; true when finished (result() and statuses() are then final).
  bool test() {
    std::lock_guard lock(mutex_);
    return test_locked();
  }

  /// Waits until the requests finish, ending the process when the deadline passes first. Without
  /// the watchdog's polls nothing progresses MPI before the host waits, so the deadline then counts
  /// from the first host wait rather than from the call.
  void wait() {
    if (test()) return;
    const Clock::time_point deadline = host_deadline();
    for (;;) {
      // Yield rather than spin: ranks often share cores (mpirun --oversubscribe), and a busy loop
      // would take the core the peer needs to reach the collective.
      std::this_thread::yield();
      if (test()) return;
      check_deadline(*this, deadline);
    }
  }

  /// For a host that polls: ends the process when the operation is still outstanding past its
  /// deadline (counted as in wait()).
  void check_host_deadline() { check_deadline(*this, host_deadline()); }

  int result() const { return result_; }
  const std::vector<MPI_Status>& statuses() const { return statuses_; }

 private:
  bool test_locked() {
    if (finished_) return true;
    int flag = 0;
    result_ = MPI_Testall(static_cast<int>(requests_.size()), requests_.data(), &flag, statuses_.data());
    // A failed test finishes the operation too: its error is the result.
    finished_ = result_ != MPI_SUCCESS || flag != 0;
    return finished_;
  }

  Clock::time_point host_deadline() {
    if (watched_) return deadline();
    if (!first_host_wait_) first_host_wait_ = Clock::now();
    return std::max(deadline(), *first_host_wait_ + timeout());
  }

  std::mutex mutex_;
  std::vector<MPI_Request> requests_;
  std::vector<MPI_Status> statuses_;
  int result_ = MPI_SUCCESS;
  bool finished_ = false;
  const bool watched_;
  std::optional<Clock::time_point> first_host_wait_;
};

class MpiWork final : public Work::Impl {
 public:
  MpiWork(std::shared_ptr<MpiOperation> operation, std::vector<Tensor> keep_alive, Finisher finish)
      : operation_(std::move(operation)), keep_alive_(std::move(keep_alive)), finish_(std::move(finish)) {}

  ~MpiWork() override {
    // The buffers must outlive the requests: an abandoned Work still waits for them (within the
    // timeout, like any wait).
    if (!done_ && !mpi_finalized()) operation_->wait();
  }

  void wait() override {
    if (done_) return;
    operation_->wait();
    complete();
  }
  void synchronize() override { wait(); }
  bool is_completed() override {
    if (done_) return true;
    if (!operation_->test()) {
      operation_->check_host_deadline();
      return false;
    }
    complete();
    return true;
  }

 private:
  void complete() {
    done_ = true;
    int rc = operation_->result();
    if (rc == MPI_ERR_IN_STATUS) {
      for (const MPI_Status& status : operation_->statuses()) {
        if (status.MPI_ERROR != MPI_SUCCESS && status.MPI_ERROR != MPI_ERR_PENDING) rc = status.MPI_ERROR;
      }
    }
    COLOSSAL_CHECK(rc == MPI_SUCCESS, "MPI error in {} [{}]: {}", operation_->operation(), operation_->group(),
                   mpi::error_text(rc));
    if (finish_) finish_(operation_->statuses());
    keep_alive_.clear();
  }

  std::shared_ptr<MpiOperation> operation_;
  std::vector<Tensor> keep_alive_;
  Finisher finish_;
  bool done_ = false;
};

/// The Work of `requests`, watched under `group`'s timeout. `what` names the call and its tensors
/// for the timeout message.
Work make_work(const ProcessGroup& group, std::string what, std::vector<MPI_Request> requests,
               std::vector<Tensor> keep_alive, Finisher finish = nullptr) {
  auto operation = std::make_shared<MpiOperation>(group, std::move(what), std::move(requests));
  if (operation->watched()) watch(operation);
  return Work(std::make_shared<MpiWork>(std::move(operation), std::move(keep_alive), std::move(finish)));
}

}  // namespace

std::shared_ptr<MpiProcessGroup> MpiProcessGroup::create_world() {
  mpi::ensure_initialized();
  MPI_Comm comm = MPI_COMM_NULL;
  COLOSSAL_MPI_CHECK(MPI_Comm_dup(MPI_COMM_WORLD, &comm), "duplicating MPI_COMM_WORLD for the world group");
  auto world = std::make_shared<MpiProcessGroup>(comm);
  world->set_timeout(resolve_collective_timeout(kDefaultCollectiveTimeout));
  return world;
}

MpiProcessGroup::MpiProcessGroup(MPI_Comm comm) : ProcessGroup(comm_rank(comm), comm_size(comm)), comm_(comm) {
  COLOSSAL_MPI_CHECK(MPI_Comm_set_errhandler(comm_, MPI_ERRORS_RETURN), "making MPI errors return on {}", describe());
}

MpiProcessGroup::~MpiProcessGroup() {
  // After MPI_Finalize (at exit, or by the program) communicators are gone already.
  if (comm_ != MPI_COMM_NULL && !mpi_finalized()) MPI_Comm_free(&comm_);
}

Work MpiProcessGroup::do_all_reduce(const Tensor& tensor, ReduceOp op) {
  const int count = element_count("all_reduce", tensor.numel(), *this);
  MPI_Request request = MPI_REQUEST_NULL;
  COLOSSAL_MPI_CHECK(MPI_Iallreduce(MPI_IN_PLACE, tensor.raw_data(), count, mpi::datatype(tensor.dtype()),
                                    mpi::reduction(op, tensor.dtype()), comm_, &request),
                     "all_reduce ({}) of a {} tensor of shape {} [{}]", reduce_op_name(op), tensor.dtype(),
                     tensor.shape(), describe());
  Finisher finish;
  if (op == ReduceOp::avg) finish = [tensor, n = size()](const auto&) { divide_in_place(tensor, n); };
  return make_work(
      *this,
      fmt::format("all_reduce ({}) of a {} tensor of shape {}", reduce_op_name(op), tensor.dtype(), tensor.shape()),
      {request}, {tensor}, std::move(finish));
}

Work MpiProcessGroup::do_reduce_scatter(const Tensor& output, const Tensor& input, ReduceOp op) {
  const int count = element_count("reduce_scatter", output.numel(), *this);
  element_count("reduce_scatter", input.numel(), *this);
  // MPI_IN_PLACE here means "input in the output buffer", not "output is my chunk of the input", so
  // any aliasing goes through a copy.
  const Tensor source = overlaps(output, input) ? staged_copy(input) : input;
  MPI_Request request = MPI_REQUEST_NULL;
  COLOSSAL_MPI_CHECK(
      MPI_Ireduce_scatter_block(source.raw_data(), output.raw_data(), count, mpi::datatype(input.dtype()),
                                mpi::reduction(op, input.dtype()), comm_, &request),
      "reduce_scatter ({}) of a {} input of shape {} into {} [{}]", reduce_op_name(op), input.dtype(), input.shape(),
      output.shape(), describe());
  Finisher finish;
  if (op == ReduceOp::avg) finish = [output, n = size()](const auto&) { divide_in_place(output, n); };
  return make_work(*this,
                   fmt::format("reduce_scatter ({}) of a {} input of shape {} into {}", reduce_op_name(op),
                               input.dtype(), input.shape(), output.shape()),
                   {request}, {output, source}, std::move(finish));
}

Work MpiProcessGroup::do_all_gather(const Tensor& output, const Tensor& input) {
  const int count = element_count("all_gather", input.numel(), *this);
  element_count("all_gather", output.numel(), *this);
  const MPI_Datatype type = mpi::datatype(input.dtype());
  const auto* my_chunk = static_cast<const char*>(output.raw_data()) + static_cast<size_t>(rank()) * input.nbytes();
  const bool in_place = input.numel() > 0 && input.raw_data() == my_chunk;
  const Tensor source = !in_place && overlaps(output, input) ? staged_copy(input) : input;
  MPI_Request request = MPI_REQUEST_NULL;
  COLOSSAL_MPI_CHECK(MPI_Iallgather(in_place ? MPI_IN_PLACE : source.raw_data(), count, type, output.raw_data(), count,
                                    type, comm_, &request),
                     "all_gather of a {} input of shape {} into {} [{}]", input.dtype(), input.shape(), output.shape(),
                     describe());
  return make_work(
      *this, fmt::format("all_gather of a {} input of shape {} into {}", input.dtype(), input.shape(), output.shape()),
      {request}, {output, source});
}

Work MpiProcessGroup::do_broadcast(const Tensor& tensor, int root) {
  const int count = element_count("broadcast", tensor.numel(), *this);
  MPI_Request request = MPI_REQUEST_NULL;
  COLOSSAL_MPI_CHECK(MPI_Ibcast(tensor.raw_data(), count, mpi::datatype(tensor.dtype()), root, comm_, &request),
                     "broadcast from rank {} of a {} tensor of shape {} [{}]", root, tensor.dtype(), tensor.shape(),
                     describe());
  return make_work(
      *this, fmt::format("broadcast from rank {} of a {} tensor of shape {}", root, tensor.dtype(), tensor.shape()),
      {request}, {tensor});
}

Work MpiProcessGroup::do_reduce(const Tensor& tensor, int root, ReduceOp op) {
  const int count = element_count("reduce", tensor.numel(), *this);
  const bool is_root = rank() == root;
  MPI_Request request = MPI_REQUEST_NULL;
  // The root reduces into its own tensor; the others only send theirs, which stays unchanged.
  COLOSSAL_MPI_CHECK(
      MPI_Ireduce(is_root ? MPI_IN_PLACE : tensor.raw_data(), is_root ? tensor.raw_data() : nullptr, count,
                  mpi::datatype(tensor.dtype()), mpi::reduction(op, tensor.dtype()), root, comm_, &request),
      "reduce ({}) to rank {} of a {} tensor of shape {} [{}]", reduce_op_name(op), root, tensor.dtype(),
      tensor.shape(), describe());
  Finisher finish;
  if (op == ReduceOp::avg && is_root) finish = [tensor, n = size()](const auto&) { divide_in_place(tensor, n); };
  return make_work(*this,
                   fmt::format("reduce ({}) to rank {} of a {} tensor of shape {}", reduce_op_name(op), root,
                               tensor.dtype(), tensor.shape()),
                   {request}, {tensor}, std::move(finish));
}

Work MpiProcessGroup::do_batch_send_recv(const std::vector<P2POp>& ops) {
  std::vector<int> counts;
  for (const P2POp& p2p : ops) {
    counts.push_back(element_count(p2p.kind == P2POp::Kind::send ? "send" : "recv", p2p.tensor.numel(), *this));
  }
  std::vector<MPI_Request> requests;
  std::vector<Tensor> tensors;
  requests.reserve(ops.size());
  try {
    for (size_t i = 0; i < ops.size(); ++i) {
      const P2POp& p2p = ops[i];
      const MPI_Datatype type = mpi::datatype(p2p.tensor.dtype());
      MPI_Request request = MPI_REQUEST_NULL;
      if (p2p.kind == P2POp::Kind::send) {
        COLOSSAL_MPI_CHECK(MPI_Isend(p2p.tensor.raw_data(), counts[i], type, p2p.peer, p2p.tag, comm_, &request),
                           "send of a {} tensor of shape {} to rank {} (tag {}) [{}]", p2p.tensor.dtype(),
                           p2p.tensor.shape(), p2p.peer, p2p.tag, describe());
      } else {
        COLOSSAL_MPI_CHECK(MPI_Irecv(p2p.tensor.raw_data(), counts[i], type, p2p.peer, p2p.tag, comm_, &request),
                           "recv into a {} tensor of shape {} from rank {} (tag {}) [{}]", p2p.tensor.dtype(),
                           p2p.tensor.shape(), p2p.peer, p2p.tag, describe());
      }
      requests.push_back(request);
      tensors.push_back(p2p.tensor);
    }
  } catch (...) {
    // Requests already posted reference their buffers: withdraw the receives, finish the sends.
    for (size_t i = 0; i < requests.size(); ++i) {
      if (ops[i].kind == P2POp::Kind::recv) MPI_Cancel(&requests[i]);
    }
    MPI_Waitall(static_cast<int>(requests.size()), requests.data(), MPI_STATUSES_IGNORE);
    throw;
  }
  // A receive into a larger tensor than was sent succeeds in MPI; colossal wants the shapes to match.
  Finisher finish = [ops, group = describe()](const std::vector<MPI_Status>& statuses) {
    for (size_t i = 0; i < ops.size(); ++i) {
      if (ops[i].kind != P2POp::Kind::recv) continue;
      int received = 0;
      MPI_Get_count(&statuses[i], mpi::datatype(ops[i].tensor.dtype()), &received);
      COLOSSAL_CHECK(received == ops[i].tensor.numel(),
                     "recv: rank {} sent {} elements (tag {}) but the receiving tensor has shape {} ({} elements of "
                     "{}); sender and receiver need the same shape and dtype [{}]",
                     ops[i].peer, received, ops[i].tag, ops[i].tensor.shape(), ops[i].tensor.numel(),
                     ops[i].tensor.dtype(), group);
    }
  };
  return make_work(*this, describe_p2p(ops), std::move(requests), std::move(tensors), std::move(finish));
}

Work MpiProcessGroup::do_all_to_all(const Tensor& output, const Tensor& input) {
  element_count("all_to_all", input.numel(), *this);
  const int chunk = static_cast<int>(input.numel() / size());
  const MPI_Datatype type = mpi::datatype(input.dtype());
  const Tensor source = overlaps(output, input) ? staged_copy(input) : input;
  MPI_Request request = MPI_REQUEST_NULL;
  COLOSSAL_MPI_CHECK(MPI_Ialltoall(source.raw_data(), chunk, type, output.raw_data(), chunk, type, comm_, &request),
                     "all_to_all of a {} tensor of shape {} [{}]", input.dtype(), input.shape(), describe());
  return make_work(*this, fmt::format("all_to_all of a {} tensor of shape {}", input.dtype(), input.shape()), {request},
                   {output, source});
}

Work MpiProcessGroup::do_barrier() {
  MPI_Request request = MPI_REQUEST_NULL;
  COLOSSAL_MPI_CHECK(MPI_Ibarrier(comm_, &request), "barrier [{}]", describe());
  return make_work(*this, "barrier", {request}, {});
}

std::shared_ptr<ProcessGroup> MpiProcessGroup::do_split(int color, int key) {
  MPI_Comm child = MPI_COMM_NULL;
  COLOSSAL_MPI_CHECK(MPI_Comm_split(comm_, color < 0 ? MPI_UNDEFINED : color, key, &child),
                     "split with color {} and key {} [{}]", color, key, describe());
  if (child == MPI_COMM_NULL) return nullptr;
  return std::make_shared<MpiProcessGroup>(child);
}

}  // namespace colossal::comm
