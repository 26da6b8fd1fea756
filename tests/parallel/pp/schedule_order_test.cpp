// Pipeline schedule orders (parallel/pp/schedule_order.h) against hand-written 1F1B and interleaved
// orders; every microbatch-chunk forwarded and backwarded once, backward after forward; the
// activations a stage holds at its peak; and a whole pipeline simulated op by op with unit-time ops:
// it never deadlocks and its makespan has the bubble (p - 1) / (v m) the schedule promises.
#include "colossal/parallel/pp/schedule_order.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <map>
#include <set>
#include <utility>
#include <vector>

#include "gradcheck.h"  // EXPECT_ERROR_CONTAINS

namespace colossal::parallel::pp {
namespace {

TEST(ScheduleOrder, OneFOneBByHand) {
  EXPECT_EQ(describe(one_f_one_b_order(0, 4, 8)), "F0 F1 F2 F3 B0 F4 B1 F5 B2 F6 B3 F7 B4 B5 B6 B7");
  EXPECT_EQ(describe(one_f_one_b_order(3, 4, 8)), "F0 B0 F1 B1 F2 B2 F3 B3 F4 B4 F5 B5 F6 B6 F7 B7");
  EXPECT_EQ(describe(one_f_one_b_order(1, 4, 8)), "F0 F1 F2 B0 F3 B1 F4 B2 F5 B3 F6 B4 F7 B5 B6 B7");
  // Fewer microbatches than the warm-up would take: all forwards, then all backwards.
  EXPECT_EQ(describe(one_f_one_b_order(0, 4, 2)), "F0 F1 B0 B1");
}

TEST(ScheduleOrder, InterleavedByHand) {
  // p = 2, m = 4, v = 2, stage 0: warm-up (2 - 0 - 1) * 2 + (2 - 1) * 2 = 4 forwards (Note
  // [Interleaved order]), then pairs, then the backwards, chunk 1 first.
  EXPECT_EQ(describe(interleaved_order(0, 2, 4, 2), 2),
            "F0.0 F1.0 F0.1 F1.1 F2.0 B0.1 F3.0 B1.1 F2.1 B0.0 F3.1 B1.0 B2.1 B3.1 B2.0 B3.0");
  // Stage 1 warms up with (v - 1) * p = 2 forwards.
  EXPECT_EQ(describe(interleaved_order(1, 2, 4, 2), 2),
            "F0.0 F1.0 F0.1 B0.1 F1.1 B1.1 F2.0 B0.0 F3.0 B1.0 F2.1 B2.1 F3.1 B3.1 B2.0 B3.0");
  // One chunk is plain 1F1B.
  EXPECT_EQ(interleaved_order(1, 4, 8, 1), one_f_one_b_order(1, 4, 8));
  EXPECT_ERROR_CONTAINS(interleaved_order(0, 4, 6, 2), "6 microbatches do not divide by the 4 pipeline stages");
  EXPECT_ERROR_CONTAINS(one_f_one_b_order(4, 4, 8), "stage 4 is not one of the 4 pipeline stages");
}

void expect_complete(const std::vector<PipelineOp>& order, int64_t m, int v, const std::string& what) {
  std::set<std::pair<int64_t, int>> forwarded, backwarded;
  for (const PipelineOp& op : order) {
    const std::pair<int64_t, int> key{op.microbatch, op.chunk};
    if (op.kind == PipelineOp::Kind::forward) {
      EXPECT_TRUE(forwarded.insert(key).second) << what << ": F" << op.microbatch << "." << op.chunk << " twice";
    } else {
      EXPECT_TRUE(forwarded.contains(key)) << what << ": B" << op.microbatch << "." << op.chunk << " before its F";
      EXPECT_TRUE(backwarded.insert(key).second) << what << ": B" << op.microbatch << "." << op.chunk << " twice";
    }
  }
  EXPECT_EQ(static_cast<int64_t>(forwarded.size()), m * v) << what;
  EXPECT_EQ(static_cast<int64_t>(backwarded.size()), m * v) << what;
}

TEST(ScheduleOrder, EveryMicrobatchOnceAndThePeakOfActivations) {
  for (int p : {1, 2, 4, 8}) {
    for (int64_t m : {1, 2, 4, 8, 16}) {
      for (int s = 0; s < p; ++s) {
        const auto order = one_f_one_b_order(s, p, m);
        expect_complete(order, m, 1, fmt::format("1F1B p{} m{} stage {}", p, m, s));
        EXPECT_EQ(peak_in_flight(order), std::min<int64_t>(p - s, m)) << "p" << p << " m" << m << " stage " << s;
        for (int v : {2, 3}) {
          if (m % p != 0) continue;
          expect_complete(interleaved_order(s, p, m, v), m, v,
                          fmt::format("interleaved p{} m{} v{} stage {}", p, m, v, s));
        }
      }
    }
  }
  EXPECT_EQ(describe(forward_only_order(2, 2), 2), "F0.0 F0.1 F1.0 F1.1");
}

/// Runs every stage's order with unit-time ops: an op starts once what it needs finished in an
/// earlier time step (the previous stage's forward of the same microbatch and chunk, or the last
/// stage's forward of the previous chunk on stage 0; the next stage's backward, or on the last stage
/// the same chunk's forward for the last chunk and stage 0's backward of the next chunk otherwise).
/// Returns the makespan, or -1 on a deadlock.
int64_t simulate(int p, int64_t m, int v) {
  std::vector<std::vector<PipelineOp>> orders;
  for (int s = 0; s < p; ++s) orders.push_back(interleaved_order(s, p, m, v));
  std::map<std::tuple<int, int, int64_t, int>, int64_t> done;  // (kind, stage, mb, chunk) -> finish time
  std::vector<size_t> next(static_cast<size_t>(p), 0);
  auto finished_before = [&](int kind, int stage, int64_t mb, int chunk, int64_t t) {
    auto it = done.find({kind, stage, mb, chunk});
    return it != done.end() && it->second <= t;
  };
  int64_t t = 0;
  size_t remaining = 0;
  for (const auto& o : orders) remaining += o.size();
  while (remaining > 0) {
    bool progressed = false;
    std::vector<std::tuple<int, int, int64_t, int>> finishing;
    for (int s = 0; s < p; ++s) {
      if (next[static_cast<size_t>(s)] >= orders[static_cast<size_t>(s)].size()) continue;
      const PipelineOp& op = orders[static_cast<size_t>(s)][next[static_cast<size_t>(s)]];
      bool ready = false;
      if (op.kind == PipelineOp::Kind::forward) {
        ready = s > 0 ? finished_before(0, s - 1, op.microbatch, op.chunk, t)
                      : (op.chunk == 0 || finished_before(0, p - 1, op.microbatch, op.chunk - 1, t));
      } else {
        ready = s < p - 1 ? finished_before(1, s + 1, op.microbatch, op.chunk, t)
                          : (op.chunk == v - 1 ? finished_before(0, s, op.microbatch, op.chunk, t)
                                               : finished_before(1, 0, op.microbatch, op.chunk + 1, t));
      }
      if (!ready) continue;
      finishing.emplace_back(op.kind == PipelineOp::Kind::forward ? 0 : 1, s, op.microbatch, op.chunk);
      ++next[static_cast<size_t>(s)];
      --remaining;
      progressed = true;
    }
    ++t;
    for (const auto& key : finishing) done[key] = t;
    if (!progressed) return -1;
  }
  return t;
}

TEST(ScheduleOrder, APipelineRunsWithoutDeadlockAndItsBubbleIsTheSchedules) {
  for (int p : {2, 4}) {
    for (int64_t m : {4, 8, 16}) {
      for (int v : {1, 2}) {
        const int64_t makespan = simulate(p, m, v);
        ASSERT_GT(makespan, 0) << "deadlock at p" << p << " m" << m << " v" << v;
        // Each stage does 2 m v unit ops; the fill and drain add 2 (p - 1) steps: bubble (p - 1) / (v m)
        // of the ideal 2 m v, for 1F1B exactly, and for the interleaved order at most that.
        const int64_t ideal = 2 * m * v;
        EXPECT_LE(makespan, ideal + 2 * (p - 1)) << "p" << p << " m" << m << " v" << v;
        if (v == 1) {
          EXPECT_EQ(makespan, ideal + 2 * (p - 1)) << "p" << p << " m" << m;
        }
      }
    }
  }
}

}  // namespace
}  // namespace colossal::parallel::pp
