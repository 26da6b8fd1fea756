// The messages one pipeline stage exchanges with its neighbours around each op of its schedule order
// (parallel/pp/schedule_order.h), grouped into the batches it issues with
// ProcessGroup::batch_send_recv. PipelineSchedule executes them; tests simulate a whole pipeline of
// them under NCCL's rules to show every pair of neighbours issues matching sequences and nothing waits
// forever.
//
// Note [Pipeline exchanges]
// NCCL has no tags: the i-th send from rank a to rank b meets b's i-th receive from a, a send does not
// complete until its receive is posted, and a communicator's operations run one after another on its
// stream. So the two ends of each direction must issue their messages in the same order, and a stage
// must not wait on a lone send whose receive its peer will only post after a send of its own (two
// crossing sends deadlock). As Megatron-LM does, each stage issues, before op i of its order, one
// batch holding the send of op i - 1's output (an activation forward, a gradient backward) and the
// receive of op i's input: send_forward + recv_backward, send_backward + recv_forward, and so on; the
// last op's send goes alone after it. The orders make each direction carry one kind of message in the
// same sequence on both ends: activations in forward order, gradients in backward order (the forward
// order k -> (chunk, microbatch) is the same on every stage; with 2 stages and several chunks a
// direction carries both kinds, and the warm-up lengths keep their interleaving equal on both ends).
// tests/parallel/pp/exchange_plan_test.cpp runs every stage's batches under these rules.
//
// Two ranks must also group their messages to each other alike: NCCL leaves it undefined when one
// sends two messages in one group and the other receives them in two (a group may block on any of
// its operations; on H100s such a pipeline hung, nondeterministically). Megatron's pairing gives
// every batch of one end exactly one batch of the other with the same messages between them.
//
// Shapes: a receiver allocates its buffer before the data comes. An activation's dtype and shape are
// the same for every microbatch of a batch, so with `headers` each activation of microbatch 0 goes
// after a small header (dtype and shape). The headers of a batch go first in a batch of their own,
// on both ends alike; the receiver reads them, then both issue the rest. The schedule keeps the
// shapes it learnt for later microbatches and later batches of the same shape.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "colossal/parallel/pp/schedule_order.h"

namespace colossal::parallel::pp {

struct PipelineMessage {
  enum class Kind { header, activation, gradient };
  Kind kind = Kind::activation;
  bool send = true;  ///< this stage sends it (else receives it)
  int peer = 0;      ///< the other stage (this stage itself with one stage and several chunks)
  int64_t microbatch = 0;
  /// The chunk on the sending stage: whose output an activation (or its header) is, whose input a
  /// gradient is the gradient of. Both ends name a message alike.
  int chunk = 0;
  friend bool operator==(const PipelineMessage&, const PipelineMessage&) = default;
};

/// One batch_send_recv: issued just before op `before_op` of the order (order.size(): after the last
/// op), sends first. A batch with a receive is waited for when an op takes what it brings (at the
/// latest before op `before_op`); one of sends only at the end of the micro-step.
struct ExchangeBatch {
  size_t before_op = 0;
  std::vector<PipelineMessage> messages;
  bool has_receive() const;
  friend bool operator==(const ExchangeBatch&, const ExchangeBatch&) = default;
};

/// The batches of stage `stage` of `num_stages` with `num_chunks` chunks running `num_microbatches`
/// through interleaved_order (1F1B with one chunk), or forward_only_order when `forward_only`, in the
/// order they are issued (Note [Pipeline exchanges]); their before_op indexes that order. With
/// `headers`, microbatch 0's activations carry their header. Empty batches are left out.
std::vector<ExchangeBatch> exchange_batches(int stage, int num_stages, int64_t num_microbatches, int num_chunks,
                                            bool headers, bool forward_only = false);

/// "send activation of microbatch 3 (chunk 0) to stage 1": for messages.
std::string describe(const PipelineMessage& message);

}  // namespace colossal::parallel::pp
