// Helpers shared by the optimizer tests: f64 parameters with hand-set gradients, reading a tensor
// back as doubles, and the state_dict round trip every optimizer must pass.
#pragma once

#include <gtest/gtest.h>

#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "colossal/core/tensor.h"
#include "colossal/optim/optimizer.h"

namespace colossal::optim::testing {

/// A leaf f64 parameter (requires grad) holding `values` with `shape` (1-D when empty).
inline Tensor make_param(const std::vector<double>& values, Shape shape = {}) {
  if (shape.empty()) shape = {static_cast<int64_t>(values.size())};
  Tensor p = core::from_vector(values, shape, DType::f64);
  p.set_requires_grad(true);
  return p;
}

/// Sets p's gradient to `values` (in p's shape and dtype). Tensors are handles: the copy shares p.
inline void set_grad(Tensor p, const std::vector<double>& values) {
  p.set_grad(core::from_vector(values, p.shape(), DType::f64).to(p.dtype()));
}

inline std::vector<double> values_of(const Tensor& t) {
  return t.to_vector<double>();
}

/// A new leaf f64 parameter holding t's current values: the model a checkpoint is restored into.
inline Tensor copy_param(const Tensor& t) {
  return make_param(values_of(t), t.shape());
}

/// EXPECTs two state dicts to hold the same keys with bit-identical values.
inline void expect_same_state(const StateDict& actual, const StateDict& expected, const std::string& what) {
  std::vector<std::string> actual_keys, expected_keys;
  for (const auto& [key, tensor] : actual) actual_keys.push_back(key);
  for (const auto& [key, tensor] : expected) expected_keys.push_back(key);
  ASSERT_EQ(actual_keys, expected_keys) << what;
  for (const auto& [key, tensor] : expected) {
    const Tensor& other = actual.at(key);
    EXPECT_EQ(other.shape(), tensor.shape()) << what << ": " << key;
    EXPECT_EQ(other.to_vector<double>(), tensor.to_vector<double>()) << what << ": " << key;
  }
}

/// Builds an optimizer over [weight 2x2, bias 2, frozen-in-practice 1] (the last never gets a
/// gradient, so it never gets state).
using MakeOptimizer = std::function<std::unique_ptr<Optimizer>(const NamedParameters& params)>;

/// Runs `before` steps, saves state_dict(), builds a second optimizer over copies of the
/// parameters with every lr changed (so a missing restore shows), loads the saved state, and then
/// expects both to run `after` more steps in lockstep, bit for bit, on the same gradients.
inline void expect_state_dict_round_trip(const MakeOptimizer& make, int before = 3, int after = 3) {
  const NamedParameters original{{"fc.weight", make_param({0.5, -1.0, 1.5, 2.0}, {2, 2})},
                                 {"fc.bias", make_param({0.1, -0.2})},
                                 {"unused", make_param({3.0})}};
  std::unique_ptr<Optimizer> first = make(original);
  // Varied in sign and size per step and element; never all zero.
  auto feed = [](const NamedParameters& params, int t) {
    for (size_t k = 0; k < 2; ++k) {
      const Tensor& p = params[k].second;
      std::vector<double> grad(static_cast<size_t>(p.numel()));
      for (size_t i = 0; i < grad.size(); ++i) {
        grad[i] = 0.25 * static_cast<double>(i + 1 + k) * (t % 2 == 0 ? -1.0 : 1.0) + 0.1 * t;
      }
      set_grad(p, grad);
    }
  };
  for (int t = 1; t <= before; ++t) {
    feed(original, t);
    first->step();
  }
  const StateDict saved = first->state_dict();
  EXPECT_FALSE(saved.contains("state.2.step")) << "the parameter without gradients has no state";

  NamedParameters restored_params;
  for (const auto& [name, p] : original) restored_params.emplace_back(name, copy_param(p));
  std::unique_ptr<Optimizer> second = make(restored_params);
  for (ParamGroup& group : second->param_groups()) group.set_lr(group.lr() * 3.0 + 0.5);
  second->load_state_dict(saved);
  expect_same_state(second->state_dict(), first->state_dict(), "right after load_state_dict");

  for (int t = before + 1; t <= before + after; ++t) {
    feed(original, t);
    feed(restored_params, t);
    first->step();
    second->step();
    for (size_t k = 0; k < original.size(); ++k) {
      EXPECT_EQ(values_of(restored_params[k].second), values_of(original[k].second))
          << original[k].first << " after step " << t;
    }
  }
  expect_same_state(second->state_dict(), first->state_dict(), "after continuing");
}

}  // namespace colossal::optim::testing
