// Lamb's validation, step and reference update.
#include "colossal/optim/lamb.h"

#include <cmath>

#include "colossal/autograd/grad_mode.h"  // NoGradGuard
#include "colossal/ops/elementwise.h"     // add, add_, addcmul_, clamp, div, mul, mul_, sqrt
#include "colossal/optim/clip_grad.h"     // vector_norm
#include "colossal/optim/trust_ratio.h"   // guarded_ratio

namespace colossal::optim {

constinit core::DispatchStub<LambStepKernel> lamb_step_stub("lamb_step");

std::map<std::string, double> LambOptions::to_map() const {
  return {{"lr", lr},
          {"beta1", beta1},
          {"beta2", beta2},
          {"eps", eps},
          {"weight_decay", weight_decay},
          {"bias_correction", bias_correction ? 1.0 : 0.0},
          {"use_trust_ratio", use_trust_ratio ? 1.0 : 0.0},
          {"trust_clip", trust_clip}};
}

LambOptions LambOptions::from_group(const ParamGroup& group) {
  return {.lr = group.get("lr"),
          .beta1 = group.get("beta1"),
          .beta2 = group.get("beta2"),
          .eps = group.get("eps"),
          .weight_decay = group.get("weight_decay"),
          .bias_correction = group.get("bias_correction") != 0.0,
          .use_trust_ratio = group.get("use_trust_ratio") != 0.0,
          .trust_clip = group.get("trust_clip")};
}

Lamb::Lamb(std::vector<ParamGroup> groups, LambOptions defaults)
    : Optimizer("LAMB", std::move(groups), defaults.to_map()) {
  validate_all_groups();
}

Lamb::Lamb(std::vector<Tensor> params, LambOptions defaults) : Lamb(single_group(std::move(params)), defaults) {}

void Lamb::validate_group(const ParamGroup& group, size_t g) const {
  auto finite_non_negative = [](double v) { return v >= 0.0 && std::isfinite(v); };
  auto unit_interval = [](double v) { return v >= 0.0 && v < 1.0; };
  auto flag = [](double v) { return v == 0.0 || v == 1.0; };
  checked_option(group, g, "lr", finite_non_negative, "a finite number >= 0");
  checked_option(group, g, "beta1", unit_interval, "in [0, 1)");
  checked_option(group, g, "beta2", unit_interval, "in [0, 1)");
  checked_option(group, g, "eps", finite_non_negative, "a finite number >= 0");
  checked_option(group, g, "weight_decay", finite_non_negative, "a finite number >= 0");
  checked_option(group, g, "bias_correction", flag, "0 (false) or 1 (true)");
  checked_option(group, g, "use_trust_ratio", flag, "0 (false) or 1 (true)");
  checked_option(
      group, g, "trust_clip", [](double v) { return v > 0.0; }, "> 0 (infinity turns it off)");
}

void Lamb::update_parameters() {
  autograd::NoGradGuard no_grad;
  validate_all_groups();
  apply_grad_scale_in_place();  // clipping's factor (scale_gradients_in_next_step)
  for (size_t g = 0; g < param_groups().size(); ++g) {
    const LambOptions options = LambOptions::from_group(param_groups()[g]);
    for (const MultiTensorLists& lists : gather_for_update(g, {"exp_avg", "exp_avg_sq"})) {
      run_multi_tensor(lamb_step_stub, &lamb_step_reference, lists, options);
    }
  }
}

void lamb_step_reference(const MultiTensorLists& lists, const LambOptions& o) {
  for (size_t i = 0; i < lists.params.size(); ++i) {
    Tensor p = lists.params[i];
    const Tensor& grad = lists.grads[i];
    Tensor exp_avg = lists.state[0][i];
    Tensor exp_avg_sq = lists.state[1][i];
    ops::mul_(exp_avg, o.beta1);
    ops::add_(exp_avg, grad, 1.0 - o.beta1);
    ops::mul_(exp_avg_sq, o.beta2);
    ops::addcmul_(exp_avg_sq, grad, grad, 1.0 - o.beta2);

    const auto step = static_cast<double>(lists.steps[i]);
    const double bias_correction1 = o.bias_correction ? 1.0 - std::pow(o.beta1, step) : 1.0;
    const double bias_correction2 = o.bias_correction ? 1.0 - std::pow(o.beta2, step) : 1.0;
    const Tensor denom = ops::add(ops::div(ops::sqrt(exp_avg_sq), std::sqrt(bias_correction2)), o.eps);
    Tensor update = ops::div(ops::div(exp_avg, bias_correction1), denom);
    if (o.weight_decay != 0.0) ops::add_(update, p, o.weight_decay);
    if (o.use_trust_ratio) {
      const Tensor weight_norm = vector_norm(p);
      const Tensor update_norm = vector_norm(update);
      Tensor trust = guarded_ratio(weight_norm, update_norm, weight_norm, update_norm);
      if (std::isfinite(o.trust_clip)) trust = ops::clamp(trust, 0.0, o.trust_clip);
      update = ops::mul(update, trust);
    }
    ops::add_(p, update, -o.lr);
  }
}

}  // namespace colossal::optim
