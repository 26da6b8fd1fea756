// GradientStatistics: see gradient_statistics.h.
#include "colossal/parallel/gradient_statistics.h"

#include <algorithm>
#include <cmath>

#include "colossal/autograd/grad_mode.h"  // NoGradGuard
#include "colossal/core/error.h"
#include "colossal/ops/elementwise.h"  // pow
#include "colossal/optim/clip_grad.h"  // total_grad_norm, scale_grads_to_norm

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

Tensor GradientStatistics::clip_grad_norm(const std::vector<Tensor>& params, double max_norm, double norm_type) const {
  if (groups_.empty()) return optim::clip_grad_norm_on_device(params, max_norm, norm_type);
  autograd::NoGradGuard no_grad;
  const bool inf_norm = std::isinf(norm_type);
  // Each rank's share as sum |g|^p (or max |g|), reduced over every group, then the p-th root. A
  // tensor every rank of the tensor group holds whole counts on tensor rank 0 only.
  std::vector<Tensor> counted;
  counted.reserve(params.size());
  const bool skip_replicated = tensor_group_ != nullptr && tensor_group_->rank() != 0 && !replicated_.empty();
  for (const Tensor& p : params) {
    if (skip_replicated && std::binary_search(replicated_.begin(), replicated_.end(), p.impl())) continue;
    counted.push_back(p);
  }
  Tensor local = optim::total_grad_norm(counted, norm_type);
  if (!params.empty() && params.front().grad().defined() && local.device() != params.front().grad().device()) {
    local = local.to(params.front().grad().device());  // nothing counted here: a CPU zero
  }
  Tensor partial = inf_norm ? local : ops::pow(local, norm_type);
  for (const auto& group : groups_) {
    if (partial.device() != group->device()) partial = partial.to(group->device());
    partial = partial.contiguous().clone();
    group->all_reduce(partial, inf_norm ? comm::ReduceOp::max : comm::ReduceOp::sum);
  }
  Tensor total = inf_norm ? partial : ops::pow(partial, 1.0 / norm_type);
  if (!params.empty() && params.front().grad().defined() && total.device() != params.front().grad().device()) {
    total = total.to(params.front().grad().device());
  }
  optim::scale_grads_to_norm(params, max_norm, total);
  return total;
}

}  // namespace colossal::parallel
