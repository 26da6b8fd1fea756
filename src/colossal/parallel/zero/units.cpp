// ZeRO's units: see units.h.
#include "colossal/parallel/zero/units.h"

#include <unordered_map>

#include "colossal/nn/module.h"  // Sequential, ModuleList

namespace colossal::parallel::zero {

namespace {

bool is_container(const nn::Module& module) {
  return dynamic_cast<const nn::Sequential*>(&module) != nullptr ||
         dynamic_cast<const nn::ModuleList*>(&module) != nullptr;
}

}  // namespace

std::vector<Unit> find_units(nn::Module& model, const std::vector<Tensor>& params) {
  std::vector<Unit> units;
  for (const auto& [name, module] : model.named_modules()) {
    if (!is_container(*module)) continue;
    bool inside = false;
    for (const Unit& unit : units) inside = inside || name.starts_with(unit.name + ".");
    if (inside) continue;
    for (const auto& [child_name, child] : module->named_children()) {
      if (is_container(*child) || child->parameters().empty()) continue;  // a nested container's members go on
      units.push_back(Unit{name.empty() ? child_name : name + "." + child_name, child.get(), {}});
    }
  }
  units.push_back(Unit{"", &model, {}});
  std::unordered_map<const core::TensorImpl*, size_t> index_of;
  for (size_t k = 0; k < params.size(); ++k) index_of.emplace(params[k].impl(), k);
  std::vector<bool> taken(params.size(), false);
  for (Unit& unit : units) {
    for (const Tensor& param : unit.module->parameters()) {
      const auto it = index_of.find(param.impl());
      if (it == index_of.end() || taken[it->second]) continue;
      taken[it->second] = true;
      unit.params.push_back(it->second);
    }
  }
  return units;
}

}  // namespace colossal::parallel::zero
