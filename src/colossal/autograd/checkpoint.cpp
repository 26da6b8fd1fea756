// Checkpointing through record(): forward without grad; backward rewinds the generators,
// recomputes with grad on detached copies of the inputs and differentiates the recomputed segment.
#include "colossal/autograd/checkpoint.h"

#include <algorithm>
#include <utility>

#include "colossal/autograd/engine.h"
#include "colossal/autograd/function.h"
#include "colossal/autograd/grad_mode.h"

namespace colossal::autograd {
namespace {

thread_local int recompute_depth = 0;

/// The generators a segment draws from: the default one first, then the listed ones, once each.
std::vector<core::Generator*> generators_of(const CheckpointOptions& options) {
  std::vector<core::Generator*> generators{&core::default_generator()};
  for (core::Generator* g : options.generators) {
    if (g != nullptr && std::find(generators.begin(), generators.end(), g) == generators.end()) {
      generators.push_back(g);
    }
  }
  return generators;
}

std::vector<core::GeneratorState> states_of(const std::vector<core::Generator*>& generators) {
  std::vector<core::GeneratorState> states;
  states.reserve(generators.size());
  for (const core::Generator* g : generators) states.push_back(g->state());
  return states;
}

/// For the recompute's scope: the generators rewound to their states at the forward and the
/// recompute depth raised; on leaving (also by an exception) the generators' states from before
/// the recompute are put back, so the draws after the segment in forward and the draws backward
/// makes elsewhere are unaffected.
class RecomputeScope {
 public:
  RecomputeScope(const std::vector<core::Generator*>& generators, const std::vector<core::GeneratorState>& at_forward)
      : generators_(generators), before_(states_of(generators)) {
    for (size_t i = 0; i < generators_.size(); ++i) generators_[i]->set_state(at_forward[i]);
    ++recompute_depth;
  }
  ~RecomputeScope() {
    --recompute_depth;
    for (size_t i = 0; i < generators_.size(); ++i) generators_[i]->set_state(before_[i]);
  }
  RecomputeScope(const RecomputeScope&) = delete;
  RecomputeScope& operator=(const RecomputeScope&) = delete;

 private:
  const std::vector<core::Generator*>& generators_;
  std::vector<core::GeneratorState> before_;
};

}  // namespace

bool is_recomputing() {
  return recompute_depth > 0;
}

std::vector<Tensor> checkpoint(const Segment& segment, const std::vector<Tensor>& inputs,
                               const CheckpointOptions& options) {
  if (!GradMode::is_enabled()) return segment(inputs);
  std::vector<core::Generator*> generators = generators_of(options);
  std::vector<core::GeneratorState> at_forward = states_of(generators);
  std::vector<Tensor> outputs;
  {
    NoGradGuard no_grad;
    outputs = segment(inputs);
  }
  for (Tensor& out : outputs) {
    for (const Tensor& in : inputs) {
      if (out.defined() && out.is_same(in)) out = out.detach();
    }
  }
  std::vector<Tensor> saved_inputs;
  std::vector<bool> input_requires_grad;
  for (const Tensor& t : inputs) {
    saved_inputs.push_back(t.defined() ? t.detach() : Tensor());
    input_requires_grad.push_back(t.defined() && t.requires_grad());
  }
  // Parameters inside the segment make the outputs need grad even when no input does; record
  // against the inputs, plus a marker so record() sees a grad-requiring input in that case.
  std::vector<Tensor> record_inputs = inputs;
  if (!any_requires_grad(inputs)) {
    Tensor marker = core::zeros({}, core::DType::f32);
    marker.set_requires_grad(true);
    record_inputs.push_back(marker);
  }
  record("Checkpoint", record_inputs, outputs,
         [segment, saved_inputs, input_requires_grad, generators = std::move(generators),
          at_forward = std::move(at_forward),
          n_inputs = record_inputs.size()](const std::vector<Tensor>& grads, const Node&) {
           std::vector<Tensor> leaves;
           for (size_t i = 0; i < saved_inputs.size(); ++i) {
             Tensor leaf = saved_inputs[i].defined() ? saved_inputs[i].detach() : Tensor();
             if (leaf.defined() && input_requires_grad[i]) leaf.set_requires_grad(true);
             leaves.push_back(leaf);
           }
           std::vector<Tensor> recomputed;
           {
             RecomputeScope scope(generators, at_forward);
             EnableGradGuard enable;
             recomputed = segment(leaves);
           }
           std::vector<Tensor> roots, root_grads;
           for (size_t i = 0; i < recomputed.size() && i < grads.size(); ++i) {
             if (recomputed[i].defined() && recomputed[i].requires_grad()) {
               roots.push_back(recomputed[i]);
               root_grads.push_back(grads[i]);
             }
           }
           if (!roots.empty()) {
             EnableGradGuard enable;
             backward(roots, root_grads);
           }
           std::vector<Tensor> result(n_inputs);
           for (size_t i = 0; i < leaves.size(); ++i) {
             if (leaves[i].defined() && input_requires_grad[i]) result[i] = leaves[i].grad();
           }
           return result;
         });
  return outputs;
}

Tensor checkpoint(const std::function<Tensor(const Tensor&)>& segment, const Tensor& input,
                  const CheckpointOptions& options) {
  // By value: the node keeps the segment for the recompute after this call returns.
  const Segment wrapped = [segment](const std::vector<Tensor>& in) { return std::vector<Tensor>{segment(in[0])}; };
  return checkpoint(wrapped, {input}, options).at(0);
}

}  // namespace colossal::autograd
