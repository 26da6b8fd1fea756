// PipelineSchedule: see pipeline_schedule.h.
#include "colossal/engine/pipeline_schedule.h"

#include <fmt/format.h>

#include <map>
#include <utility>

#include "colossal/autograd/engine.h"     // backward
#include "colossal/autograd/grad_mode.h"  // NoGradGuard
#include "colossal/comm/operation_context.h"
#include "colossal/core/error.h"
#include "colossal/core/profiler.h"  // Scope
#include "colossal/engine/engine.h"
#include "colossal/ops/elementwise.h"            // div
#include "colossal/ops/indexing.h"               // cat
#include "colossal/parallel/gradient_handler.h"  // GradientHandler
#include "colossal/parallel/pp/schedule_order.h"

namespace colossal::engine {
namespace {

using parallel::pp::PipelineOp;

constexpr int kMaxDims = 6;
enum MessageKind { kHeader = 0, kActivation = 1, kGradient = 2 };

/// Tags stay below 32768, the least MPI_TAG_UB the standard allows; a tag repeats only 256
/// microbatches later, long after its message was received (Note [Pipeline messages]).
int tag_of(MessageKind kind, int64_t microbatch, int chunk) {
  return static_cast<int>(((microbatch % 256) * 16 + chunk % 16) * 4 + kind);
}

/// A tensor's dtype and shape as the i64 header that travels before it (Note [Pipeline messages]).
Tensor header_of(const Tensor& t, Device device) {
  COLOSSAL_CHECK(t.dim() <= kMaxDims, "pipeline: tensors of at most {} dimensions travel between stages, got shape {}",
                 kMaxDims, t.shape());
  std::vector<int64_t> h(2 + kMaxDims, 0);
  h[0] = static_cast<int64_t>(t.dtype());
  h[1] = t.dim();
  for (int64_t d = 0; d < t.dim(); ++d) h[static_cast<size_t>(2 + d)] = t.size(d);
  return core::from_vector<int64_t>(h, {2 + kMaxDims}).to(device);
}

/// An empty tensor on `device` of the dtype and shape a header carries.
Tensor empty_from_header(const Tensor& header, Device device) {
  const std::vector<int64_t> h = header.to(core::kCpu).to_vector<int64_t>();
  return core::empty(Shape(h.begin() + 2, h.begin() + 2 + h[1]), TensorOptions(static_cast<DType>(h[0]), device));
}

Tensor empty_header(Device device) {
  return core::empty({2 + kMaxDims}, TensorOptions(DType::i64, device));
}

/// One stage's messages within a micro-step: asynchronous sends kept alive until the end, blocking
/// receives, and a local mailbox for a "peer" that is this stage itself (one stage, several chunks).
class Messenger {
 public:
  explicit Messenger(comm::ProcessGroup& group) : group_(group) {}
  ~Messenger() { wait_sends(); }

  void send(const Tensor& tensor, int peer, int tag) {
    const Tensor payload = tensor.contiguous();
    if (peer == group_.rank()) {
      local_[tag] = payload;
      return;
    }
    sends_.push_back(group_.send(payload, peer, tag, /*async=*/true));
    kept_.push_back(payload);
  }
  Tensor receive(const Tensor& buffer, int peer, int tag) {
    if (peer == group_.rank()) {
      auto it = local_.find(tag);
      COLOSSAL_CHECK(it != local_.end(), "pipeline stage {}: no local message with tag {} (a schedule mismatch)",
                     group_.rank(), tag);
      Tensor t = std::move(it->second);
      local_.erase(it);
      return t;
    }
    group_.recv(buffer, peer, tag);
    return buffer;
  }
  /// An activation: its header (dtype, shape), then the tensor.
  void send_activation(const Tensor& activation, int peer, int64_t microbatch, int chunk) {
    send(header_of(activation, group_.device()), peer, tag_of(kHeader, microbatch, chunk));
    send(activation, peer, tag_of(kActivation, microbatch, chunk));
  }
  Tensor receive_activation(int peer, int64_t microbatch, int chunk) {
    const Tensor header = receive(empty_header(group_.device()), peer, tag_of(kHeader, microbatch, chunk));
    return receive(empty_from_header(header, group_.device()), peer, tag_of(kActivation, microbatch, chunk));
  }
  void wait_sends() {
    for (comm::Work& w : sends_) w.wait();
    sends_.clear();
    kept_.clear();
  }

 private:
  comm::ProcessGroup& group_;
  std::vector<comm::Work> sends_;
  std::vector<Tensor> kept_;
  std::map<int, Tensor> local_;
};

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

std::shared_ptr<comm::ProcessGroup> PipelineSchedule::tied_group(comm::ProcessGroup& pipeline, bool holds) {
  return pipeline.split(holds ? 0 : comm::kNoColor, pipeline.rank());
}

Tensor PipelineSchedule::forward_backward(Engine& engine, const Tensor& input, const Tensor& target) {
  const int p = group_->size(), s = group_->rank();
  const int v = static_cast<int>(chunks_.size());
  const int64_t m = num_microbatches_;
  const bool first = s == 0, last = s == p - 1;
  const Tensor& sized = first ? input : target;
  COLOSSAL_CHECK(!(first || last) || (sized.defined() && sized.dim() >= 1 && sized.size(0) % m == 0),
                 "pipeline stage {}: the batch's {} samples do not split into {} microbatches; use a batch size that "
                 "is a multiple of the number of microbatches",
                 s, sized.defined() && sized.dim() >= 1 ? sized.size(0) : 0, m);
  const int64_t per = (first || last) ? sized.size(0) / m : 0;
  auto slice = [&](const Tensor& t, int64_t mb) { return t.narrow(0, mb * per, per); };

  Messenger messenger(*group_);
  struct Saved {
    Tensor input;   // a leaf receiving the gradient, or the microbatch's data on stage 0's chunk 0
    Tensor output;  // the chunk's output, or the microbatch's loss at the very end
  };
  std::map<std::pair<int64_t, int>, Saved> saved;
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

  for (size_t index = 0; index < order.size(); ++index) {
    const PipelineOp& op = order[index];
    if (handler != nullptr && op.kind == PipelineOp::Kind::backward) {
      handler->set_sync(sync_window && index == last_backward[static_cast<size_t>(op.chunk)]);
    }
    const int c = op.chunk;
    const int64_t mb = op.microbatch;
    const bool very_first = first && c == 0, very_last = last && c == v - 1;
    const int prev = first ? p - 1 : s - 1;  // chunk c's input comes from chunk c - 1 on the last stage
    const int next = last ? 0 : s + 1;       // its output goes to chunk c + 1 on stage 0
    // The profiler's ranges (core/profiler.h) show each stage's busy and idle time per op: the bubble.
    core::profiler::Scope scope(op.kind == PipelineOp::Kind::forward ? "pipeline: forward" : "pipeline: backward",
                                engine.device());
    // A receive that never completes names the stage, the pass and the microbatch (the watchdog's
    // message, comm/operation_context.h), not only a tag.
    const comm::OperationContext context(fmt::format("pipeline stage {} of {}: {} of microbatch {}{}", s, p,
                                                     op.kind == PipelineOp::Kind::forward ? "forward" : "backward", mb,
                                                     v > 1 ? fmt::format(", chunk {}", c) : std::string()));
    if (op.kind == PipelineOp::Kind::forward) {
      Saved& sv = saved[{mb, c}];
      if (very_first) {
        sv.input = amp != nullptr ? amp->cast_input(slice(input, mb)) : slice(input, mb);
      } else {
        // The previous chunk's output, a leaf here: its gradient is what goes back.
        sv.input = messenger.receive_activation(prev, mb, first ? c - 1 : c).detach();
        sv.input.set_requires_grad(true);
      }
      Tensor y = chunks_[static_cast<size_t>(c)]->forward(sv.input);
      if (very_last) {
        const Tensor out = amp != nullptr ? amp->cast_output(y) : y;
        sv.output = engine.criterion(out, slice(target, mb));
        losses.push_back(sv.output.detach());
        outputs.push_back(out.detach());
      } else {
        messenger.send_activation(y.detach(), next, mb, c);
        sv.output = y;
      }
    } else {
      Saved& sv = saved.at({mb, c});
      if (very_last) {
        engine.backward(ops::div(sv.output, static_cast<double>(m)));  // the batch's mean loss
      } else {
        Tensor grad =
            messenger.receive(core::empty(sv.output.shape(), TensorOptions(sv.output.dtype(), sv.output.device())),
                              next, tag_of(kGradient, mb, last ? c + 1 : c));
        autograd::backward(sv.output, grad);
      }
      if (!very_first) {
        const Tensor g = sv.input.grad();
        COLOSSAL_CHECK(g.defined(), "pipeline stage {}: microbatch {} chunk {} got no input gradient", s, mb, c);
        messenger.send(g, prev, tag_of(kGradient, mb, c));
      }
      saved.erase({mb, c});
    }
  }
  messenger.wait_sends();
  if (handler != nullptr) handler->set_sync(sync_window);  // as the Engine set it

  // Note [Tied parameters across stages]: each copy's gradient becomes the sum of every stage's, once
  // per accumulation window (the sum of the window's accumulated shares).
  if (tied_group_ != nullptr && tied_group_->size() > 1 && engine.last_step_updated()) {
    COLOSSAL_CHECK(engine.gradient_handler() == nullptr,
                   "pipeline stage {}: tied parameters across stages under data parallelism are not supported yet "
                   "(the data-parallel reduction of their gradients is still in flight here)",
                   s);
    for (Tensor& param : tied_) {
      Tensor grad = param.grad();
      if (!grad.defined()) {
        grad = core::zeros_like(param);  // this stage's share was nothing this micro-step
        param.set_grad(grad);
      }
      if (!grad.is_contiguous()) {
        grad = grad.contiguous();
        param.set_grad(grad);
      }
      tied_group_->all_reduce(grad, comm::ReduceOp::sum);
    }
  }

  // Every stage reports the last stage's mean loss (the others contribute zero).
  autograd::NoGradGuard no_grad;
  Tensor reported = core::zeros({}, TensorOptions(DType::f64, group_->device()));
  if (last) {
    for (const Tensor& l : losses) reported = ops::add(reported, l.to(DType::f64));
    reported = ops::div(reported, static_cast<double>(m));
    engine.set_last_output(ops::cat(outputs, 0));
  }
  if (p > 1) group_->all_reduce(reported, comm::ReduceOp::sum);
  return reported;
}

Tensor PipelineSchedule::evaluate(Engine& engine, const Tensor& input) {
  autograd::NoGradGuard no_grad;
  const int p = group_->size(), s = group_->rank();
  const int v = static_cast<int>(chunks_.size());
  const bool first = s == 0, last = s == p - 1;
  Messenger messenger(*group_);
  amp::MixedPrecisionOptimizer* amp = engine.amp();
  Tensor output;
  for (const PipelineOp& op : parallel::pp::forward_only_order(1, v)) {
    const int c = op.chunk;
    const comm::OperationContext context(
        fmt::format("pipeline stage {} of {}: evaluation forward{}", s, p, v > 1 ? fmt::format(", chunk {}", c) : ""));
    Tensor x;
    if (first && c == 0) {
      x = amp != nullptr ? amp->cast_input(input) : input;
    } else {
      x = messenger.receive_activation(first ? p - 1 : s - 1, 0, first ? c - 1 : c);
    }
    Tensor y = chunks_[static_cast<size_t>(c)]->forward(x);
    if (last && c == v - 1) {
      output = amp != nullptr ? amp->cast_output(y) : y;
    } else {
      messenger.send_activation(y, last ? 0 : s + 1, 0, c);
    }
  }
  messenger.wait_sends();
  if (p == 1) return output;
  // The output to every stage: its dtype and shape first, then the tensor.
  Tensor header = last ? header_of(output, group_->device()) : empty_header(group_->device());
  group_->broadcast(header, p - 1);
  output = last ? output.contiguous() : empty_from_header(header, group_->device());
  group_->broadcast(output, p - 1);
  return output;
}

}  // namespace colossal::engine
