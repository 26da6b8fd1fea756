// ProcessGroup: the collective-communication interface every parallel mode talks through (all_reduce,
// reduce_scatter, all_gather, broadcast, reduce, send/recv, all_to_all, barrier; asynchronous Work
// handles; sub-groups), implemented by the MPI backend (CPU tensors) and the NCCL backend (GPU tensors).
#pragma once

#include <chrono>
#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "colossal/core/tensor.h"

namespace colossal::comm {

enum class ReduceOp { sum, avg, max, min };
std::string_view reduce_op_name(ReduceOp op);

/// A color for split() that leaves the calling rank out of every new group.
inline constexpr int kNoColor = -1;

/// The outcome of a collective. Synchronous calls return one that is already complete; async calls
/// return one to wait() on before touching the tensors. A Work is a handle: copies share the state.
///
/// wait() orders the caller after the collective: on the CPU (MPI) it blocks until the data is there;
/// on a GPU (NCCL) it makes the caller's current stream wait for the collective, without blocking the
/// host (see Note [NCCL stream ordering] in comm/nccl/nccl_process_group.cpp). synchronize() always
/// blocks the host until the collective has finished. Errors the transport reports surface as
/// colossal::Error from wait(), synchronize() or is_completed().
class Work {
 public:
  /// What a backend implements behind the handle.
  class Impl {
   public:
    virtual ~Impl() = default;
    virtual void wait() = 0;
    virtual void synchronize() = 0;
    virtual bool is_completed() = 0;
  };

  Work() = default;  ///< an already-completed Work
  explicit Work(std::shared_ptr<Impl> impl) : impl_(std::move(impl)) {}

  void wait() {
    if (impl_) impl_->wait();
  }
  void synchronize() {
    if (impl_) impl_->synchronize();
  }
  /// True once the collective has finished (it never blocks; on the CPU it also drives progress).
  bool is_completed() { return impl_ == nullptr || impl_->is_completed(); }

 private:
  std::shared_ptr<Impl> impl_;
};

/// One send or receive of a batch (ProcessGroup::batch_send_recv); peer is a rank of the group.
struct P2POp {
  enum class Kind { send, recv };
  Kind kind = Kind::send;
  Tensor tensor;
  int peer = 0;
  /// Matches a send with its receive under MPI; NCCL has no tags and matches sends and receives
  /// between two ranks in the order they were issued.
  int tag = 0;
};

/// all_reduce_packed's packing on the current stream: each part into flat at its offset, an undefined
/// part's slice zeroed. For backends implementing do_all_reduce_packed.
void pack_parts(const Tensor& flat, const std::vector<Tensor>& parts, const std::vector<int64_t>& offsets);

/// A set of ranks that communicate. Every collective must be called by every rank of the group, in
/// the same order, with tensors of the same shape and dtype (the shapes named per call). Tensors must
/// be contiguous, live on device(), and are updated in place. One thread issues a group's calls.
///
/// Every operation has a timeout (timeout()): when it has not completed that long after it was
/// issued, the rank prints which operation on which group it waited for and exits with
/// kCollectiveTimeoutExitCode (comm/timeout.h), rather than hang because a peer skipped the call,
/// died, or a link stalled (comm/watchdog.h).
///
/// Reductions: sum, avg (sum divided by size(), in the tensor's dtype: integer division for integer
/// dtypes; NCCL's float avg multiplies by 1/size, which can differ in the last bit), max and min, over
/// f32, f64, f16, bf16, i32, i64 and u8; bool takes max (or) and min (and). f16 and bf16 reduce pairwise
/// in float and round to the dtype after each step, as NCCL does. Data movement (all_gather, broadcast,
/// send/recv, all_to_all) takes every dtype.
class ProcessGroup {
 public:
  virtual ~ProcessGroup() = default;
  ProcessGroup(const ProcessGroup&) = delete;
  ProcessGroup& operator=(const ProcessGroup&) = delete;

  /// This process's rank in the group, 0 <= rank() < size().
  int rank() const { return rank_; }
  int size() const { return size_; }
  /// "mpi" or "nccl".
  virtual std::string_view backend_name() const = 0;
  /// Where the group's tensors live: the CPU for MPI, the group's GPU for NCCL.
  virtual Device device() const = 0;
  /// The world rank of each member, indexed by group rank.
  const std::vector<int>& global_ranks() const { return global_ranks_; }
  /// "mpi group of 4 ranks (world ranks 0, 1, 2, 3), this is rank 1": for messages.
  std::string describe() const;

  /// How long an operation of this group may stay outstanding before the watchdog ends the process.
  /// A world group gets resolve_collective_timeout(InitOptions::timeout) (comm/timeout.h: 300 s
  /// unless COLOSSAL_COLLECTIVE_TIMEOUT or the program says otherwise); split() and new_group() give
  /// their groups their parent's.
  std::chrono::milliseconds timeout() const { return timeout_; }
  /// Sets the timeout of operations issued from now on; it must be positive.
  void set_timeout(std::chrono::milliseconds timeout);

  // ---- collectives
  /// Reduces `tensor` over the group; every rank ends with the result.
  Work all_reduce(const Tensor& tensor, ReduceOp op = ReduceOp::sum, bool async = false);
  /// Copies each of `parts` (flattened) into `flat` at its element offset (an undefined part zeroes
  /// its slice, whose length is then the distance to the next offset or the end), then all-reduces
  /// `flat`: data parallelism's buckets. The copies run where the collective does (on the group's
  /// stream under NCCL, after the caller's stream has produced the parts), so they add nothing to the
  /// caller's stream; the Work keeps `parts` alive until it is waited for. Parts must have flat's
  /// dtype and device and fit without overlapping.
  Work all_reduce_packed(const Tensor& flat, const std::vector<Tensor>& parts, const std::vector<int64_t>& offsets,
                         ReduceOp op = ReduceOp::sum, bool async = false);
  /// Packs `parts` into the 1-D `flat` as all_reduce_packed does (an undefined part zeroes its slice,
  /// on the group's stream under NCCL), then reduce-scatters flat into the 1-D `output` of
  /// flat.numel() / size() elements: ZeRO's buckets.
  Work reduce_scatter_packed(const Tensor& output, const Tensor& flat, const std::vector<Tensor>& parts,
                             const std::vector<int64_t>& offsets, ReduceOp op = ReduceOp::sum, bool async = false);
  /// Reduces `input` over the group and leaves rank r the r-th of size() equal chunks along dim 0:
  /// input's shape is output's with dim 0 times size(). output may be that chunk of input.
  Work reduce_scatter(const Tensor& output, const Tensor& input, ReduceOp op = ReduceOp::sum, bool async = false);
  /// Concatenates every rank's `input` along dim 0 into `output` (rank r's at chunk r): output's shape
  /// is input's with dim 0 times size(). input may be chunk rank() of output.
  Work all_gather(const Tensor& output, const Tensor& input, bool async = false);
  /// Copies root's `tensor` into every rank's.
  Work broadcast(const Tensor& tensor, int root, bool async = false);
  /// Reduces `tensor` over the group into root's; the other ranks' tensors are left unchanged.
  Work reduce(const Tensor& tensor, int root, ReduceOp op = ReduceOp::sum, bool async = false);
  /// Point to point; the receiver's tensor must have the sender's shape and dtype. The MPI backend
  /// reports a receiving tensor larger than the message; a smaller one is an MPI truncation error that
  /// Open MPI does not recover from, and NCCL cannot check either: treat mismatches as fatal. A rank
  /// cannot send to itself. Under NCCL a lone blocking send waits for its receive: pair sends and receives that
  /// cross (a pipeline's both directions) with batch_send_recv.
  Work send(const Tensor& tensor, int dst, int tag = 0, bool async = false);
  Work recv(const Tensor& tensor, int src, int tag = 0, bool async = false);
  /// Issues every send and receive of `ops` together, so they cannot deadlock on each other.
  Work batch_send_recv(const std::vector<P2POp>& ops, bool async = false);
  /// Whether an asynchronous receive may be posted before the sends this rank issues ahead of it in
  /// the same exchange, in the same order among receives: a send completes without its receive and a
  /// posted receive holds back nothing but itself. True for MPI (nonblocking sends and receives) and
  /// for the copy engines' sends and receives of a GPU pair (Note [Pair sends and receives by the copy
  /// engines]); false for NCCL's, whose sends wait for their receives and whose operations run one
  /// after another. A pipeline posts its receives one op ahead where it is true.
  virtual bool receives_post_early() const { return false; }
  /// Splits `input` into size() equal chunks along dim 0, sends chunk j to rank j and puts the chunk
  /// from rank i at chunk i of `output`. input and output have the same shape, dim 0 divisible by size().
  Work all_to_all(const Tensor& output, const Tensor& input, bool async = false);
  /// Returns once every rank of the group has entered the barrier (its Work blocks the host).
  Work barrier(bool async = false);

  // ---- sub-groups (collective over this group: every rank calls, members or not)
  /// Ranks passing the same color >= 0 form a new group, ordered by key and then by rank in this
  /// group (as MPI_Comm_split and ncclCommSplit). Returns null on ranks that pass kNoColor.
  std::shared_ptr<ProcessGroup> split(int color, int key);
  /// A group of the given ranks of this group, in the order listed (group rank i is ranks[i]).
  /// Every rank of this group must pass the same list; ranks not in it get null.
  std::shared_ptr<ProcessGroup> new_group(const std::vector<int>& ranks);

 protected:
  ProcessGroup(int rank, int size);
  /// Backends set the world ranks of a world group; split() sets them for sub-groups.
  void set_global_ranks(std::vector<int> global_ranks);

  // Backends implement these; arguments were checked by the public calls and every call is
  // asynchronous (the public call waits when async is false).
  virtual Work do_all_reduce(const Tensor& tensor, ReduceOp op) = 0;
  /// Packs on the caller's stream (or the CPU), then do_all_reduce; NCCL packs on its own stream.
  virtual Work do_all_reduce_packed(const Tensor& flat, const std::vector<Tensor>& parts,
                                    const std::vector<int64_t>& offsets, ReduceOp op);
  virtual Work do_reduce_scatter(const Tensor& output, const Tensor& input, ReduceOp op) = 0;
  /// Packs on the caller's stream (or the CPU), then do_reduce_scatter; NCCL packs on its own stream.
  virtual Work do_reduce_scatter_packed(const Tensor& output, const Tensor& flat, const std::vector<Tensor>& parts,
                                        const std::vector<int64_t>& offsets, ReduceOp op);
  virtual Work do_all_gather(const Tensor& output, const Tensor& input) = 0;
  virtual Work do_broadcast(const Tensor& tensor, int root) = 0;
  virtual Work do_reduce(const Tensor& tensor, int root, ReduceOp op) = 0;
  virtual Work do_batch_send_recv(const std::vector<P2POp>& ops) = 0;
  virtual Work do_all_to_all(const Tensor& output, const Tensor& input) = 0;
  virtual Work do_barrier() = 0;
  /// color < 0 means "not a member" (the backend maps it to MPI_UNDEFINED / NCCL_SPLIT_NOCOLOR).
  virtual std::shared_ptr<ProcessGroup> do_split(int color, int key) = 0;

 private:
  void check_tensor(std::string_view op, const Tensor& tensor, std::string_view name) const;
  void check_reduction(std::string_view op, const Tensor& tensor, ReduceOp reduce_op) const;
  void check_peer(std::string_view op, int peer, std::string_view role) const;
  /// split() with the rank list's hash (0 for split itself) every caller must agree on.
  std::shared_ptr<ProcessGroup> split_checked(int color, int key, int64_t list_hash);

  /// describe(), made once for the operations the watchdog watches (they share it).
  const std::shared_ptr<const std::string>& shared_description() const;
  friend class WatchedOperation;

  int rank_ = 0;
  int size_ = 1;
  std::vector<int> global_ranks_;
  std::chrono::milliseconds timeout_;
  mutable std::shared_ptr<const std::string> description_;  ///< reset when the world ranks change
};

/// "send of a f32 tensor of shape [4] to rank 1 (tag 0)", or "batch_send_recv of 2 ops (...)" listing
/// the first few: for messages.
std::string describe_p2p(const std::vector<P2POp>& ops);

/// True when two tensors' bytes overlap (backends stage an input that aliases its output).
bool overlaps(const Tensor& a, const Tensor& b);

}  // namespace colossal::comm
