// Adam and AdamW: validation, step, and the reference update shared by both.
#include "colossal/optim/adam.h"

#include <cmath>

#include "colossal/autograd/grad_mode.h"  // NoGradGuard
#include "colossal/core/view.h"           // cast_raw
#include "colossal/ops/elementwise.h"     // add, add_, addcmul_, addcdiv_, div, maximum, mul_, sqrt
#include "colossal/optim/clip_grad.h"     // scale_for

namespace colossal::optim {

constinit core::DispatchStub<AdamStepKernel> adam_step_stub("adam_step");

std::map<std::string, double> AdamOptions::to_map() const {
  return {{"lr", lr},
          {"beta1", beta1},
          {"beta2", beta2},
          {"eps", eps},
          {"weight_decay", weight_decay},
          {"amsgrad", amsgrad ? 1.0 : 0.0}};
}

AdamOptions AdamOptions::from_group(const ParamGroup& group) {
  return {.lr = group.get("lr"),
          .beta1 = group.get("beta1"),
          .beta2 = group.get("beta2"),
          .eps = group.get("eps"),
          .weight_decay = group.get("weight_decay"),
          .amsgrad = group.get("amsgrad") != 0.0};
}

Adam::Adam(std::string name, WeightDecayMode mode, std::vector<ParamGroup> groups, AdamOptions defaults)
    : Optimizer(std::move(name), std::move(groups), defaults.to_map()), mode_(mode) {
  validate_all_groups();
}

Adam::Adam(std::vector<ParamGroup> groups, AdamOptions defaults)
    : Adam("Adam", WeightDecayMode::l2, std::move(groups), defaults) {}

Adam::Adam(std::vector<Tensor> params, AdamOptions defaults) : Adam(single_group(std::move(params)), defaults) {}

AdamW::AdamW(std::vector<ParamGroup> groups, AdamOptions defaults)
    : Adam("AdamW", WeightDecayMode::decoupled, std::move(groups), defaults) {}

AdamW::AdamW(std::vector<Tensor> params, AdamOptions defaults) : AdamW(single_group(std::move(params)), defaults) {}

void Adam::validate_group(const ParamGroup& group, size_t g) const {
  auto finite_non_negative = [](double v) { return v >= 0.0 && std::isfinite(v); };
  auto unit_interval = [](double v) { return v >= 0.0 && v < 1.0; };
  checked_option(group, g, "lr", finite_non_negative, "a finite number >= 0");
  checked_option(group, g, "beta1", unit_interval, "in [0, 1)");
  checked_option(group, g, "beta2", unit_interval, "in [0, 1)");
  checked_option(group, g, "eps", finite_non_negative, "a finite number >= 0");
  checked_option(group, g, "weight_decay", finite_non_negative, "a finite number >= 0");
  checked_option(
      group, g, "amsgrad", [](double v) { return v == 0.0 || v == 1.0; }, "0 (false) or 1 (true)");
}

void Adam::update_parameters() {
  autograd::NoGradGuard no_grad;
  validate_all_groups();
  for (size_t g = 0; g < param_groups().size(); ++g) {
    const AdamOptions options = AdamOptions::from_group(param_groups()[g]);
    std::vector<std::string> buffers{"exp_avg", "exp_avg_sq"};
    if (options.amsgrad) buffers.push_back("max_exp_avg_sq");
    for (const MultiTensorLists& lists : gather_for_update(g, buffers)) {
      run_multi_tensor(adam_step_stub, &adam_step_reference, lists, options, mode_);
    }
  }
  take_grad_scale();  // the lists carried it into the update (MultiTensorLists::grad_scale)
}

void adam_step_reference(const MultiTensorLists& lists, const AdamOptions& o, WeightDecayMode mode) {
  const Tensor unscale = lists.grad_unscale != 1.0
                             ? core::full({}, lists.grad_unscale, TensorOptions(DType::f64, lists.device))
                             : Tensor();
  for (size_t i = 0; i < lists.params.size(); ++i) {
    Tensor p = lists.params[i];
    Tensor grad = lists.grads[i];
    // A bf16 / f16 gradient of an f32 master is read as f32 (exact), as amp's copy into an f32
    // gradient would have made it (Note [Fused mixed-precision step]).
    if (core::is_reduced_float(grad.dtype()) && p.dtype() == DType::f32) grad = core::cast_raw(grad, DType::f32);
    const DType grad_dtype = grad.dtype();
    for (const Tensor& scale : {unscale, lists.grad_scale}) {
      if (!scale.defined()) continue;
      // In the accumulation type, rounded once to the gradient's dtype (a 16-bit gradient times an
      // f32 scale promotes to f32), as the fused kernel does.
      grad = ops::mul(grad, scale_for(scale, grad_dtype));
      if (grad.dtype() != grad_dtype) grad = core::cast_raw(grad, grad_dtype);
    }
    Tensor exp_avg = lists.state[0][i];
    Tensor exp_avg_sq = lists.state[1][i];
    if (o.weight_decay != 0.0) {
      if (mode == WeightDecayMode::decoupled) {
        ops::mul_(p, 1.0 - o.lr * o.weight_decay);
      } else {
        grad = ops::add(grad, p, o.weight_decay);
      }
    }
    ops::mul_(exp_avg, o.beta1);
    ops::add_(exp_avg, grad, 1.0 - o.beta1);
    ops::mul_(exp_avg_sq, o.beta2);
    ops::addcmul_(exp_avg_sq, grad, grad, 1.0 - o.beta2);

    const auto step = static_cast<double>(lists.steps[i]);
    const double bias_correction1 = 1.0 - std::pow(o.beta1, step);
    const double bias_correction2 = 1.0 - std::pow(o.beta2, step);
    Tensor second_moment = exp_avg_sq;
    if (o.amsgrad) {
      Tensor max_exp_avg_sq = lists.state[2][i];
      max_exp_avg_sq.copy_(ops::maximum(max_exp_avg_sq, exp_avg_sq));
      second_moment = max_exp_avg_sq;
    }
    const Tensor denom = ops::add(ops::div(ops::sqrt(second_moment), std::sqrt(bias_correction2)), o.eps);
    ops::addcdiv_(p, exp_avg, denom, -o.lr / bias_correction1);
    if (i < lists.write_through.size() && lists.write_through[i].defined()) lists.write_through[i].copy_(p);
  }
}

}  // namespace colossal::optim
