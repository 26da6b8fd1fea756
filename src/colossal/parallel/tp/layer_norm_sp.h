// The layer norm of Megatron's sequence parallelism: each rank of the tensor-parallel group
// normalises its shard of the sequence [..., T/tp, C] with the replicated weight and bias, and since
// each rank's rows are different, the parameters' gradients are the sum of every rank's (Megatron
// all-reduces them over the tensor group after backward, for parameters marked sequence_parallel).
// Here the parameters enter the op through copy_to_region, whose backward is that all-reduce, so the
// gradient every rank holds after backward is already the whole one, equal on every rank, with
// gradient accumulation and no hook; with a group of one rank it is nn::LayerNorm.
#pragma once

#include <cstdint>
#include <memory>

#include "colossal/comm/process_group.h"
#include "colossal/nn/layer_norm.h"

namespace colossal::parallel::tp {

class SequenceParallelLayerNorm : public nn::LayerNorm {
 public:
  /// A copy of `serial` (its own parameters, the same values, dtype and eps) over `group`.
  SequenceParallelLayerNorm(const nn::LayerNorm& serial, std::shared_ptr<comm::ProcessGroup> group);
  /// x: this rank's sequence shard [..., T/tp, C] -> the same shape.
  Tensor forward(const Tensor& x) override;

 private:
  std::shared_ptr<comm::ProcessGroup> group_;
};

}  // namespace colossal::parallel::tp
