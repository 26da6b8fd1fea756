// Node bookkeeping, LambdaNode and AccumulateGrad.
#include "colossal/autograd/node.h"

#include <atomic>

#include "colossal/autograd/engine.h"  // defer_accumulation
#include "colossal/core/view.h"

namespace colossal::autograd {

namespace {
std::atomic<uint64_t> next_sequence_nr{0};
}

Node::Node() : sequence_nr_(next_sequence_nr.fetch_add(1)) {}

void Node::run_pre_hooks(std::vector<Tensor>& grad_outputs) const {
  for (const auto& [output_nr, hook] : pre_hooks_) {
    Tensor replaced = hook(grad_outputs[output_nr]);
    if (replaced.defined()) grad_outputs[output_nr] = replaced;
  }
}

std::vector<Tensor> LambdaNode::apply(std::vector<Tensor>&& grad_outputs) {
  COLOSSAL_CHECK(backward_ != nullptr,
                 "backward through {} a second time: its saved tensors were freed after the first backward; pass "
                 "retain_graph=true to the first backward() to keep them",
                 name_);
  return backward_(grad_outputs, *this);
}

AccumulateGrad::AccumulateGrad(Tensor leaf) : leaf_(std::move(leaf)) {
  output_meta().push_back({leaf_.shape(), leaf_.dtype(), leaf_.device()});
}

std::vector<Tensor> AccumulateGrad::apply(std::vector<Tensor>&& grad_outputs) {
  Tensor incoming = std::move(grad_outputs.at(0));
  core::AutogradMeta& meta = leaf_.autograd_meta();
  for (const auto& hook : meta.grad_hooks) {
    Tensor replaced = hook(incoming);
    if (replaced.defined()) incoming = replaced;
  }
  COLOSSAL_CHECK(incoming.shape() == leaf_.shape(), "gradient of shape {} arrived for {} of shape {}", incoming.shape(),
                 meta.name.empty() ? std::string("a leaf") : meta.name, leaf_.shape());
  if (incoming.dtype() != leaf_.dtype()) incoming = core::cast_raw(incoming, leaf_.dtype());
  if (!meta.grad.defined()) {
    // Keep the incoming buffer when nothing else can see it; otherwise copy, so a later in-place
    // accumulation cannot write into a tensor another leaf's .grad or the graph still uses.
    if (exclusively_owned(incoming)) {
      meta.grad = incoming.detach();
    } else {
      meta.grad = core::empty(incoming.shape(), core::TensorOptions(incoming.dtype(), incoming.device()));
      meta.grad.copy_(incoming);
    }
  } else if (!meta.grad_ready_hooks.empty() || !defer_accumulation(meta.grad, incoming)) {
    // A small one with no hook to see the sum is added at the backward's end with the others (Note
    // [Small gradients added together] in engine.cpp).
    core::accumulate_(meta.grad, incoming);
  }
  run_ready_hooks();
  return {};
}

void AccumulateGrad::run_ready_hooks() {
  for (const auto& hook : leaf_.autograd_meta().grad_ready_hooks) hook(leaf_);
}

bool exclusively_owned(const Tensor& t) {
  return t.use_count() == 1 && t.storage().use_count() == 1 && t.is_contiguous() && t.storage().nbytes() == t.nbytes();
}

std::shared_ptr<Node> grad_accumulator(const Tensor& leaf) {
  core::AutogradMeta& meta = const_cast<Tensor&>(leaf).autograd_meta();
  if (auto existing = meta.grad_accumulator.lock()) return existing;
  auto node = std::make_shared<AccumulateGrad>(leaf);
  meta.grad_accumulator = node;
  return node;
}

Edge gradient_edge(const Tensor& t) {
  if (!t.defined()) return {};
  const core::AutogradMeta* meta = t.autograd_meta_if_exists();
  if (meta == nullptr) return {};
  if (meta->grad_fn) return Edge{meta->grad_fn, meta->output_nr};
  if (meta->requires_grad) return Edge{grad_accumulator(t), 0};
  return {};
}

}  // namespace colossal::autograd
