// Replicated copies of serial layers for the tensor-parallel models: every rank of the tensor group
// holds the whole layer, a module of its own with the serial one's values (so the serial model may
// be dropped, and a test may keep training it beside the parallel one without the two aliasing).
#pragma once

#include <memory>

#include "colossal/nn/module.h"

namespace colossal::parallel::tp {

/// Copies every parameter and buffer of `from` into the same-named one of `to` (the same names and
/// shapes: `to` built with the serial layer's sizes), after moving `to` to `from`'s device and dtype.
/// Throws naming the module and the tensor when the two differ.
void copy_state(const nn::Module& from, nn::Module& to);

/// `fresh` (built with the serial layer's sizes) holding `serial`'s values.
template <class M>
std::shared_ptr<M> replicated_copy(const nn::Module& serial, std::shared_ptr<M> fresh) {
  copy_state(serial, *fresh);
  return fresh;
}

}  // namespace colossal::parallel::tp
