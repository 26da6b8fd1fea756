// A pipeline stage's exchange batches: see exchange_plan.h.
#include "colossal/parallel/pp/exchange_plan.h"

#include <fmt/format.h>

#include <algorithm>
#include <optional>
#include <utility>

#include "colossal/core/error.h"

namespace colossal::parallel::pp {

bool ExchangeBatch::has_receive() const {
  for (const PipelineMessage& m : messages) {
    if (!m.send) return true;
  }
  return false;
}

namespace {

/// The batches before the two ends' groupings are made to agree: before op i, the send of op i - 1's
/// output and the receive of op i's input (the headers first, in a batch of their own).
std::vector<ExchangeBatch> paired_batches(int stage, int num_stages, int64_t num_microbatches, int num_chunks,
                                          bool headers, bool forward_only) {
  // The orders check the numbers.
  const std::vector<PipelineOp> order = forward_only
                                            ? forward_only_order(num_microbatches, num_chunks)
                                            : interleaved_order(stage, num_stages, num_microbatches, num_chunks);
  const int p = num_stages, s = stage, v = num_chunks;
  const bool first = s == 0, last = s == p - 1;
  const int prev = first ? p - 1 : s - 1;  // chunk c's input comes from chunk c - 1 of the last stage
  const int next = last ? 0 : s + 1;       // its output goes to chunk c + 1 of stage 0
  using Kind = PipelineMessage::Kind;

  // What op i sends after it and receives before it.
  auto output_of = [&](const PipelineOp& op) -> std::optional<PipelineMessage> {
    const int c = op.chunk;
    if (op.kind == PipelineOp::Kind::forward) {
      if (last && c == v - 1) return std::nullopt;  // the loss
      return PipelineMessage{Kind::activation, true, next, op.microbatch, c};
    }
    if (first && c == 0) return std::nullopt;  // the data has no gradient
    return PipelineMessage{Kind::gradient, true, prev, op.microbatch, c};
  };
  auto input_of = [&](const PipelineOp& op) -> std::optional<PipelineMessage> {
    const int c = op.chunk;
    if (op.kind == PipelineOp::Kind::forward) {
      if (first && c == 0) return std::nullopt;
      return PipelineMessage{Kind::activation, false, prev, op.microbatch, first ? c - 1 : c};
    }
    if (last && c == v - 1) return std::nullopt;
    return PipelineMessage{Kind::gradient, false, next, op.microbatch, last ? c + 1 : c};
  };
  // Headers travel between two stages only (a stage's own chunks know their shapes).
  auto with_header = [&](const PipelineMessage& m) {
    return headers && m.kind == Kind::activation && m.microbatch == 0 && m.peer != s;
  };

  // The steps between exchanges (Note [Pipeline exchanges]): each op alone, but with several chunks
  // the steady phase's forward-backward pairs, as Megatron's interleaved schedule (a backward's
  // gradient may then only come once the other end sent its own).
  std::vector<std::pair<size_t, size_t>> steps;  // [begin, end) of the order
  const size_t n = order.size();
  size_t paired_begin = n, paired_end = n;
  if (v > 1 && !forward_only) {
    // w warm-up forwards, then forward-backward pairs, then w backwards.
    const auto warmup = static_cast<size_t>(warmup_forwards(s, p, num_microbatches, v));
    paired_begin = warmup;
    paired_end = n - warmup;
  }
  for (size_t i = 0; i < n;) {
    const size_t size = i >= paired_begin && i < paired_end ? 2 : 1;
    steps.emplace_back(i, i + size);
    i += size;
  }

  std::vector<ExchangeBatch> batches;
  // The headers in a batch of their own before the rest, on both ends alike: the receiver must read
  // a header before it can post the activation's receive, and NCCL needs two ranks to group their
  // messages to each other the same way (Note [Pipeline exchanges]).
  auto push = [&](const ExchangeBatch& batch) {
    ExchangeBatch header_batch{batch.before_op, {}}, rest{batch.before_op, {}};
    for (const PipelineMessage& m : batch.messages) {
      (m.kind == Kind::header ? header_batch : rest).messages.push_back(m);
    }
    if (!header_batch.messages.empty()) batches.push_back(std::move(header_batch));
    if (!rest.messages.empty()) batches.push_back(std::move(rest));
  };
  for (size_t j = 0; j <= steps.size(); ++j) {
    const size_t before = j < steps.size() ? steps[j].first : n;
    ExchangeBatch batch{before, {}};
    if (j > 0) {
      for (size_t i = steps[j - 1].first; i < steps[j - 1].second; ++i) {
        if (const auto out = output_of(order[i])) {
          if (with_header(*out)) batch.messages.push_back({Kind::header, true, out->peer, out->microbatch, out->chunk});
          batch.messages.push_back(*out);
        }
      }
    }
    // Forward only, a chunk's input comes from upstream alone: the sends go first, on their own, so
    // no send waits in a batch whose receive needs that very send to go round the stages first (with
    // several chunks stage 0's next input is the last stage's output).
    if (forward_only) {
      push(batch);
      batch.messages.clear();
    }
    if (j < steps.size()) {
      for (size_t i = steps[j].first; i < steps[j].second; ++i) {
        if (const auto in = input_of(order[i])) {
          if (with_header(*in)) batch.messages.push_back({Kind::header, false, in->peer, in->microbatch, in->chunk});
          batch.messages.push_back(*in);
        }
      }
    }
    push(batch);
  }
  return batches;
}

/// For each message of `mine` (stage `self`) with `peer`, the index of the batch of `theirs` (the
/// peer's batches) holding its other end: the i-th send in one direction meets the i-th receive.
std::vector<std::vector<size_t>> partner_batches(const std::vector<ExchangeBatch>& mine, int self,
                                                 const std::vector<ExchangeBatch>& theirs, int peer) {
  // The other end's messages with this stage, per direction (as seen from here: true = this stage sends).
  std::vector<size_t> their_receives, their_sends;
  for (size_t b = 0; b < theirs.size(); ++b) {
    for (const PipelineMessage& m : theirs[b].messages) {
      if (m.peer == self) (m.send ? their_sends : their_receives).push_back(b);
    }
  }
  std::vector<std::vector<size_t>> partner(mine.size());
  size_t sends = 0, receives = 0;
  for (size_t b = 0; b < mine.size(); ++b) {
    for (const PipelineMessage& m : mine[b].messages) {
      if (m.peer != peer) {
        partner[b].push_back(0);
        continue;
      }
      const std::vector<size_t>& list = m.send ? their_receives : their_sends;
      size_t& next = m.send ? sends : receives;
      COLOSSAL_CHECK(next < list.size(), "pipeline exchange plan: stage {} {} with no counterpart on stage {}", self,
                     describe(m), peer);
      partner[b].push_back(list[next++]);
    }
  }
  COLOSSAL_CHECK(sends == their_receives.size() && receives == their_sends.size(),
                 "pipeline exchange plan: stages {} and {} disagree on the number of messages between them", self,
                 peer);
  return partner;
}

}  // namespace

std::vector<ExchangeBatch> exchange_batches(int stage, int num_stages, int64_t num_microbatches, int num_chunks,
                                            bool headers, bool forward_only) {
  const int p = num_stages, s = stage;
  auto plan_of = [&](int q) {
    return paired_batches(q, num_stages, num_microbatches, num_chunks, headers, forward_only);
  };
  const std::vector<ExchangeBatch> mine = plan_of(s);
  if (p == 1) return mine;  // one stage: its chunks exchange through its mailbox
  // Note [Pipeline exchanges]: where a batch of this stage holds messages with a neighbour that the
  // neighbour issues in several batches (the ends of the warm-up and cool-down, where one end pairs a
  // send with a receive and the other has nothing to pair it with), it is cut the neighbour's way.
  // The neighbour cuts its own batches by this stage's alike, so each piece of one meets exactly one
  // piece of the other.
  const int prev = s == 0 ? p - 1 : s - 1, next = s == p - 1 ? 0 : s + 1;
  const std::vector<std::vector<size_t>> from_prev = partner_batches(mine, s, plan_of(prev), prev);
  const std::vector<std::vector<size_t>> from_next =
      next == prev ? from_prev : partner_batches(mine, s, plan_of(next), next);
  std::vector<ExchangeBatch> batches;
  for (size_t b = 0; b < mine.size(); ++b) {
    const std::vector<PipelineMessage>& messages = mine[b].messages;
    // Per neighbour, the distinct batches of its own that this batch's messages meet, in order; piece
    // t holds the messages meeting each neighbour's t-th.
    auto distinct = [&](int peer, const std::vector<size_t>& partner) {
      std::vector<size_t> ids;
      for (size_t k = 0; k < messages.size(); ++k) {
        if (messages[k].peer == peer && (ids.empty() || ids.back() != partner[k])) ids.push_back(partner[k]);
      }
      return ids;
    };
    const std::vector<size_t> prev_ids = distinct(prev, from_prev[b]);
    const std::vector<size_t> next_ids = next == prev ? std::vector<size_t>{} : distinct(next, from_next[b]);
    const size_t pieces = std::max<size_t>({1, prev_ids.size(), next_ids.size()});
    for (size_t t = 0; t < pieces; ++t) {
      ExchangeBatch piece{mine[b].before_op, {}};
      for (size_t k = 0; k < messages.size(); ++k) {
        const PipelineMessage& m = messages[k];
        const bool here = m.peer == prev   ? t < prev_ids.size() && from_prev[b][k] == prev_ids[t]
                          : m.peer == next ? t < next_ids.size() && from_next[b][k] == next_ids[t]
                                           : t == 0;  // this stage's own mailbox
        if (here) piece.messages.push_back(m);
      }
      if (!piece.messages.empty()) batches.push_back(std::move(piece));
    }
  }
  return batches;
}

std::string describe(const PipelineMessage& message) {
  const char* kind = message.kind == PipelineMessage::Kind::header       ? "activation header"
                     : message.kind == PipelineMessage::Kind::activation ? "activation"
                                                                         : "gradient";
  return fmt::format("{} {} of microbatch {} (chunk {}) {} stage {}", message.send ? "send" : "receive", kind,
                     message.microbatch, message.chunk, message.send ? "to" : "from", message.peer);
}

}  // namespace colossal::parallel::pp
