// Lars: layer-wise adaptive rate scaling (You et al., "Large Batch Training of Convolutional
// Networks"), in the variant of Colossal-AI's colossalai.nn.optimizer.Lars (from
// NUS-HPC-AI-Lab/LARS-ImageNet-PyTorch): the trust ratio scales the learning rate of each step.
#pragma once

#include <limits>
#include <map>
#include <string>
#include <vector>

#include "colossal/core/dispatch.h"
#include "colossal/optim/optimizer.h"

namespace colossal::optim {

/// The hyper-parameters of Lars; each is also an option key of a ParamGroup (adaptation as 0 / 1).
struct LarsOptions {
  double lr = 1e-3;           ///< learning rate, >= 0
  double momentum = 0.0;      ///< momentum factor, >= 0 (0 turns momentum off)
  double eta = 1e-3;          ///< the LARS coefficient ("eeta" in Colossal-AI), in (0, 1]
  double weight_decay = 0.0;  ///< L2 penalty added to the gradient (with adaptation only), >= 0
  double eps = 0.0;           ///< added to the trust ratio's denominator, >= 0
  double trust_clip = 50.0;   ///< the trust ratio is clamped to [0, trust_clip]; > 0
  /// The decayed gradient is clamped elementwise to [-grad_clip, grad_clip] (Colossal-AI: 10);
  /// > 0, infinity turns it off.
  double grad_clip = 10.0;
  /// Off: plain momentum SGD for this group (no trust ratio, no weight decay) - for biases and
  /// norm weights, which LARS usually leaves out.
  bool adaptation = true;

  std::map<std::string, double> to_map() const;
  static LarsOptions from_group(const ParamGroup& group);
};

/// One update of `lists` (state[0]: "momentum_buffer", present when momentum != 0).
using LarsStepKernel = void(const MultiTensorLists& lists, const LarsOptions& options);
/// Backends register a multi-tensor kernel here (see Note [Multi-tensor optimizer kernels]).
extern core::DispatchStub<LarsStepKernel> lars_step_stub;
/// The per-tensor loop over in-place ops used where no kernel is registered.
void lars_step_reference(const MultiTensorLists& lists, const LarsOptions& options);

/// For each parameter with gradient g (Colossal-AI's Lars):
///   trust = eta ||p|| / (||g|| + weight_decay ||p|| + eps) when ||p|| > 0 and ||g|| > 0, else 1;
///           clamped to [0, trust_clip]                          (1 without adaptation)
///   d = clamp(g + weight_decay p, -grad_clip, grad_clip)       (g without adaptation)
///   b <- d on the first step, else momentum b + d; d <- b       (when momentum != 0)
///   p <- p - lr * trust * d
/// Unlike the torchlars variant, the buffer accumulates unscaled gradients and this step's trust
/// ratio scales the whole buffer. The norms stay on the device (no host sync per tensor).
class Lars : public Optimizer {
 public:
  explicit Lars(std::vector<ParamGroup> groups, LarsOptions defaults = {});
  explicit Lars(std::vector<Tensor> params, LarsOptions defaults = {});

 protected:
  void update_parameters() override;
  void validate_group(const ParamGroup& group, size_t group_index) const override;
};

}  // namespace colossal::optim
