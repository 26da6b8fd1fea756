// Philox4x32-10 (Salmon et al., "Parallel random numbers: as easy as 1, 2, 3", SC'11): a
// counter-based generator. Random number i of a draw is a pure function of (seed, offset, i), so
// the CPU and CUDA produce the same dropout mask for the same seed, and any thread can compute
// any element without a shared state. Header-only so CUDA kernels include it too.
#pragma once

#include <cmath>
#include <cstdint>
#include <type_traits>

#include "colossal/core/half.h"  // COLOSSAL_HOST_DEVICE

namespace colossal::core {

struct PhiloxBlock {
  uint32_t x[4];
};

COLOSSAL_HOST_DEVICE inline void philox_mulhilo(uint32_t a, uint32_t b, uint32_t& hi, uint32_t& lo) {
  const uint64_t product = static_cast<uint64_t>(a) * b;
  hi = static_cast<uint32_t>(product >> 32);
  lo = static_cast<uint32_t>(product);
}

/// Ten rounds of Philox4x32 on counter c with key k.
COLOSSAL_HOST_DEVICE inline PhiloxBlock philox4x32_10(PhiloxBlock c, uint32_t k0, uint32_t k1) {
  constexpr uint32_t kMul0 = 0xD2511F53u, kMul1 = 0xCD9E8D57u;
  constexpr uint32_t kWeyl0 = 0x9E3779B9u, kWeyl1 = 0xBB67AE85u;
  for (int round = 0; round < 10; ++round) {
    uint32_t hi0, lo0, hi1, lo1;
    philox_mulhilo(kMul0, c.x[0], hi0, lo0);
    philox_mulhilo(kMul1, c.x[2], hi1, lo1);
    c = PhiloxBlock{{hi1 ^ c.x[1] ^ k0, lo1, hi0 ^ c.x[3] ^ k1, lo0}};
    k0 += kWeyl0;
    k1 += kWeyl1;
  }
  return c;
}

/// The four 32-bit words of block `block` of the stream (seed, offset). Element i of a draw uses
/// word i % 4 of block i / 4 (or, for 64-bit uniforms, words 2(i%2) and 2(i%2)+1 of block i / 2).
COLOSSAL_HOST_DEVICE inline PhiloxBlock philox_block(uint64_t seed, uint64_t offset, uint64_t block) {
  PhiloxBlock counter{{static_cast<uint32_t>(block), static_cast<uint32_t>(block >> 32), static_cast<uint32_t>(offset),
                       static_cast<uint32_t>(offset >> 32)}};
  return philox4x32_10(counter, static_cast<uint32_t>(seed), static_cast<uint32_t>(seed >> 32));
}

/// Uniform in [0, 1) with 24 random bits: exact in float.
COLOSSAL_HOST_DEVICE inline float uniform_float(uint32_t bits) {
  return static_cast<float>(bits >> 8) * 5.9604644775390625e-8f;
}
/// Uniform in [0, 1) with 53 random bits.
COLOSSAL_HOST_DEVICE inline double uniform_double(uint32_t hi, uint32_t lo) {
  const uint64_t bits = (static_cast<uint64_t>(hi) << 21) ^ (lo >> 11);
  return static_cast<double>(bits & ((1ull << 53) - 1)) * 1.1102230246251565e-16;
}

/// A uniform draw v in [low, high) stored as T. Rounding to T can land on high itself (in bf16 about
/// 2 draws in 1000 on [0, 1)), which [low, high) excludes: such a value steps down to the largest T
/// below high, so every dtype keeps the half-open range.
template <class T>
COLOSSAL_HOST_DEVICE inline T store_uniform(double v, double high) {
  if constexpr (std::is_same_v<T, Half> || std::is_same_v<T, BFloat16>) {
    T t(static_cast<float>(v));
    if (static_cast<double>(static_cast<float>(t)) >= high) {
      const bool negative = (t.bits & 0x8000u) != 0;
      const bool zero = (t.bits & 0x7fffu) == 0;
      t.bits = zero ? static_cast<uint16_t>(0x8001u) : static_cast<uint16_t>(negative ? t.bits + 1 : t.bits - 1);
    }
    return t;
  } else {
    T t = static_cast<T>(v);
    if (static_cast<double>(t) >= high) t = nextafter(t, static_cast<T>(-INFINITY));
    return t;
  }
}

}  // namespace colossal::core
