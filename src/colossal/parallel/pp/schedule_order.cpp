// Pipeline schedule orders: see schedule_order.h.
#include "colossal/parallel/pp/schedule_order.h"

#include <fmt/format.h>

#include <algorithm>
#include <set>
#include <utility>

#include "colossal/core/error.h"

namespace colossal::parallel::pp {
namespace {

void check_stage(int stage, int num_stages, int64_t num_microbatches, const char* op) {
  COLOSSAL_CHECK(num_stages >= 1 && stage >= 0 && stage < num_stages,
                 "{}: stage {} is not one of the {} pipeline stages", op, stage, num_stages);
  COLOSSAL_CHECK(num_microbatches >= 1, "{}: the number of microbatches must be >= 1, got {}", op, num_microbatches);
}

}  // namespace

std::vector<PipelineOp> one_f_one_b_order(int stage, int num_stages, int64_t num_microbatches) {
  check_stage(stage, num_stages, num_microbatches, "1F1B schedule");
  const int64_t warmup = std::min<int64_t>(num_stages - stage - 1, num_microbatches);
  const int64_t steady = num_microbatches - warmup;
  std::vector<PipelineOp> order;
  order.reserve(static_cast<size_t>(2 * num_microbatches));
  for (int64_t i = 0; i < warmup; ++i) order.push_back({PipelineOp::Kind::forward, i, 0});
  for (int64_t i = 0; i < steady; ++i) {
    order.push_back({PipelineOp::Kind::forward, warmup + i, 0});
    order.push_back({PipelineOp::Kind::backward, i, 0});
  }
  for (int64_t i = steady; i < num_microbatches; ++i) order.push_back({PipelineOp::Kind::backward, i, 0});
  return order;
}

std::vector<PipelineOp> interleaved_order(int stage, int num_stages, int64_t num_microbatches, int num_chunks) {
  check_stage(stage, num_stages, num_microbatches, "interleaved 1F1B schedule");
  COLOSSAL_CHECK(num_chunks >= 1, "interleaved 1F1B schedule: the number of model chunks must be >= 1, got {}",
                 num_chunks);
  if (num_chunks == 1) return one_f_one_b_order(stage, num_stages, num_microbatches);
  COLOSSAL_CHECK(num_microbatches % num_stages == 0,
                 "interleaved 1F1B schedule: {} microbatches do not divide by the {} pipeline stages (the interleaved "
                 "schedule runs microbatches in groups of one per stage); use a multiple of {}",
                 num_microbatches, num_stages, num_stages);
  const int64_t p = num_stages, v = num_chunks;
  const int64_t total = num_microbatches * v;
  const int64_t warmup = warmup_forwards(stage, num_stages, num_microbatches, num_chunks);
  auto op = [&](int64_t k, bool forward) {
    const int64_t in_group = k % (p * v);
    int chunk = static_cast<int>(in_group / p);
    if (!forward) chunk = static_cast<int>(v) - 1 - chunk;
    const int64_t microbatch = (k / (p * v)) * p + k % p;
    return PipelineOp{forward ? PipelineOp::Kind::forward : PipelineOp::Kind::backward, microbatch, chunk};
  };
  std::vector<PipelineOp> order;
  order.reserve(static_cast<size_t>(2 * total));
  for (int64_t k = 0; k < warmup; ++k) order.push_back(op(k, true));
  for (int64_t k = 0; k < total - warmup; ++k) {
    order.push_back(op(k + warmup, true));
    order.push_back(op(k, false));
  }
  for (int64_t k = total - warmup; k < total; ++k) order.push_back(op(k, false));
  return order;
}

int64_t warmup_forwards(int stage, int num_stages, int64_t num_microbatches, int num_chunks) {
  const int64_t p = num_stages, v = num_chunks, total = num_microbatches * v;
  if (v == 1) return std::min<int64_t>(p - stage - 1, num_microbatches);
  return num_microbatches == p ? total : std::min(total, (p - stage - 1) * 2 + (v - 1) * p);
}

std::vector<PipelineOp> forward_only_order(int64_t num_microbatches, int num_chunks) {
  COLOSSAL_CHECK(num_microbatches >= 1 && num_chunks >= 1,
                 "forward-only schedule: needs >= 1 microbatch and chunk, got {} and {}", num_microbatches, num_chunks);
  std::vector<PipelineOp> order;
  for (int64_t i = 0; i < num_microbatches; ++i) {
    for (int c = 0; c < num_chunks; ++c) order.push_back({PipelineOp::Kind::forward, i, c});
  }
  return order;
}

int64_t peak_in_flight(const std::vector<PipelineOp>& order) {
  std::set<std::pair<int64_t, int>> held;
  int64_t peak = 0;
  for (const PipelineOp& op : order) {
    if (op.kind == PipelineOp::Kind::forward) {
      held.insert({op.microbatch, op.chunk});
      peak = std::max<int64_t>(peak, static_cast<int64_t>(held.size()));
    } else {
      held.erase({op.microbatch, op.chunk});
    }
  }
  return peak;
}

std::string describe(const std::vector<PipelineOp>& order, int num_chunks) {
  std::string out;
  for (const PipelineOp& op : order) {
    if (!out.empty()) out += ' ';
    out += fmt::format("{}{}", op.kind == PipelineOp::Kind::forward ? 'F' : 'B', op.microbatch);
    if (num_chunks > 1) out += fmt::format(".{}", op.chunk);
  }
  return out;
}

}  // namespace colossal::parallel::pp
