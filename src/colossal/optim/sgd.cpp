// Sgd's validation, step and reference update.
#include "colossal/optim/sgd.h"

#include <cmath>

#include "colossal/autograd/grad_mode.h"  // NoGradGuard
#include "colossal/ops/elementwise.h"     // add, add_, mul_

namespace colossal::optim {

constinit core::DispatchStub<SgdStepKernel> sgd_step_stub("sgd_step");

std::map<std::string, double> SgdOptions::to_map() const {
  return {{"lr", lr},
          {"momentum", momentum},
          {"dampening", dampening},
          {"weight_decay", weight_decay},
          {"nesterov", nesterov ? 1.0 : 0.0}};
}

SgdOptions SgdOptions::from_group(const ParamGroup& group) {
  return {.lr = group.get("lr"),
          .momentum = group.get("momentum"),
          .dampening = group.get("dampening"),
          .weight_decay = group.get("weight_decay"),
          .nesterov = group.get("nesterov") != 0.0};
}

Sgd::Sgd(std::vector<ParamGroup> groups, SgdOptions defaults) : Optimizer("SGD", std::move(groups), defaults.to_map()) {
  validate_all_groups();
}

Sgd::Sgd(std::vector<Tensor> params, SgdOptions defaults) : Sgd(single_group(std::move(params)), defaults) {}

void Sgd::validate_group(const ParamGroup& group, size_t g) const {
  checked_option(
      group, g, "lr", [](double v) { return v >= 0.0 && std::isfinite(v); }, "a finite number >= 0");
  const double momentum = checked_option(
      group, g, "momentum", [](double v) { return v >= 0.0 && std::isfinite(v); }, "a finite number >= 0");
  const double dampening = checked_option(
      group, g, "dampening", [](double v) { return std::isfinite(v); }, "a finite number");
  checked_option(
      group, g, "weight_decay", [](double v) { return v >= 0.0 && std::isfinite(v); }, "a finite number >= 0");
  const double nesterov = checked_option(
      group, g, "nesterov", [](double v) { return v == 0.0 || v == 1.0; }, "0 (false) or 1 (true)");
  COLOSSAL_CHECK(nesterov == 0.0 || (momentum > 0.0 && dampening == 0.0),
                 "{}nesterov needs momentum > 0 and dampening == 0, got momentum {} and dampening {}", group_context(g),
                 momentum, dampening);
}

void Sgd::update_parameters() {
  autograd::NoGradGuard no_grad;
  validate_all_groups();
  apply_grad_scale_in_place();  // clipping's factor (scale_gradients_in_next_step)
  for (size_t g = 0; g < param_groups().size(); ++g) {
    const SgdOptions options = SgdOptions::from_group(param_groups()[g]);
    std::vector<std::string> buffers;
    if (options.momentum != 0.0) buffers.push_back("momentum_buffer");
    for (const MultiTensorLists& lists : gather_for_update(g, buffers)) {
      run_multi_tensor(sgd_step_stub, &sgd_step_reference, lists, options);
    }
  }
}

void sgd_step_reference(const MultiTensorLists& lists, const SgdOptions& o) {
  for (size_t i = 0; i < lists.params.size(); ++i) {
    Tensor p = lists.params[i];
    Tensor d_p = lists.grads[i];
    if (o.weight_decay != 0.0) d_p = ops::add(d_p, p, o.weight_decay);
    if (o.momentum != 0.0) {
      Tensor buffer = lists.state[0][i];
      if (lists.buffers_created[i]) {
        buffer.copy_(d_p);
      } else {
        ops::mul_(buffer, o.momentum);
        ops::add_(buffer, d_p, 1.0 - o.dampening);
      }
      d_p = o.nesterov ? ops::add(d_p, buffer, o.momentum) : buffer;
    }
    ops::add_(p, d_p, -o.lr);
  }
}

}  // namespace colossal::optim
