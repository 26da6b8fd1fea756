// Sgd: stochastic gradient descent with momentum, dampening, Nesterov momentum and coupled (L2)
// weight decay, step for step the update of torch.optim.SGD.
#pragma once

#include <map>
#include <string>
#include <vector>

#include "colossal/core/dispatch.h"
#include "colossal/optim/optimizer.h"

namespace colossal::optim {

/// The hyper-parameters of Sgd; each is also an option key of a ParamGroup (nesterov as 0 / 1).
struct SgdOptions {
  double lr = 1e-3;           ///< learning rate, >= 0
  double momentum = 0.0;      ///< momentum factor, >= 0 (0 turns momentum off)
  double dampening = 0.0;     ///< scales the gradient added to the momentum buffer by (1 - dampening)
  double weight_decay = 0.0;  ///< L2 penalty added to the gradient: g + weight_decay * p, >= 0
  bool nesterov = false;      ///< Nesterov momentum; needs momentum > 0 and dampening == 0

  std::map<std::string, double> to_map() const;
  static SgdOptions from_group(const ParamGroup& group);
};

/// One update of `lists` (state[0]: "momentum_buffer", present when momentum != 0).
using SgdStepKernel = void(const MultiTensorLists& lists, const SgdOptions& options);
/// Backends register a multi-tensor kernel here (see Note [Multi-tensor optimizer kernels]).
extern core::DispatchStub<SgdStepKernel> sgd_step_stub;
/// The per-tensor loop over in-place ops used where no kernel is registered.
void sgd_step_reference(const MultiTensorLists& lists, const SgdOptions& options);

/// For each parameter with gradient g (torch.optim.SGD):
///   g <- g + weight_decay * p
///   b <- g on the first step, else momentum * b + (1 - dampening) * g     (when momentum != 0)
///   g <- g + momentum * b if nesterov, else b                              (when momentum != 0)
///   p <- p - lr * g
class Sgd : public Optimizer {
 public:
  explicit Sgd(std::vector<ParamGroup> groups, SgdOptions defaults = {});
  explicit Sgd(std::vector<Tensor> params, SgdOptions defaults = {});

 protected:
  void update_parameters() override;
  void validate_group(const ParamGroup& group, size_t group_index) const override;
};

}  // namespace colossal::optim
