// Backward: count each node's dependencies reachable from the roots, then run nodes whose
// gradients are complete, latest-created first (deterministic order, and memory is freed early
// along the most recent path). Gradients arriving at the same input are summed.
#include "colossal/autograd/engine.h"

#include <queue>
#include <unordered_map>

#include "colossal/autograd/grad_mode.h"
#include "colossal/autograd/node.h"
#include "colossal/core/view.h"

namespace colossal::autograd {
namespace {

struct NodeState {
  std::vector<Tensor> grads;  // one per output of the node
  int dependencies = 0;
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

}  // namespace

void backward(const std::vector<Tensor>& roots, const std::vector<Tensor>& grad_roots, BackwardOptions options) {
  COLOSSAL_CHECK(grad_roots.empty() || grad_roots.size() == roots.size(),
                 "backward: {} roots but {} root gradients", roots.size(), grad_roots.size());
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
      COLOSSAL_CHECK(g.shape() == root.shape(), "backward: gradient for root {} has shape {}, expected {}", i, g.shape(),
                     root.shape());
    } else {
      COLOSSAL_CHECK(root.numel() == 1,
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
  while (!ready.empty()) {
    Node* node = ready.top();
    ready.pop();
    std::vector<Tensor> grads = std::move(state[node].grads);
    const auto& metas = node->output_meta();
    grads.resize(metas.size());
    for (size_t i = 0; i < grads.size(); ++i) {
      if (!grads[i].defined()) grads[i] = core::zeros(metas[i].shape, core::TensorOptions(metas[i].dtype, metas[i].device));
    }
    node->run_pre_hooks(grads);
    std::vector<Tensor> input_grads = node->apply(std::move(grads));
    if (!options.retain_graph) node->release_saved();
    const auto& edges = node->next_edges();
    COLOSSAL_CHECK(input_grads.empty() || input_grads.size() == edges.size(),
                   "{} returned {} gradients for {} inputs", node->name(), input_grads.size(), edges.size());
    for (size_t i = 0; i < input_grads.size(); ++i) {
      const Edge& e = edges[i];
      if (!e.valid() || !input_grads[i].defined()) {
        if (e.valid() && --state[e.function.get()].dependencies == 0) ready.push(e.function.get());
        continue;
      }
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
}

}  // namespace colossal::autograd
