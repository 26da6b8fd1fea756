// GradientStatistics: the one place that decides over which process groups a statistic of the
// gradients is reduced — the overflow (inf/NaN) flag of mixed precision and the norm that clipping
// divides by. The rule: exactly the groups whose ranks hold *different* gradients once the gradient
// handler has finished. A tensor-parallel group holds different shards of one layer, a pipeline
// group different layers; a data-parallel group does so only when its handler leaves shards (ZeRO),
// not after DDP's all-reduce, whose ranks hold equal gradients. With no such group (serial, or data
// parallel alone today) nothing is communicated and the local value is the global one.
#pragma once

#include <memory>
#include <vector>

#include "colossal/comm/process_group.h"
#include "colossal/core/tensor.h"
#include "colossal/parallel/parallel_context.h"

namespace colossal::parallel {

class GradientStatistics {
 public:
  /// `data_gradients_replicated`: whether the data group's ranks hold equal gradients after the
  /// gradient handler's finish() (GradientHandler::replicates_gradients; true without a handler).
  GradientStatistics(const ParallelContext& context, bool data_gradients_replicated);

  /// Tensors (parameters, or their fp32 masters under mixed precision) that every rank of the tensor
  /// group holds whole (layer norms, the row-parallel biases): the norm counts them once, on tensor
  /// rank 0, instead of once per rank. The rest are shards, each counted where it lives.
  void set_replicated_over_tensor(std::vector<Tensor> tensors);

  /// Tensors this rank holds a copy of that another rank counts in the norm (a pipeline's tied
  /// weight on every stage but the first that holds it: Note [Tied parameters across stages]).
  void set_counted_elsewhere(std::vector<Tensor> tensors);

  /// The groups reduced over, in a fixed order (tensor, pipeline, data) that every rank shares.
  const std::vector<std::shared_ptr<comm::ProcessGroup>>& groups() const { return groups_; }

  /// Whether any rank of the groups found an inf or NaN (a max over each group; the local flag when
  /// there are none). Every rank of the groups must call it together.
  bool any_found_inf(bool local_found_inf) const;

  /// The p-norm of the gradients of `params` over all ranks of the groups (each rank's share summed
  /// as sum |g|^p, or maxed for the infinity norm), as a 0-d f64 tensor on the gradients' device.
  /// No host sync. `local_sum_of_squares`, when given (p = 2 only), is this rank's sum of squares
  /// of those gradients already computed (mixed precision's overflow check has it), saving the pass.
  Tensor grad_norm(const std::vector<Tensor>& params, double norm_type, const Tensor& local_sum_of_squares = {}) const;

  /// grad_norm, with the gradients clipped to max_norm by it as optim::clip_grad_norm_on_device does.
  Tensor clip_grad_norm(const std::vector<Tensor>& params, double max_norm, double norm_type) const;

 private:
  std::vector<std::shared_ptr<comm::ProcessGroup>> groups_;
  std::shared_ptr<comm::ProcessGroup> tensor_group_;  // null when the tensor group is not reduced over
  std::vector<const core::TensorImpl*> replicated_;   // sorted, for lookup
  std::vector<const core::TensorImpl*> elsewhere_;    // sorted, for lookup
};

}  // namespace colossal::parallel
