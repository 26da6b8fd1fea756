// Generator: the (seed, offset) state of a Philox stream. Each random op takes the next offset,
// so draws never overlap and a saved state replays exactly (activation checkpointing restores it
// to recompute dropout). Also random tensor factories.
#pragma once

#include <cstdint>

#include "colossal/core/dispatch.h"
#include "colossal/core/tensor.h"

namespace colossal::core {

struct GeneratorState {
  uint64_t seed = 0;
  uint64_t offset = 0;
  friend bool operator==(const GeneratorState&, const GeneratorState&) = default;
};

class Generator {
 public:
  explicit Generator(uint64_t seed = 0) : state_{seed, 0} {}
  uint64_t seed() const { return state_.seed; }
  /// Resets to the start of seed's stream.
  void manual_seed(uint64_t seed) { state_ = {seed, 0}; }
  GeneratorState state() const { return state_; }
  void set_state(GeneratorState state) { state_ = state; }
  /// Reserves `count` offsets for one draw and returns the first. Every op that draws random
  /// numbers calls this once, on the host, so the draw is reproducible whatever device runs it.
  uint64_t next_offset(uint64_t count = 1) {
    const uint64_t o = state_.offset;
    state_.offset += count;
    return o;
  }

 private:
  GeneratorState state_;
};

/// The process's default generator (as torch.manual_seed's). Per-mode generators for parallel
/// training are created explicitly by the parallel context.
Generator& default_generator();
void manual_seed(uint64_t seed);

/// Fills t (floating) in place with uniform numbers in [low, high).
Tensor& uniform_(Tensor& t, double low = 0.0, double high = 1.0, Generator* gen = nullptr);
/// Fills t (floating) in place with normal numbers (Box-Muller on Philox uniforms).
Tensor& normal_(Tensor& t, double mean = 0.0, double std = 1.0, Generator* gen = nullptr);
Tensor rand(const Shape& shape, TensorOptions options = {}, Generator* gen = nullptr);
Tensor randn(const Shape& shape, TensorOptions options = {}, Generator* gen = nullptr);
/// Integers uniformly in [low, high).
Tensor randint(int64_t low, int64_t high, const Shape& shape, TensorOptions options = DType::i64, Generator* gen = nullptr);

/// Kernel: fills contiguous `t` from the stream (seed, offset); kind 0 uniform(a, b), 1 normal(a, b).
using RandomFillKernel = void(const Tensor& t, uint64_t seed, uint64_t offset, int kind, double a, double b);
extern DispatchStub<RandomFillKernel> random_fill_stub;

}  // namespace colossal::core
