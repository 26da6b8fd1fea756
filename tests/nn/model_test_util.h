// Checks the model tests share: parameter names, sample standard deviations of initialisations,
// gradients that reach every parameter, and pipeline pieces that cover a model exactly.
#pragma once

#include <gtest/gtest.h>

#include <cmath>
#include <map>
#include <memory>
#include <set>
#include <string>
#include <vector>

#include "colossal/nn/module.h"

namespace colossal::testing {

inline std::vector<std::string> parameter_names(const nn::Module& m) {
  std::vector<std::string> out;
  for (const auto& [name, tensor] : m.named_parameters()) out.push_back(name);
  return out;
}

/// The sample standard deviation of t's elements (about its sample mean).
inline double std_of(const Tensor& t) {
  const std::vector<double> v = t.to_vector<double>();
  double mean = 0.0;
  for (double x : v) mean += x;
  mean /= static_cast<double>(v.size());
  double sq = 0.0;
  for (double x : v) sq += (x - mean) * (x - mean);
  return std::sqrt(sq / static_cast<double>(v.size() - 1));
}

/// EXPECTs every parameter to have a gradient that is finite everywhere and not all zeros (a
/// parameter the loss never reaches would keep a zero or undefined gradient).
inline void expect_finite_nonzero_grads(const nn::Module& model) {
  for (const auto& [name, param] : model.named_parameters()) {
    const Tensor grad = param.grad();
    if (!grad.defined()) {
      ADD_FAILURE() << name << " got no gradient";
      continue;
    }
    EXPECT_EQ(grad.shape(), param.shape()) << name;
    bool finite = true, nonzero = false;
    for (double g : grad.to_vector<double>()) {
      finite = finite && std::isfinite(g);
      nonzero = nonzero || g != 0.0;
    }
    EXPECT_TRUE(finite) << name << " has a non-finite gradient";
    EXPECT_TRUE(nonzero) << name << " has an all-zero gradient";
  }
}

/// EXPECTs the pieces' state dicts to partition the model's: every key of a piece is the model's
/// key for the same storage, and every model key is in exactly one piece, except the tied ones,
/// which are in exactly two.
inline void expect_pieces_cover_the_model(const nn::Module& model,
                                          const std::vector<std::shared_ptr<nn::Module>>& pieces,
                                          const std::set<std::string>& tied = {}) {
  const nn::StateDict whole = model.state_dict();
  std::map<std::string, int> seen;
  for (const auto& piece : pieces) {
    for (const auto& [name, tensor] : piece->state_dict()) {
      const Tensor* in_model = whole.find(name);
      if (in_model == nullptr) {
        ADD_FAILURE() << "piece " << piece->type_name() << " has '" << name << "', which the model does not";
        continue;
      }
      EXPECT_EQ(tensor.raw_data(), in_model->raw_data()) << name << " is a copy, not the model's tensor";
      seen[name] += 1;
    }
  }
  for (const auto& [name, tensor] : whole) {
    EXPECT_EQ(seen[name], tied.contains(name) ? 2 : 1) << name;
  }
}

}  // namespace colossal::testing
