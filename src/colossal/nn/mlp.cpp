// MLP: submodule wiring and the forward composition.
#include "colossal/nn/mlp.h"

namespace colossal::nn {

MLP::MLP(int64_t in_features, int64_t hidden_features, const MLPOptions& options, core::Generator* generator)
    : Module("MLP") {
  const int64_t out_features = options.out_features > 0 ? options.out_features : in_features;
  fc1_ = register_module("fc1", std::make_shared<Linear>(in_features, hidden_features, options.bias, generator));
  act_ = register_module("act", std::make_shared<GELU>(options.activation));
  drop1_ = register_module("drop1", std::make_shared<Dropout>(options.dropout, options.dropout_generator));
  fc2_ = register_module("fc2", std::make_shared<Linear>(hidden_features, out_features, options.bias, generator));
  drop2_ = register_module("drop2", std::make_shared<Dropout>(options.dropout, options.dropout_generator));
}

Tensor MLP::forward(const Tensor& x) {
  return drop2_->forward(fc2_->forward(drop1_->forward(act_->forward(fc1_->forward(x)))));
}

}  // namespace colossal::nn
