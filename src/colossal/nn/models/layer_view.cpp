// LayerView: registration of shared modules under dotted names. See Note [Pipeline layers].
#include "colossal/nn/models/layer_view.h"

namespace colossal::nn::models {

void LayerView::share_module(std::string_view dotted_name, std::shared_ptr<Module> module) {
  Module* owner = this;
  size_t start = 0;
  for (size_t dot = dotted_name.find('.'); dot != std::string_view::npos; dot = dotted_name.find('.', start)) {
    const std::string part(dotted_name.substr(start, dot - start));
    std::shared_ptr<Module> container;
    for (const auto& [name, child] : owner->named_children()) {
      if (name == part) container = child;
    }
    if (container == nullptr) container = owner->register_module(part, std::make_shared<Module>("Container"));
    owner = container.get();
    start = dot + 1;
  }
  owner->register_module(std::string(dotted_name.substr(start)), std::move(module));
}

void LayerView::share_parameter(std::string name, const Tensor& parameter) {
  register_parameter(std::move(name), parameter, parameter.requires_grad());
}

}  // namespace colossal::nn::models
