// Checkpointing through record(): forward without grad; backward recomputes with grad on detached
// copies of the inputs and differentiates the recomputed segment.
#include "colossal/autograd/checkpoint.h"

#include "colossal/autograd/engine.h"
#include "colossal/autograd/function.h"
#include "colossal/autograd/grad_mode.h"
#include "colossal/core/random.h"

namespace colossal::autograd {

std::vector<Tensor> checkpoint(const Segment& segment, const std::vector<Tensor>& inputs) {
  if (!any_requires_grad(inputs) && !GradMode::is_enabled()) return segment(inputs);
  const core::GeneratorState rng_before = core::default_generator().state();
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
  Tensor marker;
  if (!any_requires_grad(inputs)) {
    marker = core::zeros({}, core::DType::f32);
    marker.set_requires_grad(true);
    record_inputs.push_back(marker);
  }
  record("Checkpoint", record_inputs, outputs,
         [segment, saved_inputs, input_requires_grad, rng_before, n_inputs = record_inputs.size()](
             const std::vector<Tensor>& grads, const Node&) {
           std::vector<Tensor> leaves;
           for (size_t i = 0; i < saved_inputs.size(); ++i) {
             Tensor leaf = saved_inputs[i].defined() ? saved_inputs[i].detach() : Tensor();
             if (leaf.defined() && input_requires_grad[i]) leaf.set_requires_grad(true);
             leaves.push_back(leaf);
           }
           core::Generator& gen = core::default_generator();
           const core::GeneratorState rng_now = gen.state();
           gen.set_state(rng_before);
           std::vector<Tensor> recomputed;
           {
             EnableGradGuard enable;
             recomputed = segment(leaves);
           }
           gen.set_state(rng_now);
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

}  // namespace colossal::autograd
