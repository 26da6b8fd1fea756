// PipelineSchedule: see pipeline_schedule.h.
#include "colossal/engine/pipeline_schedule.h"

#include <fmt/format.h>

#include <algorithm>
#include <chrono>
#include <deque>
#include <map>
#include <optional>
#include <string>
#include <tuple>
#include <utility>

#include "colossal/autograd/engine.h"     // backward
#include "colossal/autograd/function.h"   // register_hook
#include "colossal/autograd/grad_mode.h"  // NoGradGuard
#include "colossal/comm/operation_context.h"
#include "colossal/core/cuda_device.h"  // Event, current_stream (the GPU's step timing)
#include "colossal/core/error.h"
#include "colossal/core/profiler.h"  // Scope
#include "colossal/engine/engine.h"
#include "colossal/ops/elementwise.h"            // div
#include "colossal/ops/indexing.h"               // cat
#include "colossal/ops/nn_functional.h"          // embedding, embedding_put_
#include "colossal/parallel/env_override.h"      // env_switch
#include "colossal/parallel/gradient_handler.h"  // GradientHandler
#include "colossal/parallel/pp/exchange_plan.h"
#include "colossal/parallel/pp/schedule_order.h"

namespace colossal::engine {
namespace {

using parallel::pp::ExchangeBatch;
using parallel::pp::PipelineMessage;
using parallel::pp::PipelineOp;

constexpr int kMaxDims = 6;

/// A message's identity as its tag: NCCL ignores it, MPI matches by it, and the strict group
/// (comm/strict_p2p_process_group.h) checks both ends agree on it. Tags stay below 32768, the least
/// MPI_TAG_UB the standard allows; one repeats only 256 microbatches later.
int tag_of(const PipelineMessage& m) {
  return static_cast<int>(((m.microbatch % 256) * 16 + m.chunk % 16) * 4 + static_cast<int>(m.kind));
}

/// (kind, microbatch, sending chunk): a message as both ends name it.
using MessageKey = std::tuple<int, int64_t, int>;
MessageKey key_of(PipelineMessage::Kind kind, int64_t microbatch, int chunk) {
  return {static_cast<int>(kind), microbatch, chunk};
}

/// A tensor's dtype and shape as the i64 header that travels before it (Note [Pipeline exchanges]).
Tensor header_of(const Tensor& t, Device device) {
  COLOSSAL_CHECK(t.dim() <= kMaxDims, "pipeline: tensors of at most {} dimensions travel between stages, got shape {}",
                 kMaxDims, t.shape());
  std::vector<int64_t> h(2 + kMaxDims, 0);
  h[0] = static_cast<int64_t>(t.dtype());
  h[1] = t.dim();
  for (int64_t d = 0; d < t.dim(); ++d) h[static_cast<size_t>(2 + d)] = t.size(d);
  return core::from_vector<int64_t>(h, {2 + kMaxDims}).to(device);
}

/// The dtype and shape a header carries (read on the host: once per shape, not per message).
std::pair<Shape, DType> read_header(const Tensor& header) {
  const std::vector<int64_t> h = header.to(core::kCpu).to_vector<int64_t>();
  return {Shape(h.begin() + 2, h.begin() + 2 + h[1]), static_cast<DType>(h[0])};
}

Tensor empty_header(Device device) {
  return core::empty({2 + kMaxDims}, TensorOptions(DType::i64, device));
}

/// One stage's side of a pass through the pipeline: issues the order's exchange batches
/// (parallel/pp/exchange_plan.h) with the tensors the ops leave in its outbox, and files what comes
/// in its inbox. A batch with a receive is waited for when an op takes what it received (Note
/// [Waiting for a receive where it is needed]); one of sends only at the end (finish), so the sends
/// overlap the next ops.
//
// Note [Waiting for a receive where it is needed]
// The exchange plan issues a receive as early as both ends can agree on, often a batch or more before
// the op that needs it: the interleaved schedule's stage 0 issues the receive of B(chunk 2, mb 0)'s
// gradient with the send of its last warm-up forward, then runs F(chunk 0, mb 2), which needs nothing
// from the other stage. Waited for at issue, the batch held that forward back until the other stage's
// first backward was done: 2.2 ms of stage 0 idle in a 66 ms step of GPT-2 350M at pp=2, v=2 (session
// 24's trace). So a batch is waited for (on NCCL the compute stream made to wait for it, on MPI the
// host) only when take() asks for something it brings, every earlier batch with it, in issue order.
// A batch that brings a header is still waited for at once: later receives need the shape it gives.
// The issue order, which both ends of every exchange share, is unchanged.
//
// Note [Receives posted one op ahead]
// A receive posted just before the op that takes it starts moving its message only then: on the copy
// engines (Note [Pair sends and receives by the copy engines]) its stream first waits for the work the
// host queued before it, so the copy out of the slot follows the previous op's end and the host's
// issuing of the batch, both on the critical path where the host runs no further ahead of the GPU than
// the op it queues (GPT-2 350M at pp=2 in microbatches of 2: the host takes as long to queue an op as
// the GPU to run it, session 25's bubble reports). Where the group allows it
// (ProcessGroup::receives_post_early: MPI, the copy engines; not NCCL's own, whose grouped sends wait
// for their receives), a batch's receives are posted one op earlier than the plan's batch, its sends
// when due: the message is copied in while the op before runs, and the op that takes it waits only
// for the copy's event. The receives keep the plan's order among themselves, so each direction still
// carries its messages in the same order on both ends; a gradient's receive waits for the forward that
// gives its buffer's shape. Not with headers in flight (a batch's first step): a receive then needs the
// header's shape, read at once. Measured on 2 H100s (docs/benchmarks.md, session 25): the v=1 bubble
// stayed at 0.150-0.155 with it (0.150-0.154 without), v=2 came to 0.101-0.106; the ops' host time,
// not the exchanges, is what holds the bubble there.
class Exchanger {
 public:
  /// `shapes`: the activation shapes this stage learnt for this batch shape, by sending chunk,
  /// filled from headers when they come.
  /// `neighbours`: the pair groups that carry the messages with some stages instead of `group`
  /// (PipelineSchedule::set_neighbour_group).
  Exchanger(comm::ProcessGroup& group, std::map<int, std::pair<Shape, DType>>& shapes,
            const std::map<int, std::shared_ptr<comm::ProcessGroup>>& neighbours)
      : group_(group), shapes_(shapes), neighbours_(neighbours) {}
  ~Exchanger() {
    try {
      finish();
    } catch (const std::exception&) {
      // Leaving on an error already thrown: the sends' own failures say nothing more.
    }
  }

  /// What an op leaves to send: its output (an activation) or its input's gradient.
  void post(PipelineMessage::Kind kind, int64_t microbatch, int chunk, Tensor tensor) {
    outbox_[key_of(kind, microbatch, chunk)] = tensor.contiguous();
  }
  /// What the op needs, received by an earlier batch (waited for now if it is still in flight).
  Tensor take(PipelineMessage::Kind kind, int64_t microbatch, int chunk) {
    const MessageKey key = key_of(kind, microbatch, chunk);
    while (!inbox_.contains(key) && !in_flight_.empty()) complete_oldest();
    auto it = inbox_.find(key);
    COLOSSAL_CHECK(it != inbox_.end(),
                   "pipeline stage {}: no {} of microbatch {} (chunk {}) has arrived before the op that needs it (a "
                   "schedule mismatch)",
                   group_.rank(), kind == PipelineMessage::Kind::activation ? "activation" : "gradient", microbatch,
                   chunk);
    Tensor t = std::move(it->second);
    inbox_.erase(it);
    return t;
  }

  /// Issues `batch`; `gradient_like(microbatch, chunk)` gives the tensor whose shape a gradient for
  /// this stage's chunk has.
  template <class GradientLike>
  void issue(const ExchangeBatch& batch, const GradientLike& gradient_like) {
    const Device device = group_.device();
    const int self = group_.rank();
    // The messages by the group that carries them: the pipeline's, or a neighbour's pair.
    struct Part {
      comm::ProcessGroup* group = nullptr;
      std::vector<comm::P2POp> ops;
      std::vector<std::pair<PipelineMessage, Tensor>> incoming;
    };
    std::vector<Part> parts;
    auto part_of = [&](int peer) -> std::pair<Part&, int> {
      comm::ProcessGroup* group = &group_;
      int rank = peer;
      if (auto it = neighbours_.find(peer); it != neighbours_.end()) {
        group = it->second.get();
        rank = 1 - group->rank();  // a pair, ordered by stage
      }
      for (Part& part : parts) {
        if (part.group == group) return {part, rank};
      }
      parts.push_back({group, {}, {}});
      return {parts.back(), rank};
    };
    std::string what;
    for (const PipelineMessage& m : batch.messages) {
      if (!what.empty()) what += ", ";
      what += parallel::pp::describe(m);
      const MessageKey payload = key_of(
          m.kind == PipelineMessage::Kind::header ? PipelineMessage::Kind::activation : m.kind, m.microbatch, m.chunk);
      if (m.peer == self) {  // one stage, several chunks: the mailbox
        if (m.send) inbox_[payload] = take_outgoing(payload, m);
        continue;
      }
      auto [part, peer] = part_of(m.peer);
      if (m.send) {
        if (m.kind == PipelineMessage::Kind::header) {
          auto it = outbox_.find(payload);
          COLOSSAL_CHECK(it != outbox_.end(), "pipeline stage {}: nothing to {}", self, parallel::pp::describe(m));
          part.ops.push_back({comm::P2POp::Kind::send, header_of(it->second, device), peer, tag_of(m)});
        } else {
          part.ops.push_back({comm::P2POp::Kind::send, take_outgoing(payload, m), peer, tag_of(m)});
        }
        continue;
      }
      Tensor buffer;
      if (m.kind == PipelineMessage::Kind::header) {
        buffer = empty_header(device);
      } else if (m.kind == PipelineMessage::Kind::activation) {
        auto it = shapes_.find(m.chunk);
        COLOSSAL_CHECK(it != shapes_.end(), "pipeline stage {}: the shape of the {} is not known (no header came)",
                       self, parallel::pp::describe(m));
        buffer = core::empty(it->second.first, TensorOptions(it->second.second, device));
      } else {
        const Tensor& like = gradient_like(m.microbatch, m.chunk);
        buffer = core::empty(like.shape(), TensorOptions(like.dtype(), like.device()));
      }
      part.ops.push_back({comm::P2POp::Kind::recv, buffer, peer, tag_of(m)});
      part.incoming.emplace_back(m, buffer);
    }
    // A receive that never completes names the stage, the microbatches and the messages (the
    // watchdog's message, comm/operation_context.h), not only tags.
    const comm::OperationContext context(fmt::format("pipeline stage {} of {}: {}", self, group_.size(), what));
    bool header = false;
    for (Part& part : parts) {
      if (part.ops.empty()) continue;
      comm::Work work = part.group->batch_send_recv(part.ops, /*async=*/true);
      if (part.incoming.empty()) {
        sends_.push_back(std::move(work));
        continue;
      }
      header = header || std::any_of(part.incoming.begin(), part.incoming.end(),
                                     [](const auto& in) { return in.first.kind == PipelineMessage::Kind::header; });
      in_flight_.push_back({std::move(work), std::move(part.incoming)});
    }
    if (header) {
      while (!in_flight_.empty()) complete_oldest();
    }
  }

  /// Waits for the receives and sends still in flight.
  void finish() {
    while (!in_flight_.empty()) complete_oldest();
    std::vector<comm::Work> sends = std::move(sends_);
    sends_.clear();
    for (comm::Work& w : sends) w.wait();
  }

 private:
  /// A batch with receives, issued and not yet waited for.
  struct InFlight {
    comm::Work work;
    std::vector<std::pair<PipelineMessage, Tensor>> incoming;
  };

  /// Waits for the oldest batch in flight and files what it brought.
  void complete_oldest() {
    InFlight batch = std::move(in_flight_.front());
    in_flight_.pop_front();
    batch.work.wait();
    for (auto& [m, buffer] : batch.incoming) {
      if (m.kind == PipelineMessage::Kind::header) {
        shapes_[m.chunk] = read_header(buffer);
      } else {
        inbox_[key_of(m.kind, m.microbatch, m.chunk)] = buffer;
      }
    }
  }

  Tensor take_outgoing(const MessageKey& key, const PipelineMessage& m) {
    auto it = outbox_.find(key);
    COLOSSAL_CHECK(it != outbox_.end(), "pipeline stage {}: nothing to {}", group_.rank(), parallel::pp::describe(m));
    Tensor t = std::move(it->second);
    outbox_.erase(it);
    return t;
  }

  comm::ProcessGroup& group_;
  std::map<int, std::pair<Shape, DType>>& shapes_;
  const std::map<int, std::shared_ptr<comm::ProcessGroup>>& neighbours_;
  std::map<MessageKey, Tensor> outbox_, inbox_;
  std::deque<InFlight> in_flight_;
  std::vector<comm::Work> sends_;
};

/// The stage's clock over a micro-step (Note [Pipeline bubble]).
class StepTimer {
 public:
  explicit StepTimer(Device device) : device_(device) { mark(); }
  void begin_op() {
    mark();
    host_.push_back(Clock::now());
  }
  void end_op() {
    mark();
    host_.push_back(Clock::now());
  }
  /// The span ends now (after the step's closing all-reduce: when the last stage is done too).
  StageTiming finish() {
    mark();
    if (device_.is_cuda()) events_.back().synchronize();
    // marks[i]: ms from the start; 0 the start, then each op's start and end, last the finish.
    std::vector<double> marks;
    if (device_.is_cuda()) {
      for (const core::cuda::Event& e : events_) marks.push_back(events_.front().elapsed_ms(e));
    } else {
      for (const Clock::time_point& t : times_)
        marks.push_back(std::chrono::duration<double, std::milli>(t - times_.front()).count());
    }
    StageTiming t;
    t.span_ms = marks.back();
    const size_t ops = (marks.size() - 2) / 2;
    std::vector<double> gaps, op_ms;
    for (size_t k = 0; k < ops; ++k) {
      const double ms = marks[2 * k + 2] - marks[2 * k + 1];
      t.busy_ms += ms;
      op_ms.push_back(ms);
      if (ms > t.longest_op_ms || t.longest_op < 0) {
        t.longest_op = static_cast<int64_t>(k);
        t.longest_op_ms = ms;
        t.longest_op_host_ms = std::chrono::duration<double, std::milli>(host_[2 * k + 1] - host_[2 * k]).count();
      }
      if (k > 0) gaps.push_back(marks[2 * k + 1] - marks[2 * k]);
    }
    if (!op_ms.empty()) {
      std::nth_element(op_ms.begin(), op_ms.begin() + static_cast<std::ptrdiff_t>(op_ms.size() / 2), op_ms.end());
      t.median_op_ms = op_ms[op_ms.size() / 2];
    }
    t.lead_ms = ops > 0 ? marks[1] : t.span_ms;
    t.tail_ms = ops > 0 ? t.span_ms - marks[2 * ops] : 0;
    if (!gaps.empty()) {
      std::nth_element(gaps.begin(), gaps.begin() + static_cast<std::ptrdiff_t>(gaps.size() / 2), gaps.end());
      t.median_gap_ms = gaps[gaps.size() / 2];
    }
    return t;
  }

 private:
  /// A timing event recorded now on the stage's stream. Created on the stage's GPU: an event belongs
  /// to the device current at its creation, and recording it on another device's stream fails
  /// (cudaErrorInvalidResourceHandle, seen on rank 1 of 2 GPUs where the host thread's current
  /// device was still 0).
  /// On the CPU, the host clock's now.
  void mark() {
    if (!device_.is_cuda()) {
      times_.push_back(Clock::now());
      return;
    }
    const core::cuda::DeviceGuard guard(device_);
    events_.emplace_back(/*enable_timing=*/true);
    events_.back().record(core::cuda::current_stream(device_));
  }

  using Clock = std::chrono::steady_clock;
  Device device_;
  // The step's start, then each op's start and end (and the finish): events on a GPU, else times.
  std::vector<core::cuda::Event> events_;
  std::vector<Clock::time_point> times_;
  // The host's clock at each op's start and end (also on a GPU: how long the host took to queue it).
  std::vector<Clock::time_point> host_;
};

/// The shapes' key: training or evaluation, the microbatches and the batch's shape, which every
/// stage knows (each is given the batch) and which fix every activation's shape.
std::vector<int64_t> shape_key(bool training, int64_t num_microbatches, const Tensor& input) {
  std::vector<int64_t> key{training ? 1 : 0, num_microbatches, static_cast<int64_t>(input.dtype())};
  for (int64_t d = 0; d < input.dim(); ++d) key.push_back(input.size(d));
  return key;
}

}  // namespace

PipelineSchedule::PipelineSchedule(std::vector<std::shared_ptr<nn::Module>> chunks,
                                   std::shared_ptr<comm::ProcessGroup> group, int64_t num_microbatches)
    : chunks_(std::move(chunks)), group_(std::move(group)), num_microbatches_(num_microbatches) {
  COLOSSAL_CHECK(group_ != nullptr, "PipelineSchedule needs the pipeline group");
  COLOSSAL_CHECK(!chunks_.empty(), "PipelineSchedule: stage {} has no model chunk", group_->rank());
  for (size_t c = 0; c < chunks_.size(); ++c) {
    COLOSSAL_CHECK(chunks_[c] != nullptr, "PipelineSchedule: chunk {} of stage {} is null", c, group_->rank());
  }
  COLOSSAL_CHECK(num_microbatches_ >= 1, "PipelineSchedule: the number of microbatches must be >= 1, got {}",
                 num_microbatches_);
  // The orders check what they need (microbatches a multiple of the stages when interleaved).
  (void)parallel::pp::interleaved_order(group_->rank(), group_->size(), num_microbatches_,
                                        static_cast<int>(chunks_.size()));
}

void PipelineSchedule::set_tied_parameters(std::vector<Tensor> parameters,
                                           std::shared_ptr<comm::ProcessGroup> tied_group) {
  COLOSSAL_CHECK(parameters.empty() || tied_group != nullptr,
                 "PipelineSchedule: stage {} has {} tied parameters but no group to sum their gradients over",
                 group_->rank(), parameters.size());
  tied_ = std::move(parameters);
  tied_group_ = std::move(tied_group);
}

void PipelineSchedule::rebind_tied_parameters(std::vector<Tensor> parameters) {
  COLOSSAL_CHECK(parameters.size() == tied_.size(),
                 "PipelineSchedule: rebinding {} tied parameters with {} tensors on stage {}", tied_.size(),
                 parameters.size(), group_->rank());
  tied_ = std::move(parameters);
}

std::map<int, std::shared_ptr<comm::ProcessGroup>> PipelineSchedule::neighbour_pairs(
    const std::shared_ptr<comm::ProcessGroup>& pipeline, bool ring) {
  COLOSSAL_CHECK(pipeline != nullptr, "PipelineSchedule::neighbour_pairs needs the pipeline group");
  std::map<int, std::shared_ptr<comm::ProcessGroup>> pairs;
  const int p = pipeline->size(), s = pipeline->rank();
  if (p <= 2) return pairs;
  // Edge e joins stage e and stage e + 1 (e = p - 1: the last stage and stage 0). A round splits off
  // edges no two of which share a stage: the even ones, the odd ones, and with an odd count of
  // stages the ring's closing edge alone.
  const int edges = ring ? p : p - 1;
  std::vector<std::vector<int>> rounds(3);
  for (int e = 0; e < edges; ++e) {
    const bool closing_odd = p % 2 == 1 && e == p - 1;
    rounds[closing_odd ? 2 : e % 2].push_back(e);
  }
  for (const std::vector<int>& round : rounds) {
    if (round.empty()) continue;
    int color = comm::kNoColor, other = -1;
    for (size_t k = 0; k < round.size(); ++k) {
      const int a = round[k], b = (round[k] + 1) % p;
      if (s == a || s == b) {
        color = static_cast<int>(k);
        other = s == a ? b : a;
      }
    }
    std::shared_ptr<comm::ProcessGroup> pair = pipeline->split(color, s);  // ordered by stage
    if (pair != nullptr) pairs[other] = std::move(pair);
  }
  return pairs;
}

void PipelineSchedule::set_neighbour_group(int stage, std::shared_ptr<comm::ProcessGroup> pair) {
  const int p = group_->size(), s = group_->rank();
  COLOSSAL_CHECK(pair != nullptr && pair->size() == 2,
                 "PipelineSchedule: stage {}'s group with stage {} must be a pair of the two stages", s, stage);
  COLOSSAL_CHECK(stage >= 0 && stage < p && stage != s && (stage == (s + 1) % p || stage == (s + p - 1) % p),
                 "PipelineSchedule: stage {} of {} has no neighbour {}", s, p, stage);
  COLOSSAL_CHECK(pair->rank() == (s < stage ? 0 : 1),
                 "PipelineSchedule: stage {}'s pair with stage {} must order its two ranks by stage", s, stage);
  // Over pairs, a stage's exchanges with its two neighbours run apart; sends that wait for their
  // receives (NCCL's own) could then wait on each other round the pipeline.
  COLOSSAL_CHECK(pair->receives_post_early(),
                 "PipelineSchedule: stage {}'s pair with stage {} is {}, whose sends wait for their receives; a "
                 "neighbour's pair must carry sends that do not (the copy engines', comm::use_pair_p2p)",
                 s, stage, pair->backend_name());
  COLOSSAL_CHECK(shapes_.empty(), "PipelineSchedule: stage {}'s pair with stage {} is set after the first step", s,
                 stage);
  neighbours_[stage] = std::move(pair);
}

const std::vector<ExchangeBatch>& PipelineSchedule::exchange_plan(bool forward_only, bool headers) {
  auto [it, made] = plans_.try_emplace({forward_only, headers});
  if (made) {
    it->second = parallel::pp::exchange_batches(group_->rank(), group_->size(), forward_only ? 1 : num_microbatches_,
                                                static_cast<int>(chunks_.size()), headers, forward_only);
  }
  return it->second;
}

const PipelineSchedule::EarlyPlan* PipelineSchedule::early_plan() {
  if (!early_plan_) {
    const std::vector<ExchangeBatch>& batches = exchange_plan(/*forward_only=*/false, /*headers=*/false);
    bool on = true;
    for (const ExchangeBatch& batch : batches) {
      for (const PipelineMessage& msg : batch.messages) {
        if (msg.peer == group_->rank()) continue;  // the stage's own mailbox
        auto it = neighbours_.find(msg.peer);
        on = on && (it != neighbours_.end() ? *it->second : *group_).receives_post_early();
      }
    }
    early_plan_.emplace();
    if (on) {
      EarlyPlan& plan = early_plan_->emplace();
      for (const ExchangeBatch& batch : batches) {
        ExchangeBatch sends{batch.before_op, {}}, receives{batch.before_op, {}};
        for (const PipelineMessage& msg : batch.messages) (msg.send ? sends : receives).messages.push_back(msg);
        plan.sends.push_back(std::move(sends));
        plan.receives.push_back(std::move(receives));
      }
    }
  }
  return *early_plan_ ? &**early_plan_ : nullptr;
}

std::shared_ptr<comm::ProcessGroup> PipelineSchedule::tied_group(const std::shared_ptr<comm::ProcessGroup>& pipeline,
                                                                 bool holds) {
  COLOSSAL_CHECK(pipeline != nullptr, "PipelineSchedule::tied_group needs the pipeline group");
  // Where every stage holds a copy (GPT-2's wte on 2 stages) the group is the pipeline's own: a second
  // communicator over the same ranks would only add one more to keep in step (NCCL's communicators on
  // one GPU must be used in the same order everywhere), and one more to create and destroy.
  Tensor holders = core::from_vector<int32_t>({holds ? 1 : 0}, {1}).to(pipeline->device());
  {
    const comm::OperationContext context("pipeline: counting the stages that hold tied parameters");
    pipeline->all_reduce(holders, comm::ReduceOp::sum);
  }
  if (holders.to(core::kCpu).to_vector<int32_t>()[0] == pipeline->size()) return pipeline;
  return pipeline->split(holds ? 0 : comm::kNoColor, pipeline->rank());
}

// Note [Tied sum under the last backward]
// The stages' sum of a tied weight's gradients (Note [Tied parameters across stages]) waits for every
// share, and the first stage's share is complete only when its last backward ends: summed after it,
// the all-reduce sat on every stage's tail. GPT-2 350M's wte at pp=2 (50,257 x 1,024) took 0.39 ms
// there, both stages idle (docs/benchmarks.md, session 25).
//
// Where the first stage uses the weight only as a lookup table (GPT-2's embedding; set_tied_rows),
// its last backward adds to the rows the last microbatch looked up and to no other. So:
// - stage 0 starts the sum of its share so far with every other stage's (their backwards are done
//   once the last gradient has come back) when its last backward starts, and that backward waits for
//   the sum only where it reaches the piece that holds the weight: a hook on the piece's output, put
//   there by a forward hook armed for the last microbatch's forward, which in GPT-2 is the embedding,
//   the last thing that backward does. The sum runs under the 12 blocks' backward before it;
// - that backward then adds the last microbatch's rows to the summed gradient, in place;
// - stage 0 sends those rows, read back by the lookup itself (ops::embedding over the gradient), with
//   their indices, to the other stages, which write them over theirs (ops::embedding_put_). Every copy
//   ends bit-equal to stage 0's: the all-reduce leaves the same bits on every rank and the rows are
//   copied, not recomputed. GPT-2 350M's last microbatch of 2 x 1,024 tokens sends 2,048 rows (8 MB in
//   f32) instead of the 206 MB table.
// The order of the collectives is the same on every stage of the tied group: the sum (stage 0 issues it
// after the receive its last backward needs, and sends nothing after that backward; the others after
// their last op and its sends), then the indices and the rows. At pp=2 the tied group is the pipeline
// group, whose NCCL operations must come in one order on both stages, so this matters. The sum's order
// of addition differs from the old one ((s0 of microbatches 0..m-2 + the others') + s0 of microbatch
// m-1 against s0 + the others'): the same gradient to rounding.
//
// Not taken (the sum after the backwards, as before) under data parallelism (the handler's reduction
// of the window comes first there), without set_tied_rows (colossal train sets it for GPT-2, whose
// embedding and head stay whole on every tensor rank of a pipeline), or with
// COLOSSAL_PIPELINE_TIED_UNDER_BACKWARD=0, which must then be set on every stage.
// Where the piece's output carries no autograd node (a checkpointed embedding), stage 0 waits for the
// sum at the start of its last backward: correct, without the gain.
namespace {

/// The gradient of a tied parameter, made defined and contiguous for its collectives.
Tensor tied_gradient(Tensor& param) {
  Tensor grad = param.grad();
  if (!grad.defined()) {
    grad = core::zeros_like(param);  // this stage's share was nothing this micro-step
    param.set_grad(grad);
  }
  if (!grad.is_contiguous()) {
    grad = grad.contiguous();
    param.set_grad(grad);
  }
  return grad;
}

}  // namespace

void PipelineSchedule::hook_tied_piece_once() {
  if (tied_piece_searched_) return;
  tied_piece_searched_ = true;
  auto holds_all = [&](const nn::Module& module) {
    const std::vector<Tensor> params = module.parameters();
    return std::all_of(tied_.begin(), tied_.end(), [&](const Tensor& tied) {
      return std::any_of(params.begin(), params.end(), [&](const Tensor& p) { return p.impl() == tied.impl(); });
    });
  };
  nn::Module* piece = nullptr;
  for (const std::shared_ptr<nn::Module>& child : chunks_.front()->children()) {
    if (!holds_all(*child)) continue;
    if (piece != nullptr) return;  // two pieces use the weight: no single point to wait at
    piece = child.get();
  }
  if (piece == nullptr) return;
  piece->register_forward_hook([state = tied_wait_](nn::Module&, const Tensor&, const Tensor& output) -> Tensor {
    if (!state->armed) return Tensor();
    state->armed = false;
    if (!output.requires_grad() || output.is_leaf()) return Tensor();  // nothing recorded: no place for a wait
    Tensor out = output;
    autograd::register_hook(out, [state](const Tensor&) {
      for (comm::Work& sum : state->sums) sum.wait();
      return Tensor();
    });
    state->hooked = true;
    return Tensor();
  });
}

Tensor PipelineSchedule::forward_backward(Engine& engine, const Tensor& input, const Tensor& target) {
  const int p = group_->size(), s = group_->rank();
  const int v = static_cast<int>(chunks_.size());
  const int64_t m = num_microbatches_;
  const bool first = s == 0, last = s == p - 1;
  COLOSSAL_CHECK(input.defined() && input.dim() >= 1,
                 "pipeline stage {}: every stage needs the batch's input (its shape fixes the activations' shapes)", s);
  const Tensor& sized = first ? input : target;
  COLOSSAL_CHECK(!(first || last) || (sized.defined() && sized.dim() >= 1 && sized.size(0) % m == 0),
                 "pipeline stage {}: the batch's {} samples do not split into {} microbatches; use a batch size that "
                 "is a multiple of the number of microbatches",
                 s, sized.defined() && sized.dim() >= 1 ? sized.size(0) : 0, m);
  const int64_t per = (first || last) ? sized.size(0) / m : 0;
  auto slice = [&](const Tensor& t, int64_t mb) { return t.narrow(0, mb * per, per); };

  // Note [Pipeline exchanges]: microbatch 0's activations carry headers the first time a batch of
  // this shape comes; their shapes are kept for the rest.
  const std::vector<int64_t> key = shape_key(true, m, input);
  const bool shapes_known = shapes_.contains(key);
  Exchanger exchanger(*group_, shapes_[key], neighbours_);
  const std::vector<ExchangeBatch>& batches = exchange_plan(/*forward_only=*/false, !shapes_known);
  size_t next_batch = 0;

  struct Saved {
    Tensor input;   // a leaf receiving the gradient, or the microbatch's data on stage 0's chunk 0
    Tensor output;  // the chunk's output, or the microbatch's loss at the very end
  };
  std::map<std::pair<int64_t, int>, Saved> saved;
  // A gradient for chunk c's output has the output's shape.
  auto gradient_like = [&](int64_t mb, int sending_chunk) -> const Tensor& {
    return saved.at({mb, last ? sending_chunk - 1 : sending_chunk}).output;
  };
  std::vector<Tensor> losses, outputs;
  amp::MixedPrecisionOptimizer* amp = engine.amp();

  // Note [Gradient reduction under a pipeline]: a parameter gets a gradient from every microbatch's
  // backward; the gradient handler (data parallelism) must reduce it once, after the last. So its
  // sync is on only during each chunk's last backward of a window-ending micro-step.
  const std::vector<PipelineOp> order = parallel::pp::interleaved_order(s, p, m, v);
  parallel::GradientHandler* handler = engine.gradient_handler();
  const bool sync_window = handler != nullptr && engine.last_step_updated();
  std::vector<size_t> last_backward(static_cast<size_t>(v), 0);
  for (size_t i = 0; i < order.size(); ++i) {
    if (order[i].kind == PipelineOp::Kind::backward) last_backward[static_cast<size_t>(order[i].chunk)] = i;
  }
  if (handler != nullptr) handler->set_sync(false);
  // Note [Tied sum under the last backward]: stage 0 sums under its last backward, the others after
  // their last op.
  const bool tied_sum = tied_group_ != nullptr && tied_group_->size() > 1 && engine.last_step_updated();
  const bool tied_under_backward = tied_sum && handler == nullptr && tied_rows_ != nullptr &&
                                   parallel::env_switch("COLOSSAL_PIPELINE_TIED_UNDER_BACKWARD").value_or(true);
  const bool tied_leads = tied_under_backward && tied_group_->rank() == 0;
  if (tied_leads) {
    COLOSSAL_CHECK(first,
                   "pipeline stage {}: set_tied_rows needs the first stage holding tied parameters to be stage 0", s);
    COLOSSAL_CHECK(batches.empty() || batches.back().before_op <= last_backward.front(),
                   "pipeline stage {}: an exchange follows chunk 0's last backward, which the tied parameters' sum "
                   "would then overtake",
                   s);
    hook_tied_piece_once();
    tied_wait_->sums.clear();
    tied_wait_->hooked = false;
  }
  std::optional<StepTimer> timer;
  if (timing_) timer.emplace(engine.device());

  // Note [Receives posted one op ahead]: where the groups allow it (and no header is in flight), each
  // batch's receives go up before the op ahead of the one that takes them, its sends when due.
  const EarlyPlan* early = shapes_known ? early_plan() : nullptr;
  size_t next_receive = 0;  // with early receives: the first batch whose receives are not posted yet
  // A gradient's buffer takes its shape from the chunk's output, there once its forward has run.
  auto can_post = [&](const ExchangeBatch& receives) {
    for (const PipelineMessage& msg : receives.messages) {
      if (msg.kind == PipelineMessage::Kind::gradient &&
          !saved.contains({msg.microbatch, last ? msg.chunk - 1 : msg.chunk}))
        return false;
    }
    return true;
  };

  for (size_t index = 0; index <= order.size(); ++index) {
    while (next_batch < batches.size() && batches[next_batch].before_op == index) {
      if (early != nullptr) {
        exchanger.issue(early->sends[next_batch], gradient_like);
      } else {
        exchanger.issue(batches[next_batch], gradient_like);
      }
      ++next_batch;
    }
    // The receives due before this op or the next, in the plan's order (a receive due now always can).
    while (early != nullptr && next_receive < batches.size() &&
           (batches[next_receive].before_op <= index ||
            (batches[next_receive].before_op == index + 1 && can_post(early->receives[next_receive])))) {
      exchanger.issue(early->receives[next_receive++], gradient_like);
    }
    if (index == order.size()) break;
    const PipelineOp& op = order[index];
    const int c = op.chunk;
    const int64_t mb = op.microbatch;
    const bool very_first = first && c == 0, very_last = last && c == v - 1;
    // What the op needs from a neighbour, waited for before its clock starts (Note [Waiting for a
    // receive where it is needed]): the wait is idle time, not the op's.
    Tensor received;
    if (op.kind == PipelineOp::Kind::forward && !very_first) {
      received = exchanger.take(PipelineMessage::Kind::activation, mb, first ? c - 1 : c);
    } else if (op.kind == PipelineOp::Kind::backward && !very_last) {
      received = exchanger.take(PipelineMessage::Kind::gradient, mb, last ? c + 1 : c);
    }
    if (timer) timer->begin_op();
    if (handler != nullptr && op.kind == PipelineOp::Kind::backward) {
      handler->set_sync(sync_window && index == last_backward[static_cast<size_t>(op.chunk)]);
    }
    // The profiler's ranges (core/profiler.h) show each stage's busy and idle time per op: the bubble.
    core::profiler::Scope scope(op.kind == PipelineOp::Kind::forward ? "pipeline: forward" : "pipeline: backward",
                                engine.device());
    // The collectives an op issues (data parallelism's) name the stage, the pass and the microbatch.
    const comm::OperationContext context(fmt::format("pipeline stage {} of {}: {} of microbatch {}{}", s, p,
                                                     op.kind == PipelineOp::Kind::forward ? "forward" : "backward", mb,
                                                     v > 1 ? fmt::format(", chunk {}", c) : std::string()));
    // Stage 0's sum of the tied gradients starts as its last backward does (after the receive it
    // needs); the backward waits for it where it reaches the piece that holds them.
    if (tied_leads && index == last_backward.front()) {
      for (Tensor& param : tied_)
        tied_wait_->sums.push_back(tied_group_->all_reduce(tied_gradient(param), comm::ReduceOp::sum, true));
      if (!tied_wait_->hooked) {
        for (comm::Work& sum : tied_wait_->sums) sum.wait();
      }
    }
    if (op.kind == PipelineOp::Kind::forward) {
      Saved& sv = saved[{mb, c}];
      if (tied_leads && c == 0 && mb == m - 1) tied_wait_->armed = true;
      if (very_first) {
        sv.input = amp != nullptr ? amp->cast_input(slice(input, mb)) : slice(input, mb);
      } else {
        // The previous chunk's output, a leaf here: its gradient is what goes back.
        sv.input = received.detach();
        sv.input.set_requires_grad(true);
      }
      Tensor y = chunks_[static_cast<size_t>(c)]->forward(sv.input);
      if (tied_leads) tied_wait_->armed = false;
      if (very_last) {
        const Tensor out = amp != nullptr ? amp->cast_output(y) : y;
        sv.output = engine.criterion(out, slice(target, mb));
        losses.push_back(sv.output.detach());
        outputs.push_back(out.detach());
      } else {
        exchanger.post(PipelineMessage::Kind::activation, mb, c, y.detach());
        sv.output = y;
      }
    } else {
      Saved& sv = saved.at({mb, c});
      if (very_last) {
        engine.backward(ops::div(sv.output, static_cast<double>(m)));  // the batch's mean loss
      } else {
        autograd::backward(sv.output, received);
      }
      if (!very_first) {
        const Tensor g = sv.input.grad();
        COLOSSAL_CHECK(g.defined(), "pipeline stage {}: microbatch {} chunk {} got no input gradient", s, mb, c);
        exchanger.post(PipelineMessage::Kind::gradient, mb, c, g);
      }
      saved.erase({mb, c});
    }
    if (timer) timer->end_op();
  }
  exchanger.finish();
  if (handler != nullptr) handler->set_sync(sync_window);  // as the Engine set it

  // Every stage reports the last stage's mean loss (the others contribute zero). The last stage sums
  // it and concatenates its outputs (GPT-2 350M's logits of 16 x 1024 tokens: 1.6 GB, about 1 ms)
  // before the tied parameters' sum, while it waits there for the first stage's last backward anyway;
  // after that sum they sat between the two closing all-reduces, which every stage waits for
  // (docs/benchmarks.md, session 23).
  autograd::NoGradGuard no_grad;
  Tensor reported = core::zeros({}, TensorOptions(DType::f64, group_->device()));
  if (last) {
    for (const Tensor& l : losses) reported = ops::add(reported, l.to(DType::f64));
    reported = ops::div(reported, static_cast<double>(m));
    engine.set_last_output(ops::cat(outputs, 0));
  }
  // Note [Tied parameters across stages]: each copy's gradient becomes the sum of every stage's, once
  // per accumulation window (the sum of the window's accumulated shares).
  if (tied_under_backward) {
    // Note [Tied sum under the last backward]: stage 0's sum is done (its last backward waited for
    // it); the others sum now, then take the rows stage 0's last microbatch added.
    const comm::OperationContext context(
        fmt::format("pipeline stage {} of {}: the tied parameters' sum and the rows of microbatch {}", s, p, m - 1));
    if (tied_leads) {
      for (comm::Work& sum : tied_wait_->sums) sum.wait();
      tied_wait_->sums.clear();
    } else {
      for (Tensor& param : tied_) tied_group_->all_reduce(tied_gradient(param), comm::ReduceOp::sum);
    }
    const int64_t per_input = input.size(0) / m;
    const Tensor shape_of_rows = tied_rows_(input.narrow(0, (m - 1) * per_input, per_input));
    Tensor rows = tied_leads ? shape_of_rows.contiguous()
                             : core::empty(shape_of_rows.shape(), TensorOptions(shape_of_rows.dtype(), input.device()));
    tied_group_->broadcast(rows, 0);
    for (Tensor& param : tied_) {
      Tensor grad = param.grad();
      Tensor values = tied_leads
                          ? ops::embedding(rows, grad)
                          : core::empty({rows.numel(), grad.size(1)}, TensorOptions(grad.dtype(), grad.device()));
      tied_group_->broadcast(values, 0);
      if (!tied_leads) ops::embedding_put_(grad, rows, values);
    }
  } else if (tied_sum) {
    // Under data parallelism the handler's reduction of this window is finished first (it averages the
    // copies over the replicas in place); the stages' sum then adds up the averaged shares, which is
    // the average of the sums.
    if (handler != nullptr) handler->finish();
    for (Tensor& param : tied_) tied_group_->all_reduce(tied_gradient(param), comm::ReduceOp::sum);
  }

  if (p > 1) {
    const comm::OperationContext context(
        fmt::format("pipeline stage {} of {}: the micro-step's loss, after this stage's {} microbatches", s, p, m));
    group_->all_reduce(reported, comm::ReduceOp::sum);
  }
  if (timer) last_timing_ = timer->finish();
  return reported;
}

Tensor PipelineSchedule::evaluate(Engine& engine, const Tensor& input) {
  autograd::NoGradGuard no_grad;
  const int p = group_->size(), s = group_->rank();
  const int v = static_cast<int>(chunks_.size());
  const bool first = s == 0, last = s == p - 1;
  COLOSSAL_CHECK(input.defined() && input.dim() >= 1,
                 "pipeline stage {}: every stage needs the batch's input (its shape fixes the activations' shapes)", s);
  const std::vector<int64_t> key = shape_key(false, 1, input);
  const bool shapes_known = shapes_.contains(key);
  std::map<int, std::pair<Shape, DType>>& shapes = shapes_[key];
  amp::MixedPrecisionOptimizer* amp = engine.amp();
  Tensor output;
  {
    Exchanger exchanger(*group_, shapes, neighbours_);
    const std::vector<ExchangeBatch>& batches = exchange_plan(/*forward_only=*/true, !shapes_known);
    const std::vector<PipelineOp> order = parallel::pp::forward_only_order(1, v);
    auto no_gradients = [](int64_t, int) -> const Tensor& {
      COLOSSAL_FAIL("pipeline evaluation: no gradient travels");
    };
    size_t next_batch = 0;
    for (size_t index = 0; index <= order.size(); ++index) {
      while (next_batch < batches.size() && batches[next_batch].before_op == index) {
        exchanger.issue(batches[next_batch++], no_gradients);
      }
      if (index == order.size()) break;
      const int c = order[index].chunk;
      const Tensor x = first && c == 0 ? (amp != nullptr ? amp->cast_input(input) : input)
                                       : exchanger.take(PipelineMessage::Kind::activation, 0, first ? c - 1 : c);
      Tensor y = chunks_[static_cast<size_t>(c)]->forward(x);
      if (last && c == v - 1) {
        output = amp != nullptr ? amp->cast_output(y) : y;
      } else {
        exchanger.post(PipelineMessage::Kind::activation, 0, c, y);
      }
    }
    exchanger.finish();
  }
  if (p == 1) return output;
  // The output to every stage; its dtype and shape first, the first time a batch of this shape comes
  // (kept under the key -1, no chunk's).
  const comm::OperationContext context(fmt::format("pipeline stage {} of {}: evaluation output broadcast", s, p));
  if (!shapes_known) {
    Tensor header = last ? header_of(output, group_->device()) : empty_header(group_->device());
    group_->broadcast(header, p - 1);
    shapes[-1] = read_header(header);
  }
  if (last) {
    output = output.contiguous();
  } else {
    output = core::empty(shapes.at(-1).first, TensorOptions(shapes.at(-1).second, group_->device()));
  }
  group_->broadcast(output, p - 1);
  return output;
}

}  // namespace colossal::engine
