// MpiProcessGroup: the ProcessGroup of CPU tensors over an MPI communicator (Open MPI). Every
// collective is a nonblocking MPI call (MPI_Iallreduce, ...) behind a Work, waited on within the
// group's timeout (comm/watchdog.h); sub-groups come from MPI_Comm_split. Used for CPU training and tests, and by the
// NCCL backend's bootstrap under mpirun.
#pragma once

#include <memory>

#include "colossal/comm/mpi/mpi_runtime.h"
#include "colossal/comm/process_group.h"

namespace colossal::comm {

class MpiProcessGroup final : public ProcessGroup {
 public:
  /// Every rank of MPI_COMM_WORLD, on a duplicate of it (so our traffic never matches the program's
  /// own MPI messages). Starts MPI if nobody has (mpi::ensure_initialized). Its timeout is
  /// COLOSSAL_COLLECTIVE_TIMEOUT when set, else kDefaultCollectiveTimeout (comm/timeout.h).
  static std::shared_ptr<MpiProcessGroup> create_world();
  /// Takes ownership of `comm` (freed with the group) and makes its errors return rather than abort.
  explicit MpiProcessGroup(MPI_Comm comm);
  ~MpiProcessGroup() override;

  std::string_view backend_name() const override { return "mpi"; }
  /// MPI_Isend and MPI_Irecv: a receive may be posted at any time.
  bool receives_post_early() const override { return true; }
  Device device() const override { return core::kCpu; }
  MPI_Comm comm() const { return comm_; }

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
  MPI_Comm comm_ = MPI_COMM_NULL;
};

}  // namespace colossal::comm
