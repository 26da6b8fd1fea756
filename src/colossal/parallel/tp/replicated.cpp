// Replicated copies of serial layers: see replicated.h.
#include "colossal/parallel/tp/replicated.h"

#include "colossal/autograd/grad_mode.h"  // NoGradGuard
#include "colossal/core/error.h"

namespace colossal::parallel::tp {

void copy_state(const nn::Module& from, nn::Module& to) {
  const nn::StateDict state = from.state_dict();
  if (!state.empty()) {
    const Tensor& any = state.begin()->second;
    to.to(any.device());
    to.to(any.dtype());
  }
  autograd::NoGradGuard no_grad;
  to.load_state_dict(state, /*strict=*/true);  // throws naming a tensor the two do not share
}

}  // namespace colossal::parallel::tp
