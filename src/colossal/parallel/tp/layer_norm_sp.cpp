// The sequence-parallel layer norm: see layer_norm_sp.h.
#include "colossal/parallel/tp/layer_norm_sp.h"

#include <utility>

#include "colossal/autograd/grad_mode.h"  // NoGradGuard
#include "colossal/core/error.h"
#include "colossal/ops/nn_functional.h"     // layer_norm
#include "colossal/parallel/tp/mappings.h"  // copy_to_region

namespace colossal::parallel::tp {

SequenceParallelLayerNorm::SequenceParallelLayerNorm(const nn::LayerNorm& serial,
                                                     std::shared_ptr<comm::ProcessGroup> group)
    : nn::LayerNorm(serial.normalized_shape(), serial.eps(), serial.weight().defined(), serial.bias().defined()),
      group_(std::move(group)) {
  COLOSSAL_CHECK(group_ != nullptr, "SequenceParallelLayerNorm needs the tensor-parallel group");
  autograd::NoGradGuard no_grad;
  if (serial.weight().defined()) to(serial.weight().device());
  if (serial.weight().defined()) to(serial.weight().dtype());
  if (serial.weight().defined()) weight().copy_(serial.weight());
  if (serial.bias().defined()) bias().copy_(serial.bias());
}

Tensor SequenceParallelLayerNorm::forward(const Tensor& x) {
  const Tensor w = weight().defined() ? copy_to_region(weight(), *group_) : Tensor();
  const Tensor b = bias().defined() ? copy_to_region(bias(), *group_) : Tensor();
  return ops::layer_norm(x, normalized_shape(), w, b, eps());
}

}  // namespace colossal::parallel::tp
