// record(), custom Function application and tensor hooks.
#include "colossal/autograd/function.h"

#include "colossal/autograd/grad_mode.h"
#include "colossal/core/view.h"

namespace colossal::autograd {

bool any_requires_grad(const std::vector<Tensor>& inputs) {
  if (!GradMode::is_enabled()) return false;
  for (const Tensor& t : inputs) {
    if (t.defined() && t.requires_grad()) return true;
  }
  return false;
}

void record(std::string name, const std::vector<Tensor>& inputs, const std::vector<Tensor>& outputs,
            LambdaNode::BackwardFn backward) {
  if (!any_requires_grad(inputs)) return;
  auto node = std::make_shared<LambdaNode>(std::move(name), std::move(backward));
  std::vector<Edge> edges;
  edges.reserve(inputs.size());
  for (const Tensor& t : inputs) edges.push_back(gradient_edge(t));
  node->set_next_edges(std::move(edges));
  for (size_t i = 0; i < outputs.size(); ++i) {
    Tensor out = outputs[i];
    if (!out.defined()) {
      node->output_meta().push_back({});
      continue;
    }
    node->output_meta().push_back({out.shape(), out.dtype(), out.device()});
    // Integer outputs (indices) carry no gradient.
    if (!core::is_floating(out.dtype())) continue;
    core::AutogradMeta& meta = out.autograd_meta();
    COLOSSAL_CHECK(meta.grad_fn == nullptr, "record({}): output {} already belongs to a graph", node->name(), i);
    meta.grad_fn = node;
    meta.output_nr = static_cast<uint32_t>(i);
  }
}

void FunctionContext::save_for_backward(std::vector<Tensor> tensors) {
  saved.clear();
  for (const Tensor& t : tensors) saved.push_back(t.defined() ? t.detach() : Tensor());
}

std::vector<Tensor> apply(const std::shared_ptr<Function>& fn, const std::vector<Tensor>& inputs) {
  auto ctx = std::make_shared<FunctionContext>();
  const bool recording = any_requires_grad(inputs);
  for (const Tensor& t : inputs) ctx->needs_input_grad.push_back(recording && t.defined() && t.requires_grad());
  std::vector<Tensor> outputs;
  {
    NoGradGuard no_grad;
    outputs = fn->forward(*ctx, inputs);
  }
  // An output that is an input (or a view sharing its handle) must become a new handle, or the
  // graph would point the input at itself.
  for (Tensor& out : outputs) {
    for (const Tensor& in : inputs) {
      if (out.defined() && out.is_same(in)) out = out.detach();
    }
  }
  record(fn->name(), inputs, outputs, [fn, ctx](const std::vector<Tensor>& grads, const Node&) {
    auto result = fn->backward(*ctx, grads);
    COLOSSAL_CHECK(result.size() == ctx->needs_input_grad.size(), "{}::backward returned {} gradients for {} inputs",
                   fn->name(), result.size(), ctx->needs_input_grad.size());
    return result;
  });
  return outputs;
}

void register_hook(Tensor& t, std::function<Tensor(const Tensor&)> hook) {
  COLOSSAL_CHECK(t.requires_grad(), "register_hook: the tensor (shape {}) does not require grad", t.shape());
  if (t.is_leaf()) {
    t.autograd_meta().grad_hooks.push_back(std::move(hook));
  } else {
    t.grad_fn()->add_pre_hook(t.autograd_meta().output_nr, std::move(hook));
  }
}

void register_grad_ready_hook(Tensor& leaf, std::function<void(Tensor&)> hook) {
  COLOSSAL_CHECK(leaf.is_leaf() && leaf.requires_grad(),
                 "register_grad_ready_hook: needs a leaf that requires grad (a parameter), got a tensor of shape {}",
                 leaf.shape());
  leaf.autograd_meta().grad_ready_hooks.push_back(std::move(hook));
}

void retain_grad(Tensor& t) {
  COLOSSAL_CHECK(t.requires_grad(), "retain_grad: the tensor (shape {}) does not require grad", t.shape());
  if (t.is_leaf()) return;
  // Hold the tensor weakly: a strong handle here would keep it alive as long as its producer.
  std::weak_ptr<core::TensorImpl> weak = t.shared_impl();
  t.grad_fn()->add_pre_hook(t.autograd_meta().output_nr, [weak](const Tensor& g) {
    auto impl = weak.lock();
    if (!impl) return Tensor();
    core::AutogradMeta& meta = impl->ensure_autograd_meta();
    if (!meta.grad.defined()) {
      meta.grad = core::empty(g.shape(), core::TensorOptions(g.dtype(), g.device()));
      meta.grad.copy_(g);
    } else {
      core::accumulate_(meta.grad, g);
    }
    return Tensor();
  });
}

}  // namespace colossal::autograd
