// StrictP2PProcessGroup: see strict_p2p_process_group.h (Note [Strict point-to-point]).
#include "colossal/comm/strict_p2p_process_group.h"

#include <fmt/format.h>

#include <algorithm>
#include <functional>
#include <utility>

#include "colossal/comm/operation_context.h"
#include "colossal/core/error.h"

namespace colossal::comm {
namespace {

constexpr int kMaxDims = 8;
/// A message's description as it travels: sequence number, tag, dtype, rank, then the sizes.
constexpr int64_t kMetaSize = 4 + kMaxDims;
/// The receiver's answer: 1 when the message was the one it expected, 0 with its expectation after.
constexpr int64_t kAckSize = 1 + kMetaSize;
/// Each message's three transfers (its description, its data, the acknowledgement) take consecutive
/// tags, below 32768 (the least MPI_TAG_UB the standard allows); the sequence numbers wrap long after
/// a message's transfers finished (one operation at a time).
constexpr int64_t kSequenceWrap = 10000;

int tag_of(int64_t sequence, int part) {
  return static_cast<int>(3 * (sequence % kSequenceWrap) + part);
}

std::vector<int64_t> meta_of(int64_t sequence, const P2POp& op) {
  COLOSSAL_CHECK(op.tensor.dim() <= kMaxDims, "strict p2p: tensors of at most {} dimensions, got shape {}", kMaxDims,
                 op.tensor.shape());
  std::vector<int64_t> meta(kMetaSize, 0);
  meta[0] = sequence;
  meta[1] = op.tag;
  meta[2] = static_cast<int64_t>(op.tensor.dtype());
  meta[3] = op.tensor.dim();
  for (int64_t d = 0; d < op.tensor.dim(); ++d) meta[static_cast<size_t>(4 + d)] = op.tensor.size(d);
  return meta;
}

Shape shape_of(const std::vector<int64_t>& meta) {
  return Shape(meta.begin() + 4, meta.begin() + 4 + meta[3]);
}

std::string describe_meta(const std::vector<int64_t>& meta) {
  return fmt::format("tag {}, a {} tensor of shape {}", meta[1], static_cast<DType>(meta[2]), shape_of(meta));
}

Tensor i64_tensor(const std::vector<int64_t>& values, Device device) {
  return core::from_vector<int64_t>(values, {static_cast<int64_t>(values.size())}).to(device);
}

std::vector<int64_t> host_values(const Tensor& t) {
  return t.to(core::kCpu).to_vector<int64_t>();
}

/// A batch's Work: its sends' transfers, then its receives'; once the sends finish, the receivers'
/// acknowledgements are checked.
class StrictWork final : public Work::Impl {
 public:
  StrictWork(Work sends, Work receives, std::function<void()> check_acks)
      : sends_(std::move(sends)), receives_(std::move(receives)), check_acks_(std::move(check_acks)) {}

  void wait() override {
    sends_.wait();
    receives_.wait();
    finish();
  }
  void synchronize() override {
    sends_.synchronize();
    receives_.synchronize();
    finish();
  }
  bool is_completed() override {
    if (!sends_.is_completed() || !receives_.is_completed()) return false;
    finish();
    return true;
  }

 private:
  void finish() {
    if (checked_) return;
    checked_ = true;
    if (check_acks_) check_acks_();
  }

  Work sends_, receives_;
  std::function<void()> check_acks_;
  bool checked_ = false;
};

}  // namespace

StrictP2PProcessGroup::StrictP2PProcessGroup(std::shared_ptr<ProcessGroup> inner)
    : ProcessGroup(inner->rank(), inner->size()), inner_(std::move(inner)) {
  name_ = fmt::format("{} (strict p2p)", inner_->backend_name());
  set_global_ranks(inner_->global_ranks());
  set_timeout(inner_->timeout());
}

StrictP2PProcessGroup::~StrictP2PProcessGroup() {
  try {
    wait_previous();
  } catch (const std::exception&) {
    // A failed operation already reported its error to whoever waited for it.
  }
}

void StrictP2PProcessGroup::wait_previous() {
  Work previous = std::move(previous_);
  previous_ = Work();
  previous.wait();
}

Work StrictP2PProcessGroup::remember(Work work) {
  previous_ = work;
  return work;
}

Work StrictP2PProcessGroup::do_all_reduce(const Tensor& tensor, ReduceOp op) {
  wait_previous();
  return remember(inner_->all_reduce(tensor, op, /*async=*/true));
}

Work StrictP2PProcessGroup::do_reduce_scatter(const Tensor& output, const Tensor& input, ReduceOp op) {
  wait_previous();
  return remember(inner_->reduce_scatter(output, input, op, /*async=*/true));
}

Work StrictP2PProcessGroup::do_all_gather(const Tensor& output, const Tensor& input) {
  wait_previous();
  return remember(inner_->all_gather(output, input, /*async=*/true));
}

Work StrictP2PProcessGroup::do_broadcast(const Tensor& tensor, int root) {
  wait_previous();
  return remember(inner_->broadcast(tensor, root, /*async=*/true));
}

Work StrictP2PProcessGroup::do_reduce(const Tensor& tensor, int root, ReduceOp op) {
  wait_previous();
  return remember(inner_->reduce(tensor, root, op, /*async=*/true));
}

Work StrictP2PProcessGroup::do_all_to_all(const Tensor& output, const Tensor& input) {
  wait_previous();
  return remember(inner_->all_to_all(output, input, /*async=*/true));
}

Work StrictP2PProcessGroup::do_barrier() {
  wait_previous();
  return remember(inner_->barrier(/*async=*/true));
}

std::shared_ptr<ProcessGroup> StrictP2PProcessGroup::do_split(int color, int key) {
  wait_previous();
  std::shared_ptr<ProcessGroup> child = inner_->split(color, key);
  if (child == nullptr) return nullptr;
  return std::make_shared<StrictP2PProcessGroup>(std::move(child));
}

Work StrictP2PProcessGroup::do_batch_send_recv(const std::vector<P2POp>& ops) {
  wait_previous();
  const Device device = inner_->device();
  // Named as the caller's batch, not as the descriptions and acknowledgements that carry it.
  const OperationContext context(fmt::format("strict p2p {}", describe_p2p(ops)));

  // The sends: each one's description and data, and the receive of its acknowledgement.
  struct PendingSend {
    int peer;
    std::vector<int64_t> meta;
    Tensor ack;
  };
  std::vector<PendingSend> sends;
  std::vector<P2POp> send_ops;
  for (const P2POp& op : ops) {
    if (op.kind != P2POp::Kind::send) continue;
    const int64_t sequence = sent_[op.peer]++;
    PendingSend pending{op.peer, meta_of(sequence, op), core::empty({kAckSize}, TensorOptions(DType::i64, device))};
    send_ops.push_back({P2POp::Kind::send, i64_tensor(pending.meta, device), op.peer, tag_of(sequence, 0)});
    send_ops.push_back({P2POp::Kind::send, op.tensor, op.peer, tag_of(sequence, 1)});
    send_ops.push_back({P2POp::Kind::recv, pending.ack, op.peer, tag_of(sequence, 2)});
    sends.push_back(std::move(pending));
  }
  Work sends_work = inner_->batch_send_recv(send_ops, /*async=*/true);

  // The receives: first the descriptions of the messages that come (waiting, within the timeout, for
  // the peers to issue their sends), checked against what this rank expects.
  struct PendingReceive {
    const P2POp* op;
    std::vector<int64_t> expected;
    Tensor meta;
  };
  std::vector<PendingReceive> receives;
  std::vector<P2POp> meta_ops;
  for (const P2POp& op : ops) {
    if (op.kind != P2POp::Kind::recv) continue;
    const int64_t sequence = received_[op.peer]++;
    PendingReceive pending{&op, meta_of(sequence, op), core::empty({kMetaSize}, TensorOptions(DType::i64, device))};
    meta_ops.push_back({P2POp::Kind::recv, pending.meta, op.peer, tag_of(sequence, 0)});
    receives.push_back(std::move(pending));
  }
  inner_->batch_send_recv(meta_ops);
  std::vector<P2POp> data_ops;
  std::string mismatch;
  for (const PendingReceive& pending : receives) {
    const std::vector<int64_t> got = host_values(pending.meta);
    const int peer = pending.op->peer;
    Tensor into = pending.op->tensor;
    std::vector<int64_t> ack(kAckSize, 1);
    if (got != pending.expected) {
      // Drained into a tensor of the sent shape (a smaller one would truncate), and refused.
      if (mismatch.empty()) {
        mismatch = fmt::format(
            "strict p2p (NCCL's rules, Note [Strict point-to-point]): rank {}'s receive #{} from rank {} expects {}, "
            "but rank {}'s send #{} to it is {}; NCCL matches the sends and receives between two ranks by their "
            "order, so both must issue them in the same order with the same shapes [{}{}]",
            rank(), pending.expected[0], peer, describe_meta(pending.expected), peer, got[0], describe_meta(got),
            describe(), OperationContext::current().empty() ? "" : "; " + OperationContext::current());
      }
      into = core::empty(shape_of(got), TensorOptions(static_cast<DType>(got[2]), device));
      ack[0] = 0;
    }
    std::copy(pending.expected.begin(), pending.expected.end(), ack.begin() + 1);
    data_ops.push_back({P2POp::Kind::recv, into, peer, tag_of(pending.expected[0], 1)});
    data_ops.push_back({P2POp::Kind::send, i64_tensor(ack, device), peer, tag_of(pending.expected[0], 2)});
  }
  Work receives_work = inner_->batch_send_recv(data_ops, /*async=*/true);
  if (!mismatch.empty()) {
    receives_work.wait();
    throw Error(mismatch);
  }

  // Once the sends finished, each receiver has said whether the message was the one it expected.
  auto check_acks = [sends = std::move(sends), rank = rank(), group = describe(),
                     context = OperationContext::current()] {
    for (const PendingSend& pending : sends) {
      const std::vector<int64_t> ack = host_values(pending.ack);
      if (ack[0] == 1) continue;
      const std::vector<int64_t> expected(ack.begin() + 1, ack.end());
      throw Error(fmt::format(
          "strict p2p (NCCL's rules, Note [Strict point-to-point]): rank {}'s send #{} to rank {} is {}, but rank "
          "{}'s receive #{} from it expects {}; NCCL matches the sends and receives between two ranks by their "
          "order, so both must issue them in the same order with the same shapes [{}{}]",
          rank, pending.meta[0], pending.peer, describe_meta(pending.meta), pending.peer, expected[0],
          describe_meta(expected), group, context.empty() ? "" : "; " + context));
    }
  };
  return remember(
      Work(std::make_shared<StrictWork>(std::move(sends_work), std::move(receives_work), std::move(check_acks))));
}

}  // namespace colossal::comm
