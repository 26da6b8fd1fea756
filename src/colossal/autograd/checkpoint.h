// Activation checkpointing: run a segment without keeping its activations, and recompute it in
// backward. The default generator's state is saved and replayed, so dropout inside the segment
// draws the same mask both times.
#pragma once

#include <functional>
#include <vector>

#include "colossal/core/tensor.h"

namespace colossal::autograd {

using Segment = std::function<std::vector<Tensor>(const std::vector<Tensor>&)>;

/// Returns segment(inputs), recording one node that recomputes the segment in backward.
/// Parameters used inside the segment receive their gradients during that recomputation.
std::vector<Tensor> checkpoint(const Segment& segment, const std::vector<Tensor>& inputs);

}  // namespace colossal::autograd
