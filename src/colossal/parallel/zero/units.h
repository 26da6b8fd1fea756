// The units ZeRO hangs forward hooks on (Note [ZeRO-3 units] in zero3.cpp): every module held in a
// Sequential or ModuleList outside another unit (the transformer blocks, an MLP's layers), then the
// model itself, which holds what no other unit does (GPT-2's embeddings, tied head and last norm).
// Those are the modules the models call through nn::Module::operator(), so their forward hooks run.
#pragma once

#include <cstddef>
#include <string>
#include <vector>

#include "colossal/nn/module.h"

namespace colossal::parallel::zero {

struct Unit {
  std::string name;            ///< dotted path in the model; "" for the model itself (always last)
  nn::Module* module;          ///< lives as long as the model
  std::vector<size_t> params;  ///< indices into the list given to find_units, each parameter in one unit
};

/// The units of `model`, each with the parameters of `params` it holds and no earlier unit does (a
/// tied parameter goes to the first unit holding it, the model's own last). A parameter of `params`
/// that is not the model's is in none.
std::vector<Unit> find_units(nn::Module& model, const std::vector<Tensor>& params);

}  // namespace colossal::parallel::zero
