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
void backward(const std::vector<Tensor>& roots, const std::vector<Tensor>& grad_roots = {}, BackwardOptions options = {});
inline void backward(const Tensor& root, const Tensor& grad_root = Tensor(), BackwardOptions options = {}) {
  backward(std::vector<Tensor>{root}, grad_root.defined() ? std::vector<Tensor>{grad_root} : std::vector<Tensor>{}, options);
}

}  // namespace colossal::autograd
