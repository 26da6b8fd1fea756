// The backward engine: reverse-mode differentiation over the recorded graph.
#pragma once

#include <vector>

#include "colossal/core/tensor.h"

namespace colossal::autograd {

struct BackwardOptions {
  /// Keep saved tensors so the same graph can be differentiated again.
  bool retain_graph = false;
};

/// Computes gradients of `roots` (weighted by `grad_roots`; a scalar root may omit its gradient,
/// which is then 1) and accumulates them into the .grad of every leaf that requires grad.
void backward(const std::vector<Tensor>& roots, const std::vector<Tensor>& grad_roots = {},
              BackwardOptions options = {});
inline void backward(const Tensor& root, const Tensor& grad_root = Tensor(), BackwardOptions options = {}) {
  backward(std::vector<Tensor>{root}, grad_root.defined() ? std::vector<Tensor>{grad_root} : std::vector<Tensor>{},
           options);
}

class Node;

/// Gradient accumulation in the op that computes a gradient (Note [Gradient accumulation in the op]
/// in engine.cpp). Called by a running node's backward for its input `input` (a leaf, a 2-D
/// transpose of a leaf made by Tensor::t(), or a computed tensor): where the gradient for that input
/// may be added straight into the tensor the engine would add it into — the leaf's .grad, or a sum
/// already waiting at the leaf or at the node that computed the input — that tensor, laid out as the
/// input (the transpose of the leaf's where the input is one), of the input's shape and `dtype`; else
/// an undefined tensor. Outside backward, or with the environment variable
/// COLOSSAL_FUSED_GRAD_ACCUMULATION=0: undefined.
Tensor accumulation_target(const Node& node, size_t input, DType dtype);
/// Says the node added its gradient for `input` into accumulation_target(node, input, ...)'s tensor;
/// it then returns an undefined gradient for that input, and the engine delivers nothing more.
void mark_accumulated(const Node& node, size_t input);
/// How many gradients ops have added into their targets in this process (a test hook).
int64_t fused_gradient_accumulations();

/// Called by a leaf's accumulator for .grad += incoming (Note [Small gradients added together]):
/// inside a backward, for a .grad of at most kBatchedAccumulationBytes that is contiguous and of
/// incoming's dtype, files the pair to be added with the backward's other such pairs in one
/// core::accumulate_many_ when the backward ends, and returns true; else false (the caller adds it
/// now). The caller must have no grad-ready hooks to run on the sum. Off with
/// COLOSSAL_FUSED_GRAD_ACCUMULATION=0.
bool defer_accumulation(const Tensor& grad, const Tensor& incoming);
inline constexpr int64_t kBatchedAccumulationBytes = int64_t{256} << 10;
/// How many gradient additions backwards have batched so in this process (a test hook).
int64_t batched_gradient_accumulations();

}  // namespace colossal::autograd
