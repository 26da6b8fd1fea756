// GradientStatistics: see gradient_statistics.h.
#include "colossal/parallel/gradient_statistics.h"

#include <algorithm>
#include <cmath>

#include "colossal/autograd/grad_mode.h"  // NoGradGuard
#include "colossal/core/error.h"
#include "colossal/ops/elementwise.h"  // pow, sqrt
#include "colossal/optim/clip_grad.h"  // total_grad_norm, sum_of_squares, scale_grads_to_norm

namespace colossal::parallel {

GradientStatistics::GradientStatistics(const ParallelContext& context, bool data_gradients_replicated) {
  const ParallelLayout& layout = context.layout();
  if (layout.tensor_size() > 1) {
    tensor_group_ = context.group(GroupKind::kTensor);
    groups_.push_back(tensor_group_);
  }
  if (layout.pipeline_size() > 1) groups_.push_back(context.group(GroupKind::kPipeline));
  if (layout.data_size() > 1 && !data_gradients_replicated) groups_.push_back(context.group(GroupKind::kData));
}

void GradientStatistics::set_replicated_over_tensor(std::vector<Tensor> tensors) {
  replicated_.clear();
  for (const Tensor& t : tensors) replicated_.push_back(t.impl());
  std::sort(replicated_.begin(), replicated_.end());
}

void GradientStatistics::set_counted_elsewhere(std::vector<Tensor> tensors) {
  elsewhere_.clear();
  for (const Tensor& t : tensors) elsewhere_.push_back(t.impl());
  std::sort(elsewhere_.begin(), elsewhere_.end());
}

bool GradientStatistics::any_found_inf(bool local_found_inf) const {
  if (groups_.empty()) return local_found_inf;
  bool found = local_found_inf;
  for (const auto& group : groups_) {
    Tensor flag = core::from_vector<int32_t>({found ? 1 : 0}, {1}).to(group->device());
    group->all_reduce(flag, comm::ReduceOp::max);
    found = flag.to(core::kCpu).item<int32_t>() != 0;
  }
  return found;
}

Tensor GradientStatistics::grad_norm(const std::vector<Tensor>& params, double norm_type,
                                     const Tensor& local_sum_of_squares) const {
  autograd::NoGradGuard no_grad;
  const bool inf_norm = std::isinf(norm_type);
  const bool skip_replicated = tensor_group_ != nullptr && tensor_group_->rank() != 0 && !replicated_.empty();
  // A precomputed sum counts every tensor; a tensor rank other than 0 must leave the replicated out.
  const bool reuse = local_sum_of_squares.defined() && norm_type == 2.0 && !skip_replicated && elsewhere_.empty();
  if (groups_.empty()) return reuse ? ops::sqrt(local_sum_of_squares) : optim::total_grad_norm(params, norm_type);
  // Each rank's share as sum |g|^p (or max |g|), reduced over every group, then the p-th root. A
  // tensor every rank of the tensor group holds whole counts on tensor rank 0 only.
  Tensor partial;
  if (reuse) {
    partial = local_sum_of_squares;
  } else {
    std::vector<Tensor> counted;
    counted.reserve(params.size());
    for (const Tensor& p : params) {
      if (skip_replicated && std::binary_search(replicated_.begin(), replicated_.end(), p.impl())) continue;
      if (std::binary_search(elsewhere_.begin(), elsewhere_.end(), p.impl())) continue;
      counted.push_back(p);
    }
    if (norm_type == 2.0) {
      std::vector<Tensor> grads;
      for (const Tensor& p : counted) {
        if (Tensor g = p.grad(); g.defined()) grads.push_back(g);
      }
      partial = optim::sum_of_squares(grads);  // one pass (Note [Clipping in one pass])
    } else {
      const Tensor local = optim::total_grad_norm(counted, norm_type);
      partial = inf_norm ? local : ops::pow(local, norm_type);
    }
  }
  const Device device =
      !params.empty() && params.front().grad().defined() ? params.front().grad().device() : partial.device();
  for (const auto& group : groups_) {
    if (partial.device() != group->device()) partial = partial.to(group->device());
    partial = partial.contiguous().clone();
    group->all_reduce(partial, inf_norm ? comm::ReduceOp::max : comm::ReduceOp::sum);
  }
  Tensor total = inf_norm ? partial : norm_type == 2.0 ? ops::sqrt(partial) : ops::pow(partial, 1.0 / norm_type);
  if (total.device() != device) total = total.to(device);
  return total;
}

Tensor GradientStatistics::clip_grad_norm(const std::vector<Tensor>& params, double max_norm, double norm_type) const {
  const Tensor total = grad_norm(params, norm_type);
  optim::scale_grads_to_norm(params, max_norm, total);
  return total;
}

}  // namespace colossal::parallel
