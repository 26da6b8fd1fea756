// Activation checkpointing: run a segment without keeping its activations, and recompute it in
// backward (PyTorch's torch.utils.checkpoint, Megatron's recompute). The generators the segment
// draws from are saved at its forward and rewound for the recompute, so dropout inside it draws
// the same masks both times. The models switch it on per block (GPT2Config, ViTConfig and
// ResNetConfig's checkpoint_activations; model.options.checkpoint_activations in a config).
#pragma once

#include <functional>
#include <vector>

#include "colossal/core/random.h"  // Generator
#include "colossal/core/tensor.h"

namespace colossal::autograd {

using Segment = std::function<std::vector<Tensor>(const std::vector<Tensor>&)>;

struct CheckpointOptions {
  /// The generators the segment may draw random numbers from besides core::default_generator(),
  /// which is always included; null entries are skipped. A Generator is only a (seed, offset)
  /// counter on the host that CPU and CUDA kernels both read (core/random.h), so saving it saves
  /// the stream on either device. Under tensor parallelism pass both of the layer's generators
  /// (parallel/tp/random.h: the data one and the tensor-parallel one).
  std::vector<core::Generator*> generators;
};

/// Returns segment(inputs), recording one node that recomputes the segment in backward.
/// Parameters used inside the segment receive their gradients during that recomputation. With
/// grad mode off it is segment(inputs) and nothing is saved.
///
/// The segment must compute the same function both times: the same modules in the same
/// train/eval mode, random numbers only from the listed generators, and (under tensor
/// parallelism) the same collectives on every rank of a group, which the recompute issues again
/// inside backward, as Megatron does. Side effects of a forward other than random draws, such as
/// BatchNorm's running statistics, must ask is_recomputing() and skip the second update.
std::vector<Tensor> checkpoint(const Segment& segment, const std::vector<Tensor>& inputs,
                               const CheckpointOptions& options = {});

/// One tensor in, one out: the form a transformer block or a residual block takes.
Tensor checkpoint(const std::function<Tensor(const Tensor&)>& segment, const Tensor& input,
                  const CheckpointOptions& options = {});

/// True on this thread while a checkpointed segment is being recomputed in backward (fairscale's
/// is_recomputing): a forward's side effects were already made by the first run.
bool is_recomputing();

}  // namespace colossal::autograd
