// The small f32 MLP and random batches the amp tests train: a Linear - GELU - Linear of stated
// sizes initialised from a seed, and normal(0, 1) batches from a seed, both built on the CPU.
#pragma once

#include <cstdint>
#include <memory>

#include "colossal/core/random.h"    // Generator, normal_
#include "colossal/core/tensor.h"    // Tensor, empty
#include "colossal/nn/activation.h"  // GELU
#include "colossal/nn/linear.h"
#include "colossal/nn/module.h"  // Sequential

namespace colossal::amp::testing {

/// The widths of Linear(in, hidden) - GELU - Linear(hidden, out).
struct MlpSizes {
  int64_t in;
  int64_t hidden;
  int64_t out;
};

/// Linear(in, hidden) - GELU - Linear(hidden, out) in f32 on the CPU, initialised from Generator(seed).
inline std::shared_ptr<nn::Sequential> make_mlp(uint64_t seed, MlpSizes sizes) {
  core::Generator generator(seed);
  auto model = std::make_shared<nn::Sequential>();
  model->push_back(std::make_shared<nn::Linear>(sizes.in, sizes.hidden, true, &generator));
  model->push_back(std::make_shared<nn::GELU>());
  model->push_back(std::make_shared<nn::Linear>(sizes.hidden, sizes.out, true, &generator));
  return model;
}

/// A [rows, cols] f32 CPU tensor of normal(0, 1) values from Generator(seed).
inline Tensor random_batch(int64_t rows, int64_t cols, uint64_t seed) {
  core::Generator generator(seed);
  Tensor t = core::empty({rows, cols});
  core::normal_(t, 0.0, 1.0, &generator);
  return t;
}

}  // namespace colossal::amp::testing
