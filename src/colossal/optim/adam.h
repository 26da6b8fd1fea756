// Adam (L2 weight decay added to the gradient) and AdamW (decoupled weight decay), with bias
// correction and optional AMSGrad, step for step the updates of torch.optim.Adam and torch.optim.AdamW.
#pragma once

#include <map>
#include <string>
#include <vector>

#include "colossal/core/dispatch.h"
#include "colossal/optim/optimizer.h"

namespace colossal::optim {

/// The hyper-parameters of Adam and AdamW; each is also an option key of a ParamGroup.
struct AdamOptions {
  double lr = 1e-3;           ///< learning rate, >= 0
  double beta1 = 0.9;         ///< decay of the first-moment average, in [0, 1)
  double beta2 = 0.999;       ///< decay of the second-moment average, in [0, 1)
  double eps = 1e-8;          ///< added to the denominator, >= 0
  double weight_decay = 0.0;  ///< Adam: L2 penalty on the gradient; AdamW: decoupled decay rate; >= 0
  bool amsgrad = false;       ///< divide by the running maximum of the second moment (AMSGrad)

  std::map<std::string, double> to_map() const;
  static AdamOptions from_group(const ParamGroup& group);
};

/// How weight decay enters: added to the gradient (Adam) or applied to the weights (AdamW).
enum class WeightDecayMode { l2, decoupled };

/// One update of `lists` (state: "exp_avg", "exp_avg_sq" and, with amsgrad, "max_exp_avg_sq").
using AdamStepKernel = void(const MultiTensorLists& lists, const AdamOptions& options, WeightDecayMode mode);
/// Backends register a multi-tensor kernel here (see Note [Multi-tensor optimizer kernels]).
extern core::DispatchStub<AdamStepKernel> adam_step_stub;
/// The per-tensor loop over in-place ops used where no kernel is registered. A gradient narrower
/// than its parameter (bf16 or f16 for f32) is converted to the parameter's dtype first (exactly);
/// lists.grad_unscale, then lists.grad_scale multiply it; lists.write_through[i], where defined,
/// receives the updated parameter (copy_, round to nearest even).
void adam_step_reference(const MultiTensorLists& lists, const AdamOptions& options, WeightDecayMode mode);

/// For each parameter with gradient g, at step t (counted per parameter, from 1):
///   g <- g + weight_decay * p                       (Adam only)
///   p <- p * (1 - lr * weight_decay)                (AdamW only, before the moments are used)
///   m <- beta1 m + (1 - beta1) g;   v <- beta2 v + (1 - beta2) g^2
///   v_max <- max(v_max, v), used in place of v        (amsgrad)
///   p <- p - lr / (1 - beta1^t) * m / (sqrt(v) / sqrt(1 - beta2^t) + eps)
class Adam : public Optimizer {
 public:
  explicit Adam(std::vector<ParamGroup> groups, AdamOptions defaults = {});
  explicit Adam(std::vector<Tensor> params, AdamOptions defaults = {});
  /// A 16-bit gradient of an f32 parameter, the unscale and the write-through, all in the one
  /// update pass (Note [Fused mixed-precision step] in amp/mixed_precision_optimizer.cpp).
  bool supports_mixed_precision_step() const override { return true; }

 protected:
  void update_parameters() override;
  Adam(std::string name, WeightDecayMode mode, std::vector<ParamGroup> groups, AdamOptions defaults);
  void validate_group(const ParamGroup& group, size_t group_index) const override;

 private:
  WeightDecayMode mode_;
};

/// AdamW's defaults: torch.optim.AdamW's weight_decay of 0.01.
inline AdamOptions adamw_defaults() {
  AdamOptions options;
  options.weight_decay = 1e-2;
  return options;
}

class AdamW : public Adam {
 public:
  explicit AdamW(std::vector<ParamGroup> groups, AdamOptions defaults = adamw_defaults());
  explicit AdamW(std::vector<Tensor> params, AdamOptions defaults = adamw_defaults());
};

}  // namespace colossal::optim
