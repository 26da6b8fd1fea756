// Lars's validation, step and reference update.
#include "colossal/optim/lars.h"

#include <cmath>

#include "colossal/autograd/grad_mode.h"  // NoGradGuard
#include "colossal/ops/elementwise.h"     // add, add_, clamp, mul, mul_
#include "colossal/optim/clip_grad.h"     // vector_norm
#include "colossal/optim/trust_ratio.h"   // guarded_ratio

namespace colossal::optim {

constinit core::DispatchStub<LarsStepKernel> lars_step_stub("lars_step");

std::map<std::string, double> LarsOptions::to_map() const {
  return {{"lr", lr},
          {"momentum", momentum},
          {"eta", eta},
          {"weight_decay", weight_decay},
          {"eps", eps},
          {"trust_clip", trust_clip},
          {"grad_clip", grad_clip},
          {"adaptation", adaptation ? 1.0 : 0.0}};
}

LarsOptions LarsOptions::from_group(const ParamGroup& group) {
  return {.lr = group.get("lr"),
          .momentum = group.get("momentum"),
          .eta = group.get("eta"),
          .weight_decay = group.get("weight_decay"),
          .eps = group.get("eps"),
          .trust_clip = group.get("trust_clip"),
          .grad_clip = group.get("grad_clip"),
          .adaptation = group.get("adaptation") != 0.0};
}

Lars::Lars(std::vector<ParamGroup> groups, LarsOptions defaults)
    : Optimizer("LARS", std::move(groups), defaults.to_map()) {
  validate_all_groups();
}

Lars::Lars(std::vector<Tensor> params, LarsOptions defaults) : Lars(single_group(std::move(params)), defaults) {}

void Lars::validate_group(const ParamGroup& group, size_t g) const {
  auto finite_non_negative = [](double v) { return v >= 0.0 && std::isfinite(v); };
  checked_option(group, g, "lr", finite_non_negative, "a finite number >= 0");
  checked_option(group, g, "momentum", finite_non_negative, "a finite number >= 0");
  checked_option(
      group, g, "eta", [](double v) { return v > 0.0 && v <= 1.0; }, "in (0, 1]");
  checked_option(group, g, "weight_decay", finite_non_negative, "a finite number >= 0");
  checked_option(group, g, "eps", finite_non_negative, "a finite number >= 0");
  checked_option(
      group, g, "trust_clip", [](double v) { return v > 0.0 && std::isfinite(v); }, "a finite number > 0");
  checked_option(
      group, g, "grad_clip", [](double v) { return v > 0.0; }, "> 0 (infinity turns it off)");
  checked_option(
      group, g, "adaptation", [](double v) { return v == 0.0 || v == 1.0; }, "0 (false) or 1 (true)");
}

void Lars::update_parameters() {
  autograd::NoGradGuard no_grad;
  validate_all_groups();
  apply_grad_scale_in_place();  // clipping's factor (scale_gradients_in_next_step)
  for (size_t g = 0; g < param_groups().size(); ++g) {
    const LarsOptions options = LarsOptions::from_group(param_groups()[g]);
    std::vector<std::string> buffers;
    if (options.momentum != 0.0) buffers.push_back("momentum_buffer");
    for (const MultiTensorLists& lists : gather_for_update(g, buffers)) {
      run_multi_tensor(lars_step_stub, &lars_step_reference, lists, options);
    }
  }
}

void lars_step_reference(const MultiTensorLists& lists, const LarsOptions& o) {
  for (size_t i = 0; i < lists.params.size(); ++i) {
    Tensor p = lists.params[i];
    Tensor d = lists.grads[i];
    Tensor trust;
    if (o.adaptation) {
      const Tensor weight_norm = vector_norm(p);
      const Tensor grad_norm = vector_norm(d);
      const Tensor denominator = ops::add(ops::add(grad_norm, weight_norm, o.weight_decay), o.eps);
      trust = ops::clamp(guarded_ratio(ops::mul(weight_norm, o.eta), denominator, weight_norm, grad_norm), 0.0,
                         o.trust_clip);
      if (o.weight_decay != 0.0) d = ops::add(d, p, o.weight_decay);
    }
    if (std::isfinite(o.grad_clip)) d = ops::clamp(d, -o.grad_clip, o.grad_clip);
    if (o.momentum != 0.0) {
      Tensor buffer = lists.state[0][i];
      if (lists.buffers_created[i]) {
        buffer.copy_(d);
      } else {
        ops::mul_(buffer, o.momentum);
        ops::add_(buffer, d);
      }
      d = buffer;
    }
    if (trust.defined()) d = ops::mul(d, trust);
    ops::add_(p, d, -o.lr);
  }
}

}  // namespace colossal::optim
