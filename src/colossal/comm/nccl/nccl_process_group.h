// NcclProcessGroup: the ProcessGroup of GPU tensors over one NCCL communicator with a CUDA stream of
// its own, ordered against the caller's stream with events; sub-groups from ncclCommSplit. The world
// starts from rank 0's unique id, sent by MPI_Bcast under mpirun and by the TCP rendezvous otherwise.
// No NCCL or CUDA types here: the communicator is forward-declared, streams are core::Stream.
#pragma once

#include <chrono>
#include <cstdint>
#include <memory>
#include <string>

#include "colossal/comm/bootstrap.h"
#include "colossal/comm/process_group.h"

struct ncclComm;  // nccl.h: typedef struct ncclComm* ncclComm_t

namespace colossal::comm {

namespace detail {
struct NcclCommState;  // the communicator, its stream and its device, shared with in-flight Work
}  // namespace detail

class NcclProcessGroup final : public ProcessGroup {
 public:
  /// The world of `env` on `device`: rank 0 makes the unique id and every rank joins
  /// (ncclCommInitRank). Under Open MPI (env.source == openmpi, in builds with MPI) the id travels by
  /// MPI_Bcast; otherwise by the TCP rendezvous on env.master_addr:env.rendezvous_port(). Its timeout
  /// is COLOSSAL_COLLECTIVE_TIMEOUT when set, else kDefaultCollectiveTimeout (comm/timeout.h).
  static std::shared_ptr<NcclProcessGroup> create_world(const DistEnv& env, Device device,
                                                        std::chrono::milliseconds rendezvous_timeout);
  /// Takes ownership of `comm`, whose GPU is `device`.
  NcclProcessGroup(ncclComm* comm, Device device);
  ~NcclProcessGroup() override;

  std::string_view backend_name() const override { return "nccl"; }
  Device device() const override;
  /// The stream this group's collectives run on (a high-priority stream of its own).
  core::Stream stream() const;
  /// Aborts the communicator (ncclCommAbort): in-flight work is dropped and later calls fail. For a
  /// rank that learned a peer died and must not hang.
  void abort();
  /// From now on, sums of f32, bf16 and f16 tensors of at least `min_bytes` over this group of two
  /// GPUs of one host are moved by the copy engines through a window of `window_bytes` on each GPU
  /// (PairAllReduce, Note [Pair all-reduce by the copy engines]); the rest stays NCCL's. Collective
  /// over the group. Returns false, saying why in `why_not`, where the group is not such a pair.
  bool use_pair_all_reduce(int64_t window_bytes, int64_t min_bytes, std::string* why_not = nullptr);
  /// From now on, batch_send_recv over this group of two GPUs of one host is moved by the copy
  /// engines through `slots` slots of `slot_bytes` on each GPU (PairP2P, Note [Pair sends and receives
  /// by the copy engines]). Collective over the group. Returns false, saying why in `why_not`, where
  /// the group is not such a pair.
  bool use_pair_p2p(int64_t slot_bytes, int64_t slots, std::string* why_not = nullptr);
  /// True once use_pair_p2p turned the copy engines' sends and receives on (NCCL's own wait for each other).
  bool receives_post_early() const override;

 protected:
  Work do_all_reduce(const Tensor& tensor, ReduceOp op) override;
  Work do_all_reduce_packed(const Tensor& flat, const std::vector<Tensor>& parts, const std::vector<int64_t>& offsets,
                            ReduceOp op) override;
  Work do_reduce_scatter(const Tensor& output, const Tensor& input, ReduceOp op) override;
  Work do_reduce_scatter_packed(const Tensor& output, const Tensor& flat, const std::vector<Tensor>& parts,
                                const std::vector<int64_t>& offsets, ReduceOp op) override;
  Work do_all_gather(const Tensor& output, const Tensor& input) override;
  Work do_broadcast(const Tensor& tensor, int root) override;
  Work do_reduce(const Tensor& tensor, int root, ReduceOp op) override;
  Work do_batch_send_recv(const std::vector<P2POp>& ops) override;
  Work do_all_to_all(const Tensor& output, const Tensor& input) override;
  Work do_barrier() override;
  std::shared_ptr<ProcessGroup> do_split(int color, int key) override;

 private:
  explicit NcclProcessGroup(std::shared_ptr<detail::NcclCommState> state);
  std::shared_ptr<detail::NcclCommState> state_;
};

}  // namespace colossal::comm
