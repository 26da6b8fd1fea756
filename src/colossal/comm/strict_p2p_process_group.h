// StrictP2PProcessGroup: a ProcessGroup over another one (MPI ranks on the CPU) whose operations follow
// NCCL's rules, so that code whose point-to-point exchanges would hang or mix up messages over NCCL
// hangs (until the watchdog ends it, naming the operation) or fails with a message on CPU ranks too.
// Tests run the pipeline schedules under it (tests/engine/pipeline_schedule_mpi_test.cpp).
//
// Note [Strict point-to-point]
// NCCL matches a send from a to b with b's receive from a by their order (it has no tags), completes a
// send only once its receive is posted, and runs a communicator's operations one after another on its
// stream. Over MPI none of this holds (tags match, small sends complete at once, requests overlap), so
// this group adds it:
// - one at a time: an operation starts only once the group's previous one has finished (the stream);
// - synchronous sends: a send's Work completes when its receiver has posted the receive (the receiver
//   acknowledges it), as MPI_Issend;
// - order checked: the i-th send from a to b travels with its tag, dtype and shape, and b's i-th
//   receive from a checks them against its own; a mismatch is an error on both ranks naming both
//   sides (under NCCL the data would have landed in the wrong tensor, or the ranks would hang). Tags
//   are not used to match: the pipeline puts a message's identity in its tag, so a swap shows.
// The operations of a batch_send_recv start together: its sends first, then its receives.
#pragma once

#include <map>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "colossal/comm/process_group.h"

namespace colossal::comm {

class StrictP2PProcessGroup final : public ProcessGroup {
 public:
  /// Every rank of `inner` wraps it (its rank, size, world ranks and timeout); the operations then
  /// go through this group only. Sub-groups split from it are strict too.
  explicit StrictP2PProcessGroup(std::shared_ptr<ProcessGroup> inner);
  ~StrictP2PProcessGroup() override;

  /// "mpi (strict p2p)".
  std::string_view backend_name() const override { return name_; }
  Device device() const override { return inner_->device(); }

 protected:
  Work do_all_reduce(const Tensor& tensor, ReduceOp op) override;
  Work do_reduce_scatter(const Tensor& output, const Tensor& input, ReduceOp op) override;
  Work do_all_gather(const Tensor& output, const Tensor& input) override;
  Work do_broadcast(const Tensor& tensor, int root) override;
  Work do_reduce(const Tensor& tensor, int root, ReduceOp op) override;
  Work do_batch_send_recv(const std::vector<P2POp>& ops) override;
  Work do_all_to_all(const Tensor& output, const Tensor& input) override;
  Work do_barrier() override;
  std::shared_ptr<ProcessGroup> do_split(int color, int key) override;

 private:
  /// Waits for the previous operation (Note [Strict point-to-point]: one at a time).
  void wait_previous();
  Work remember(Work work);

  std::shared_ptr<ProcessGroup> inner_;
  std::string name_;
  Work previous_;
  std::map<int, int64_t> sent_;      ///< sends issued to each peer
  std::map<int, int64_t> received_;  ///< receives issued from each peer
};

}  // namespace colossal::comm
