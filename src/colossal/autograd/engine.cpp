// Backward: count each node's dependencies reachable from the roots, then run nodes whose
// gradients are complete, latest-created first (deterministic order, and memory is freed early
// along the most recent path). Gradients arriving at the same input are summed.
#include "colossal/autograd/engine.h"

#include <algorithm>
#include <atomic>
#include <cstdlib>
#include <cstring>
#include <map>
#include <queue>
#include <unordered_map>
#include <utility>

#include "colossal/autograd/grad_mode.h"
#include "colossal/autograd/node.h"
#include "colossal/core/view.h"

namespace colossal::autograd {
namespace {

struct NodeState {
  std::vector<Tensor> grads;  // one per output of the node
  int dependencies = 0;
};

// Note [Gradient accumulation in the op]
// Where a leaf's gradient is summed over several backwards (microbatches of a pipeline, micro-steps
// of gradient accumulation) or over several uses in one graph (a layer run on the batch in chunks),
// each contribution is computed into a fresh tensor and then added into the sum by a kernel of its
// own: for a weight, the GEMM writes the gradient and an elementwise pass reads it and the sum and
// writes the sum. A GEMM can add its product into what is there (beta = 1), as Megatron-LM's
// gradient_accumulation_fusion does into its main_grad buffers. accumulation_target hands the op the
// tensor its gradient would be added into, when doing the addition there changes nothing else:
//   - the op's input is the leaf, or a 2-D transpose of it (Tensor::t(): nn::Conv1D's weight) whose
//     node nothing else feeds in this backward and which has no pre-hooks;
//   - the leaf's accumulator has no pre-hooks; and either
//     (a) a sum for the leaf is already waiting at its accumulator (another use in this graph came
//         first) in a buffer no one else holds, of the op's dtype, contiguous: the op adds into it and
//         the later uses and the accumulator run as before; or
//     (b) nothing is waiting, no other use is still to come in this backward (the accumulator's
//         count of pending edges is 1), the leaf's .grad is defined, contiguous, of the op's dtype,
//         and the leaf has no gradient hooks (they must see the gradient alone): the op adds into
//         .grad, and the accumulator, when its turn comes, only runs the grad-ready hooks (data
//         parallelism's buckets count the leaf as ready then, as before).
// The op then returns no gradient for that input (mark_accumulated), and the engine passes over the
// transpose node without running it. The sum is the same up to rounding: the product is added in the
// GEMM's f32 accumulator and rounded once, instead of being rounded to the gradient's dtype first.
// Not only leaves: (c) where the op's input is computed (its edge leads to the node of another op)
// and a sum for that output of that node is already waiting, in a buffer no one else holds, of the
// op's dtype, the op adds into it: a residual stream's gradient, which a block's add delivers before
// the branch's layer norm computes its own for the same tensor (GPT-2 and ViT: two a block, each a
// pass over [B, T, C] of its own before). The node runs as before, on the sum, once its other edges
// have delivered. Layer norm rounds its gradient to the sum's dtype before adding it, as the separate
// pass did, so those sums are the same bit for bit.
// The embedding's backward (ops/embedding.cpp) adds each named row's sum into its weight's target
// and reads and writes no other row: for GPT-2's wte (50257 x 1024) that saves clearing the whole
// table and the engine's pass over it, each microbatch; f16/bf16 rows are rounded once, as the GEMM's.

// Note [Small gradients added together]
// A leaf's accumulator adds an arriving gradient into .grad with a kernel of its own. For the weights
// the ops themselves add (Note [Gradient accumulation in the op]), but a block's layer-norm scales and
// shifts and its linear biases arrive whole, each a few thousand values: GPT-2 350M's first pipeline
// stage launched 104 such additions at the end of every backward of a microbatch after the second, at
// about 4 us of host time each (0.41 ms a backward, 2.5 ms of a 68 ms step: session 24's trace). So
// within a backward, an accumulator whose leaf has no grad-ready hooks (those must see the sum when
// they run) files a small addition instead (defer_accumulation), and the backward makes them all
// with one core::accumulate_many_ when its graph is done: on a GPU one launch per 64 of them, each
// element's sum the same as the kernel of its own would give. An addition into a .grad already filed
// in this backward first makes the filed ones. Leaves with hooks (data parallelism's buckets, ZeRO's)
// add at once, as before.

/// What a backward that an op added into a target leaves for the engine to do at a node.
enum class Absorbed {
  through,    // a transpose node the op passed over: skip it, release its accumulator's edge
  into_grad,  // the accumulator whose leaf's .grad took the gradient: run its grad-ready hooks only
};

struct LaterFirst {
  bool operator()(const Node* a, const Node* b) const { return a->sequence_nr() < b->sequence_nr(); }
};

void add_into(Tensor& slot, Tensor&& incoming) {
  if (!slot.defined()) {
    slot = std::move(incoming);
    return;
  }
  // Never write into a buffer someone else may hold; make the sum a fresh tensor.
  if (slot.use_count() == 1 && slot.storage().use_count() == 1 && slot.is_contiguous() &&
      slot.dtype() == incoming.dtype()) {
    core::accumulate_(slot, incoming);
  } else {
    Tensor sum = core::empty(slot.shape(), core::TensorOptions(slot.dtype(), slot.device()));
    sum.copy_(slot);
    core::accumulate_(sum, incoming.dtype() == sum.dtype() ? incoming : core::cast_raw(incoming, sum.dtype()));
    slot = std::move(sum);
  }
}

/// The backward running on this thread: its nodes' states, and what ops added into targets.
struct Task {
  std::unordered_map<Node*, NodeState>* state = nullptr;
  /// Targets handed out and not yet used: (node, input) -> the nodes to pass over and how.
  std::map<std::pair<const Node*, size_t>, std::vector<std::pair<Node*, Absorbed>>> offered;
  std::unordered_map<Node*, Absorbed> absorbed;
  /// Small .grad additions filed for the end (Note [Small gradients added together]).
  std::vector<Tensor> deferred_grads, deferred_incoming;

  void add_deferred() {
    if (deferred_grads.empty()) return;
    core::accumulate_many_(std::exchange(deferred_grads, {}), std::exchange(deferred_incoming, {}));
  }
};
thread_local Task* current_task = nullptr;
std::atomic<int64_t> fused_accumulations{0};
std::atomic<int64_t> batched_accumulations{0};

/// COLOSSAL_FUSED_GRAD_ACCUMULATION=0 turns the targets off (for measuring what they save).
bool fused_gradient_accumulation_enabled() {
  static const bool enabled = [] {
    const char* v = std::getenv("COLOSSAL_FUSED_GRAD_ACCUMULATION");
    return v == nullptr || std::strcmp(v, "0") != 0;
  }();
  return enabled;
}

}  // namespace

Tensor accumulation_target(const Node& node, size_t input, DType dtype) {
  Task* task = current_task;
  if (task == nullptr || !fused_gradient_accumulation_enabled() || input >= node.next_edges().size()) return {};
  const Edge& edge = node.next_edges()[input];
  if (!edge.valid()) return {};
  auto pending = [&](Node* n) -> NodeState* {
    auto it = task->state->find(n);
    return it == task->state->end() ? nullptr : &it->second;
  };
  auto waiting = [](const NodeState* s) { return s != nullptr && !s->grads.empty() && s->grads[0].defined(); };
  std::vector<std::pair<Node*, Absorbed>> passed;
  Node* first = edge.function.get();
  auto* acc = dynamic_cast<AccumulateGrad*>(first);
  bool transposed = false;
  if (acc == nullptr) {
    const NodeState* s = pending(first);
    // (c): a sum waiting at the node that computed the input.
    if (s != nullptr && edge.input_nr < s->grads.size() && s->grads[edge.input_nr].defined()) {
      const Tensor& sum = s->grads[edge.input_nr];
      if (!exclusively_owned(sum) || sum.dtype() != dtype || first->has_pre_hooks()) return {};
      task->offered[{&node, input}] = {};
      return sum;
    }
    // A 2-D transpose of the leaf, fed by this node alone.
    if (first->name() != "transpose" || first->next_edges().size() != 1 || first->has_pre_hooks() ||
        first->output_meta().size() != 1 || first->output_meta()[0].shape.size() != 2 || s == nullptr ||
        s->dependencies != 1 || waiting(s)) {
      return {};
    }
    const Edge& next = first->next_edges()[0];
    if (!next.valid()) return {};
    acc = dynamic_cast<AccumulateGrad*>(next.function.get());
    if (acc == nullptr) return {};
    transposed = true;
    passed.emplace_back(first, Absorbed::through);
  }
  if (acc->has_pre_hooks()) return {};
  NodeState* s = pending(acc);
  if (s == nullptr) return {};
  Tensor base;
  if (waiting(s)) {  // (a): add into the sum waiting at the accumulator
    if (!exclusively_owned(s->grads[0]) || s->grads[0].dtype() != dtype) return {};
    base = s->grads[0];
  } else {  // (b): add into .grad; the accumulator then only runs the grad-ready hooks
    const core::AutogradMeta* meta_ptr = acc->leaf().autograd_meta_if_exists();
    if (meta_ptr == nullptr) return {};
    const core::AutogradMeta& meta = *meta_ptr;
    if (s->dependencies != 1 || !meta.grad.defined() || !meta.grad_hooks.empty() || !meta.grad.is_contiguous() ||
        meta.grad.dtype() != dtype || meta.grad.shape() != acc->leaf().shape()) {
      return {};
    }
    base = meta.grad;
    passed.emplace_back(acc, Absorbed::into_grad);
  }
  if (base.device() != acc->leaf().device()) return {};
  task->offered[{&node, input}] = std::move(passed);
  return transposed ? core::transpose_raw(base, 0, 1) : base;
}

void mark_accumulated(const Node& node, size_t input) {
  Task* task = current_task;
  COLOSSAL_CHECK(task != nullptr, "mark_accumulated: called outside backward");
  auto it = task->offered.find({&node, input});
  COLOSSAL_CHECK(it != task->offered.end(), "mark_accumulated: {} was given no target for its input {}", node.name(),
                 input);
  for (const auto& [n, how] : it->second) task->absorbed[n] = how;
  task->offered.erase(it);
  fused_accumulations.fetch_add(1, std::memory_order_relaxed);
}

int64_t fused_gradient_accumulations() {
  return fused_accumulations.load(std::memory_order_relaxed);
}

bool defer_accumulation(const Tensor& grad, const Tensor& incoming) {
  Task* task = current_task;
  if (task == nullptr || !fused_gradient_accumulation_enabled() || !grad.defined() || !incoming.defined() ||
      static_cast<int64_t>(grad.nbytes()) > kBatchedAccumulationBytes || !grad.is_contiguous() ||
      grad.dtype() != incoming.dtype() || grad.device() != incoming.device() || grad.shape() != incoming.shape()) {
    return false;
  }
  const bool filed = std::any_of(task->deferred_grads.begin(), task->deferred_grads.end(),
                                 [&](const Tensor& g) { return g.raw_data() == grad.raw_data(); });
  if (filed) task->add_deferred();  // the sums into one .grad go in the order they came
  task->deferred_grads.push_back(grad);
  task->deferred_incoming.push_back(incoming);
  batched_accumulations.fetch_add(1, std::memory_order_relaxed);
  return true;
}

int64_t batched_gradient_accumulations() {
  return batched_accumulations.load(std::memory_order_relaxed);
}

void backward(const std::vector<Tensor>& roots, const std::vector<Tensor>& grad_roots, BackwardOptions options) {
  COLOSSAL_CHECK(grad_roots.empty() || grad_roots.size() == roots.size(), "backward: {} roots but {} root gradients",
                 roots.size(), grad_roots.size());
  std::vector<std::pair<Edge, Tensor>> starts;
  for (size_t i = 0; i < roots.size(); ++i) {
    const Tensor& root = roots[i];
    COLOSSAL_CHECK(root.defined(), "backward: root {} is undefined", i);
    COLOSSAL_CHECK(root.requires_grad(),
                   "backward: root {} (shape {}) does not require grad: no input of the computation that produced it "
                   "requires grad, or it was computed under NoGradGuard",
                   i, root.shape());
    Tensor g;
    if (!grad_roots.empty() && grad_roots[i].defined()) {
      g = grad_roots[i];
      COLOSSAL_CHECK(g.shape() == root.shape(), "backward: gradient for root {} has shape {}, expected {}", i,
                     g.shape(), root.shape());
    } else {
      COLOSSAL_CHECK(
          root.numel() == 1,
          "backward: root {} has shape {}; a gradient is implied only for one-element roots, pass grad_roots", i,
          root.shape());
      g = core::ones(root.shape(), core::TensorOptions(root.dtype(), root.device()));
    }
    starts.emplace_back(gradient_edge(root), g);
  }

  // Dependencies: how many edges point at each node from the part of the graph we will run.
  std::unordered_map<Node*, NodeState> state;
  std::vector<Node*> stack;
  std::unordered_map<Node*, bool> seen;
  for (auto& [edge, g] : starts) {
    if (!seen[edge.function.get()]) {
      seen[edge.function.get()] = true;
      stack.push_back(edge.function.get());
    }
  }
  while (!stack.empty()) {
    Node* node = stack.back();
    stack.pop_back();
    for (const Edge& e : node->next_edges()) {
      if (!e.valid()) continue;
      state[e.function.get()].dependencies += 1;
      if (!seen[e.function.get()]) {
        seen[e.function.get()] = true;
        stack.push_back(e.function.get());
      }
    }
  }

  std::priority_queue<Node*, std::vector<Node*>, LaterFirst> ready;
  // Keep nodes alive while we run them even if the graph lets go of them.
  std::unordered_map<Node*, std::shared_ptr<Node>> keep_alive;
  auto deliver = [&](const Edge& edge, Tensor&& g) {
    Node* target = edge.function.get();
    NodeState& s = state[target];
    if (s.grads.size() < target->output_meta().size()) s.grads.resize(target->output_meta().size());
    add_into(s.grads.at(edge.input_nr), std::move(g));
    keep_alive.emplace(target, edge.function);
  };
  for (auto& [edge, g] : starts) deliver(edge, Tensor(g));
  for (auto& [edge, g] : starts) {
    if (state[edge.function.get()].dependencies == 0) {
      state[edge.function.get()].dependencies = -1;  // queued
      ready.push(edge.function.get());
    }
  }

  // The graph is differentiated with recording off: gradients are not themselves differentiable.
  NoGradGuard no_grad;
  Task task;
  task.state = &state;
  struct CurrentTask {  // restores an enclosing backward's (a checkpoint's recomputation runs one inside)
    Task* saved;
    explicit CurrentTask(Task* t) : saved(std::exchange(current_task, t)) {}
    ~CurrentTask() { current_task = saved; }
  } current(&task);
  while (!ready.empty()) {
    Node* node = ready.top();
    ready.pop();
    task.offered.clear();
    if (auto absorbed = task.absorbed.find(node); absorbed != task.absorbed.end()) {
      // An op added this node's gradient where it belongs (Note [Gradient accumulation in the op]).
      const Absorbed how = absorbed->second;
      task.absorbed.erase(absorbed);
      if (how == Absorbed::into_grad) {
        static_cast<AccumulateGrad*>(node)->run_ready_hooks();
      } else {
        for (const Edge& e : node->next_edges()) {
          if (e.valid() && --state[e.function.get()].dependencies == 0) ready.push(e.function.get());
        }
      }
      if (!options.retain_graph) node->release_saved();
      state.erase(node);
      keep_alive.erase(node);
      continue;
    }
    std::vector<Tensor> grads = std::move(state[node].grads);
    const auto& metas = node->output_meta();
    grads.resize(metas.size());
    for (size_t i = 0; i < grads.size(); ++i) {
      if (!grads[i].defined())
        grads[i] = core::zeros(metas[i].shape, core::TensorOptions(metas[i].dtype, metas[i].device));
    }
    node->run_pre_hooks(grads);
    std::vector<Tensor> input_grads = node->apply(std::move(grads));
    if (!options.retain_graph) node->release_saved();
    const auto& edges = node->next_edges();
    COLOSSAL_CHECK(input_grads.empty() || input_grads.size() == edges.size(), "{} returned {} gradients for {} inputs",
                   node->name(), input_grads.size(), edges.size());
    for (size_t i = 0; i < input_grads.size(); ++i) {
      const Edge& e = edges[i];
      if (!e.valid() || !input_grads[i].defined()) {
        if (!e.valid()) continue;
        keep_alive.emplace(e.function.get(), e.function);
        if (--state[e.function.get()].dependencies == 0) ready.push(e.function.get());
        continue;
      }
      COLOSSAL_CHECK(!task.absorbed.contains(e.function.get()),
                     "{} returned a gradient for input {} after adding it into its accumulation target", node->name(),
                     i);
      const OutputMeta& want = e.function->output_meta().at(e.input_nr);
      COLOSSAL_CHECK(input_grads[i].shape() == want.shape, "{}: gradient for input {} has shape {}, expected {}",
                     node->name(), i, input_grads[i].shape(), want.shape);
      deliver(e, std::move(input_grads[i]));
      if (--state[e.function.get()].dependencies == 0) ready.push(e.function.get());
    }
    if (input_grads.empty()) {
      for (const Edge& e : edges) {
        if (e.valid() && --state[e.function.get()].dependencies == 0) ready.push(e.function.get());
      }
    }
    state.erase(node);
    keep_alive.erase(node);
  }
  task.add_deferred();
}

}  // namespace colossal::autograd
