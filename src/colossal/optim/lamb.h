// Lamb: layer-wise adaptive moments (You et al., "Large Batch Optimization for Deep Learning:
// Training BERT in 76 minutes") - Adam's direction plus weight decay, rescaled per tensor by the
// trust ratio ||p|| / ||update||, as Colossal-AI's Lamb computes it (apex's FusedLAMB differs in
// where it applies the ratio; see Lamb below).
#pragma once

#include <limits>
#include <map>
#include <string>
#include <vector>

#include "colossal/core/dispatch.h"
#include "colossal/optim/optimizer.h"

namespace colossal::optim {

/// The hyper-parameters of Lamb; each is also an option key of a ParamGroup (booleans as 0 / 1).
struct LambOptions {
  double lr = 1e-3;           ///< learning rate, >= 0
  double beta1 = 0.9;         ///< decay of the first-moment average, in [0, 1)
  double beta2 = 0.999;       ///< decay of the second-moment average, in [0, 1)
  double eps = 1e-6;          ///< added to the denominator, >= 0 (Colossal-AI's default)
  double weight_decay = 0.0;  ///< decoupled: added to the update as weight_decay * p, >= 0
  /// Divide the moments by (1 - beta^t) (the paper's Algorithm 2, apex FusedLamb). Off gives
  /// Colossal-AI's colossalai.nn.optimizer.Lamb exactly, which follows the paper's v3 without it.
  bool bias_correction = true;
  /// Off forces the trust ratio to 1 (Colossal-AI's adam=True), leaving Adam with decoupled decay.
  bool use_trust_ratio = true;
  /// The trust ratio is clamped to [0, trust_clip]; > 0. Infinity, the default, leaves it unclamped
  /// as Colossal-AI's Lamb does; timm's Lamb(trust_clip=True) is 1.
  double trust_clip = std::numeric_limits<double>::infinity();

  std::map<std::string, double> to_map() const;
  static LambOptions from_group(const ParamGroup& group);
};

/// One update of `lists` (state: "exp_avg", "exp_avg_sq").
using LambStepKernel = void(const MultiTensorLists& lists, const LambOptions& options);
/// Backends register a multi-tensor kernel here (see Note [Multi-tensor optimizer kernels]).
extern core::DispatchStub<LambStepKernel> lamb_step_stub;
/// The per-tensor loop over in-place ops used where no kernel is registered.
void lamb_step_reference(const MultiTensorLists& lists, const LambOptions& options);

/// For each parameter with gradient g, at step t (per parameter, from 1):
///   m <- beta1 m + (1 - beta1) g;   v <- beta2 v + (1 - beta2) g^2
///   m_hat = m / (1 - beta1^t);  v_hat = v / (1 - beta2^t)      (1 instead without bias_correction)
///   r = m_hat / (sqrt(v_hat) + eps) + weight_decay * p
///   trust = min(||p|| / ||r||, trust_clip), or 1 when either norm is 0   (1 without use_trust_ratio)
///   p <- p - lr * trust * r
/// The norms are taken over the whole tensor (one "layer" per parameter tensor) and stay on the
/// device: no host sync per tensor. The ratio applies to every tensor, as in Colossal-AI's Lamb (and
/// apex's use_nvlamb); apex's FusedLAMB by default skips it where weight_decay is 0, which here is
/// use_trust_ratio = false on the no-decay group. FusedLAMB's global gradient clipping
/// (max_grad_norm) is not part of this update: call clip_grad_norm before step().
class Lamb : public Optimizer {
 public:
  explicit Lamb(std::vector<ParamGroup> groups, LambOptions defaults = {});
  explicit Lamb(std::vector<Tensor> params, LambOptions defaults = {});

 protected:
  void update_parameters() override;
  void validate_group(const ParamGroup& group, size_t group_index) const override;
};

}  // namespace colossal::optim
