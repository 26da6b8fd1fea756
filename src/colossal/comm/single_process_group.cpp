// single_process_group: see single_process_group.h.
#include "colossal/comm/single_process_group.h"

#include "colossal/core/error.h"

namespace colossal::comm {
namespace {

class SingleProcessGroup final : public ProcessGroup {
 public:
  explicit SingleProcessGroup(Device device) : ProcessGroup(0, 1), device_(device) {}

  std::string_view backend_name() const override { return "single"; }
  Device device() const override { return device_; }

 protected:
  // Reductions over one rank leave the tensor as it is (avg divides by 1).
  Work do_all_reduce(const Tensor&, ReduceOp) override { return {}; }
  Work do_reduce(const Tensor&, int, ReduceOp) override { return {}; }
  Work do_broadcast(const Tensor&, int) override { return {}; }
  Work do_barrier() override { return {}; }
  // One chunk: output is the input (the public calls checked the shapes).
  Work do_reduce_scatter(const Tensor& output, const Tensor& input, ReduceOp) override { return copy(output, input); }
  Work do_all_gather(const Tensor& output, const Tensor& input) override { return copy(output, input); }
  Work do_all_to_all(const Tensor& output, const Tensor& input) override { return copy(output, input); }
  Work do_batch_send_recv(const std::vector<P2POp>& ops) override {
    // check_peer lets only rank 0 through, and a rank cannot send to itself.
    COLOSSAL_CHECK(ops.empty(), "batch_send_recv: a single-process group has no peer to exchange with [{}]",
                   describe());
    return {};
  }
  std::shared_ptr<ProcessGroup> do_split(int color, int) override {
    return color < 0 ? nullptr : std::make_shared<SingleProcessGroup>(device_);
  }

 private:
  static Work copy(const Tensor& output, const Tensor& input) {
    if (output.raw_data() != input.raw_data()) output.copy_(input);
    return {};
  }

  Device device_;
};

}  // namespace

std::shared_ptr<ProcessGroup> single_process_group(Device device) {
  return std::make_shared<SingleProcessGroup>(device);
}

}  // namespace colossal::comm
