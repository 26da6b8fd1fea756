// A pipeline stage's exchange batches: see exchange_plan.h.
#include "colossal/parallel/pp/exchange_plan.h"

#include <fmt/format.h>

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

std::vector<ExchangeBatch> exchange_batches(int stage, int num_stages, int64_t num_microbatches, int num_chunks,
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
    std::vector<PipelineMessage> receives;
    bool headers_first = false;
    if (j < steps.size()) {
      for (size_t i = steps[j].first; i < steps[j].second; ++i) {
        if (const auto in = input_of(order[i])) {
          if (with_header(*in)) {
            batch.messages.push_back({Kind::header, false, in->peer, in->microbatch, in->chunk});
            headers_first = true;
          }
          receives.push_back(*in);
        }
      }
    }
    if (headers_first) {
      // The headers with the rest of the batch; the receives once their shapes are known.
      batches.push_back(std::move(batch));
      batch = ExchangeBatch{before, {}};
    }
    batch.messages.insert(batch.messages.end(), receives.begin(), receives.end());
    if (!batch.messages.empty()) batches.push_back(std::move(batch));
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
