// The host step of Adam, AdamW and LAMB for ZeRO's optimizer offload (parallel/zero/low_level_zero.h):
// fp32 parameters and moments in host memory, updated by a multi-threaded (OpenMP over fixed chunks),
// vectorised (the update compiled for AVX-512, AVX2 and baseline x86-64, picked at run time) pass
// that reads the gradient in f32, bf16 or f16 and can write the updated parameter in the model's
// dtype into a (pinned) buffer on the way, for the copy back to the GPU. DeepSpeed's CPUAdam is the
// idea; the math is optim/adam.h's and optim/lamb.h's (Note [Host optimizer step] in the .cpp).
#pragma once

#include <cstddef>
#include <vector>

#include "colossal/core/tensor.h"
#include "colossal/optim/optimizer.h"

namespace colossal::optim {

/// One parameter of a host step.
struct HostStepItem {
  /// The parameter: optimizer.param_groups()[group].params[index], contiguous f32 on the CPU.
  size_t group = 0;
  size_t index = 0;
  /// Its gradient: contiguous f32, bf16 or f16 on the CPU, as many elements as the parameter.
  Tensor grad;
  /// Undefined, or a contiguous CPU tensor of the parameter's numel that receives the updated
  /// parameter converted to its dtype (f32, bf16 or f16; round to nearest even): the staging buffer
  /// of the copy back into the model.
  Tensor out;
};

/// Whether host_step can step `optimizer` ("Adam", "AdamW" and "LAMB").
bool host_step_supports(const Optimizer& optimizer);

/// One update of the parameters `items` name, as optimizer.step() would make it with those
/// gradients: the group's hyper-parameters, each parameter's state buffers (created as f32 CPU zeros
/// when missing, as the optimizer's own step does) and step count (advanced by one), every gradient
/// multiplied by `grad_scale` (rounded to f32, as scale_for does for f32) first. The parameters
/// without an item are left alone (they keep their step count), so a caller may step a model in
/// pieces (ZeRO's buckets) — except LAMB, whose trust ratio is per parameter and needs each item
/// whole, which it is by construction. Throws naming the optimizer when it is none of those
/// host_step_supports accepts, and naming the parameter when a tensor is on another device, of
/// another dtype or size.
void host_step(Optimizer& optimizer, const std::vector<HostStepItem>& items, double grad_scale = 1.0);

}  // namespace colossal::optim
