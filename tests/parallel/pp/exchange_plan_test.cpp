// The pipeline's exchange batches (parallel/pp/exchange_plan.h) by hand, and whole pipelines of them
// run under NCCL's rules (Note [Pipeline exchanges]): each stage's batches one after another on one
// stream, a batch done once every send and receive in it met its partner in the partner's current
// batch, the i-th send from a to b meeting b's i-th receive from a. Every pipeline of 1 to 8 stages, 1
// to 3 chunks and up to 16 microbatches, with and without headers, for training and evaluation, must
// finish with each send met by a receive of the same message, and two neighbours must group their
// messages to each other alike (NCCL leaves other groupings undefined); a schedule whose neighbours
// disagree (or the old unpaired sends, or a header sent with its activation but received alone) must not.
#include "colossal/parallel/pp/exchange_plan.h"

#include <fmt/format.h>
#include <gtest/gtest.h>

#include <map>
#include <string>
#include <utility>
#include <vector>

namespace colossal::parallel::pp {
namespace {

using Kind = PipelineMessage::Kind;

/// Runs every stage's batches under NCCL's rules; "" when all finish with matching messages, else what
/// went wrong (the first mismatch, or the stages stuck and what their batches wait for).
std::string run_under_nccl_rules(const std::vector<std::vector<ExchangeBatch>>& stages) {
  const int p = static_cast<int>(stages.size());
  struct Slot {
    int stage;
    size_t batch;
    size_t index;
  };
  // Each direction's sends and receives in issue order; a stage's messages to itself are its mailbox.
  std::map<std::pair<int, int>, std::vector<Slot>> sends, receives;  // (from, to)
  std::map<std::tuple<int, int, int64_t, int>, int> mailbox;         // (stage, kind, mb, chunk) -> count
  for (int s = 0; s < p; ++s) {
    for (size_t b = 0; b < stages[s].size(); ++b) {
      for (size_t k = 0; k < stages[s][b].messages.size(); ++k) {
        const PipelineMessage& m = stages[s][b].messages[k];
        if (m.peer == s) {
          int& count = mailbox[{s, static_cast<int>(m.kind), m.microbatch, m.chunk}];
          if (m.send) {
            ++count;
          } else if (--count < 0) {
            return fmt::format("stage {}: {} before it was sent", s, describe(m));
          }
          continue;
        }
        (m.send ? sends[{s, m.peer}] : receives[{m.peer, s}]).push_back({s, b, k});
      }
    }
  }
  // partner[stage][batch][index]: the message it meets.
  std::vector<std::vector<std::vector<Slot>>> partner(static_cast<size_t>(p));
  for (int s = 0; s < p; ++s) {
    for (const ExchangeBatch& batch : stages[s]) partner[s].emplace_back(batch.messages.size(), Slot{-1, 0, 0});
  }
  for (const auto& [direction, list] : sends) {
    const auto it = receives.find(direction);
    const size_t n = it == receives.end() ? 0 : it->second.size();
    if (n != list.size()) {
      return fmt::format("stage {} sends {} messages to stage {}, which receives {}", direction.first, list.size(),
                         direction.second, n);
    }
    for (size_t i = 0; i < n; ++i) {
      const Slot a = list[i], b = it->second[i];
      const PipelineMessage& x = stages[a.stage][a.batch].messages[a.index];
      const PipelineMessage& y = stages[b.stage][b.batch].messages[b.index];
      if (x.kind != y.kind || x.microbatch != y.microbatch || x.chunk != y.chunk) {
        return fmt::format("message {} from stage {} to {}: stage {} {}, but stage {} meets it with {}", i, a.stage,
                           b.stage, a.stage, describe(x), b.stage, describe(y));
      }
      partner[a.stage][a.batch][a.index] = b;
      partner[b.stage][b.batch][b.index] = a;
    }
  }
  for (const auto& [direction, list] : receives) {
    if (!sends.contains(direction)) {
      return fmt::format("stage {} receives {} messages from stage {}, which sends none", direction.second, list.size(),
                         direction.first);
    }
  }
  // Group patterns: NCCL leaves it undefined when two ranks group their messages to each other
  // differently (a group may block on any of its operations). Between every two stages, the i-th batch
  // of one holding messages for the other must meet the other's i-th such batch, message for message.
  for (int a = 0; a < p; ++a) {
    for (int b = 0; b < p; ++b) {
      if (a == b) continue;
      std::vector<size_t> mine, theirs;  // a's batches with messages for b, b's with messages for a
      for (size_t k = 0; k < stages[a].size(); ++k) {
        for (const PipelineMessage& m : stages[a][k].messages) {
          if (m.peer == b) {
            mine.push_back(k);
            break;
          }
        }
      }
      for (size_t k = 0; k < stages[b].size(); ++k) {
        for (const PipelineMessage& m : stages[b][k].messages) {
          if (m.peer == a) {
            theirs.push_back(k);
            break;
          }
        }
      }
      if (mine.size() != theirs.size()) {
        return fmt::format("stage {} groups its messages with stage {} into {} batches, stage {} into {}", a, b,
                           mine.size(), b, theirs.size());
      }
      for (size_t i = 0; i < mine.size(); ++i) {
        const std::vector<PipelineMessage>& batch = stages[a][mine[i]].messages;
        for (size_t k = 0; k < batch.size(); ++k) {
          if (batch[k].peer != b) continue;
          const Slot other = partner[a][mine[i]][k];
          if (other.batch != theirs[i]) {
            return fmt::format(
                "stage {} batch {} ({}) meets stage {}'s batch {}, not its batch {}: the two group their messages "
                "differently",
                a, mine[i], describe(batch[k]), b, other.batch, theirs[i]);
          }
        }
      }
    }
  }
  // One stream per stage: batch current[s] runs; a message is done once its partner's batch runs too.
  std::vector<size_t> current(static_cast<size_t>(p), 0);
  std::vector<std::vector<std::vector<bool>>> done(static_cast<size_t>(p));
  for (int s = 0; s < p; ++s) {
    for (const ExchangeBatch& batch : stages[s]) done[s].emplace_back(batch.messages.size(), false);
  }
  for (bool progressed = true; progressed;) {
    progressed = false;
    for (int s = 0; s < p; ++s) {
      if (current[s] >= stages[s].size()) continue;
      const size_t b = current[s];
      bool all = true;
      for (size_t k = 0; k < stages[s][b].messages.size(); ++k) {
        const Slot other = partner[s][b][k];
        if (other.stage < 0) continue;  // the stage's own mailbox
        if (!done[s][b][k] && current[other.stage] == other.batch) {
          done[s][b][k] = true;  // both ends at once: the transfer ran
          done[other.stage][other.batch][other.index] = true;
        }
        all = all && done[s][b][k];
      }
      if (all) {
        ++current[s];
        progressed = true;
      }
    }
  }
  std::string stuck;
  for (int s = 0; s < p; ++s) {
    if (current[s] >= stages[s].size()) continue;
    std::string waits;
    for (const PipelineMessage& m : stages[s][current[s]].messages) waits += fmt::format("; {}", describe(m));
    stuck += fmt::format(" stage {} at batch {} of {} (before op {}{})", s, current[s], stages[s].size(),
                         stages[s][current[s]].before_op, waits);
  }
  return stuck.empty() ? "" : "deadlock:" + stuck;
}

std::vector<std::vector<ExchangeBatch>> training_pipeline(int p, int64_t m, int v, bool headers) {
  std::vector<std::vector<ExchangeBatch>> stages;
  for (int s = 0; s < p; ++s) stages.push_back(exchange_batches(s, p, m, v, headers));
  return stages;
}

TEST(ExchangePlan, OneFOneBByHand) {
  // p = 2, m = 2: stage 0 runs F0 F1 B0 B1, stage 1 F0 B0 F1 B1.
  const auto stage0 = exchange_batches(0, 2, 2, 1, false);
  const std::vector<ExchangeBatch> expected0 = {
      {1, {{Kind::activation, true, 1, 0, 0}}},
      {2, {{Kind::activation, true, 1, 1, 0}, {Kind::gradient, false, 1, 0, 0}}},  // send_forward + recv_backward
      {3, {{Kind::gradient, false, 1, 1, 0}}},
  };
  EXPECT_EQ(stage0, expected0);
  const auto stage1 = exchange_batches(1, 2, 2, 1, true);
  const std::vector<ExchangeBatch> expected1 = {
      {0, {{Kind::header, false, 0, 0, 0}}},  // the header first, alone here
      {0, {{Kind::activation, false, 0, 0, 0}}},
      {2, {{Kind::gradient, true, 0, 0, 0}, {Kind::activation, false, 0, 1, 0}}},  // send_backward + recv_forward
      {4, {{Kind::gradient, true, 0, 1, 0}}},                                      // the last send, alone
  };
  EXPECT_EQ(stage1, expected1);
  EXPECT_TRUE(stage1[2].has_receive());
  EXPECT_FALSE(stage1[3].has_receive());

  // One microbatch: stage 1 receives the activation, then sends the gradient, in two batches; stage 0,
  // which would pair its send with its receive, cuts its batch the same way (and the header goes alone).
  const std::vector<ExchangeBatch> single0 = {
      {1, {{Kind::header, true, 1, 0, 0}}},
      {1, {{Kind::activation, true, 1, 0, 0}}},
      {1, {{Kind::gradient, false, 1, 0, 0}}},
  };
  EXPECT_EQ(exchange_batches(0, 2, 1, 1, true), single0);
}

TEST(ExchangePlan, EveryPipelineFinishesWithMatchingMessagesUnderNcclRules) {
  int pipelines = 0;
  for (int p : {1, 2, 3, 4, 8}) {
    for (int v : {1, 2, 3}) {
      for (int64_t m : {1, 2, 3, 4, 6, 8, 16}) {
        if (v > 1 && m % p != 0) continue;
        for (bool headers : {false, true}) {
          EXPECT_EQ(run_under_nccl_rules(training_pipeline(p, m, v, headers)), "")
              << "p " << p << " v " << v << " m " << m << (headers ? " with headers" : "");
          ++pipelines;
        }
      }
      // Evaluation: one microbatch forward through every chunk.
      std::vector<std::vector<ExchangeBatch>> stages;
      for (int s = 0; s < p; ++s) stages.push_back(exchange_batches(s, p, 1, v, true, /*forward_only=*/true));
      EXPECT_EQ(run_under_nccl_rules(stages), "") << "evaluation, p " << p << " v " << v;
    }
  }
  EXPECT_GT(pipelines, 100);
}

TEST(ExchangePlan, TheSimulationCatchesUnpairedSendsAndMismatchedOrders) {
  // The exchange before Note [Pipeline exchanges]: every send a batch of its own right after its op,
  // every receive one right before. Two stages, 1F1B over 4 microbatches: stage 0 sends activation 1
  // while stage 1 sends gradient 0, each waiting for a receive the other posts only afterwards.
  std::vector<std::vector<ExchangeBatch>> unpaired;
  for (int s = 0; s < 2; ++s) {
    std::vector<ExchangeBatch> batches;
    for (const ExchangeBatch& batch : exchange_batches(s, 2, 4, 1, false)) {
      for (const PipelineMessage& message : batch.messages) batches.push_back({batch.before_op, {message}});
    }
    unpaired.push_back(batches);
  }
  // Stage 0's i-th batch with stage 1 is no longer stage 1's i-th: caught as a grouping both ends
  // disagree on, before the simulation would find the two sends waiting on each other.
  EXPECT_NE(run_under_nccl_rules(unpaired).find("group their messages differently"), std::string::npos)
      << run_under_nccl_rules(unpaired);

  // The header as first sent (session 9, hung on H100s): stage 0 sends header and activation in one
  // batch, stage 1 receives them in two.
  const std::vector<std::vector<ExchangeBatch>> header_split = {
      {{1, {{Kind::header, true, 1, 0, 0}, {Kind::activation, true, 1, 0, 0}}}},
      {{0, {{Kind::header, false, 0, 0, 0}}}, {0, {{Kind::activation, false, 0, 0, 0}}}},
  };
  EXPECT_EQ(run_under_nccl_rules(header_split),
            "stage 0 groups its messages with stage 1 into 1 batches, stage 1 into 2");

  // Stage 1 receiving its first two activations the other way round: NCCL would hand it microbatch
  // 0's as microbatch 1's.
  std::vector<std::vector<ExchangeBatch>> mismatched = training_pipeline(2, 4, 2, false);
  std::swap(mismatched[1][0].messages, mismatched[1][1].messages);
  EXPECT_NE(run_under_nccl_rules(mismatched).find("stage 1 meets it with receive activation of microbatch 1"),
            std::string::npos)
      << run_under_nccl_rules(mismatched);
}

}  // namespace
}  // namespace colossal::parallel::pp
