// Checks the model tests share: parameter names, sample standard deviations of initialisations,
// gradients that reach every parameter, and pipeline pieces that cover a model exactly.
#pragma once

#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <functional>
#include <map>
#include <memory>
#include <set>
#include <string>
#include <vector>

#include "colossal/core/random.h"
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

/// EXPECTs the pieces `built` says of `partial` (a model built with that PieceFilter, Note [Pieces
/// built]) to hold the same names and bits as `full`'s (built from the same generator state), the
/// model's names to be the same, and the pieces left out to be stand-ins far smaller than the full ones.
inline void expect_built_pieces_equal_the_full_model(nn::Module& full, nn::Module& partial,
                                                     const std::vector<std::shared_ptr<nn::Module>>& full_pieces,
                                                     const std::vector<std::shared_ptr<nn::Module>>& partial_pieces,
                                                     const std::function<bool(size_t)>& built) {
  EXPECT_EQ(parameter_names(partial), parameter_names(full));
  ASSERT_EQ(partial_pieces.size(), full_pieces.size());
  std::set<std::string> in_built;  // a tied weight is built whole when a piece built holds it
  for (size_t i = 0; i < full_pieces.size(); ++i) {
    if (!built(i)) continue;
    for (const auto& [name, tensor] : full_pieces[i]->state_dict()) in_built.insert(name);
  }
  for (size_t i = 0; i < full_pieces.size(); ++i) {
    const nn::StateDict want = full_pieces[i]->state_dict(), got = partial_pieces[i]->state_dict();
    int64_t want_numel = 0, got_numel = 0;
    for (const auto& [name, tensor] : want) {
      const Tensor* mine = got.find(name);
      ASSERT_NE(mine, nullptr) << "piece " << i << " lacks " << name;
      if (!in_built.contains(name)) {
        want_numel += tensor.numel();
        got_numel += mine->numel();
      }
      if (!built(i)) continue;
      ASSERT_EQ(mine->shape(), tensor.shape()) << name;
      EXPECT_EQ(std::memcmp(mine->raw_data(), tensor.raw_data(), static_cast<size_t>(tensor.nbytes())), 0)
          << "piece " << i << ": " << name << " differs from the full model's";
    }
    if (!built(i)) {
      EXPECT_LT(got_numel * 10, want_numel) << "piece " << i << " left out is no stand-in";
    }
  }
}

/// Builds `Model` (GPT2, VisionTransformer) from `config` whole, then with each set of `kept` pieces
/// built and the others stand-ins, from the same seed, and EXPECTs the pieces built to equal the whole
/// model's and the generator to end at the same offset (Note [Pieces built]).
template <class Model, class Config>
void expect_pieces_built_alone_equal_the_whole(const Config& config, const std::vector<std::set<size_t>>& kept) {
  core::Generator whole_gen(11), dropout(12);
  Model whole(config, &whole_gen, &dropout);
  for (const std::set<size_t>& pieces : kept) {
    core::Generator gen(11);
    const auto built = [&pieces](size_t piece) { return pieces.contains(piece); };
    Model partial(config, &gen, &dropout, built);
    EXPECT_EQ(gen.state().offset, whole_gen.state().offset) << "the stand-ins drew as many times";
    expect_built_pieces_equal_the_full_model(whole, partial, whole.layers(), partial.layers(), built);
  }
}

}  // namespace colossal::testing
