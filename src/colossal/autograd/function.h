// How ops and users add differentiable computations to the graph.
//
// record(): what every built-in op calls after computing its outputs. It creates a LambdaNode
// whose backward closure returns one gradient per input, wires the inputs' gradient edges and
// marks the outputs as produced by it. Closures must capture saved tensors with detach() (see
// Note [Saved tensors]).
//
// Function: a user-written op with forward and backward (communication ops are written this way).
//
// Note [Saved tensors]: a closure that captured an output Tensor itself would form a cycle
// output -> grad_fn -> closure -> output and never be freed. detach() gives a handle on the same
// storage without autograd metadata, which breaks the cycle; the engine frees closures after a
// backward unless retain_graph is set.
#pragma once

#include <any>
#include <memory>
#include <string>
#include <vector>

#include "colossal/autograd/node.h"

namespace colossal::autograd {

/// True when grad mode is on and any of the tensors requires grad.
bool any_requires_grad(const std::vector<Tensor>& inputs);

/// Records `outputs` as computed from `inputs` by an op called `name`. `backward` receives the
/// gradients of the outputs and the node (ask node.needs_input_grad(i) to skip unneeded work) and
/// returns one gradient per input (an undefined Tensor where there is none). Does nothing when no
/// input requires grad or grad mode is off. Outputs must be fresh tensors (not yet in any graph).
void record(std::string name, const std::vector<Tensor>& inputs, const std::vector<Tensor>& outputs,
            LambdaNode::BackwardFn backward);

/// State a custom Function's forward hands to its backward.
struct FunctionContext {
  std::vector<Tensor> saved;              ///< save_for_backward() fills this
  std::vector<bool> needs_input_grad;     ///< per input, set before forward runs
  std::any data;                          ///< anything else forward wants to pass on
  void save_for_backward(std::vector<Tensor> tensors);
};

/// A differentiable operation written by hand. forward() runs with grad recording off.
class Function {
 public:
  virtual ~Function() = default;
  virtual std::string name() const = 0;
  virtual std::vector<Tensor> forward(FunctionContext& ctx, const std::vector<Tensor>& inputs) = 0;
  /// Returns one gradient per forward input (undefined where none).
  virtual std::vector<Tensor> backward(FunctionContext& ctx, const std::vector<Tensor>& grad_outputs) = 0;
};

/// Runs fn on inputs and records it, so backward() later calls fn->backward.
std::vector<Tensor> apply(const std::shared_ptr<Function>& fn, const std::vector<Tensor>& inputs);

/// A hook on t's gradient: for a leaf it runs before accumulation, for a non-leaf before the
/// producing node's backward. Returning a defined tensor replaces the gradient.
void register_hook(Tensor& t, std::function<Tensor(const Tensor&)> hook);
/// A hook run on a leaf right after its .grad has been updated by a backward (gradient-ready).
void register_grad_ready_hook(Tensor& leaf, std::function<void(Tensor&)> hook);
/// Keeps a non-leaf's gradient in its .grad after backward (leaves always keep theirs).
void retain_grad(Tensor& t);

}  // namespace colossal::autograd
